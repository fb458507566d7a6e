"""Tests of `pacs.grpo.checkpoints` (and the two resume rules of `pacs.grpo.resume` it serves, which checkpoint and
whether the run is finished) and `PACSTrainer`'s checkpoints: a run resumed from any checkpoint, in the middle of a
generation batch or not, ends where the uninterrupted run ends; an interrupted save is skipped on resume."""

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from pacs import PACSTrainer
from pacs.grpo.checkpoints import (
    COMPLETE_MARKER,
    ROLLOUT_DIR,
    last_complete_checkpoint,
    run_identity,
    sync_checkpoint_files,
    write_complete_marker,
)
from pacs.grpo.resume import finished_run, resolve_resume_checkpoint, resume_decision
from tests.launching import ZERO3_CPU_ACCELERATE_CONFIG, accelerate_launch, run_launched
from tests.scripts.train_resume import resume_runs
from tests.tiny_config import tiny_pacs_config


RESUME_SCRIPT = Path(__file__).parent / "scripts" / "train_resume.py"
TOLERANCE = 1e-6  # relative to the update the uninterrupted run made


def _checkpoint(output_dir: Path, step: int, complete: bool = True, trainer_state: bool = True) -> Path:
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    if trainer_state:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if complete:
        write_complete_marker(folder, global_step=step)
    return folder


# ---------------------------------------------------------------------------------------------------------------------
# Which checkpoint a resume takes
# ---------------------------------------------------------------------------------------------------------------------


def test_newest_complete_checkpoint_is_taken_and_the_skipped_ones_are_named(tmp_path, caplog):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 10)  # numeric order, not string order
    _checkpoint(tmp_path, 12, complete=False)  # killed after trainer_state.json, before the marker
    _checkpoint(tmp_path, 14, complete=False, trainer_state=False)  # killed while writing the weights
    (tmp_path / "checkpoint-16").write_text("not a folder")
    path, skipped = last_complete_checkpoint(tmp_path)
    assert path == str(tmp_path / "checkpoint-10")
    assert [name for name, _ in skipped] == ["checkpoint-14", "checkpoint-12"]
    assert all(COMPLETE_MARKER in reason for _, reason in skipped)
    with caplog.at_level(logging.WARNING, logger="pacs.grpo.checkpoints"):
        assert resolve_resume_checkpoint(True, str(tmp_path)) == str(tmp_path / "checkpoint-10")
        assert resolve_resume_checkpoint("true", str(tmp_path)) == str(tmp_path / "checkpoint-10")  # command line
    assert "checkpoint-14" in caplog.text and "checkpoint-12" in caplog.text
    assert resolve_resume_checkpoint(None, str(tmp_path)) is None
    assert resolve_resume_checkpoint(False, str(tmp_path)) is None


def test_a_named_incomplete_checkpoint_is_an_error_that_says_what_is_missing(tmp_path):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4, complete=False)
    with pytest.raises(ValueError, match=r"checkpoint-4: its save did not finish \(no pacs_checkpoint_complete"):
        resolve_resume_checkpoint(str(tmp_path / "checkpoint-4"), str(tmp_path))
    with pytest.raises(ValueError, match="no such folder"):
        resolve_resume_checkpoint(str(tmp_path / "checkpoint-6"), str(tmp_path))
    assert resolve_resume_checkpoint(str(tmp_path / "checkpoint-2"), str(tmp_path)) == str(tmp_path / "checkpoint-2")


def test_no_complete_checkpoint_is_an_error_listing_why(tmp_path):
    _checkpoint(tmp_path, 4, complete=False, trainer_state=False)
    with pytest.raises(ValueError, match="found no complete checkpoint.*checkpoint-4: its save did not finish"):
        resolve_resume_checkpoint(True, str(tmp_path))
    with pytest.raises(ValueError, match="no checkpoint-N folder"):
        resolve_resume_checkpoint(True, str(tmp_path / "empty"))


def test_checkpoints_saved_without_the_marker_resume_as_transformers_would(tmp_path):
    # GRPOTrainer's (or an older pacs's) checkpoints: a trainer_state.json is the sign of a finished save
    _checkpoint(tmp_path, 2, complete=False)
    _checkpoint(tmp_path, 4, complete=False, trainer_state=False)
    path, skipped = last_complete_checkpoint(tmp_path)
    assert path == str(tmp_path / "checkpoint-2") and [name for name, _ in skipped] == ["checkpoint-4"]
    assert resolve_resume_checkpoint(path, str(tmp_path)) == path


def test_a_file_that_does_not_match_the_marker_is_skipped_and_named(tmp_path, caplog):
    for step in (2, 4):
        folder = _checkpoint(tmp_path, step, complete=False)
        (folder / "optimizer.pt").write_bytes(b"x" * 1000)
        (folder / "sub").mkdir()
        (folder / "sub" / "rank0.pt").write_bytes(b"y" * 10)
        write_complete_marker(folder, files=sync_checkpoint_files(folder), global_step=step)
    marker = json.loads((tmp_path / "checkpoint-4" / COMPLETE_MARKER).read_text())
    assert marker["files"] == {"optimizer.pt": 1000, "sub/rank0.pt": 10, "trainer_state.json": 18}
    assert resolve_resume_checkpoint(True, str(tmp_path)) == str(tmp_path / "checkpoint-4")
    (tmp_path / "checkpoint-4" / "optimizer.pt").write_bytes(b"x" * 100)  # a disk that filled up, a cut-short copy
    with caplog.at_level(logging.WARNING, logger="pacs.grpo.checkpoints"):
        assert resolve_resume_checkpoint(True, str(tmp_path)) == str(tmp_path / "checkpoint-2")
    assert "checkpoint-4" in caplog.text and "optimizer.pt has 100 bytes, 1000 when the checkpoint was saved" in (
        caplog.text
    )
    with pytest.raises(
        ValueError, match=r"checkpoint-4: .*optimizer\.pt has 100 bytes.*newest complete .*checkpoint-2"
    ):
        resolve_resume_checkpoint(str(tmp_path / "checkpoint-4"), str(tmp_path))
    (tmp_path / "checkpoint-2" / "sub" / "rank0.pt").unlink()
    with pytest.raises(ValueError, match=r"sub/rank0\.pt is missing.*has no complete checkpoint"):
        resolve_resume_checkpoint(str(tmp_path / "checkpoint-2"), str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", "checkpoint-4"]  # nothing deleted


def test_finished_run_by_steps_and_by_epochs(tmp_path):
    from types import SimpleNamespace

    folder = _checkpoint(tmp_path, 8)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 8, "epoch": 2.0}))
    args = SimpleNamespace(output_dir=str(tmp_path), max_steps=8, num_train_epochs=3.0)
    assert "is at step 8, and max_steps is 8" in finished_run(folder, args)
    assert finished_run(folder, SimpleNamespace(**{**vars(args), "max_steps": 6})) is not None
    assert finished_run(folder, SimpleNamespace(**{**vars(args), "max_steps": 9})) is None
    assert finished_run(folder, SimpleNamespace(**{**vars(args), "max_steps": -1})) is None  # epoch 2 of 3
    assert "epoch 2, and num_train_epochs is 2" in finished_run(
        folder, SimpleNamespace(**{**vars(args), "max_steps": -1, "num_train_epochs": 2.0})
    )
    assert finished_run(None, args) is None


# ---------------------------------------------------------------------------------------------------------------------
# Exact resume, in one process
# ---------------------------------------------------------------------------------------------------------------------


def _check_resumed(record: dict, grad_accum: int, generate_every: int):
    """Every resumed run ends at the uninterrupted run's parameters and generates exactly when it did."""
    assert record["update_norm"] > 0
    for k, run in record["resumed"].items():
        k = int(k)
        mid_generation = (k * grad_accum) % generate_every != 0
        assert run["rollout_saved"] == mid_generation, k  # at a generation boundary nothing extra is written
        assert run["relative_difference"] <= TOLERANCE, (k, run["relative_difference"])
        # a resume in the middle of a generation batch generates nothing until the next generation is due
        assert run["generated_at"] == [step for step in record["generated_at"] if step >= k], k


@pytest.mark.parametrize("steps_per_generation", [2, 4])
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_resume_from_every_checkpoint_matches_the_uninterrupted_run(
    tiny_model_dir, tmp_path, steps_per_generation, grad_accum
):
    # one group of 4 per micro-batch; checkpoints after every optimizer step 1..5 of 6; sampled completions
    record = resume_runs(tiny_model_dir, str(tmp_path), (4, grad_accum, steps_per_generation, 1, 6), [1, 2, 3, 4, 5])
    assert len(record["generated_at"]) > 1
    _check_resumed(record, grad_accum, steps_per_generation)


def test_resume_with_groups_split_over_micro_batches(tiny_model_dir, tmp_path):
    # per-device batch 1, G=4: 4 micro-batches per optimizer step, 2 optimizer steps per generation (split path)
    record = resume_runs(tiny_model_dir, str(tmp_path), (1, 4, 8, 1, 4), [1, 2, 3])
    _check_resumed(record, 4, 8)


def test_resume_with_num_iterations(tiny_model_dir, tmp_path):
    # 2 optimizer steps per pass over the generation batch, 2 passes: a generation every 4 optimizer steps
    record = resume_runs(tiny_model_dir, str(tmp_path), (4, 1, 2, 2, 5), [1, 2, 3, 4])
    assert record["generated_at"] == [0, 4]
    _check_resumed(record, 1, 4)


def test_resume_with_lora(tiny_model_dir, tmp_path):
    record = resume_runs(tiny_model_dir, str(tmp_path), (4, 1, 4, 1, 3), [1, 2], lora=True)
    _check_resumed(record, 1, 4)


def test_resume_without_the_saved_rollout_regenerates_and_differs(tiny_model_dir, tmp_path, monkeypatch):
    # What the saved rollout buys: without it (as with transformers alone), a resume in the middle of a generation
    # batch generates new completions at once and ends elsewhere. This also shows the exactness test above can fail.
    import pacs.grpo.trainer

    monkeypatch.setattr(pacs.grpo.trainer, "load_rollout", lambda *args, **kwargs: None)
    record = resume_runs(tiny_model_dir, str(tmp_path), (4, 1, 4, 1, 4), [1])
    run = record["resumed"]["1"] if "1" in record["resumed"] else record["resumed"][1]
    assert run["rollout_saved"] and run["generated_at"][0] == 1  # regenerated right away
    assert run["relative_difference"] > 1e-3


def _check_later_epochs(record: dict, resume_steps: list[int], epochs: float):
    """Each resumed run draws the uninterrupted run's prompts at every generation after its checkpoint, logs what it
    logged and ends at its parameters."""
    assert record["epoch"] >= epochs  # the run went through that many epochs
    drawn = {int(step): prompts for step, prompts in record["prompts_at"].items()}
    assert len({tuple(p) for p in drawn.values()}) > 1
    for k in resume_steps:
        run = record["resumed"][k] if k in record["resumed"] else record["resumed"][str(k)]
        assert {int(s): p for s, p in run["prompts_at"].items()} == {s: p for s, p in drawn.items() if s >= k}, k
        assert run["relative_difference"] <= TOLERANCE, (k, run["relative_difference"])
        expected = [e for e in record["logged"] if e["step"] > k]
        assert len(run["logged"]) == len(expected) > 0, k
        for got, want in zip(run["logged"], expected, strict=True):
            assert got.keys() == want.keys(), k
            if "train_loss" in want:  # transformers' summary: the mean loss of this `train()` call's steps only
                got, want = {**got, "train_loss": None}, {**want, "train_loss": None}
            assert got == pytest.approx(want, rel=1e-5, abs=1e-7), (k, got, want)


# 4 prompts, one group of 4 per optimizer step, a generation every 2: an epoch is 4 optimizer steps, 12 steps are 3
# epochs; 5 and 9 resume inside epochs 2 and 3 (in the middle of a generation batch), 8 at the start of epoch 3. Seed 0:
# its three epochs pair the 4 prompts differently ({0,1}{2,3}, {0,2}{1,3}, {2,3}{0,1}), so a wrong epoch shows
EPOCHS_RUN, EPOCHS_RESUMED = (4, 1, 2, 1, 12), [5, 8, 9]


def test_resume_in_a_later_epoch_draws_that_epochs_prompts(tiny_model_dir, tmp_path):
    record = resume_runs(tiny_model_dir, str(tmp_path), EPOCHS_RUN, EPOCHS_RESUMED, prompts=4, seed=0)
    _check_later_epochs(record, EPOCHS_RESUMED, 3)


def test_resume_in_a_later_epoch_with_dynamic_sampling(tiny_model_dir, tmp_path):
    # 6 prompts of which every third can be solved: top-up rounds; an epoch is 6 optimizer steps, 14 steps reach epoch 3
    overrides = {"dynamic_sampling": True, "max_completion_length": 6, "seed": 0}
    record = resume_runs(tiny_model_dir, str(tmp_path), (4, 1, 2, 1, 14), [9, 13], prompts=6, **overrides)
    assert max(record["ds_rounds"]) > 1
    _check_later_epochs(record, [9, 13], 2)


def test_trls_sampler_redraws_the_first_epoch_after_a_resume(tiny_model_dir, tmp_path, monkeypatch):
    # What `pacs.grpo.sampler` buys: with TRL's sampler, a run resumed in epoch 2 draws epoch 0's order again and ends
    # elsewhere. This also shows that the epoch tests above can fail.
    from trl.trainer.utils import RepeatSampler

    from pacs.grpo.sampler import EpochRepeatSampler

    monkeypatch.setattr(EpochRepeatSampler, "__iter__", RepeatSampler.__iter__)  # TRL's: one generator, drawn on
    record = resume_runs(tiny_model_dir, str(tmp_path), (4, 1, 2, 1, 8), [5], prompts=4, seed=0)
    run = record["resumed"][5]
    assert run["prompts_at"][6] != record["prompts_at"][6]
    assert run["prompts_at"][6] == record["prompts_at"][2]  # epoch 0's second generation, again
    assert run["relative_difference"] > 1e-3


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def test_interrupted_save_is_skipped_and_the_run_finishes(tiny_model_dir, tmp_path, caplog):
    out = tmp_path / "out"
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(32)]})

    def trainer(max_steps, **kwargs):
        args = tiny_pacs_config(out, max_steps=max_steps, save_strategy="steps", save_steps=1, **kwargs)
        return PACSTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset)

    trainer(2, steps_per_generation=4).train()
    assert (out / "checkpoint-2" / COMPLETE_MARKER).exists() and (out / "checkpoint-2" / ROLLOUT_DIR).is_dir()
    # a save of step 3 killed half-way through the weights: no trainer_state.json, no marker
    shutil.copytree(out / "checkpoint-2", out / "checkpoint-3")
    for name in (COMPLETE_MARKER, "trainer_state.json"):
        (out / "checkpoint-3" / name).unlink()
    weights = out / "checkpoint-3" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    resumed = trainer(4, steps_per_generation=4)
    trained = []
    training_step = resumed.training_step
    resumed.training_step = lambda *a, **k: trained.append(resumed.state.global_step) or training_step(*a, **k)
    with caplog.at_level(logging.WARNING, logger="pacs.grpo.checkpoints"):
        resumed.train(resume_from_checkpoint=True)
    assert "Not resuming from" in caplog.text and "checkpoint-3" in caplog.text
    assert trained == [2, 3]  # continued from checkpoint-2: optimizer steps 3 and 4
    assert [e["step"] for e in resumed.state.log_history if "pacs/loss" in e] == [1, 2, 3, 4]
    # the interrupted folder was written anew by the resumed run, complete this time
    assert (out / "checkpoint-3" / COMPLETE_MARKER).exists() and (out / "checkpoint-3" / "trainer_state.json").exists()
    assert last_complete_checkpoint(out)[0] == str(out / "checkpoint-4")
    with pytest.raises(ValueError, match="its save did not finish"):
        (out / "checkpoint-4" / COMPLETE_MARKER).unlink()
        trainer(5).train(resume_from_checkpoint=str(out / "checkpoint-4"))


def _files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_resuming_a_finished_run_trains_nothing_and_keeps_the_final_model(tiny_model_dir, tmp_path, caplog):
    out = tmp_path / "out"
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(32)]})

    def trainer(max_steps):
        args = tiny_pacs_config(out, max_steps=max_steps, save_strategy="steps", save_steps=2)
        return PACSTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset)

    first = trainer(4)
    first.train()
    first.save_model()
    before = _files(out)
    marker = json.loads((out / "checkpoint-4" / COMPLETE_MARKER).read_text())
    assert marker["files"]["optimizer.pt"] == (out / "checkpoint-4" / "optimizer.pt").stat().st_size > 0
    assert "trainer_state.json" in marker["files"]
    mid_generation = json.loads((out / "checkpoint-2" / COMPLETE_MARKER).read_text())
    assert mid_generation["rollout"] and ROLLOUT_DIR + "/rank0.pt" in mid_generation["files"]

    # 1. PACSTrainer.train itself, then the script's save_model: nothing trained, nothing written
    resumed = trainer(4)
    with caplog.at_level(logging.WARNING, logger="pacs.grpo.resume"):
        output = resumed.train(resume_from_checkpoint=True)
    assert "The run is finished" in caplog.text and "checkpoint-4 is at step 4, and max_steps is 4" in caplog.text
    assert output.global_step == 4 and resumed.state.global_step == 4
    resumed.save_model()
    resumed.save_model(str(tmp_path / "elsewhere"))  # the final weights, which `train` loaded
    assert (tmp_path / "elsewhere" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    # 2. the command line's setting, and the script's save_model after it
    again = trainer(4)
    again.train(resume_from_checkpoint="true")
    again.save_model()
    assert again._resume.finished and _files(out) == before  # the final model byte-identical, no checkpoint-5
    # 3. a larger max_steps extends the run
    longer = trainer(6)
    longer.train(resume_from_checkpoint=True)
    assert not longer._resume.finished and longer.state.global_step == 6
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    # 4. a checkpoint whose optimizer.pt was cut short: auto resume takes the previous one, naming the file
    optimizer = out / "checkpoint-6" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pacs.grpo.checkpoints"):
        assert resolve_resume_checkpoint(True, str(out)) == str(out / "checkpoint-4")
    assert "Not resuming from" in caplog.text and "optimizer.pt has 100 bytes" in caplog.text
    with pytest.raises(
        ValueError, match=r"optimizer\.pt has 100 bytes.*newest complete checkpoint there is .*checkpoint-4"
    ):
        trainer(6).train(resume_from_checkpoint=str(out / "checkpoint-6"))
    assert optimizer.exists()  # nothing deleted


@pytest.mark.parametrize("lora", [False, True])
def test_a_finished_resume_holds_the_final_model(tiny_model_dir, tmp_path, lora):
    # `trainer.train(resume_from_checkpoint=True)` at max_steps trains nothing, and what the script does next
    # (evaluate, save, inspect trainer.model) sees the final model, not the initial one
    from peft import LoraConfig

    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(16)]})

    def trainer():
        args = tiny_pacs_config(tmp_path / "out", max_steps=2, save_strategy="steps", save_steps=2)
        peft = (
            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM") if lora else None
        )
        return PACSTrainer(
            model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset, peft_config=peft
        )

    def weights(t):
        return {n: p.detach().clone() for n, p in t.model.named_parameters() if not lora or "lora_" in n}

    first = trainer()
    initial = weights(first)
    first.train()
    final = weights(first)
    assert any(not torch.equal(initial[n], final[n]) for n in final)  # the run moved the weights
    resumed = trainer()
    assert all(torch.equal(initial[n], w) for n, w in weights(resumed).items())
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 2
    after = weights(resumed)
    assert after.keys() == final.keys() and all(torch.equal(final[n], after[n]) for n in final)


def test_the_grpo_baseline_does_not_train_past_a_finished_run(tiny_model_dir, tmp_path, caplog):
    from trl import GRPOConfig, GRPOTrainer

    out = tmp_path / "out"
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(32)]})
    pacs_args = tiny_pacs_config(out, max_steps=2, save_strategy="steps", save_steps=2)
    settings = {k: getattr(pacs_args, k) for k in ("output_dir", "use_cpu", "bf16", "per_device_train_batch_size",
                                                   "num_generations", "max_completion_length", "max_steps",
                                                   "learning_rate", "save_strategy", "save_steps", "report_to")}  # fmt: skip

    def trainer():
        return GRPOTrainer(
            model=tiny_model_dir, reward_funcs=parity_reward, args=GRPOConfig(**settings), train_dataset=dataset
        )

    def train_unless_finished(t, setting) -> bool:
        # any Trainer (TRL's own GRPOTrainer here) reads the one resume decision as HardenedGRPOTrainer does
        resume = resume_decision(setting, t.args, run_identity(tiny_model_dir, 1, t.args))
        if not resume.finished:
            t.train(resume_from_checkpoint=resume.checkpoint)
        return not resume.finished

    first = trainer()
    assert train_unless_finished(first, None) is True
    first.save_model()
    before = _files(out)
    with caplog.at_level(logging.WARNING, logger="pacs.grpo.resume"):
        assert train_unless_finished(trainer(), True) is False
    assert "The run is finished" in caplog.text
    assert _files(out) == before


def test_pacs_train_on_a_finished_grpo_baseline_run_changes_nothing(tiny_model_dir, tmp_path, caplog):
    # `pacs train --algorithm grpo`, in this process: resumed at max_steps it neither trains nor saves
    import warnings

    from pacs import train

    out = tmp_path / "run"
    argv = ["--config", "tiny_cpu", "--algorithm", "grpo", "--model_name_or_path", tiny_model_dir]
    argv += ["--output_dir", str(out), "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "2"]
    argv += ["--eval_strategy", "no", "--report_to", "none"]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        args = train.parse_args(argv)
    assert not [w for w in record if "gradient_checkpointing" in str(w.message)]  # our recipe key warns no more
    with caplog.at_level(logging.DEBUG, logger="pacs.grpo.resume"):
        train.main(*args)
    before = _files(out)
    assert "model.safetensors" in before and "checkpoint-2/trainer_state.json" in before
    assert _decisions(caplog) == ["a fresh start: no resume asked for"]  # one decision in this process's run
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="pacs.grpo.resume"):
        train.main(*train.parse_args([*argv, "--resume_from_checkpoint", "true"]))
    (decision,) = _decisions(caplog)  # decided once, before the model loaded; the trainer read it
    assert decision.startswith("The run is finished")
    assert _files(out) == before


def _decisions(caplog) -> list[str]:
    prefix = "Resume decision: "
    return [r.getMessage()[len(prefix) : -1] for r in caplog.records if r.getMessage().startswith(prefix)]


def test_grpo_baseline_checkpoints_carry_the_marker_and_the_rollout(tiny_model_dir, tmp_path):
    # docs/recipes.md: `pacs train --algorithm grpo` checkpoints as PACS does; step 1 of 2 per generation is mid-batch
    from pacs import train

    out = tmp_path / "run"
    argv = ["--config", "tiny_cpu", "--algorithm", "grpo", "--model_name_or_path", tiny_model_dir]
    argv += ["--output_dir", str(out), "--max_steps", "1", "--save_strategy", "steps", "--save_steps", "1"]
    train.main(*train.parse_args([*argv, "--eval_strategy", "no", "--report_to", "none"]))
    assert (out / "checkpoint-1" / COMPLETE_MARKER).is_file() and (out / "checkpoint-1" / ROLLOUT_DIR).is_dir()


def test_rotation_keeps_the_newest_complete_checkpoint(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(32)]})
    args = tiny_pacs_config(out, max_steps=3, save_strategy="steps", save_steps=1, save_total_limit=1)
    PACSTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset).train()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"]
    assert (out / "checkpoint-3" / COMPLETE_MARKER).exists()
    marker = json.loads((out / "checkpoint-3" / COMPLETE_MARKER).read_text())
    assert marker["global_step"] == 3 and marker["world_size"] == 1 and marker["rollout"] is True


def test_rollout_is_compact(tiny_model_dir, tmp_path):
    # token ids, masks, log-probs and labels only: no logits (vocabulary-sized) tensors
    out = tmp_path / "out"
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(32)]})
    args = tiny_pacs_config(out, max_steps=1, save_strategy="steps", save_steps=1, steps_per_generation=4)
    trainer = PACSTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset)
    trainer.train()
    saved = torch.load(out / "checkpoint-1" / ROLLOUT_DIR / "rank0.pt", weights_only=True)
    assert saved["step"] == 1 and saved["world_size"] == 1 and len(saved["buffered_inputs"]) == 4
    vocab = trainer.model.config.vocab_size
    for batch in saved["buffered_inputs"]:
        assert {"prompt_ids", "completion_ids", "completion_mask", "pacs_labels"} <= set(batch)
        assert all(v.size(-1) != vocab for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 1)


# ---------------------------------------------------------------------------------------------------------------------
# Several processes, DeepSpeed ZeRO-3
# ---------------------------------------------------------------------------------------------------------------------


def _launch_resume(tmp_path, launcher, model_dir, *numbers):
    out = tmp_path / "out"
    out.mkdir(parents=True)
    cmd = [*launcher, str(RESUME_SCRIPT), model_dir, str(out), *map(str, numbers)]
    run_launched(cmd, tmp_path)
    return [json.loads(p.read_text()) for p in sorted(out.glob("resume*.json"))]


@pytest.mark.distributed
def test_resume_on_two_processes_with_rows_exchanged(tiny_model_dir, tmp_path):
    # 2 processes x 1 row x 2 accumulation steps = one group of 4 per optimizer step, 2 optimizer steps per generation:
    # the rows are exchanged between processes after each generation; each process saves and restores its own share
    launcher = [*accelerate_launch(), "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    records = _launch_resume(tmp_path, launcher, tiny_model_dir, 1, 2, 4, 1, 4, 1, 2)
    assert [r["rank"] for r in records] == [0, 1]
    for record in records:
        _check_resumed(record, 2, 4)
    assert os.path.isfile(tmp_path / "out" / "full" / "checkpoint-1" / ROLLOUT_DIR / "rank1.pt")


@pytest.mark.distributed
def test_resume_under_deepspeed_zero3(tiny_model_dir, tmp_path):
    (tmp_path / "zero3_cpu.yaml").write_text(ZERO3_CPU_ACCELERATE_CONFIG)
    launcher = [*accelerate_launch(), "--config_file", str(tmp_path / "zero3_cpu.yaml")]
    (record,) = _launch_resume(tmp_path, launcher, tiny_model_dir, 4, 1, 4, 1, 3, 1)
    _check_resumed(record, 1, 4)


@pytest.mark.distributed
@pytest.mark.parametrize("dynamic_sampling", [False, True], ids=["plain", "dynamic_sampling"])
def test_resume_in_later_epochs_on_two_processes(tiny_model_dir, tmp_path, dynamic_sampling):
    # 2 processes x 2 rows x 2 accumulation steps, a generation every 2 optimizer steps (4 prompts, groups spanning the
    # processes); 8 prompts: an epoch is 4 optimizer steps. 5 and 9 resume in the middle of a generation batch inside
    # epochs 2 and 3: transformers' `set_epoch` does not reach the sampler there (accelerate's skip wrapper over its
    # shard wrapper), the layer's `_init_training_state` does
    launcher = [*accelerate_launch(), "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    extra = ["--prompts", 8, *(["--dynamic-sampling"] if dynamic_sampling else [])]
    records = _launch_resume(tmp_path, launcher, tiny_model_dir, 2, 2, 4, 1, 12, 5, 9, *extra)
    assert [r["rank"] for r in records] == [0, 1]
    for record in records:
        _check_later_epochs(record, [5, 9], 3)
    if dynamic_sampling:
        assert max(records[0]["ds_rounds"]) > 1
