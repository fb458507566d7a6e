"""Where PACS pays: accuracy per generated completion as each generation feeds more optimizer steps (CPU).

    nice -n 10 python -m benchmarks.reuse.reuse --jobs 2 --seeds 0 1 2 3 4 5 6 7   # what reuse.md ran: 113 runs,
                                                         # ~111 CPU-min, ~95 min on 2 shared cores
    python -m benchmarks.reuse.reuse --smoke                 # one tiny iteration (what tests/test_benchmarks.py runs)
    python -m benchmarks.reuse.reuse --report-only           # redo reuse.md / reuse.png from reuse.json
    python -m benchmarks.reuse.reuse --cached-only --seeds ...  # collect cached runs into reuse.json, run nothing

Same task, model and SFT warm start as `learning.py` (three-digit addition with a 32-token scratchpad, a 0.49M-parameter
Qwen3). Every run gets the same number of generated completions (`--completions`, 8 prompts x 8 per optimizer
step); what changes is how many optimizer steps each generation feeds. TRL has two knobs for that, and they differ:

- `steps_per_generation = k` (the axis here, k in `--reuse`): one generation of k x 64 completions is cut into k
  slices, one per optimizer step. Every completion is still used once, so at equal completions every k takes the same
  number of optimizer steps; k only makes generations k times rarer (and larger) and steps 2..k off-policy.
- `num_iterations = mu` (`--num-iterations-at`, with steps_per_generation 1): one generation of 64 completions is
  used for mu optimizer steps, each a full pass over it. At equal completions this takes mu times as many optimizer
  steps: it is the knob that reuses completions.

Steps:

1. The SFT checkpoint of `learning.py` (trained once, cached in the work dir).
2. Learning-rate pick: every (algorithm, k) cell is trained on seed 0 at the learning rates of a small grid around
   the rate `learning.py` picked for that algorithm (PICKED_LR, and `--lr-steps` half-decade steps from it); the
   cell's rate is the one with the best validation accuracy (mean of the last 3 evaluations); a pick at the edge of
   its grid also gets the next rate beyond that edge (`--lr-extend` rounds). The num_iterations mu
   cell takes the rate picked for k = mu (same optimizer steps per generation), so that only the knob differs.
3. Seeds `--seeds` on the test split at each cell's rate (the seed-0 run of step 2 is reused). Greedy test accuracy
   at fixed numbers of generated completions (`--eval-every-completions`), the same points for every cell.
4. Per cell: final test accuracy with a 95% t-interval, completions to a threshold, the share of optimizer steps whose
   gradient norm was clipped (and GRPO's/RLOO's share of importance-ratio-clipped tokens), and for PACS the critic
   (`harness.critic_summary`: |sigma(psi) - 1/2| on off-policy steps, the within-group ranking of psi). Paired by
   seed: PACS minus GRPO/RLOO per cell, and each algorithm's k=16 (and mu) minus its k=1.

Each finished run is cached as JSON in `--work-dir`/reuse_runs (keyed by every setting that changes it, the config's
keyword arguments included), so an interrupted or extended invocation redoes nothing; reuse.json collects them, and
`reuse_report.py` renders reuse.md and reuse.png from it. `--algorithms` (or `--configs`) takes any name of
`rl_runs.CONFIGS`, so a config added there (any PACSConfig keyword arguments) can be run here too; its learning-rate
grid is centred on PICKED_LR (1e-5 for a name not listed there).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

import torch

from benchmarks import _tasks, harness, rl_runs
from benchmarks.learning import learning_report
from benchmarks.reuse import reuse_report
from benchmarks.reuse.reuse_report import cells, pick_lrs


HERE = Path(__file__).resolve().parent
ALGORITHMS = ["PACS b=1 balanced", "GRPO", "RLOO"]  # names of rl_runs.CONFIGS
PICKED_LR = {"PACS b=1 balanced": 1e-5, "GRPO": 3e-5, "RLOO": 1e-5}  # learning.md: validation pick at k=4, 120 steps
LR_LADDER = [1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3]


def lr_grid(name: str, offsets: list[int]) -> list[float]:
    """The rates `offsets` half-decade steps away from PICKED_LR[name].

    >>> lr_grid("GRPO", [-1, 0, 1])
    [1e-05, 3e-05, 0.0001]
    """
    i = LR_LADDER.index(PICKED_LR.get(name, 1e-5))
    return [LR_LADDER[i + o] for o in offsets]


def run_settings(args, spg: int, mu: int) -> argparse.Namespace:
    """`args` as rl_runs.run_one reads them for one cell: the same completions, the cell's knob and step count."""
    rows = reuse_report.rows_per_step(args)
    return argparse.Namespace(
        **{
            **vars(args),
            "steps_per_generation": spg,
            "num_iterations": mu,
            "max_steps": mu * args.completions // rows,  # each completion feeds mu optimizer steps
            "eval_every": mu * args.eval_every_completions // rows,
            "work_dir": os.path.join(args.work_dir, f"k{spg}-mu{mu}"),
        }
    )


def run_key(args, name: str) -> dict:
    """Every setting that changes a run's result (not which runs are made, nor how they are reported)."""
    keys = ("hidden_size", "num_layers", "sft_lr", "sft_target", "sft_max_steps", "sft_batch_size", "threads")
    keys += ("num_generations", "prompts_per_step", "completions", "eval_every_completions")
    keys += ("warm_start",) if not args.smoke else ()
    return {**{k: getattr(args, k) for k in keys}, "config": rl_runs.CONFIGS[name]}


def run_tag(name: str, spg: int, mu: int, lr: float, seed: int) -> str:
    return f"{name.replace(' ', '_').replace('=', '')}-k{spg}-mu{mu}-lr{lr:g}-s{seed}"


def cache(args) -> harness.RunCache:
    return harness.RunCache(Path(args.work_dir) / "reuse_runs")


# 1. Runs, in this process or in a pool of workers (each builds the task once) --------------------------------------


def run_cell(args, spec) -> dict:
    """One (algorithm, steps_per_generation, num_iterations, lr, seed) run, cached as JSON in the work dir."""
    name, spg, mu, lr, seed = spec
    run = rl_runs.run_one(name, lr, seed, run_settings(args, spg, mu), _tasks.warm_start(args, _tasks.task(args))[0])
    run.update(steps_per_generation=spg, num_iterations=mu)
    return cache(args).put(run_tag(*spec), run_key(args, name), run)


def execute(args, specs: list[tuple], runs: list[dict], save) -> None:
    """Run the specs that are not cached yet (`args.jobs` at a time, costliest first); append every result to runs."""
    harness.run_missing(
        specs, lambda spec: cache(args).get(run_tag(*spec), run_key(args, spec[0])), functools.partial(run_cell, args),
        runs, save, args.jobs, args.cached_only, order=lambda spec: -spec[2],  # a mu run takes mu x the steps
    )  # fmt: skip


# 2. Main -----------------------------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out-dir", default=str(HERE), help="where reuse.{json,png,md} go")
    p.add_argument(
        "--work-dir", default="/tmp/pacs-bench-learning", help="SFT checkpoint, cached runs (shared with learning.py)"
    )
    p.add_argument("--algorithms", "--configs", dest="algorithms", nargs="+", default=ALGORITHMS, metavar="NAME",
                   choices=list(rl_runs.CONFIGS), help="names of rl_runs.CONFIGS; the first is compared")  # fmt: skip
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="the first one also picks the lr")
    p.add_argument("--reuse", nargs="+", type=int, default=[1, 4, 16], help="steps_per_generation values")
    p.add_argument("--num-iterations-at", dest="num_iterations_at", type=int, default=4, help="0: no such cell")
    p.add_argument(
        "--num-iterations-for",
        dest="num_iterations_for",
        nargs="+",
        default=ALGORITHMS,
        choices=list(rl_runs.CONFIGS),
    )
    p.add_argument("--lr-steps", dest="lr_steps", nargs="+", type=int, default=[-1, 0], help="grid: half-decade steps "
                   "from learning.md's pick (-1: a third of it)")  # fmt: skip
    p.add_argument("--lr-extend", dest="lr_extend", type=int, default=1, help="rounds of growing a grid past its edge")
    p.add_argument("--completions", type=int, default=4096, help="generated completions per run")
    p.add_argument("--eval-every-completions", dest="eval_every_completions", type=int, default=512)
    p.add_argument("--threshold", type=float, default=0.65, help="report completions to this test accuracy")
    p.add_argument(
        "--cached-only", dest="cached_only", action="store_true", help="run nothing: report the cached runs"
    )
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (worker processes, one torch thread each)")
    _tasks.add_task_args(p)
    p.add_argument("--report-only", dest="report_only", action="store_true", help="redo table/plot from the json")
    p.add_argument("--smoke", action="store_true", help="one tiny iteration: k 1 and 2, mu 2, 1 seed, 1 lr, 2 steps")
    args = p.parse_args(argv)
    if args.smoke:
        args.seeds, args.reuse, args.num_iterations_at, args.lr_steps, args.lr_extend = [0], [1, 2], 2, [0], 0
        args.jobs = 1
        args.completions, args.eval_every_completions, args.prompts_per_step, args.num_generations = 16, 8, 2, 4
        args.sft_max_steps, args.sft_target, args.hidden_size = 25, 1.0, 32
    rows = args.prompts_per_step * args.num_generations
    for k in args.reuse:
        if args.completions % (rows * k) or args.eval_every_completions % rows:
            p.error(
                f"--completions ({args.completions}) must be a multiple of {rows * k} (one generation at k={k}: "
                f"{args.prompts_per_step} prompts x {args.num_generations} x {k}), and --eval-every-completions "
                f"({args.eval_every_completions}) a multiple of {rows}"
            )
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    out_dir, work_dir = Path(args.out_dir), Path(args.work_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw_path = out_dir / ("reuse_smoke.json" if args.smoke else "reuse.json")
    if args.report_only:
        raw = learning_report.load_raw(raw_path, out_dir / "reuse_verdict.md")
        reuse_report.write(argparse.Namespace(**{**vars(args), **raw["args"], "smoke": args.smoke}), raw, out_dir)
        return raw
    torch.set_num_threads(args.threads)
    work_dir.mkdir(parents=True, exist_ok=True)
    t = _tasks.task(args)
    _, sft_meta = _tasks.warm_start(args, t)  # pinned (benchmarks/warm_starts/), sha256 checked
    info = harness.machine_info()  # with info["code"]: $PACS_BENCH_CODE or "this checkout"
    args.lr_center = {name: PICKED_LR.get(name, 1e-5) for name in args.algorithms}  # for the report
    runs: list[dict] = []
    command = " ".join(["python -m benchmarks.reuse.reuse", *sys.argv[1:]]) if argv is None else f"reuse.main({argv})"
    raw = {"info": info, "args": vars(args), "command": command, "sft": sft_meta, "warm_start": sft_meta, "runs": runs}

    def save():
        raw["info"]["load_average_end"] = harness.load_average()
        raw_path.write_text(json.dumps(raw, indent=1))

    # 2. lr pick on the first seed (validation accuracy), then 3. the other seeds at each cell's picked lr. A
    # num_iterations mu cell takes the lr picked for steps_per_generation mu (same optimizer steps per generation):
    # the comparison of the two knobs then differs in the knob alone, and mu x dearer runs skip the grid.
    t0 = time.perf_counter()
    gridded = [c for c in cells(args) if c[2] == 1 or c[2] not in args.reuse]
    grid = {c: lr_grid(c[0], args.lr_steps) for c in gridded}
    for extension in range(args.lr_extend + 1):
        execute(args, [(*c, lr, args.seeds[0]) for c, lrs in grid.items() for lr in lrs], runs, save)
        picked = pick_lrs(runs, args.seeds[0])
        if extension < args.lr_extend:  # a pick at the edge of its grid: also try the next rate beyond that edge
            for c, lrs in grid.items():
                i, step = LR_LADDER.index(picked[c]), (picked[c] == max(lrs)) - (picked[c] == min(lrs))
                if step and 0 <= i + step < len(LR_LADDER):
                    lrs.append(LR_LADDER[i + step])
    picked.update({(n, 1, mu): picked[n, mu, 1] for n, spg, mu in cells(args) if (n, spg, mu) not in gridded})
    print(f"[reuse] picked learning rates (validation, seed {args.seeds[0]}): {picked}", flush=True)
    for group in (gridded, [c for c in cells(args) if c not in gridded]):  # the mu x dearer runs last
        seeds = [s for s in args.seeds if group is not gridded or s != args.seeds[0]]
        execute(args, [(*c, picked[c], s) for c in group for s in seeds], runs, save)
    raw["info"]["wall_seconds"] = time.perf_counter() - t0
    save()
    reuse_report.write(args, raw, out_dir)
    return raw


if __name__ == "__main__":
    main()
