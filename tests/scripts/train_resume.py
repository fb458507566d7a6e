"""Train PACS on the tiny model saving every step, then resume from chosen checkpoints; launched by
tests/test_checkpoints.py (which also calls `resume_runs` in-process).

PYTHONPATH=. python tests/scripts/train_resume.py MODEL_DIR OUT_DIR P GA S ITERATIONS MAX_STEPS K [K ...]
PYTHONPATH=. accelerate launch --multi_gpu --num_processes 2 --cpu tests/scripts/train_resume.py MODEL_DIR OUT_DIR 1 2 4 1 4 1 3
PYTHONPATH=. accelerate launch --config_file ZERO3_CPU.yaml tests/scripts/train_resume.py MODEL_DIR OUT_DIR 4 1 4 1 4 2 --lora
PYTHONPATH=. accelerate launch --multi_gpu --num_processes 2 --cpu tests/scripts/train_resume.py MODEL_DIR OUT_DIR 2 2 4 1 4 1 2 3 \
    --dynamic-sampling
PYTHONPATH=. accelerate launch --config_file ZERO3_CPU_2.yaml tests/scripts/train_resume.py MODEL_DIR OUT_DIR 2 2 4 1 4 1 2 \
    --dynamic-sampling   # ZeRO-3 on 2 processes (tests/test_dynamic_sampling_paths.py)
accelerate launch --multi_gpu --num_processes 2 --cpu tests/scripts/train_resume.py MODEL_DIR OUT_DIR 2 2 4 1 12 5 9 \
    --prompts 8   # 8 prompts: an epoch is 4 optimizer steps, so 5 and 9 resume inside epochs 2 and 3

With `--dynamic-sampling`: `dynamic_sampling=True` on prompts of which only every third can be solved (`hard_reward`), so
that generation batches need top-up rounds; the record then has each run's `pacs/ds/rounds`.

`--prompts N`: a training set of N prompts (64 by default), so that a run of a few steps lasts several epochs.

Completions are sampled (the tiny model, temperature 1), so a resumed run matches the uninterrupted one only if it
continues the saved generation batch and the RNG exactly. Writes `resume<rank>.json`: the relative distance of each
resumed run's final parameters to the uninterrupted run's, at which optimizer steps each run generated, which prompts
each generation drew, and each run's logged metrics (`log_history` without its timings).
"""

import json
import os
import sys

import torch
from datasets import Dataset

from pacs import PACSTrainer
from tests.scripts.train_tiny import flat_parameters, parity_reward
from tests.tiny_config import tiny_pacs_config


def hard_reward(prompts, completions, **kwargs):
    """Only prompts marked "mixed" can be solved (by odd-length completions): the others make uniform groups."""
    return [float("mixed" in p and len(c) % 2 == 1) for p, c in zip(prompts, completions, strict=True)]


TIMING_KEYS = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


def _train(model_dir, out_dir, numbers, resume=None, lora=False, prompts=64, **overrides):
    per_device, grad_accum, steps_per_generation, iterations, max_steps = numbers
    settings = dict(
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=grad_accum,
        steps_per_generation=steps_per_generation,
        num_iterations=iterations,
        max_steps=max_steps,
        optim="sgd",
        learning_rate=0.1,
        lr_scheduler_type="linear",  # the scheduler's state must come back too
        seed=3,
    )
    args = tiny_pacs_config(out_dir, **{**settings, **overrides})
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(prompts)]})
    reward = parity_reward
    if args.dynamic_sampling:
        dataset = Dataset.from_dict({"prompt": [f"Q{i} {'mixed' if i % 3 == 0 else 'hard'}?" for i in range(prompts)]})
        reward = hard_reward
    trainer = PACSTrainer(
        model=model_dir, reward_funcs=reward, args=args, train_dataset=dataset, peft_config=peft_config
    )
    generated_at = []  # (optimizer step, the prompts drawn) at each generation
    generate = trainer._generate_and_score_completions

    def counting(inputs):
        generated_at.append((trainer.state.global_step, sorted({row["prompt"] for row in inputs})))
        return generate(inputs)

    trainer._generate_and_score_completions = counting
    before = flat_parameters(trainer)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, before, flat_parameters(trainer), generated_at


def _logged(trainer, after_step: int = 0) -> list[dict]:
    """The run's `log_history` past optimizer step `after_step`, without its timings."""
    history = [e for e in trainer.state.log_history if e.get("step", 0) > after_step]
    return [{k: v for k, v in e.items() if k not in TIMING_KEYS} for e in history]


def resume_runs(model_dir, out_dir, numbers, resume_steps, lora=False, prompts=64, **overrides) -> dict:
    """The uninterrupted run (saving a checkpoint every step), then one resumed run per step in `resume_steps`;
    `prompts`: the training set's size; `overrides` are further `PACSConfig` settings of every run."""
    full_dir = os.path.join(out_dir, "full")
    trainer, before, after, generations = _train(
        model_dir, full_dir, numbers, lora=lora, prompts=prompts, save_strategy="steps", save_steps=1, **overrides
    )
    update = (after - before).norm().item()
    record = {"rank": trainer.accelerator.process_index, "update_norm": update}
    record["generated_at"] = [step for step, _ in generations]
    record["prompts_at"] = {step: drawn for step, drawn in generations}
    record["epoch"] = trainer.state.epoch
    record["logged"] = _logged(trainer)
    plugin = trainer.accelerator.state.deepspeed_plugin
    record["zero_stage"] = plugin.zero_stage if plugin is not None else None
    record["ds_rounds"] = [e["pacs/ds/rounds"] for e in trainer.state.log_history if "pacs/ds/rounds" in e]
    record["checkpoints"] = sorted(os.listdir(full_dir))
    record["resumed"] = {}
    for k in resume_steps:
        checkpoint = os.path.join(full_dir, f"checkpoint-{k}")
        resumed_trainer, _, resumed, resumed_generations = _train(
            model_dir, os.path.join(out_dir, f"resumed-{k}"), numbers, resume=checkpoint, lora=lora, prompts=prompts,
            **overrides,
        )  # fmt: skip
        record["resumed"][k] = {
            "relative_difference": ((resumed - after).norm() / max(update, 1e-30)).item(),
            "generated_at": [step for step, _ in resumed_generations],
            "prompts_at": {step: drawn for step, drawn in resumed_generations},
            "rollout_saved": os.path.isdir(os.path.join(checkpoint, "pacs_rollout")),
            "logged": _logged(resumed_trainer, k),
        }
    return record


if __name__ == "__main__":
    model_dir, out_dir, *rest = sys.argv[1:]
    lora = "--lora" in rest
    overrides = {"dynamic_sampling": True, "max_completion_length": 6} if "--dynamic-sampling" in rest else {}
    prompts = int(rest[rest.index("--prompts") + 1]) if "--prompts" in rest else 64
    if "--prompts" in rest:
        del rest[rest.index("--prompts") : rest.index("--prompts") + 2]
    values = [int(x) for x in rest if not x.startswith("--")]
    result = resume_runs(model_dir, out_dir, values[:5], values[5:], lora=lora, prompts=prompts, **overrides)
    with open(os.path.join(out_dir, f"resume{result['rank']}.json"), "w") as f:
        json.dump(result, f)
    torch.distributed.barrier() if torch.distributed.is_initialized() else None
