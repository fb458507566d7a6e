"""Train PACS on the tiny model with a NaN loss at optimizer step 2 and record what the guard did; launched by
tests/test_guards.py (two CPU processes, or DeepSpeed ZeRO-3 on CPU).

PYTHONPATH=. accelerate launch --multi_gpu --num_processes 2 --cpu tests/scripts/train_guard.py MODEL_DIR OUT_DIR
PYTHONPATH=. accelerate launch --config_file ZERO3_CPU.yaml tests/scripts/train_guard.py MODEL_DIR OUT_DIR
"""

import json
import os
import sys

import torch
from datasets import Dataset
from transformers import TrainerCallback

from pacs import PACSTrainer
from pacs.grpo.guards import METRIC
from tests.tiny_config import tiny_pacs_config


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


class NaNAtStep(TrainerCallback):
    """NaN out the final norm's output in the forward passes with grad of optimizer step `nan_step` (0-based) on rank
    0 only (the other ranks' gradients are finite: the guard must skip on every rank together), and record the
    parameters (gathered under ZeRO-3) after every step."""

    def __init__(self, trainer, nan_step):
        self.trainer, self.nan_step, self.active = trainer, nan_step, False
        self.params = []
        trainer.model.model.norm.register_forward_hook(self.hook)

    def hook(self, module, inputs, output):
        return output * float("nan") if self.active and torch.is_grad_enabled() else output

    def on_step_begin(self, args, state, control, **kwargs):
        self.active = state.global_step == self.nan_step and self.trainer.accelerator.process_index == 0

    def on_step_end(self, args, state, control, **kwargs):
        self.active = False
        params = list(self.trainer.model.parameters())
        if self.trainer.is_deepspeed_enabled:
            import deepspeed

            with deepspeed.zero.GatheredParameters(params):
                self.params.append(torch.cat([p.detach().flatten().clone() for p in params]))
        else:
            self.params.append(torch.cat([p.detach().flatten().clone() for p in params]))


def main(model_dir: str, out_dir: str) -> None:
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(64)]})
    args = tiny_pacs_config(out_dir, steps_per_generation=2, max_steps=4)
    trainer = PACSTrainer(model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset)
    spy = NaNAtStep(trainer, nan_step=1)
    trainer.add_callback(spy)
    trainer.train()
    rank = trainer.accelerator.process_index
    p = spy.params
    record = {
        "rank": rank,
        "zero_stage": trainer.accelerator.state.deepspeed_plugin.zero_stage if trainer.is_deepspeed_enabled else None,
        "finite_params": bool(all(torch.isfinite(x).all() for x in p)),
        "nan_step_unchanged": bool(torch.equal(p[1], p[0])),
        "next_steps_changed": bool(not torch.equal(p[2], p[1]) and not torch.equal(p[3], p[2])),
        "skipped_steps": [entry[METRIC] for entry in trainer.state.log_history if METRIC in entry],
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
