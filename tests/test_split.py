"""Tests of `PACSTrainer`'s split path: groups that straddle micro-batches (and processes) get the exact whole-group
gradient. Plain SGD (no momentum, no clipping) in float32, so the parameters after training are a function of the
summed gradients alone."""

import pytest
import torch
from datasets import Dataset

from pacs import PACSTrainer
from pacs.trainer import exchange_order, split_layout
from tests.scripts.train_split import FixedCompletions
from tests.tiny_config import tiny_pacs_config


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def prompts(n=32):
    return Dataset.from_dict({"prompt": [f"What is {i} + {3 * i}?" for i in range(n)]})


def sometimes_none_reward(completions, **kwargs):
    """Parity, but unscorable (None) for every fifth completion."""
    return [None if i % 5 == 2 else float(len(c) % 2) for i, c in enumerate(completions)]


class FixedAndTruncated(FixedCompletions):
    truncate_every = 5


def train(model_dir, tmp_path, name, reward=parity_reward, trainer_cls=PACSTrainer, **overrides):
    """Train and return (initial parameters, final parameters, trainer)."""
    settings = dict(
        optim="sgd",
        learning_rate=0.2,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,  # no clipping: the update is lr x gradient
        num_generations=4,
        max_completion_length=8,
        seed=1,
    )
    args = tiny_pacs_config(tmp_path / name, **{**settings, **overrides})
    trainer = trainer_cls(model=model_dir, reward_funcs=reward, args=args, train_dataset=prompts())
    before = torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])
    trainer.train()
    after = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    return before, after, trainer


def relative_gap(reference, other):
    before, after, _ = reference
    return ((other[1] - after).norm() / (after - before).norm()).item()


# Whole groups per micro-batch (P=4) vs P = 1, 2, 3 with G = 4, same generations and optimizer steps.
LAYOUTS = {
    # 3 prompts per generation, 3 optimizer steps per generation (steps 2 and 3 off-policy)
    "steps": (
        dict(per_device_train_batch_size=4, gradient_accumulation_steps=1, steps_per_generation=3, max_steps=3),
        [(1, 4, 12), (2, 2, 6)],
    ),
    # one optimizer step per pass over the generation batch, two passes (num_iterations=2: the second off-policy)
    "iterations": (
        dict(
            per_device_train_batch_size=4,
            gradient_accumulation_steps=3,
            steps_per_generation=3,
            num_iterations=2,
            max_steps=2,
        ),
        [(3, 4, 4), (1, 12, 12)],
    ),
}


@pytest.mark.parametrize("score", ["rloo", "grpo", "naive"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_split_path_matches_whole_groups(tiny_model_dir, tmp_path, layout, score):
    whole, splits = LAYOUTS[layout]
    reference = train(tiny_model_dir, tmp_path, "whole", pacs_score=score, **whole)
    assert not reference[2]._pacs_split
    logs = [e for e in reference[2].state.log_history if "pacs/psi_std" in e]
    assert logs[-1]["pacs/psi_std"] > 1e-3  # the comparison covers off-policy steps where psi != 0
    shared = {
        k: v for k, v in whole.items() if k not in ("per_device_train_batch_size", "gradient_accumulation_steps")
    }
    for P, GA, S in splits:
        shared["steps_per_generation"] = S
        split = train(
            tiny_model_dir, tmp_path, f"split{P}", pacs_score=score, per_device_train_batch_size=P,
            gradient_accumulation_steps=GA, **shared,
        )  # fmt: skip
        assert split[2]._pacs_split
        assert relative_gap(reference, split) < 1e-5, (P, GA, S)
        split_logs = [e for e in split[2].state.log_history if "pacs/psi_std" in e]
        # metrics over the step's whole groups (the whole-group path averages equal-sized micro-batches: same means)
        for key in ("pacs/loss", "pacs/label_mean", "pacs/critic_brier", "pacs/psi_mean"):
            assert [e[key] for e in split_logs] == pytest.approx([e[key] for e in logs], rel=1e-4, abs=1e-5), key


def test_split_path_matches_whole_groups_with_the_mean_logp_proxy(tiny_model_dir, tmp_path):
    # r = beta * mean_t log pi is not 0 on-policy: every step of the split path needs its forward without grad
    whole, splits = LAYOUTS["steps"]
    reference = train(tiny_model_dir, tmp_path, "whole", pacs_reward_proxy="mean_logp", **whole)
    P, GA, S = splits[0]
    split = train(
        tiny_model_dir, tmp_path, "split", pacs_reward_proxy="mean_logp", per_device_train_batch_size=P,
        gradient_accumulation_steps=GA, steps_per_generation=S, max_steps=whole["max_steps"],
    )  # fmt: skip
    assert relative_gap(reference, split) < 1e-5


@pytest.mark.parametrize("class_weight", ["balanced", None])
def test_split_path_matches_with_kl_unscorable_and_truncated_rows(tiny_model_dir, tmp_path, class_weight):
    # TRL's KL term, rows without a reward (weight 0) and truncated rows emptied by mask_truncated_completions (out
    # of the group statistics), with gradient checkpointing in the split run
    extra = dict(
        beta=0.1, mask_truncated_completions=True, pacs_class_weight=class_weight, steps_per_generation=3,
        max_steps=3, trainer_cls=FixedAndTruncated,
    )  # fmt: skip
    whole = train(
        tiny_model_dir, tmp_path, "whole", sometimes_none_reward, per_device_train_batch_size=4,
        gradient_accumulation_steps=1, **extra,
    )  # fmt: skip
    split = train(
        tiny_model_dir, tmp_path, "split", sometimes_none_reward, per_device_train_batch_size=2,
        gradient_accumulation_steps=2, gradient_checkpointing=True, **{**extra, "steps_per_generation": 6},
    )  # fmt: skip
    assert relative_gap(whole, split) < 1e-5
    logs = [e for e in split[2].state.log_history if "kl" in e]
    assert logs and logs[-1]["kl"] > 0 and logs[-1]["pacs/psi_std"] > 0
    assert 0 < logs[0]["completions/clipped_ratio"] < 0.5


def test_split_path_on_policy_step_needs_no_extra_forward(tiny_model_dir, tmp_path, monkeypatch):
    args = dict(per_device_train_batch_size=1, gradient_accumulation_steps=4, steps_per_generation=8, max_steps=2)
    counts = []
    original = PACSTrainer._per_token_logps

    def counting(self, model, inputs, **kwargs):
        counts.append(torch.is_grad_enabled())
        return original(self, model, inputs, **kwargs)

    monkeypatch.setattr(PACSTrainer, "_per_token_logps", counting)
    train(tiny_model_dir, tmp_path, "count", **args)
    # step 1 (on-policy): 4 forwards with grad; step 2 (off-policy): first 4 without grad for r, then 4 with grad
    assert counts == [True] * 4 + [False] * 4 + [True] * 4


def test_split_layout_names_a_valid_setting():
    assert split_layout(1, 8, 32, 1, 8) == "local"
    assert split_layout(2, 4, 16, 1, 8) == "local"
    assert split_layout(3, 1, 1, 4, 4) == "local"  # groups span processes, one optimizer step per generation
    assert split_layout(1, 1, 4, 8, 8) == "exchange"  # one row per process, a group per step over 8 processes
    assert split_layout(1, 2, 8, 2, 4) == "exchange"
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=8 .*steps_per_generation=32"):
        split_layout(1, 2, 8, 1, 8)
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=2 "):
        split_layout(1, 1, 4, 4, 8)
    with pytest.raises(ValueError, match=r"multiple of gradient_accumulation_steps \(4\)"):
        split_layout(1, 4, 6, 1, 4)


def test_exchange_order_gives_every_process_its_share_of_each_step():
    order = exchange_order(rows_per_process=6, world_size=2, rows_per_step=2, num_generations=4)  # 3 groups
    assert sorted(order.flatten().tolist()) == list(range(12))
    for step in range(3):  # step j over both processes: exactly group j
        rows = order[:, 2 * step : 2 * step + 2].flatten()
        assert sorted(rows.tolist()) == list(range(4 * step, 4 * step + 4))


def test_split_layout_is_checked_when_the_config_is_built(tmp_path):
    # with the config, before any trainer or model exists
    with pytest.raises(ValueError, match=r"steps_per_generation \(6\) must be a multiple of gradient_accumulation"):
        tiny_pacs_config(
            tmp_path / "bad", per_device_train_batch_size=2, gradient_accumulation_steps=4, steps_per_generation=6
        )
    args = tiny_pacs_config(tmp_path / "ok", per_device_train_batch_size=2, gradient_accumulation_steps=2)
    assert args.split_layout() == "local"
    assert tiny_pacs_config(tmp_path / "whole").split_layout() is None  # a micro-batch holds whole groups


@pytest.mark.parametrize("P, GA, S, entropy_coef", [(4, 1, 3, 0.0), (2, 2, 6, 0.0), (1, 4, 12, 0.0), (1, 4, 12, 0.01)])
def test_logged_loss_is_the_steps_pacs_loss(tiny_model_dir, tmp_path, P, GA, S, entropy_coef):
    # The logged `loss` (and TRL's `policy_loss` with the entropy bonus on) is the optimizer step's PACS loss, on
    # whole groups and on the split path (which once divided it by gradient_accumulation_steps twice)
    _, _, trainer = train(
        tiny_model_dir, tmp_path, f"log{P}", per_device_train_batch_size=P, gradient_accumulation_steps=GA,
        steps_per_generation=S, max_steps=3, entropy_coef=entropy_coef, logging_steps=1,
    )  # fmt: skip
    assert trainer._pacs_split == (P < 4)
    logs = [e for e in trainer.state.log_history if "pacs/loss" in e]
    assert len(logs) == 3 and logs[-1]["pacs/psi_std"] > 1e-3  # off-policy steps included
    key = "policy_loss" if entropy_coef else "loss"
    assert [e[key] for e in logs] == pytest.approx([e["pacs/loss"] for e in logs], rel=1e-5)
    if entropy_coef:  # the logged loss then holds the bonus: it differs from the PACS loss
        assert all(e["loss"] < e["pacs/loss"] for e in logs)


def group_reward(uniform):
    """Odd-numbered prompts: `uniform` for every completion (1.0: a uniform group; None: unscored); even ones: 1.0
    for the first completion of the group and 0.0 for the others (a mixed group, whatever the text)."""

    def reward(completions, prompts, **kwargs):
        odd = [int(p.split()[2]) % 2 == 1 for p in prompts]  # "What is {i} + {3 * i}?"
        return [uniform if o else float(i % 4 == 0) for i, o in enumerate(odd)]

    reward.__name__ = "group_reward"
    return reward


@pytest.mark.parametrize("layout", [(8, 1, 3), (2, 4, 12)], ids=["whole", "split"])
def test_dropped_uniform_groups_train_as_if_unscored(tiny_model_dir, tmp_path, layout):
    # pacs_uniform_groups="drop" on uniform groups == the same groups left unscored (every row weight 0): the mixed
    # groups' gradient with the same normaliser, a uniform group's exactly 0; kept, uniform groups push off-policy
    P, GA, S = layout
    shared = dict(per_device_train_batch_size=P, gradient_accumulation_steps=GA, steps_per_generation=S, max_steps=3)
    dropped = train(tiny_model_dir, tmp_path, "drop", group_reward(1.0), pacs_uniform_groups="drop", **shared)
    unscored = train(tiny_model_dir, tmp_path, "unscored", group_reward(None), **shared)
    kept = train(tiny_model_dir, tmp_path, "keep", group_reward(1.0), **shared)
    assert dropped[2]._pacs_split == (P < 8)
    assert relative_gap(unscored, dropped) < 1e-6
    assert relative_gap(unscored, kept) > 1e-3
    logs = [e for e in dropped[2].state.log_history if "pacs/loss" in e]
    assert len(logs) == 3 and logs[-1]["pacs/psi_std"] > 1e-3  # off-policy steps included
    # logged when on only; with binary labels and every row scored, the uniform groups are the unmixed ones
    fracs = [e["pacs/uniform_groups_dropped_frac"] for e in logs]
    assert fracs == pytest.approx([1 - e["pacs/frac_mixed_groups"] for e in logs]) and 0 < max(fracs) < 1
    assert not any("pacs/uniform_groups_dropped_frac" in e for e in kept[2].state.log_history)
