"""`pacs.grpo.dynamic_sampling` and the layer's `dynamic_sampling`: generation batches of groups whose rewards differ.

- The pure pieces: the uniform test (equality over the whole group), the choice of groups (trim, fallback), the top-up
  stream (deterministic, no prompt twice in a batch, its state), the assembly over two simulated processes.
- The settings it cannot serve are refused before the model loads.
- Off: no dynamic-sampling key is logged. On, with a reward that never makes a uniform group: the same run as off
  (weights and every key of the off run's log), for `HardenedGRPOTrainer` and `PACSTrainer` (whole and split path).
- On, with uniform groups: every group that reaches the loss differs, except the logged fallback groups; top-ups are
  deterministic; a resume inside a generation batch and one between two are exact.
"""

import pytest
import torch
from datasets import Dataset, IterableDataset
from trl import GRPOTrainer

from pacs import PACSTrainer
from pacs.grpo import HardenedGRPOConfig, HardenedGRPOTrainer
from pacs.grpo.dynamic_sampling import STATE_FILE as DYNAMIC_SAMPLING_STATE
from pacs.grpo.dynamic_sampling import TopUpStream, assemble_rows, select_groups, uniform_signal
from tests.recording import RecordingGRPO, RecordingPACS
from tests.simulated_processes import two_processes
from tests.tiny_config import tiny_pacs_config


GRPO_KEYS = (
    "output_dir", "use_cpu", "bf16", "per_device_train_batch_size", "gradient_accumulation_steps",
    "steps_per_generation", "num_generations", "max_completion_length", "max_steps", "learning_rate", "optim",
    "lr_scheduler_type", "seed", "save_strategy", "save_steps", "report_to", "logging_steps", "dynamic_sampling",
    "dynamic_sampling_max_rounds", "dynamic_sampling_metric",
)  # fmt: skip
TIMING = ("runtime", "per_second", "step_time")


def grpo_config(output_dir, **overrides) -> HardenedGRPOConfig:
    pacs_args = tiny_pacs_config(output_dir, **overrides)
    return HardenedGRPOConfig(**{k: getattr(pacs_args, k) for k in GRPO_KEYS})


def alternating_reward(completions, **kwargs):
    """Never a uniform group: completions 0, 2, ... of every group get 0, 1, 3, ... get 1 (groups of an even G start
    at an even row of the process's slice)."""
    return [float(i % 2) for i in range(len(completions))]


def hard_reward(prompts, completions, **kwargs):
    """Only prompts marked "mixed" can be solved (by odd-length completions); the rest are all wrong: uniform."""
    return [float("mixed" in p and len(c) % 2 == 1) for p, c in zip(prompts, completions, strict=True)]


def hard_prompts(n=48) -> Dataset:
    return Dataset.from_dict({"prompt": [f"Q{i} {'mixed' if i % 3 == 0 else 'hard'}: {i} + {i}?" for i in range(n)]})


def prompts(n=32) -> Dataset:
    return Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(n)]})


# ---------------------------------------------------------------------------------------------------------------------
# The pure pieces
# ---------------------------------------------------------------------------------------------------------------------


def test_a_group_is_uniform_only_when_every_scored_completion_agrees():
    ok = torch.ones(12, dtype=torch.bool)
    values = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1, 0.5, 0.5, 0.5, 0.25])
    # the lone winner of [1, 0, 0, 0] differs (a leave-one-out test would drop it); 0.25 among 0.5s differs
    assert uniform_signal(values, ok, 4).tolist() == [False, True, False]
    # unscored rows are left out: [1, ?, 1, 1] is uniform, [?, ?, ?, 0] has one scored row: uniform
    valid = torch.tensor([True, False, True, True, False, False, False, True, True, True, True, True])
    values = torch.tensor([1.0, 0, 1, 1, 1, 0, 1, 0, 0, 0, 0, 1])
    assert uniform_signal(values, valid, 4).tolist() == [True, True, False]
    with pytest.raises(ValueError, match="num_generations=5"):
        uniform_signal(values, valid, 5)


def test_groups_are_chosen_in_generation_order_then_trimmed_or_filled():
    rounds = [torch.tensor([False, True, False, True]), torch.tensor([True, True, False, True])]
    assert select_groups(rounds, 3) == ([(0, 1), (0, 3), (1, 0)], 0)  # the last round's surplus is trimmed
    assert select_groups(rounds, 4) == ([(0, 1), (0, 3), (1, 0), (1, 1)], 0)
    # too few mixed groups: uniform ones fill the batch, in generation order, and are counted
    assert select_groups(rounds[:1], 4) == ([(0, 1), (0, 3), (0, 0), (0, 2)], 2)


def test_the_top_up_stream_is_deterministic_and_never_repeats_a_prompt_in_a_batch():
    keys = [f"p{i % 10}" for i in range(20)]  # 10 distinct prompts, each twice in the data
    stream = TopUpStream(seed=7)
    used = {"p0", "p1"}
    drawn = stream.draw(20, 5, keys.__getitem__, used)
    assert len({keys[i] for i in drawn}) == 5 and not {keys[i] for i in drawn} & {"p0", "p1"}
    assert used == {"p0", "p1", *(keys[i] for i in drawn)}
    again = TopUpStream(seed=7)
    assert again.draw(20, 5, keys.__getitem__, {"p0", "p1"}) == drawn
    assert TopUpStream(seed=8).draw(20, 5, keys.__getitem__, {"p0", "p1"}) != drawn
    # its state resumes the same draws
    state = stream.state_dict()
    following = stream.draw(20, 3, keys.__getitem__, set())
    resumed = TopUpStream(seed=7)
    resumed.load_state_dict(state)
    assert resumed.draw(20, 3, keys.__getitem__, set()) == following
    # not enough fresh prompts in the data: None, the stream unchanged
    before = stream.state_dict()
    assert stream.draw(20, 4, keys.__getitem__, {f"p{i}" for i in range(7)}) is None
    assert stream.state_dict() == before
    # the stream wraps into a new epoch (a new permutation) when it runs out
    stream = TopUpStream(seed=1)
    assert stream.draw(4, 3, lambda i: i, set()) is not None and stream.epoch == 0
    assert stream.draw(4, 3, lambda i: i, set()) is not None and stream.epoch == 1 and stream.position == 2


def test_assembly_over_two_processes_keeps_groups_whole_and_contiguous():
    G, n = 2, 4  # 2 processes x 4 rows: 4 groups per round; rows are labelled round*100 + global row
    widths = {0: [3, 5], 1: [4, 2]}  # completion width per (round, process): padded to the widest, 5

    def round_batch(r, p):
        rows = torch.arange(p * n, p * n + n) + 100 * r
        width = widths[r][p]
        return {
            "label": rows,  # (n,)
            "prompt_ids": rows[:, None].repeat(1, 2 + r),  # (n, P): left-padded
            "completion_ids": rows[:, None].repeat(1, width),  # (n, C): right-padded
            "flag": rows % 2 == 0,  # bool
        }

    picks = [(1, 3), (0, 0), (1, 1), (0, 2)]  # (round, group), in the assembled order

    def run(p, gather):
        return assemble_rows([round_batch(0, p), round_batch(1, p)], picks, G, p, gather, {"completion_ids": -1})

    out = two_processes(run)
    labels = torch.cat([out[0]["label"], out[1]["label"]]).tolist()
    assert labels == [106, 107, 0, 1, 102, 103, 4, 5]  # group g of round r: rows 2g, 2g+1
    for p in (0, 1):
        assert out[p]["completion_ids"].shape == (4, 5) and out[p]["prompt_ids"].shape == (4, 3)
        assert out[p]["flag"].dtype == torch.bool and out[p]["flag"].tolist() == [x % 2 == 0 for x in out[p]["label"]]
    # row 0 of round 1 (global 106 lives on process 1, width 2): right-padded with -1; round 0's prompts left-padded
    assert out[0]["completion_ids"][0].tolist() == [106, 106, -1, -1, -1]
    assert out[0]["prompt_ids"][2].tolist() == [0, 0, 0]  # round 0, 2 wide: one 0 of padding on the left
    assert out[1]["prompt_ids"][0].tolist() == [102, 102, 102]


# ---------------------------------------------------------------------------------------------------------------------
# Settings it cannot serve, before the model loads
# ---------------------------------------------------------------------------------------------------------------------


def test_settings_it_cannot_serve_are_refused_before_the_model_loads(tiny_model_dir, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match='scale_rewards="batch"'):
        grpo_config(tmp_path, dynamic_sampling=True, scale_rewards="batch")
    with pytest.raises(ValueError, match="multi_objective_aggregation"):
        grpo_config(tmp_path, dynamic_sampling=True, multi_objective_aggregation="normalize_then_sum")
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="dynamic_sampling_max_rounds must be an integer >= 1"):
            grpo_config(tmp_path, dynamic_sampling=True, dynamic_sampling_max_rounds=bad)
    grpo_config(tmp_path, scale_rewards="batch")  # off: whatever it is

    def load(*args, **kwargs):
        raise AssertionError("GRPOTrainer.__init__ ran: the model loads before the checks")

    monkeypatch.setattr(GRPOTrainer, "__init__", load)
    args = grpo_config(tmp_path, dynamic_sampling=True)
    stream = IterableDataset.from_generator(lambda: iter([{"prompt": "1+1?"}]))
    with pytest.raises(ValueError, match="must be a map-style dataset"):
        HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=hard_reward, args=args, train_dataset=stream)
    args = grpo_config(tmp_path, dynamic_sampling=True, dynamic_sampling_metric="accuracy")
    with pytest.raises(ValueError, match=r"reward functions are \['hard_reward'\]"):
        HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=hard_reward, args=args, train_dataset=prompts())
    args = grpo_config(tmp_path, dynamic_sampling=True, dynamic_sampling_metric="hard_reward")
    with pytest.raises(AssertionError, match="the model loads"):  # a reward function's name is valid
        HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=hard_reward, args=args, train_dataset=prompts())


# ---------------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------------


def _train(cls, tiny_model_dir, args, reward=hard_reward, data=None, resume=None):
    trainer = cls(model=tiny_model_dir, reward_funcs=reward, args=args, train_dataset=data or hard_prompts())
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _logged(trainer, prefix="pacs/ds/") -> list[dict]:
    return [{k: v for k, v in e.items() if k.startswith(prefix)} for e in trainer.state.log_history if "loss" in e]


def _same_run(a, b, extra_keys_in_b=()):
    for x, y in zip(a.state.log_history, b.state.log_history, strict=True):
        keys = {k for k in x if not any(t in k for t in TIMING)}
        assert {k: x[k] for k in keys} == {k: y[k] for k in keys}
        assert set(y) - set(x) <= set(extra_keys_in_b) | {k for k in y if k.startswith("pacs/ds/")}
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(p, q), name


@pytest.mark.parametrize(
    "trainer_cls, config, settings",
    [
        (HardenedGRPOTrainer, grpo_config, {}),
        (PACSTrainer, tiny_pacs_config, {}),
        (PACSTrainer, tiny_pacs_config, {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2}),
    ],
    ids=["grpo", "pacs-whole", "pacs-split"],
)
def test_on_without_a_uniform_group_is_the_run_off(tiny_model_dir, tmp_path, trainer_cls, config, settings):
    common = dict(max_steps=4, steps_per_generation=4 if settings else 2, **settings)
    off = _train(trainer_cls, tiny_model_dir, config(tmp_path / "off", **common), alternating_reward, prompts())
    on = _train(
        trainer_cls, tiny_model_dir, config(tmp_path / "on", dynamic_sampling=True, **common), alternating_reward,
        prompts(),
    )  # fmt: skip
    assert not [k for e in off.state.log_history for k in e if k.startswith("pacs/ds/")]  # off logs none
    _same_run(off, on)
    ds = [e for e in _logged(on) if e]
    assert ds and all(e["pacs/ds/rounds"] == 1 and e["pacs/ds/fallback_groups"] == 0 for e in ds)


def _uniform_groups_in(batch, G, tokenizer) -> int:
    # the reward recomputed from the batch's own tokens (hard_reward), group by group
    prompts = tokenizer.batch_decode(batch["prompt_ids"], skip_special_tokens=True)
    texts = [
        tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
        for ids, mask in zip(batch["completion_ids"], batch["completion_mask"], strict=True)
    ]
    rewards = torch.tensor(hard_reward(prompts, texts))
    return int(uniform_signal(rewards, torch.ones_like(rewards, dtype=torch.bool), G).sum())


@pytest.mark.parametrize("trainer_cls, config", [(RecordingGRPO, grpo_config), (RecordingPACS, tiny_pacs_config)])
def test_only_groups_that_differ_reach_the_loss_except_the_fallback(tiny_model_dir, tmp_path, trainer_cls, config):
    settings = dict(dynamic_sampling=True, max_steps=6, steps_per_generation=2, max_completion_length=6)
    args = config(tmp_path / "a", **settings)
    trainer = _train(trainer_cls, tiny_model_dir, args)
    G = args.num_generations
    logged = [e for e in _logged(trainer) if e]
    assert len(trainer.batches) == len(logged) == 3
    assert any(e["pacs/ds/rounds"] > 1 for e in logged)  # the hard prompts made top-ups necessary
    for batch, entry in zip(trainer.batches, logged, strict=True):
        uniform = _uniform_groups_in(batch, G, trainer.processing_class)
        assert uniform == entry["pacs/ds/fallback_groups"]
        assert entry["pacs/ds/groups_generated"] == entry["pacs/ds/rounds"] * 2  # 2 groups per generation batch
        if "pacs_labels" in batch:  # PACS: the labels the loss sees differ within each group
            labels = batch["pacs_labels"].view(-1, G)
            assert int((labels.amax(1) == labels.amin(1)).sum()) == uniform
            assert batch["pacs_index"].tolist() == list(range(batch["pacs_index"].numel()))
    totals = [e["pacs/ds/generated_completions"] for e in logged]
    assert totals == [sum(e["pacs/ds/groups_generated"] for e in logged[: i + 1]) * G for i in range(3)]
    # deterministic: the same run again draws the same top-ups
    again = _train(trainer_cls, tiny_model_dir, config(tmp_path / "b", **settings))
    for x, y in zip(trainer.batches, again.batches, strict=True):
        assert torch.equal(x["prompt_ids"], y["prompt_ids"]) and torch.equal(x["completion_ids"], y["completion_ids"])


def test_rounds_running_out_fill_the_batch_with_uniform_groups_and_warn(tiny_model_dir, tmp_path, caplog):
    def never(completions, **kwargs):
        return [0.0] * len(completions)

    args = grpo_config(
        tmp_path, dynamic_sampling=True, dynamic_sampling_max_rounds=3, max_steps=2, steps_per_generation=1
    )
    with caplog.at_level("WARNING", logger="pacs.grpo.trainer"):
        trainer = _train(RecordingGRPO, tiny_model_dir, args, never)
    logged = [e for e in _logged(trainer) if e]
    assert [e["pacs/ds/rounds"] for e in logged] == [3, 3]
    assert [e["pacs/ds/fallback_groups"] for e in logged] == [1, 1]  # 1 group of 4 per generation batch
    assert [e["pacs/ds/generated_per_trained"] for e in logged] == [3, 3]
    assert "Raise dynamic_sampling_max_rounds" in caplog.text


@pytest.mark.parametrize("checkpoint", [1, 2], ids=["mid-generation", "between-generations"])
@pytest.mark.parametrize("trainer_cls, config", [(HardenedGRPOTrainer, grpo_config), (PACSTrainer, tiny_pacs_config)])
def test_resume_with_dynamic_sampling_is_exact(tiny_model_dir, tmp_path, trainer_cls, config, checkpoint):
    settings = dict(
        dynamic_sampling=True, max_steps=4, steps_per_generation=2, optim="sgd", learning_rate=0.1, seed=3,
        save_strategy="steps", save_steps=1, max_completion_length=6,
    )  # fmt: skip
    full = _train(trainer_cls, tiny_model_dir, config(tmp_path / "full", **settings))
    assert (tmp_path / "full" / f"checkpoint-{checkpoint}" / DYNAMIC_SAMPLING_STATE).is_file()
    assert any(e.get("pacs/ds/rounds", 1) > 1 for e in full.state.log_history)  # top-ups happened
    args = config(tmp_path / "full", **settings)
    resumed = _train(trainer_cls, tiny_model_dir, args, resume=str(tmp_path / "full" / f"checkpoint-{checkpoint}"))
    after = [e for e in full.state.log_history if e.get("step", 0) > checkpoint]
    for x, y in zip(after, [e for e in resumed.state.log_history if e.get("step", 0) > checkpoint], strict=True):
        # the closing summary's train_loss averages the steps this session trained: not the same steps
        keys = {k for k in x if not any(t in k for t in TIMING) and k != "train_loss"}
        assert {k: x[k] for k in keys} == {k: y[k] for k in keys}
    for (name, p), q in zip(full.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q), name


class Counting(HardenedGRPOTrainer):
    """Counts the layer's extension points per training generation batch."""

    def _before_generation(self, mode):
        super()._before_generation(mode)
        if mode == "train":
            self.counts = getattr(self, "counts", [])
            self.counts.append(
                {"_before_generation": 1, "_after_rewards": 0, "_after_scoring": 0, "_after_monitors": 0}
            )

    def _after_rewards(self, rewards_per_func, scorable, mode):
        if mode == "train":
            self.counts[-1]["_after_rewards"] += 1
        return super()._after_rewards(rewards_per_func, scorable, mode)

    def _after_scoring(self, output, mode):
        if mode == "train":
            self.counts[-1]["_after_scoring"] += 1
        return super()._after_scoring(output, mode)

    def _after_monitors(self, output, mode):
        if mode == "train":
            self.counts[-1]["_after_monitors"] += 1
        return super()._after_monitors(output, mode)


def test_points_run_once_per_generation_batch_and_the_rewards_point_once_per_round(tiny_model_dir, tmp_path):
    args = grpo_config(tmp_path, dynamic_sampling=True, max_steps=3, steps_per_generation=1, max_completion_length=6)
    trainer = _train(Counting, tiny_model_dir, args)
    rounds = [e["pacs/ds/rounds"] for e in _logged(trainer) if e]
    assert len(trainer.counts) == len(rounds) == 3 and max(rounds) > 1
    for counts, r in zip(trainer.counts, rounds, strict=True):
        assert counts == {"_before_generation": 1, "_after_rewards": r, "_after_scoring": 1, "_after_monitors": 1}


@pytest.mark.distributed
def test_resume_with_dynamic_sampling_on_two_processes_is_exact(tiny_model_dir, tmp_path):
    # 2 processes x 2 rows, G 4: each group spans both processes (the split path), 2 optimizer steps per generation;
    # top-up rounds are drawn, gathered and re-sliced over the processes; checkpoints 1 and 3 fall inside a generation
    import json
    from pathlib import Path

    from tests.launching import accelerate_launch, run_launched

    script = Path(__file__).parent / "scripts" / "train_resume.py"
    out = tmp_path / "out"
    out.mkdir()
    launcher = [*accelerate_launch(), "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]  # a free port
    cmd = [*launcher, str(script), tiny_model_dir, str(out)]
    run_launched([*cmd, "2", "2", "4", "1", "4", "1", "2", "3", "--dynamic-sampling"], tmp_path)
    records = [json.loads(p.read_text()) for p in sorted(out.glob("resume*.json"))]
    assert [r["rank"] for r in records] == [0, 1]
    for record in records:
        assert max(record["ds_rounds"]) > 1  # top-ups happened
        assert record["update_norm"] > 0
        for k, run in record["resumed"].items():
            assert run["rollout_saved"] == (int(k) % 2 == 1), k
            assert run["relative_difference"] <= 1e-6, (k, run["relative_difference"])
            assert run["generated_at"] == [s for s in record["generated_at"] if s >= int(k)], k


@pytest.mark.parametrize("algorithm, config", [("pacs", "PACSConfig"), ("grpo", "HardenedGRPOConfig")])
def test_pacs_train_takes_it_as_a_flag_and_refuses_a_bad_setting_in_one_line(algorithm, config, capsys):
    from pacs.cli import main as cli_main
    from pacs.train import parse_args

    flags = ["--dynamic_sampling", "true", "--dynamic_sampling_max_rounds", "4", "--model_name_or_path", "m"]
    _, args, _ = parse_args(["--config", "tiny_cpu", "--algorithm", algorithm, *flags])
    assert type(args).__name__ == config
    assert (args.dynamic_sampling, args.dynamic_sampling_max_rounds, args.dynamic_sampling_metric) == (
        True,
        4,
        "reward",
    )
    capsys.readouterr()
    argv = ["train", "--config", "tiny_cpu", "--algorithm", algorithm, "--dynamic_sampling", "true"]
    assert cli_main([*argv, "--scale_rewards", "batch"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pacs train: error: dynamic_sampling needs advantages") and "\n" not in err
