"""Tests of `pacs.trainer.PACSTrainer` on the tiny offline model: groups stay whole, labels travel with their rows,
the model learns, LoRA, evaluation, KL, two CPU processes and DeepSpeed ZeRO-3."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from pacs import PACSTrainer
from pacs.trainer import shuffle_groups
from tests.launching import ZERO3_CPU_ACCELERATE_CONFIG, accelerate_launch, run_launched
from tests.tiny_config import tiny_pacs_config


SCRIPT = Path(__file__).parent / "scripts" / "train_tiny.py"
PACS_METRICS = (
    "pacs/loss",
    "pacs/psi_mean",
    "pacs/psi_std",
    "pacs/critic_brier",
    "pacs/label_mean",
    "pacs/frac_mixed_groups",
    "pacs/critic_margin",
    "pacs/critic_close_frac",
    "pacs/proxy_abs_mean",
)


def parity_reward(completions, **kwargs):
    """1.0 for a completion with an odd number of characters: random enough to mix labels within groups."""
    return [float(len(c) % 2) for c in completions]


def prompts(n=32):
    return Dataset.from_dict({"prompt": [f"What is {i} + {3 * i}?" for i in range(n)]})


def config(tmp_path, **kwargs):
    return tiny_pacs_config(tmp_path / "out", **kwargs)


class Recorder:
    """Wraps `_compute_loss` to keep what every micro-batch looked like."""

    def __init__(self, trainer):
        self.batches = []
        self._compute_loss = trainer._compute_loss
        trainer._compute_loss = self

    def __call__(self, model, inputs):
        self.batches.append({k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return self._compute_loss(model, inputs)


def assert_whole_groups(prompt_ids: torch.Tensor, G: int):
    grouped = prompt_ids.view(-1, G, prompt_ids.size(-1))
    assert (grouped == grouped[:, :1]).all(), "a micro-batch holds a split group"
    assert len({tuple(g[0].tolist()) for g in grouped}) == grouped.size(0), "two groups of the same prompt"


def test_shuffle_groups_keeps_groups_and_permutes():
    torch.manual_seed(0)
    data = {"x": torch.arange(12), "y": [f"r{i}" for i in range(12)], "n": torch.tensor(3), "z": None}
    orders = set()
    for _ in range(10):
        out = shuffle_groups(data, 3)
        assert out["n"].item() == 3 and out["z"] is None
        assert out["y"] == [f"r{i}" for i in out["x"].tolist()]
        groups = out["x"].view(-1, 3)
        assert ((groups - groups[:, :1]) == torch.arange(3)).all() and (groups[:, 0] % 3 == 0).all()
        orders.add(tuple(groups[:, 0].tolist()))
    assert len(orders) > 1
    with pytest.raises(ValueError, match="whole groups"):
        shuffle_groups({"x": torch.arange(5)}, 2)


def test_critic_metrics_on_hand_made_values():
    from pacs.trainer import critic_metrics

    # two groups of 2; the last completion does not count (weight 0) and would change every metric if it did
    psi = torch.tensor([3.0, -2.0, 0.1, 0.0])
    labels = torch.tensor([1.0, 0.0, 0.0, 0.95])
    weights = torch.tensor([1.0, 2.0, 1.0, 0.0])
    rewards = torch.tensor([0.5, -1.0, 0.2, 9.0])
    m = critic_metrics(psi, labels, weights, rewards, num_generations=2)
    probs = torch.sigmoid(psi[:3])  # 0.953, 0.119, 0.525
    assert m["pacs/critic_margin"] == pytest.approx(0.5 - probs[1].item())  # median of 0.453, 0.381, 0.025
    assert m["pacs/critic_close_frac"] == pytest.approx(1 / 3)  # only |1 - 0.953| < 0.1
    assert m["pacs/proxy_abs_mean"] == pytest.approx((0.5 + 1.0 + 0.2) / 3)
    assert "pacs/critic_accuracy" not in m and "pacs/majority_accuracy" not in m  # ill-posed: retired (pacs.critic)
    assert m["pacs/label_mean"] == pytest.approx(1 / 3)
    assert m["pacs/frac_mixed_groups"] == pytest.approx(0.5)  # the second group has one valid completion
    assert m["pacs/critic_brier"] == pytest.approx(((probs - labels[:3]) ** 2).mean().item())
    assert critic_metrics(torch.zeros(2), torch.ones(2), torch.ones(2), torch.zeros(2), 2)["pacs/critic_margin"] == 0


def test_multi_step_training_keeps_groups_and_labels_and_learns(tiny_model_dir, tmp_path):
    args = config(tmp_path, steps_per_generation=2, num_iterations=2, max_steps=4)
    trainer = PACSTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())
    recorder = Recorder(trainer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()

    assert len(recorder.batches) == 4
    tokenizer = trainer.processing_class
    for batch in recorder.batches:
        assert batch["prompt_ids"].size(0) == 4
        assert_whole_groups(batch["prompt_ids"], 4)
        # each label is the reward of the very completion in its row (labels travel through the group shuffle)
        ids = [row[mask.bool()].tolist() for row, mask in zip(batch["completion_ids"], batch["completion_mask"])]
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        assert batch["pacs_labels"].tolist() == parity_reward(texts)
    # steps_per_generation=2 x num_iterations=2: one generation serves 4 optimizer steps, so old logps are kept
    assert all("old_per_token_logps" in b for b in recorder.batches)
    changed = sum((p.detach() - before[n]).abs().sum().item() for n, p in trainer.model.named_parameters())
    assert changed > 0
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    for key in PACS_METRICS:
        assert all(key in entry for entry in logs), key
    assert logs[0]["pacs/psi_std"] == 0.0  # first step after generation is on-policy: psi == 0
    assert any(entry["pacs/psi_std"] > 0 for entry in logs[1:])  # later steps are off-policy
    assert all(0.0 <= entry.get("pacs/critic_ranking", 0.5) <= 1.0 for entry in logs)
    assert any("pacs/critic_ranking" in entry for entry in logs)


def test_groups_whole_with_gradient_accumulation(tiny_model_dir, tmp_path):
    args = config(tmp_path, gradient_accumulation_steps=2, steps_per_generation=4, max_steps=2)
    trainer = PACSTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())
    recorder = Recorder(trainer)
    trainer.train()
    assert len(recorder.batches) == 4
    for batch in recorder.batches:
        assert_whole_groups(batch["prompt_ids"], 4)


def test_labels_outside_unit_interval_are_rejected(tiny_model_dir, tmp_path):
    def too_big(completions, **kwargs):
        return [2.0] * len(completions)

    trainer = PACSTrainer(model=tiny_model_dir, reward_funcs=too_big, args=config(tmp_path), train_dataset=prompts())
    with pytest.raises(ValueError, match=r"needs it in \[0, 1\].*too_big=2"):
        trainer.train()


def test_unscorable_completions_get_no_weight(tiny_model_dir, tmp_path):
    def half_none(completions, **kwargs):
        return [None if i % 4 == 0 else float(len(c) % 2) for i, c in enumerate(completions)]

    trainer = PACSTrainer(
        model=tiny_model_dir, reward_funcs=half_none, args=config(tmp_path, max_steps=1), train_dataset=prompts()
    )
    recorder = Recorder(trainer)
    trainer.train()
    scorable = recorder.batches[0]["pacs_scorable"]
    assert scorable.tolist().count(0.0) == 1 and torch.isfinite(torch.tensor(trainer.state.log_history[0]["loss"]))


def test_rejects_plain_grpo_config(tiny_model_dir, tmp_path):
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    with pytest.raises(TypeError, match="needs args=PACSConfig"):
        PACSTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())


def test_lora_changes_only_adapter_weights(tiny_model_dir, tmp_path):
    from peft import LoraConfig

    trainer = PACSTrainer(
        model=tiny_model_dir,
        reward_funcs=parity_reward,
        args=config(tmp_path, steps_per_generation=2, learning_rate=5e-2),
        train_dataset=prompts(),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    lora = [n for n in before if "lora_" in n]
    assert lora, "no LoRA parameters"
    assert all(torch.equal(before[n], after[n].detach()) for n in before if "lora_" not in n)
    assert any(not torch.equal(before[n], after[n].detach()) for n in lora)


@pytest.mark.parametrize("num_generations_eval,eval_batch", [(None, 4), (1, 3), (3, 6)])
def test_evaluate_needs_no_whole_groups(tiny_model_dir, tmp_path, num_generations_eval, eval_batch):
    # Evaluation makes no update, so psi == 0 and the loss is log 2 by construction: any eval batch, G_eval = 1 too,
    # and no critic metrics (they would carry no information), only the label mean.
    args = config(
        tmp_path, per_device_eval_batch_size=eval_batch, num_generations_eval=num_generations_eval, eval_strategy="no"
    )
    trainer = PACSTrainer(
        model=tiny_model_dir,
        reward_funcs=parity_reward,
        args=args,
        train_dataset=prompts(),
        eval_dataset=prompts(3),
    )
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] == pytest.approx(math.log(2), rel=1e-5)
    assert 0.0 <= metrics["eval_pacs/label_mean"] <= 1.0
    assert "eval_pacs/critic_ranking" not in metrics and "eval_pacs/psi_std" not in metrics
    assert "eval_reward" in metrics and "eval_entropy" in metrics


def test_evaluate_rejects_an_eval_batch_trl_cannot_group(tiny_model_dir, tmp_path):
    args = config(tmp_path, per_device_eval_batch_size=5, num_generations_eval=3, eval_strategy="no")
    trainer = PACSTrainer(
        model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts(), eval_dataset=prompts(3)
    )
    with pytest.raises(ValueError, match=r"per_device_eval_batch_size in \[3, 6, 9\]"):
        trainer.evaluate()
    # (with evaluation during training, GRPOConfig itself checks this when the config is built)


def test_entropy_bonus_is_added_to_the_pacs_loss(tiny_model_dir, tmp_path):
    # TRL's static entropy bonus: loss = PACS - coef * mean token entropy (per micro-batch, / grad accumulation)
    recorded = {}
    args = config(tmp_path, entropy_coef=0.5, max_steps=1, gradient_accumulation_steps=2, steps_per_generation=2)
    trainer = PACSTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())
    compute = trainer._compute_loss

    def spy(model, inputs):
        loss = compute(model, inputs)
        recorded.setdefault("losses", []).append(loss.item())
        return loss

    trainer._compute_loss = spy
    trainer.train()
    log = next(e for e in trainer.state.log_history if "loss" in e)
    assert log["entropy_coef"] == 0.5 and "policy_loss" in log
    # the returned loss is (pacs - 0.5 * entropy) / 2 per micro-batch
    expected = (log["policy_loss"] - 0.5 * log["entropy"]) / 2
    assert sum(recorded["losses"]) / 2 == pytest.approx(expected, rel=1e-3)


def test_adaptive_entropy_bonus_updates_its_coefficient(tiny_model_dir, tmp_path):
    args = config(
        tmp_path,
        use_adaptive_entropy=True,
        entropy_coef=0.1,
        entropy_target=100.0,  # always above: the coefficient grows every optimizer step
        entropy_coef_delta=0.05,
        max_steps=2,
        steps_per_generation=2,
    )
    trainer = PACSTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())
    trainer.train()
    assert trainer.entropy_coef == pytest.approx(0.2)
    coefs = [e["entropy_coef"] for e in trainer.state.log_history if "entropy_coef" in e]
    assert coefs == pytest.approx([0.15, 0.2])


def test_kl_term_with_reference_model(tiny_model_dir, tmp_path):
    trainer = PACSTrainer(
        model=tiny_model_dir,
        reward_funcs=parity_reward,
        args=config(tmp_path, beta=0.1, max_steps=2, steps_per_generation=2),
        train_dataset=prompts(),
    )
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert all("kl" in entry for entry in logs)
    # loss = pacs + beta * kl (kl is 0 at step 1, the policy still equals the reference)
    assert logs[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert logs[1]["loss"] == pytest.approx(logs[1]["pacs/loss"] + 0.1 * logs[1]["kl"], rel=1e-3, abs=1e-5)


def _launch(cmd, tmp_path, timeout=900):
    run_launched(cmd, tmp_path, timeout)
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("rank*.json"))]


@pytest.mark.distributed
def test_two_cpu_processes(tiny_model_dir, tmp_path):
    (tmp_path / "out").mkdir()
    cmd = [*accelerate_launch(), "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    cmd += [str(SCRIPT), tiny_model_dir, str(tmp_path / "out")]
    records = _launch(cmd, tmp_path)
    assert [r["rank"] for r in records] == [0, 1] and all(r["world_size"] == 2 for r in records)
    for record in records:
        assert record["finite_params"]
        for ids in record["prompt_ids"]:
            assert_whole_groups(torch.tensor(ids), 4)
    # the ranks trained on different prompts
    assert records[0]["prompt_ids"][0] != records[1]["prompt_ids"][0]
    logs = [e for e in records[0]["log_history"] if "loss" in e]
    assert len(logs) == 3 and all("pacs/psi_std" in e for e in logs)


@pytest.mark.distributed
def test_deepspeed_zero3_on_cpu(tiny_model_dir, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "zero3_cpu.yaml").write_text(ZERO3_CPU_ACCELERATE_CONFIG)
    cmd = [*accelerate_launch(), "--config_file", str(tmp_path / "zero3_cpu.yaml")]
    cmd += [str(SCRIPT), tiny_model_dir, str(tmp_path / "out")]
    (record,) = _launch(cmd, tmp_path)
    assert record["zero_stage"] == 3 and record["finite_params"]
    for ids in record["prompt_ids"]:
        assert_whole_groups(torch.tensor(ids), 4)
    logs = [e for e in record["log_history"] if "loss" in e]
    assert len(logs) == 3 and all("pacs/loss" in e for e in logs)


SPLIT_SCRIPT = Path(__file__).parent / "scripts" / "train_split.py"


def _split_run(tmp_path, name, launcher, model_dir, *numbers):
    out = tmp_path / name / "out"
    out.mkdir(parents=True)
    records = _launch([*launcher, str(SPLIT_SCRIPT), model_dir, str(out), *map(str, numbers)], tmp_path / name)
    params = [torch.load(out / f"params{r['rank']}.pt") for r in records]
    return records, params


@pytest.mark.distributed
def test_split_groups_across_two_processes_match_one_process(tiny_model_dir, tmp_path):
    # 12 rows = 3 groups of 4 per generation; 6 per process, so group 1 spans the two ranks; one optimizer step per
    # pass and num_iterations=2, so the second step is off-policy (psi != 0). Completions are a fixed function of
    # (prompt, position in the group), so both runs see the same ones; rank 1 holds only rows of uniform groups.
    two = [*accelerate_launch(), "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    records, params = _split_run(tmp_path, "two", two, tiny_model_dir, 6, 1, 1, 2)
    (whole,), (whole_params,) = _split_run(tmp_path, "one", [sys.executable], tiny_model_dir, 12, 1, 1, 2)
    assert [r["world_size"] for r in records] == [2, 2] and all(r["split"] for r in records) and not whole["split"]
    assert all(label == 0.0 for step in records[1]["labels"] for label in step)  # rank 1: uniform groups only
    assert sorted(records[0]["labels"][0] + records[1]["labels"][0]) == sorted(whole["labels"][0])
    update = whole_params["after"] - whole_params["before"]
    assert update.norm() > 0
    for p in params:  # both ranks hold the same parameters, equal to the one-process update
        assert ((p["after"] - whole_params["after"]).norm() / update.norm()).item() < 1e-5
    logs = [e for e in records[0]["log_history"] if "pacs/loss" in e]
    whole_logs = [e for e in whole["log_history"] if "pacs/loss" in e]
    assert logs[1]["pacs/psi_std"] > 0.1
    assert [e["pacs/loss"] for e in logs] == pytest.approx([e["pacs/loss"] for e in whole_logs], rel=1e-5)


@pytest.mark.distributed
def test_split_groups_with_rows_exchanged_between_processes(tiny_model_dir, tmp_path):
    # 2 processes x 1 row x 2 accumulation steps = one group of 4 per optimizer step, 2 optimizer steps per generation:
    # each process generated one whole group, and each step needs 2 rows of one group on each process, so the rows
    # are exchanged after generation. Same update as one process with whole groups in generation order.
    two = [*accelerate_launch(), "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    records, params = _split_run(tmp_path, "two", two, tiny_model_dir, 1, 2, 4, 1)
    (whole,), (whole_params,) = _split_run(
        tmp_path, "one", [sys.executable], tiny_model_dir, 4, 1, 2, 1, "--no-shuffle"
    )
    assert all(r["split"] for r in records) and not whole["split"]
    update = whole_params["after"] - whole_params["before"]
    assert update.norm() > 0
    for p in params:
        assert ((p["after"] - whole_params["after"]).norm() / update.norm()).item() < 1e-5
    # each optimizer step saw half of one group on each process: the labels of the step are the whole group's
    for step in range(2):
        step_labels = sorted(sum((r["labels"][2 * step] + r["labels"][2 * step + 1] for r in records), []))
        assert step_labels == sorted(whole["labels"][step])
    logs = [e for e in records[0]["log_history"] if "pacs/loss" in e]
    assert logs[1]["pacs/psi_std"] > 0


@pytest.mark.distributed
def test_split_groups_under_deepspeed_zero3_with_batch_1(tiny_model_dir, tmp_path):
    (tmp_path / "zero3_cpu.yaml").write_text(ZERO3_CPU_ACCELERATE_CONFIG)
    launcher = [*accelerate_launch(), "--config_file", str(tmp_path / "zero3_cpu.yaml")]
    # per-device batch 1, G=4: 4 micro-batches per optimizer step, 2 optimizer steps per generation
    (record,), _ = _split_run(tmp_path, "z3", launcher, tiny_model_dir, 1, 4, 8, 1)
    assert record["zero_stage"] == 3 and record["split"] and record["update_norm"] > 0
    logs = [e for e in record["log_history"] if "pacs/loss" in e]
    assert len(logs) == 2 and logs[1]["pacs/psi_std"] > 0


def test_split_groups_with_lora_and_batch_1(tiny_model_dir, tmp_path):
    (record,), (params,) = _split_run(tmp_path, "lora", [sys.executable], tiny_model_dir, 1, 4, 8, 1, "--lora")
    assert record["split"] and record["update_norm"] > 0
    changed = (params["after"] != params["before"]).sum().item()
    assert 0 < changed < params["after"].numel() // 4  # only the adapters (q_proj, v_proj, rank 4) moved


def test_docstring_examples_run(tiny_model_dir):
    import doctest

    import pacs._compat
    import pacs.anchors
    import pacs.anchors.reference
    import pacs.critic
    import pacs.grpo.checkpoints
    import pacs.grpo.resume
    import pacs.grpo.trainer
    import pacs.grpo.vllm_sync
    import pacs.run_lock
    import pacs.split
    import pacs.testing

    # (the fixture has already saved a model once, so one-time import banners do not land in the doctest output)

    for module in (
        pacs.anchors,
        pacs.anchors.reference,
        pacs.critic,
        pacs.grpo.checkpoints,
        pacs.grpo.resume,
        pacs.grpo.trainer,
        pacs.grpo.vllm_sync,
        pacs.run_lock,
        pacs.split,
        pacs._compat,
        pacs.testing,
    ):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_vllm_importance_weights_are_logged_and_applied(tiny_model_dir, tmp_path, monkeypatch):
    # vLLM's sequence-level correction (simulated: no vLLM on CPU): masked completions (ratio 0) get weight 0, and
    # the fraction masked and the mean kept ratio are logged
    from trl import GRPOTrainer

    original = GRPOTrainer._generate_and_score_completions

    def with_ratio(self, inputs):
        output = original(self, inputs)
        ratio = torch.ones(output["prompt_ids"].size(0), 1)
        ratio[::4] = 0.0  # one completion per group masked
        ratio[1::4] = 1.5
        output["importance_sampling_ratio"] = ratio
        return output

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", with_ratio)
    trainer = PACSTrainer(
        model=tiny_model_dir, reward_funcs=parity_reward, args=config(tmp_path, max_steps=1), train_dataset=prompts()
    )
    recorder = Recorder(trainer)
    trainer.train()
    log = next(e for e in trainer.state.log_history if "loss" in e)
    assert log["pacs/is_masked_frac"] == pytest.approx(0.25)
    assert log["pacs/is_ratio_mean"] == pytest.approx((1.5 + 1.0 + 1.0) / 3)
    batch = recorder.batches[0]
    weight = trainer._sample_weight(batch, batch["completion_mask"], torch.float32)
    assert weight[batch["importance_sampling_ratio"][:, 0] == 0].abs().sum() == 0


def test_model_card_cites_the_pacs_paper(tiny_model_dir, tmp_path):
    trainer = PACSTrainer(
        model=tiny_model_dir, reward_funcs=parity_reward, args=config(tmp_path), train_dataset=prompts()
    )
    trainer.create_model_card(model_name="tiny-pacs")
    card = (Path(trainer.args.output_dir) / "README.md").read_text()
    assert "trained with PACS, a method introduced in [Implicit Actor Critic Coupling via a Supervised" in card
    assert "https://huggingface.co/papers/2509.02522" in card and "eprint       = {arXiv:2509.02522}" in card
    assert "@article{li2025implicit" in card and "Jiaming Li and Longze Chen" in card
    assert "DeepSeekMath" not in card and "2402.03300" not in card
    assert "Cite TRL as:" in card  # the rest of TRL's card is kept
