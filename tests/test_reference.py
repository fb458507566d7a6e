"""Tests of `pacs.anchors.reference`: the reward proxy anchored to a fixed reference policy (`pacs_anchor="reference"`), its
periodic hard reset with the optimizer states, LoRA snapshots, the split path and exact resume. Float32, no bf16."""

from pathlib import Path

import pytest
import torch
from datasets import Dataset
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from transformers import AutoModelForCausalLM, TrainerCallback

from pacs import PACSConfig, PACSTrainer
from pacs.anchors.reference import REF_ADAPTER, reset_optimizer_states
from pacs.loss import pacs_loss
from tests.scripts.train_resume import resume_runs
from tests.tiny_config import tiny_pacs_config


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def prompts(n=64):
    return Dataset.from_dict({"prompt": [f"What is {i} + {3 * i}?" for i in range(n)]})


def make_trainer(model_dir, tmp_path, name="run", peft_config=None, trainer_cls=PACSTrainer, **overrides):
    settings = dict(
        pacs_anchor="reference",
        optim="sgd",
        learning_rate=0.2,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,  # no clipping: the update is -lr x gradient
        steps_per_generation=2,  # 2 optimizer steps per generation (gradient accumulation 1)
        max_steps=4,
        seed=1,
    )
    args = tiny_pacs_config(tmp_path / name, **{**settings, **overrides})
    return trainer_cls(
        model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts(), peft_config=peft_config
    )


def train_logs(trainer) -> list[dict]:
    trainer.train()
    return [entry for entry in trainer.state.log_history if "pacs/loss" in entry]


class StepRecorder(PACSTrainer):
    """Keeps, for every micro-batch the loss sees, its inputs and the parameters it was computed at."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = []

    def _compute_loss(self, model, inputs):
        keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "pacs_labels")
        self.records.append(
            {
                "inputs": {k: inputs[k].detach().clone() for k in keys},
                "params": parameters_to_vector(self.model.parameters()).detach().clone(),
            }
        )
        return super()._compute_loss(model, inputs)


def completion_logps(model, inputs) -> torch.Tensor:
    """Per-token log-probabilities of the completion tokens, computed directly (no TRL, no fused LM head)."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    T = inputs["completion_ids"].size(1)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -T - 1 : -1].float()  # (B, T, V)
    return logits.log_softmax(-1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)  # (B, T)


# ---------------------------------------------------------------------------------------------------------------------
# Settings and the optimizer reset
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(pacs_anchor="ref"), "use 'rollout'"),
        (dict(pacs_anchor="reference", pacs_reference_reset_generations=-1), "integer >= 0"),
    ],
)
def test_bad_anchor_settings_say_what_is_valid(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        PACSConfig(str(tmp_path), use_cpu=True, bf16=False, **overrides)


def test_reset_optimizer_states_makes_the_next_adam_step_a_first_step():
    torch.manual_seed(0)
    fresh, used = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    used.load_state_dict(fresh.state_dict())
    opt_fresh, opt_used = torch.optim.AdamW(fresh.parameters(), lr=0.1), torch.optim.AdamW(used.parameters(), lr=0.1)
    x = torch.randn(5, 3)
    for _ in range(3):  # history the reset must erase
        used(x).pow(2).sum().backward()
        opt_used.step()
        opt_used.zero_grad()
    assert reset_optimizer_states(opt_used) == 2
    used_before = [p.detach().clone() for p in used.parameters()]
    fresh.load_state_dict(used.state_dict())
    for model, opt in ((fresh, opt_fresh), (used, opt_used)):
        model(x).pow(2).sum().backward()
        opt.step()
    for a, b, before in zip(fresh.parameters(), used.parameters(), used_before):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)  # the same update as a brand-new AdamW
        assert not torch.equal(b, before)


# ---------------------------------------------------------------------------------------------------------------------
# The loss against an independent computation
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("resets", [0, 1])
def test_loss_and_gradient_match_an_independent_computation(tiny_model_dir, tmp_path, resets):
    trainer = make_trainer(
        tiny_model_dir, tmp_path, trainer_cls=StepRecorder, max_steps=6, pacs_reference_reset_generations=resets
    )
    logs = train_logs(trainer)
    final = parameters_to_vector(trainer.model.parameters()).detach()
    assert len(trainer.records) == len(logs) == 6
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    reference = parameters_to_vector(initial.parameters()).detach().clone()
    for k, record in enumerate(trainer.records):
        if resets and k > 0 and k % 2 == 0:  # generation boundary: pi_ref <- pi_theta
            reference = record["params"]
        vector_to_parameters(reference, initial.parameters())
        with torch.no_grad():
            ref_logps = completion_logps(initial, record["inputs"])
        vector_to_parameters(record["params"], policy.parameters())
        policy.zero_grad()
        logps = completion_logps(policy, record["inputs"])
        inputs = record["inputs"]
        loss, _ = pacs_loss(logps, ref_logps, inputs["completion_mask"], inputs["pacs_labels"], 4, beta=1.0)
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in policy.parameters()])
        after = trainer.records[k + 1]["params"] if k + 1 < len(trainer.records) else final
        assert logs[k]["pacs/loss"] == pytest.approx(loss.item(), rel=1e-5), k
        update = after - record["params"]
        assert (update + 0.2 * grad).norm() <= 1e-4 * update.norm(), k  # SGD: the update is -lr x the gradient


def test_psi_is_zero_right_after_a_reset_and_not_on_the_next_generation(tiny_model_dir, tmp_path):
    # 2 optimizer steps per generation, pi_ref reset after every 2 generations: before generation 3 (step 5)
    trainer = make_trainer(tiny_model_dir, tmp_path, max_steps=8, pacs_reference_reset_generations=2)
    logs = train_logs(trainer)
    psi_std = [entry["pacs/psi_std"] for entry in logs]
    proxy = [entry["pacs/proxy_abs_mean"] for entry in logs]
    assert [entry["pacs/reference_resets"] for entry in logs] == [0, 0, 0, 0, 1, 1, 1, 1]
    for step in (0, 4):  # first step of generations 1 and 3: pi_theta == pi_ref
        assert psi_std[step] <= 1e-6 and proxy[step] <= 1e-6, (step, psi_std, proxy)
        assert logs[step]["pacs/reference_kl"] == pytest.approx(0.0, abs=1e-6)
    for step in (2, 6):  # first step of generations 2 and 4: the policy has moved away from pi_ref
        assert psi_std[step] > 1e-4 and proxy[step] > 1e-4, (step, psi_std, proxy)
        assert logs[step]["pacs/reference_kl"] > 0


def test_rollout_anchor_is_zero_on_every_first_step(tiny_model_dir, tmp_path):
    # the contrast the reference anchor exists for: with pi_old, every generation's first step has psi == 0
    logs = train_logs(make_trainer(tiny_model_dir, tmp_path, max_steps=6, pacs_anchor="rollout"))
    assert all(logs[step]["pacs/psi_std"] == 0.0 for step in (0, 2, 4))
    assert "pacs/reference_resets" not in logs[0]


class AdamSteps(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        inner = optimizer
        while hasattr(inner, "optimizer"):
            inner = inner.optimizer
        self.steps.append(int(next(iter(inner.state.values()))["step"]))


@pytest.mark.parametrize("reset_optimizer,expected", [(True, [1, 2, 1, 2, 1, 2]), (False, [1, 2, 3, 4, 5, 6])])
def test_adam_step_count_restarts_at_a_reset(tiny_model_dir, tmp_path, reset_optimizer, expected):
    trainer = make_trainer(
        tiny_model_dir, tmp_path, optim="adamw_torch", learning_rate=1e-3, max_steps=6,
        pacs_reference_reset_generations=1, pacs_reset_optimizer=reset_optimizer,
    )  # fmt: skip
    steps = AdamSteps()
    trainer.add_callback(steps)
    trainer.train()
    assert steps.steps == expected
    assert trainer._pacs_anchor.resets == 2


# ---------------------------------------------------------------------------------------------------------------------
# LoRA, TRL's KL reference, the split path
# ---------------------------------------------------------------------------------------------------------------------


def test_lora_reference_is_a_snapshot_of_the_adapter(tiny_model_dir, tmp_path):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = make_trainer(
        tiny_model_dir, tmp_path, peft_config=lora, max_steps=6, learning_rate=0.05, pacs_reference_reset_generations=1
    )
    anchor = trainer._pacs_anchor
    assert anchor.ref_model is None  # no second copy of the base model
    ref_params = [p for n, p in trainer.model.named_parameters() if f".{REF_ADAPTER}." in n]
    assert ref_params and not any(p.requires_grad for p in ref_params)
    snapshots = []
    reset = anchor.reset

    def recording_reset(*args):
        reset(*args)
        snapshots.append({n: p.detach().clone() for n, p in trainer.model.named_parameters() if ".default." in n})

    anchor.reset = recording_reset
    logs = train_logs(trainer)
    assert len(snapshots) == 2
    named = dict(trainer.model.named_parameters())
    for name, value in snapshots[-1].items():  # pi_ref holds the adapter of the last reset, not the base model's
        assert torch.equal(named[name.replace(".default.", f".{REF_ADAPTER}.")], value)
    assert any(value.abs().sum() > 0 for name, value in snapshots[-1].items() if "lora_B" in name)
    for step in (2, 4):  # first step after each reset: pi_theta == pi_ref (the adapter-free base would differ)
        assert logs[step]["pacs/psi_std"] <= 1e-6
    assert max(logs[step]["pacs/psi_std"] for step in (1, 3, 5)) > 1e-5  # second steps: the adapter has moved


@pytest.mark.parametrize("resets,shared", [(0, True), (1, False)])
def test_kl_reference_is_shared_only_while_both_are_the_initial_model(tiny_model_dir, tmp_path, resets, shared):
    trainer = make_trainer(tiny_model_dir, tmp_path, beta=0.05, pacs_reference_reset_generations=resets)
    anchor = trainer._pacs_anchor
    assert (anchor.ref_model is trainer.ref_model) == shared
    logs = train_logs(trainer)
    assert all("kl" in entry and "pacs/reference_kl" in entry for entry in logs)


def _flat_update(trainer_factory):
    trainer = trainer_factory()
    before = parameters_to_vector(trainer.model.parameters()).detach().clone()
    trainer.train()
    return before, parameters_to_vector(trainer.model.parameters()).detach()


@pytest.mark.parametrize("batch,accumulation", [(2, 2), (1, 4)])
def test_split_path_matches_whole_groups(tiny_model_dir, tmp_path, batch, accumulation):
    common = dict(max_steps=6, pacs_reference_reset_generations=2)
    whole_before, whole = _flat_update(lambda: make_trainer(tiny_model_dir, tmp_path, "whole", **common))
    split_before, split = _flat_update(
        lambda: make_trainer(
            tiny_model_dir, tmp_path, "split", per_device_train_batch_size=batch,
            gradient_accumulation_steps=accumulation, steps_per_generation=2 * accumulation, **common,
        )
    )  # fmt: skip
    assert torch.equal(whole_before, split_before)
    assert ((split - whole).norm() / (whole - whole_before).norm()).item() <= 1e-5


# ---------------------------------------------------------------------------------------------------------------------
# Exact resume across a reset
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lora", [False, True])
def test_resume_across_a_reset_matches_the_uninterrupted_run(tiny_model_dir, tmp_path, lora):
    # one group per micro-batch, 2 optimizer steps per generation, pi_ref reset before generations 2 and 3;
    # checkpoints after every step: before a reset, right at one, and in the middle of a generation after one
    overrides = dict(pacs_anchor="reference", pacs_reference_reset_generations=1, optim="adamw_torch")
    record = resume_runs(tiny_model_dir, str(tmp_path), (4, 1, 2, 1, 6), [1, 2, 3, 5], lora=lora, **overrides)
    assert record["update_norm"] > 0
    for k, run in record["resumed"].items():
        assert run["relative_difference"] <= 1e-6, (k, run["relative_difference"])
        assert run["generated_at"] == [step for step in record["generated_at"] if step >= int(k)], k


# ---------------------------------------------------------------------------------------------------------------------
# Two processes, DeepSpeed ZeRO-3
# ---------------------------------------------------------------------------------------------------------------------

TINY_SCRIPT = Path(__file__).parent / "scripts" / "train_tiny.py"
ANCHOR = ["pacs_anchor=reference", "pacs_reference_reset_generations=1", "max_steps=4"]


def _launch(cmd, tmp_path):
    import json

    from tests.launching import run_launched

    run_launched(cmd, tmp_path)
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("rank*.json"))]


def _check_reset_run(record):
    # 2 optimizer steps per generation, pi_ref reset before generation 2 (step 3): psi == 0 there, resets counted
    assert record["finite_params"] and record["update_norm"] > 0
    logs = [e for e in record["log_history"] if "pacs/loss" in e]
    assert [e["pacs/reference_resets"] for e in logs] == [0, 0, 1, 1]
    assert logs[0]["pacs/psi_std"] <= 1e-6 and logs[2]["pacs/psi_std"] <= 1e-6
    assert logs[2]["pacs/reference_kl"] == pytest.approx(0.0, abs=1e-6)
    assert logs[3]["pacs/reference_kl"] > 0
    # pi_ref == the policy at generations 1 and 2 (a reset): no fresh ranking; the pooled ranking is a share
    assert "pacs/critic_ranking_fresh" not in logs[0] and "pacs/critic_ranking_fresh" not in logs[2]
    assert all(0.0 <= e.get("pacs/critic_ranking", 0.5) <= 1.0 for e in logs)


@pytest.mark.distributed
def test_two_cpu_processes(tiny_model_dir, tmp_path):
    from tests.launching import accelerate_launch

    (tmp_path / "out").mkdir()
    cmd = [*accelerate_launch(), "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    cmd += [str(TINY_SCRIPT), tiny_model_dir, str(tmp_path / "out"), *ANCHOR]
    records = _launch(cmd, tmp_path)
    assert [r["world_size"] for r in records] == [2, 2]
    for record in records:
        _check_reset_run(record)
    # the critic's ranking pools both processes' groups: every rank logs the same value at every step
    rankings = [[e.get("pacs/critic_ranking") for e in r["log_history"] if "pacs/loss" in e] for r in records]
    assert rankings[0] == rankings[1] and any(v is not None for v in rankings[0])


@pytest.mark.distributed
def test_deepspeed_zero3_on_cpu(tiny_model_dir, tmp_path):
    from tests.launching import ZERO3_CPU_ACCELERATE_CONFIG, accelerate_launch

    (tmp_path / "out").mkdir()
    (tmp_path / "zero3_cpu.yaml").write_text(ZERO3_CPU_ACCELERATE_CONFIG)
    cmd = [*accelerate_launch(), "--config_file", str(tmp_path / "zero3_cpu.yaml")]
    cmd += [str(TINY_SCRIPT), tiny_model_dir, str(tmp_path / "out"), *ANCHOR]
    (record,) = _launch(cmd, tmp_path)
    assert record["zero_stage"] == 3
    _check_reset_run(record)  # the reset copied the sharded weights: pi_ref's forward equals the policy's


# ---------------------------------------------------------------------------------------------------------------------
# Re-warmup after an optimizer reset (pacs_reset_warmup_steps)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        dict(pacs_reset_warmup_steps=2),  # rollout anchor: no reset to warm up after
        dict(pacs_reset_warmup_steps=2, pacs_anchor="reference"),  # never reset
        dict(pacs_reset_warmup_steps=2, pacs_anchor="reference", pacs_reference_reset_generations=2,
             pacs_reset_optimizer=False),
        dict(pacs_reset_warmup_steps=-1),
    ],
)  # fmt: skip
def test_rewarmup_without_an_optimizer_reset_is_refused(tmp_path, overrides):
    with pytest.raises(ValueError, match="pacs_reset_warmup_steps"):
        PACSConfig(str(tmp_path), use_cpu=True, bf16=False, **overrides)


class StepUpdates(TrainerCallback):
    """The learning rate each optimizer step ran at, and its parameter change."""

    def __init__(self, model):
        self.model, self.lrs, self.norms = model, [], []

    def on_step_begin(self, args, state, control, **kwargs):
        self.before = parameters_to_vector(self.model.parameters()).detach().clone()

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.lrs.append(optimizer.param_groups[0]["lr"])

    def on_step_end(self, args, state, control, **kwargs):
        self.norms.append((parameters_to_vector(self.model.parameters()).detach() - self.before).norm().item())


def _rewarmup_run(tiny_model_dir, tmp_path, name, warmup):
    trainer = make_trainer(
        tiny_model_dir, tmp_path, name, optim="adamw_torch", learning_rate=1e-3, max_steps=6,
        pacs_reference_reset_generations=1, pacs_reset_warmup_steps=warmup,
    )  # fmt: skip
    record = StepUpdates(trainer.model)
    trainer.add_callback(record)
    logs = train_logs(trainer)
    return record, logs


def test_rewarmup_scales_the_steps_after_a_reset(tiny_model_dir, tmp_path):
    # 2 optimizer steps per generation, pi_ref reset (with Adam's states) before steps 3 and 5
    plain, _ = _rewarmup_run(tiny_model_dir, tmp_path, "plain", 0)
    warm, logs = _rewarmup_run(tiny_model_dir, tmp_path, "warm", 2)
    assert plain.lrs == pytest.approx([1e-3] * 6)
    assert warm.lrs == pytest.approx([1e-3, 1e-3, 1e-3 / 3, 2e-3 / 3, 1e-3 / 3, 2e-3 / 3])
    assert [e["learning_rate"] for e in logs] == pytest.approx([1e-3] * 6)  # the schedule itself is untouched
    # one factor per step, the one applied (at the second reset the step-start factor 1 is replaced, not averaged)
    assert "pacs/lr_factor" not in logs[0]
    assert [e["pacs/lr_factor"] for e in logs[2:]] == pytest.approx([1 / 3, 2 / 3, 1 / 3, 2 / 3])
    # steps 1-2 are the same run; step 3 starts from the same weights and batch, and Adam's first step (and AdamW's
    # decay) is linear in the learning rate: the re-warmed update is a third of the plain one
    assert warm.norms[:2] == pytest.approx(plain.norms[:2], rel=1e-6)
    assert warm.norms[2] == pytest.approx(plain.norms[2] / 3, rel=1e-4)


def test_resume_in_a_rewarmup_matches_the_uninterrupted_run(tiny_model_dir, tmp_path):
    # reset before generations 2 and 3 (steps 3 and 5), K = 2: checkpoints inside both re-warmups
    overrides = dict(
        pacs_anchor="reference", pacs_reference_reset_generations=1, optim="adamw_torch", pacs_reset_warmup_steps=2
    )
    record = resume_runs(tiny_model_dir, str(tmp_path), (4, 1, 2, 1, 6), [3, 5], **overrides)
    assert record["update_norm"] > 0
    for k, run in record["resumed"].items():
        assert run["relative_difference"] <= 1e-6, (k, run["relative_difference"])
