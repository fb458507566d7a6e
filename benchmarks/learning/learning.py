"""Does PACS learn faster than GRPO, and is its critic doing anything? A tiny model, long completions, on a CPU.

    python benchmarks/learning/learning.py               # full run (lr grid + seeds), ~1 h on one shared CPU core
    python benchmarks/learning/learning.py --jobs 2      # the same, two runs at a time
    python benchmarks/learning/learning.py --configs GRPO "PACS b=1 balanced" --seeds 0 1 2  # some configs, some seeds
    python benchmarks/learning/learning.py --smoke       # one tiny iteration (what tests/test_benchmarks.py runs)
    python benchmarks/learning/learning.py --report-only  # redo learning.md / learning.png from learning.json

The task (`_tasks.py`) is three-digit addition answered with a worked scratchpad, one column at a time from the
right, then the answer: "347+586=" -> "7+6+0=13,4+8+1=13,3+5+1=09>0933" (31 characters + eos, one token per
character). The reward checks only the answer after ">" (like a math verifier), so PACS's reward proxy
r = beta * sum_t log-ratio sums ~32 tokens. Steps:

1. Draw disjoint problem sets: held-out test (500), validation (200, for picking the learning rate), SFT dev (200),
   SFT (3,000) and RL prompts (10,000).
2. Warm start: a randomly initialised Qwen3 (hidden 128, 2 layers) is trained by plain supervised learning on full
   scratchpads until its greedy dev accuracy first reaches `--sft-target`, then saved once; every RL run starts from it.
3. Learning-rate pick: every config of `--configs` (CONFIGS below: PACS beta 1 and 2 with balanced class weights, PACS
   beta 1 without class weights, GRPO, RLOO; TRL's KL off for all) is trained on seed 0 at each learning rate of
   `--lr-grid`; its learning rate is the one with the best validation accuracy (mean of the last 3 evaluations). The
   test set plays no part.
4. Each config at its own learning rate on seeds `--seeds` (the seed-0 run of step 3 is reused); greedy test accuracy
   every `--eval-every` steps. Per seed the prompt order is the same for all configs (TRL's `RepeatSampler` is seeded
   by `args.seed` in all three trainers). Logged per optimizer step (`logging_steps=1`, kept in each run's
   `train_log`): reward, grad norm, TRL's token `entropy`, and PACSTrainer's critic metrics, summarised over the
   off-policy steps by `_common.critic_summary` (per-step medians of |sigma(psi) - 1/2|, the within-group ranking
   of psi in-sample and on each generation's first step, the Brier score on mixed groups); the share of steps where
   gradient clipping was active (pre-clip norm > 1).
5. Each finished run is cached as JSON in `--work-dir`/learning_runs (keyed by every setting that changes it,
   the config's own keyword arguments included), so a config or seed added later runs alone; learning.json collects
   the runs of this invocation, and `learning_report.py` renders learning.md and learning.png from it.

A new config is one line in CONFIGS: a name, the trainer family ("pacs", "grpo", "rloo") and the config's keyword
arguments (any PACSConfig / GRPOConfig / RLOOConfig field), e.g.
`"PACS ref reset 4": ("pacs", {"pacs_anchor": "reference", "pacs_reference_reset_generations": 4})`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _common, report, _tasks

import _common  # sets the offline environment before transformers is imported
import _tasks
import learning_report
import torch


HERE = Path(__file__).resolve().parent

CONFIGS = {
    # name: (trainer family, config keyword arguments; they override the shared settings of `make_trainer`)
    "PACS b=1 balanced": ("pacs", {"pacs_beta": 1.0, "pacs_class_weight": "balanced"}),
    "PACS b=2 balanced": ("pacs", {"pacs_beta": 2.0, "pacs_class_weight": "balanced"}),
    "PACS b=1 no weights": ("pacs", {"pacs_beta": 1.0, "pacs_class_weight": "none"}),
    "GRPO": ("grpo", {}),
    "RLOO": ("rloo", {}),
}
RATIO_CLIP = "clip_ratio/region_mean"  # GRPO's and RLOO's share of tokens whose importance ratio was clipped
# per-step log keys kept in a run's train_log (entropy: TRL's token entropy, for a curve over training)
TRAIN_LOG_KEYS = ("step", "grad_norm", "reward", "entropy", RATIO_CLIP, *_common.CRITIC_KEYS, "pacs/proxy_abs_mean")


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
    critic = _common.critic_summary(log, args.steps_per_generation * args.num_iterations)
    clip = _common.clip_fraction(log, 1.0)
    print(
        f"[rl] {name:20s} lr {lr:g} seed {seed}: val {curve[0][1]:.3f} -> {curve[-1][1]:.3f}, test "
        f"{curve[0][2]:.3f} -> {curve[-1][2]:.3f}, clip {clip:.0%}"
        + (f", |s(psi)-.5| step-median q50 {critic['critic_margin_step_q10_q50_q90'][1]:.3f}" if critic else "")
        + f" in {seconds:.0f}s (cpu {cpu:.0f}s, load {_common.load_average()})",
        flush=True,
    )
    return {
        "config": name,
        "lr": lr,
        "seed": seed,
        "curve": curve,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "load": _common.load_average(),
        "critic": critic,
        "clip_fraction": clip,
        "psi_std": [v for _, v in _common.per_step(log, "pacs/psi_std")],
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


def cache(args) -> _common.RunCache:
    return _common.RunCache(Path(args.work_dir) / "learning_runs")


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
    _common.run_missing(
        specs, partial(cached, args), partial(run_cached, args), runs, save, args.jobs, args.cached_only
    )


# 3. Main ----------------------------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out-dir", default=str(HERE), help="where learning.{json,png,md} go")
    p.add_argument("--work-dir", default="/tmp/pacs-bench-learning", help="SFT checkpoint, cached runs, outputs")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS), metavar="NAME",
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
    """A study's own options (`p`, which has `--smoke`) and, from what is left, this script's task and RL options:
    `(merged, own)`, where `merged` holds both (the study's value wins where both name an option)."""
    args, rest = p.parse_known_args(argv)
    merged = parse_args(rest + (["--smoke"] if args.smoke else []))
    for k, v in vars(args).items():
        setattr(merged, k, v)
    return merged, args


def main(argv=None) -> dict:
    args = parse_args(argv)
    out_dir, work_dir = Path(args.out_dir), Path(args.work_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw_path = out_dir / ("learning_smoke.json" if args.smoke else "learning.json")
    if args.report_only:
        raw = learning_report.load_raw(raw_path, out_dir / "learning_verdict.md")
        raw["args"]["thresholds"] = args.thresholds  # a report choice, not a run setting
        learning_report.write(raw, out_dir, args.smoke)
        return raw
    torch.set_num_threads(args.threads)
    work_dir.mkdir(parents=True, exist_ok=True)
    t = _tasks.task(args)
    _, sft_meta = _tasks.warm_start(args, t)  # pinned (benchmarks/warm_starts/), sha256 checked
    runs: list[dict] = []
    argv_ = sys.argv if argv is None else ["benchmarks/learning/learning.py", *argv]
    raw = {"info": _common.machine_info(), "args": vars(args), "argv": argv_, "sft": sft_meta, "runs": runs}
    raw["warm_start"] = sft_meta

    def save():
        raw["info"]["load_average_end"] = _common.load_average()
        raw_path.write_text(json.dumps(raw, indent=1))

    # 3. lr pick on the first seed (validation accuracy), then 4. the other seeds at each config's picked lr
    execute(args, [(name, lr, args.seeds[0]) for lr in args.lr_grid for name in args.configs], runs, save)
    picked = learning_report.pick_lrs(runs, args.seeds[0], args.configs)
    print(f"[rl] picked learning rates (validation, seed {args.seeds[0]}): {picked}", flush=True)
    execute(
        args, [(name, picked[name], s) for s in args.seeds[1:] for name in args.configs if name in picked], runs, save
    )
    save()
    learning_report.write(raw, out_dir, args.smoke)
    return raw


if __name__ == "__main__":
    main()
