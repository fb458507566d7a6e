"""Rows balanced by tokens (`pacs.grpo.balance`, `HardenedGRPOTrainer._balanced_step`): the partition, the regrouped
micro-batches, and that a balanced optimizer step has the unbalanced one's gradient (GRPO; PACS whole groups and split
path), in float32 with plain SGD, so the parameters after training are a function of the summed gradients alone."""

from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset

from pacs import PACSConfig, PACSTrainer
from pacs.grpo import HardenedGRPOConfig, HardenedGRPOTrainer
from pacs.grpo.balance import balance_micro_batches, balanced_partition, row_tokens


def lognormal_lengths(n, seed, mean=600.0, sigma=1.0, cap=4096):
    rng = np.random.default_rng(seed)
    return np.minimum(rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, n), cap).round() + 50


def test_partition_has_equal_counts_and_even_loads():
    worst, before = [], []
    for seed in range(50):  # the benchmark's setting: 8 rows per micro-batch, 4 micro-batches per step
        weights = lognormal_lengths(32, seed)
        bins = balanced_partition(weights.tolist(), 4)
        assert sorted(i for b in bins for i in b) == list(range(32)) and all(len(b) == 8 for b in bins)
        loads = [weights[b].sum() for b in bins]
        worst.append(max(loads) / np.mean(loads))
        fixed = weights.reshape(4, 8).sum(1)
        before.append(fixed.max() / fixed.mean())
    assert max(worst) <= 1.25 and np.median(worst) < np.median(before)
    assert balanced_partition(weights.tolist(), 4) == bins  # deterministic
    with pytest.raises(ValueError, match="equal count"):
        balanced_partition([1, 2, 3], 2)


def micro_batches(lengths, rows, width=12):
    batches = []
    for start in range(0, len(lengths), rows):
        chunk = lengths[start : start + rows]
        completion_mask = (torch.arange(width)[None] < torch.tensor(chunk)[:, None]).long()  # (B, T)
        batches.append({
            "prompt_ids": torch.arange(start, start + rows)[:, None].repeat(1, 3),  # (B, 3): the row number
            "prompt_mask": torch.ones(rows, 3, dtype=torch.long),
            "completion_ids": completion_mask * 7,
            "completion_mask": completion_mask,
            "advantages": torch.arange(start, start + rows).float(),
            "texts": [f"row{start + i}" for i in range(rows)],
            "num_items_in_batch": torch.tensor(99.0),
            "old_per_token_logps": None,
        })  # fmt: skip
    return batches


@pytest.mark.parametrize("unit", [1, 2])
def test_micro_batches_are_regrouped_whole(unit):
    lengths = [12, 12, 11, 12, 1, 1, 2, 1, 3, 2, 12, 11]  # 3 micro-batches of 4 rows; groups of 2: (0,1), (2,3), ...
    batches = micro_batches(lengths, rows=4)
    balanced = balance_micro_batches(batches, unit)
    assert len(balanced) == 3 and all(b["prompt_ids"].size(0) == 4 for b in balanced)
    loads = [int(row_tokens(b).sum()) for b in balanced]
    assert max(loads) < max(int(row_tokens(b).sum()) for b in batches)
    rows = torch.cat([b["prompt_ids"][:, 0] for b in balanced])
    assert sorted(rows.tolist()) == list(range(12))  # every row once
    for b in balanced:  # each row's columns moved together; lists too; scalars and None kept
        ids = b["prompt_ids"][:, 0]
        assert torch.equal(b["advantages"], ids.float()) and b["texts"] == [f"row{i}" for i in ids.tolist()]
        assert torch.equal(b["completion_mask"].sum(1), torch.tensor(lengths)[ids])
        assert b["num_items_in_batch"].item() == 99.0 and b["old_per_token_logps"] is None
        if unit == 2:  # whole groups, in order
            assert (ids.view(-1, 2)[:, 0] % 2 == 0).all() and (
                ids.view(-1, 2)[:, 1] - ids.view(-1, 2)[:, 0] == 1
            ).all()
    assert torch.equal(batches[0]["prompt_ids"][:, 0], torch.arange(4))  # the inputs are untouched
    with pytest.raises(ValueError, match="multiple of 3"):
        balance_micro_batches(batches, 3)


# ---------------------------------------------------------------------------------------------------------------------
# In the trainer: the balanced step's gradient is the fixed batches' one
# ---------------------------------------------------------------------------------------------------------------------


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


class FixedLengths:
    """Completions of very different lengths, a fixed function of (prompt, row): both runs see the same batch."""

    balanced_steps = 0

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations):
        tokenizer = self.processing_class
        letters = [tokenizer.convert_tokens_to_ids(c) for c in "abcdefgh"]
        completions = []
        for j, ids in enumerate(prompt_ids):
            gen = torch.Generator().manual_seed(sum(ids) * 1000 + j)
            length = int(torch.randint(1, 23, (1,), generator=gen)) if j % 3 else 1
            tokens = [letters[int(k)] for k in torch.randint(0, len(letters), (length,), generator=gen)]
            completions.append(tokens + [tokenizer.eos_token_id])
        return completions, None

    def _balanced_step(self, inputs):
        before = [row_tokens(b).sum().item() for b in self._optimizer_step_batches()[0]]
        inputs = super()._balanced_step(inputs)
        after = [row_tokens(b).sum().item() for b in self._optimizer_step_batches()[0]]
        self.balanced_steps += max(after) < max(before)  # the step was regrouped, and its heaviest got lighter
        return inputs


class Unbalanced:
    def _balance_unit(self):
        return None


class FixedGRPO(FixedLengths, HardenedGRPOTrainer):
    pass


class FixedPACS(FixedLengths, PACSTrainer):
    pass


class ForcedUnit:  # a mutation of `_balance_unit`: balance whatever the loss
    def _balance_unit(self):
        return 1


SETTINGS = dict(
    optim="sgd", learning_rate=0.2, lr_scheduler_type="constant", max_grad_norm=0.0, num_generations=4,
    max_completion_length=24, seed=1, gradient_accumulation_steps=4, max_steps=2,
)  # fmt: skip


def config(output_dir, grpo, **overrides):
    base = dict(output_dir=str(output_dir), use_cpu=True, bf16=False, logging_steps=1, save_strategy="no",
                report_to="none", padding_free=True)  # fmt: skip
    return (HardenedGRPOConfig if grpo else PACSConfig)(**{**base, **overrides})


def train(model_dir, tmp_path, trainer_cls, grpo, **overrides):
    args = config(tmp_path, grpo, **{**SETTINGS, **overrides})
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {3 * i}?" for i in range(64)]})
    trainer = trainer_cls(model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset)
    before = torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])
    trainer.train()
    after = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    return (after - before), trainer


CASES = {
    # rows anywhere; two optimizer steps per generation (the second off-policy)
    "grpo": (FixedGRPO, True, dict(per_device_train_batch_size=4, steps_per_generation=8)),
    "grpo_dr": (FixedGRPO, True, dict(per_device_train_batch_size=4, steps_per_generation=4, loss_type="dr_grpo")),
    # PACS whole groups: two groups per micro-batch, moved whole
    "pacs": (FixedPACS, False, dict(per_device_train_batch_size=8, steps_per_generation=8)),
    # PACS split path: groups cut by micro-batches, rows anywhere (their coefficients ride with them)
    "pacs_split": (FixedPACS, False, dict(per_device_train_batch_size=2, steps_per_generation=4, num_iterations=2)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_balanced_step_has_the_fixed_batches_gradient(tiny_model_dir, tmp_path, case):
    cls, grpo, overrides = CASES[case]
    unbalanced = type("Unbalanced" + cls.__name__, (Unbalanced, cls), {})
    reference, fixed = train(tiny_model_dir, tmp_path / "fixed", unbalanced, grpo, **overrides)
    update, balanced = train(tiny_model_dir, tmp_path / "balanced", cls, grpo, **overrides)
    assert fixed.balanced_steps == 0 and balanced.balanced_steps >= 1  # the grouping did change
    assert reference.norm() > 0
    assert ((update - reference).norm() / reference.norm()).item() < 1e-5


def test_partition_dependent_losses_keep_todays_grouping(tiny_model_dir, tmp_path):
    # bnpo normalises by each micro-batch's tokens: balanced anyway (a mutation), the gradient changes
    overrides = dict(per_device_train_batch_size=4, steps_per_generation=4, loss_type="bnpo")
    reference, _ = train(tiny_model_dir, tmp_path / "fixed", FixedGRPO, True, **overrides)
    forced = type("ForcedGRPO", (ForcedUnit, FixedGRPO), {})
    update, trainer = train(tiny_model_dir, tmp_path / "forced", forced, True, **overrides)
    assert trainer.balanced_steps >= 1
    assert ((update - reference).norm() / reference.norm()).item() > 1e-4
    # so the layer keeps today's grouping for it, and for the other losses that depend on the partition
    for name, settings in {
        "bnpo": dict(loss_type="bnpo"), "entropy quantile": dict(top_entropy_quantile=0.5),
        "entropy bonus": dict(entropy_coef=0.01), "padding": dict(),
    }.items():  # fmt: skip
        args = config(tmp_path / "x", True, per_device_train_batch_size=4, num_generations=4, **settings)
        args.padding_free = name != "padding"  # off: TRL's grouping, whatever the loss
        trainer = HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args,
                                      train_dataset=Dataset.from_dict({"prompt": ["a"] * 8}))  # fmt: skip
        assert trainer._balance_unit() is None, name
    args = config(tmp_path / "y", True, per_device_train_batch_size=4, num_generations=4)
    trainer = HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args,
                                  train_dataset=Dataset.from_dict({"prompt": ["a"] * 8}))  # fmt: skip
    assert trainer._balance_unit() == 1  # dapo: normalised by the generation batch's tokens
    trainer.aux_loss_enabled = True  # a mixture-of-experts model's load-balancing loss, per micro-batch
    assert trainer._balance_unit() is None


def test_resume_inside_a_generation_regroups_as_the_interrupted_run(tiny_model_dir, tmp_path):
    # 2 optimizer steps of 2 micro-batches per generation, a checkpoint after each: checkpoint-1 holds the buffered
    # rollout with step 1 regrouped and step 2 not yet; the resumed run regroups step 2 as the full run did
    settings = dict(SETTINGS, per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=4,
                    max_steps=3, save_strategy="steps", save_steps=1)  # fmt: skip
    full_update, full = train(tiny_model_dir, tmp_path / "full", FixedGRPO, True, **settings)
    assert full.balanced_steps >= 2
    args = config(tmp_path / "full", True, **settings)
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {3 * i}?" for i in range(64)]})
    resumed = FixedGRPO(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset)
    initial = torch.cat([p.detach().flatten().clone() for p in resumed.model.parameters()])
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-1"))
    update = torch.cat([p.detach().flatten() for p in resumed.model.parameters()]) - initial
    assert resumed.balanced_steps >= 1
    assert ((update - full_update).norm() / full_update.norm()).item() <= 1e-6


@pytest.mark.distributed
def test_zero3_on_two_processes_balanced_matches_the_padded_run(tiny_model_dir, tmp_path):
    # each process regroups its own rows (two whole groups per micro-batch, two micro-batches per step): the same
    # number of forwards and the same shapes on both, the step's gradient unchanged
    import json

    from tests.launching import ZERO3_CPU_ACCELERATE_CONFIG, accelerate_launch, run_launched

    (tmp_path / "zero3_cpu.yaml").write_text(ZERO3_CPU_ACCELERATE_CONFIG)
    script = Path(__file__).parent / "scripts" / "train_tiny.py"
    cmd = [*accelerate_launch(), "--config_file", str(tmp_path / "zero3_cpu.yaml"), "--num_processes", "2",
           str(script), tiny_model_dir]  # fmt: skip
    batch = ["per_device_train_batch_size=8", "gradient_accumulation_steps=2", "steps_per_generation=4",
             "max_completion_length=16", "max_steps=2"]  # fmt: skip
    params, seen = {}, {}
    for name, flag in (("off", "padding_free=0"), ("on", "padding_free=1")):
        (tmp_path / name).mkdir()
        run_launched([*cmd, str(tmp_path / name), flag, *batch], tmp_path)
        params[name] = torch.load(tmp_path / name / "params0.pt")
        seen[name] = [json.loads((tmp_path / name / f"rank{r}.json").read_text())["prompt_ids"] for r in range(2)]
    before, after = params["off"]["before"], params["off"]["after"]
    assert torch.equal(params["on"]["before"], before) and (after - before).norm() > 0
    assert ((params["on"]["after"] - after).norm() / (after - before).norm()).item() < 1e-3
    assert seen["on"] != seen["off"]  # the micro-batches were regrouped
    for rank in range(2):  # each optimizer step holds the same rows, regrouped
        for step in range(2):
            on, off = (sorted(map(tuple, sum(seen[k][rank][2 * step : 2 * step + 2], []))) for k in ("on", "off"))
            assert on == off
