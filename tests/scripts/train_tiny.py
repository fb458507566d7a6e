"""Train PACS on the tiny model for a few steps and record what the loss saw; launched by tests/test_trainer.py.

PYTHONPATH=. accelerate launch --multi_gpu --num_processes 2 --cpu tests/scripts/train_tiny.py MODEL_DIR OUT_DIR
PYTHONPATH=. accelerate launch --config_file ZERO3_CPU.yaml tests/scripts/train_tiny.py MODEL_DIR OUT_DIR
"""

import json
import os
import sys

import torch
from datasets import Dataset

from pacs import PACSTrainer
from tests.tiny_config import tiny_pacs_config


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def flat_parameters(trainer) -> torch.Tensor:
    """All parameters as one vector (gathered first under DeepSpeed ZeRO-3, where each process holds a shard)."""
    params = list(trainer.model.parameters())
    if trainer.is_deepspeed_enabled or any(getattr(p, "ds_numel", None) for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params):
            return torch.cat([p.detach().flatten().clone() for p in params])
    return torch.cat([p.detach().flatten().clone() for p in params])


def train_and_record(trainer, out_dir: str) -> None:
    """Train, keeping what every micro-batch's loss saw; write rank<r>.json and params<r>.pt into `out_dir`."""
    seen, labels = [], []
    compute_loss = trainer._compute_loss

    def spy(model, inputs):
        seen.append(inputs["prompt_ids"].tolist())
        labels.append(inputs["pacs_labels"].tolist())
        return compute_loss(model, inputs)

    trainer._compute_loss = spy
    before = flat_parameters(trainer)
    trainer.train()
    after = flat_parameters(trainer)
    rank = trainer.accelerator.process_index
    record = {
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "split": trainer._pacs_split,
        "zero_stage": trainer.accelerator.state.deepspeed_plugin.zero_stage if trainer.is_deepspeed_enabled else None,
        "prompt_ids": seen,
        "labels": labels,
        "log_history": trainer.state.log_history,
        "finite_params": bool(torch.isfinite(after).all()),
        "update_norm": (after - before).norm().item(),
    }
    torch.save({"before": before, "after": after}, os.path.join(out_dir, f"params{rank}.pt"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def main(model_dir: str, out_dir: str, *overrides: str) -> None:
    """`overrides`: further PACSConfig settings as KEY=VALUE (integers parsed), e.g. pacs_anchor=reference."""
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(64)]})
    settings = {k: int(v) if v.isdigit() else v for k, v in (o.split("=", 1) for o in overrides)}
    args = tiny_pacs_config(out_dir, **{"steps_per_generation": 2, **settings})
    trainer = PACSTrainer(model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset)
    train_and_record(trainer, out_dir)


if __name__ == "__main__":
    main(*sys.argv[1:])
