"""The RL runs the task studies share (learning, reuse, anchor, sparsity, filtering, gradient_term, dynamic_sampling):
the named configs (`CONFIGS`: trainer family and config keyword arguments), the trainer exactly as a user builds it
(`make_trainer`), one run from the warm start with its evaluations (`run_one`), runs cached one JSON each and run
`--jobs` at a time (`execute`), and the task and RL options (`parse_args`; `parse_study_args` for a study's own options
on top). Not run on its own; `learning/learning.py` is the study that compares the configs.

A new config is one line in CONFIGS: a name, the trainer family ("pacs", "grpo", "hardened_grpo", "rloo") and the
config's keyword arguments (any PACSConfig / GRPOConfig / RLOOConfig field), e.g.
`"PACS ref reset 4": ("pacs", {"pacs_anchor": "reference", "pacs_reference_reset_generations": 4})`.
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from pathlib import Path

from benchmarks import _tasks, harness


CONFIGS = {
    # name: (trainer family, config keyword arguments; they override the shared settings of `make_trainer`)
    "PACS b=1 balanced": ("pacs", {"pacs_beta": 1.0, "pacs_class_weight": "balanced"}),
    "PACS b=2 balanced": ("pacs", {"pacs_beta": 2.0, "pacs_class_weight": "balanced"}),
    "PACS b=1 no weights": ("pacs", {"pacs_beta": 1.0, "pacs_class_weight": "none"}),
    "GRPO": ("grpo", {}),
    "RLOO": ("rloo", {}),
}
COMPARED = tuple(CONFIGS)  # the learning study's configs; the other studies add theirs to CONFIGS when they run
RATIO_CLIP = "clip_ratio/region_mean"  # GRPO's and RLOO's share of tokens whose importance ratio was clipped
# per-step log keys kept in a run's train_log (entropy: TRL's token entropy, for a curve over training)
TRAIN_LOG_KEYS = ("step", "grad_norm", "reward", "entropy", RATIO_CLIP, *harness.CRITIC_KEYS, "pacs/proxy_abs_mean")


# 1. One RL run ----------------------------------------------------------------------------------------------------


def make_trainer(name: str, lr: float, args, model_path: str, train_dataset, seed: int, out: str, reward=None):
    """The trainer exactly as a user would build it; all three share every setting except the algorithm and lr.
    `reward`: the reward function (default `_tasks.answer_reward`; a study may wrap it to record what it sees)."""
    family, extra = CONFIGS[name]
    common = dict(
        output_dir=out,
        seed=seed,
        use_cpu=True,
        bf16=False,
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=args.max_steps,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        gradient_accumulation_steps=1,
        steps_per_generation=args.steps_per_generation,  # GA is 1: each step takes the next slice of a generation
        num_iterations=args.num_iterations,  # passes over each generation batch (TRL's mu)
        max_completion_length=_tasks.COMPLETION_TOKENS,
        temperature=1.0,
        beta=0.0,  # no KL / reference model for any of the three
        shuffle_dataset=True,
        logging_steps=1,  # one log entry per optimizer step: grad norm, entropy, the critic's per-step metrics
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    if family == "pacs":
        from pacs import PACSConfig as Config
        from pacs import PACSTrainer as Trainer
    elif family == "grpo":
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer
    elif family == "hardened_grpo":  # TRL's GRPO through pacs's GRPO layer (bit-identical to it; dynamic sampling)
        from pacs.grpo import HardenedGRPOConfig as Config
        from pacs.grpo import HardenedGRPOTrainer as Trainer
    elif family == "rloo":
        from trl import RLOOConfig as Config
        from trl import RLOOTrainer as Trainer
    else:
        raise ValueError(
            f"config {name!r}: unknown trainer family {family!r}; use 'pacs', 'grpo', 'hardened_grpo' or 'rloo'"
        )
    config = Config(**{**common, **extra})
    return Trainer(
        model=model_path, reward_funcs=reward or _tasks.answer_reward, args=config, train_dataset=train_dataset,
        processing_class=_tasks.task(args)["tokenizer"],
    )  # fmt: skip


def run_one(name: str, lr: float, seed: int, args, model_path: str) -> dict:
    """Train `name` at `lr` on `seed` from the SFT checkpoint; evaluate every `args.eval_every` steps; summarise."""
    from transformers import PrinterCallback

    t = _tasks.task(args)
    curve: list[tuple[int, float, float]] = []  # (step, validation acc, test acc)

    tag = f"{name.replace(' ', '_').replace('=', '')}-lr{lr:g}-s{seed}"
    trainer = make_trainer(name, lr, args, model_path, t["train"], seed, os.path.join(args.work_dir, "runs", tag))
    trainer.remove_callback(PrinterCallback)  # keep stdout to one line per run
    trainer.add_callback(_tasks.eval_callback(args, curve))
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    log = [e for e in trainer.state.log_history if "train_runtime" not in e]
    # TRL generates every steps_per_generation * num_iterations optimizer steps (GA is 1); the others are off-policy
    critic = harness.critic_summary(log, args.steps_per_generation * args.num_iterations)
    clip = harness.clip_fraction(log, 1.0)
    print(
        f"[rl] {name:20s} lr {lr:g} seed {seed}: val {curve[0][1]:.3f} -> {curve[-1][1]:.3f}, test "
        f"{curve[0][2]:.3f} -> {curve[-1][2]:.3f}, clip {clip:.0%}"
        + (f", |s(psi)-.5| step-median q50 {critic['critic_margin_step_q10_q50_q90'][1]:.3f}" if critic else "")
        + f" in {seconds:.0f}s (cpu {cpu:.0f}s, load {harness.load_average()})",
        flush=True,
    )
    return {
        "config": name,
        "lr": lr,
        "seed": seed,
        "curve": curve,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "load": harness.load_average(),
        "critic": critic,
        "clip_fraction": clip,
        "psi_std": [v for _, v in harness.per_step(log, "pacs/psi_std")],
        "train_log": [{k: v for k, v in e.items() if k in TRAIN_LOG_KEYS} for e in log],
    }


# 2. Many runs: cached one JSON per run, `--jobs` at a time ----------------------------------------------------------


def run_key(args, name: str) -> dict:
    """Every setting that changes a run's result (not which runs are made, nor how they are reported)."""
    keys = ("hidden_size", "num_layers", "sft_lr", "sft_target", "sft_max_steps", "sft_batch_size", "threads")
    keys += ("num_generations", "prompts_per_step", "max_steps", "steps_per_generation", "num_iterations")
    keys += ("warm_start",) if not args.smoke else ()
    return {**{k: getattr(args, k) for k in keys}, "eval_every": args.eval_every, "config": CONFIGS[name]}


def run_tag(name: str, lr: float, seed: int) -> str:
    return f"{name.replace(' ', '_').replace('=', '')}-lr{lr:g}-s{seed}"


def cache(args) -> harness.RunCache:
    return harness.RunCache(Path(args.work_dir) / "learning_runs")


def run_cached(args, spec: tuple[str, float, int]) -> dict:
    """One (config, lr, seed) run, stored in the cache; in a pool worker, the task is built once per process."""
    name, lr, seed = spec
    run = run_one(name, lr, seed, args, _tasks.warm_start(args, _tasks.task(args))[0])
    return cache(args).put(run_tag(*spec), run_key(args, name), run)


def cached(args, spec: tuple[str, float, int]) -> dict | None:
    return cache(args).get(run_tag(*spec), run_key(args, spec[0]))


def execute(args, specs: list[tuple], runs: list[dict], save) -> None:
    """Add every spec's run to `runs`: from the cache, else run (`args.jobs` at a time), saving after each."""
    partial = functools.partial
    harness.run_missing(
        specs, partial(cached, args), partial(run_cached, args), runs, save, args.jobs, args.cached_only
    )


# 3. Options -------------------------------------------------------------------------------------------------------


def parse_args(argv, description: str | None = None):
    """The task and RL options of the task studies (learning.py's command line; `description`: its help's heading)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out-dir", help="where the results go (default: the study's folder, e.g. learning/)")
    p.add_argument("--work-dir", default="/tmp/pacs-bench-learning", help="SFT checkpoint, cached runs, outputs")
    p.add_argument("--configs", nargs="+", default=list(COMPARED), choices=list(CONFIGS), metavar="NAME",
                   help=f"configs to run, of: {', '.join(map(repr, CONFIGS))}")  # fmt: skip
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4], help="the first one also picks the lr")
    p.add_argument("--lr-grid", dest="lr_grid", nargs="+", type=float, default=[3e-6, 1e-5, 3e-5, 1e-4, 3e-4])
    _tasks.add_task_args(p)
    p.add_argument("--max-steps", dest="max_steps", type=int, default=120, help="RL optimizer steps per run")
    p.add_argument("--steps-per-generation", dest="steps_per_generation", type=int, default=4)
    p.add_argument("--num-iterations", dest="num_iterations", type=int, default=1, help="TRL's passes per generation")
    p.add_argument("--eval-every", dest="eval_every", type=int, default=20)
    p.add_argument("--thresholds", nargs="+", type=float, default=[0.6, 0.65])
    p.add_argument(
        "--jobs", type=int, default=1, help="runs at a time (worker processes, --threads torch threads each)"
    )
    p.add_argument("--cached-only", dest="cached_only", action="store_true", help="run nothing: collect cached runs")
    p.add_argument("--report-only", dest="report_only", action="store_true", help="redo table/plot from the json")
    p.add_argument("--smoke", action="store_true", help="one tiny iteration: 1 seed, 1 lr, 2 RL steps, 25 SFT steps")
    args = p.parse_args(argv)
    if args.smoke:
        args.seeds, args.lr_grid, args.max_steps, args.eval_every, args.steps_per_generation = [0], [1e-4], 2, 1, 2
        args.sft_max_steps, args.sft_target, args.hidden_size = 25, 1.0, 32
    return args


def parse_study_args(p: argparse.ArgumentParser, argv) -> tuple[argparse.Namespace, argparse.Namespace]:
    """A study's own options (`p`, which has `--smoke`) and, from what is left, the task and RL options of `parse_args`:
    `(merged, own)`, where `merged` holds both (the study's value wins where both name an option)."""
    args, rest = p.parse_known_args(argv)
    merged = parse_args(rest + (["--smoke"] if args.smoke else []))
    for k, v in vars(args).items():
        setattr(merged, k, v)
    return merged, args
