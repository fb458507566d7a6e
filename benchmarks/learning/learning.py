"""Does PACS learn faster than GRPO, and is its critic doing anything? A tiny model, long completions, on a CPU.

    python -m benchmarks.learning.learning               # full run (lr grid + seeds), ~1 h on one shared CPU core
    python -m benchmarks.learning.learning --jobs 2      # the same, two runs at a time
    python -m benchmarks.learning.learning --configs GRPO "PACS b=1 balanced" --seeds 0 1 2  # some configs, some seeds
    python -m benchmarks.learning.learning --smoke       # one tiny iteration (what tests/test_benchmarks.py runs)
    python -m benchmarks.learning.learning --report-only  # redo learning.md / learning.png from learning.json

The task (`_tasks.py`) is three-digit addition answered with a worked scratchpad, one column at a time from the
right, then the answer: "347+586=" -> "7+6+0=13,4+8+1=13,3+5+1=09>0933" (31 characters + eos, one token per
character). The reward checks only the answer after ">" (like a math verifier), so PACS's reward proxy
r = beta * sum_t log-ratio sums ~32 tokens. Steps:

1. Draw disjoint problem sets: held-out test (500), validation (200, for picking the learning rate), SFT dev (200),
   SFT (3,000) and RL prompts (10,000).
2. Warm start: a randomly initialised Qwen3 (hidden 128, 2 layers) is trained by plain supervised learning on full
   scratchpads until its greedy dev accuracy first reaches `--sft-target`, then saved once; every RL run starts from it.
3. Learning-rate pick: every config of `--configs` (`rl_runs.COMPARED`: PACS beta 1 and 2 with balanced class
   weights, PACS beta 1 without class weights, GRPO, RLOO; TRL's KL off for all) is trained on seed 0 at each
   learning rate of `--lr-grid`; its learning rate is the one with the best validation accuracy (mean of the last 3
   evaluations). The test set plays no part.
4. Each config at its own learning rate on seeds `--seeds` (the seed-0 run of step 3 is reused); greedy test accuracy
   every `--eval-every` steps. Per seed the prompt order is the same for all configs (TRL's `RepeatSampler` is seeded
   by `args.seed` in all three trainers). Logged per optimizer step (`logging_steps=1`, kept in each run's
   `train_log`): reward, grad norm, TRL's token `entropy`, and PACSTrainer's critic metrics, summarised over the
   off-policy steps by `harness.critic_summary` (per-step medians of |sigma(psi) - 1/2|, the within-group ranking
   of psi in-sample and on each generation's first step, the Brier score on mixed groups); the share of steps where
   gradient clipping was active (pre-clip norm > 1).
5. Each finished run is cached as JSON in `--work-dir`/learning_runs (keyed by every setting that changes it,
   the config's own keyword arguments included), so a config or seed added later runs alone; learning.json collects
   the runs of this invocation, and `learning_report.py` renders learning.md and learning.png from it.

The configs, the trainers, one run and the run cache are `benchmarks/rl_runs.py` (the task studies share them); a
new config is one line in `rl_runs.CONFIGS`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from benchmarks import _tasks, harness, rl_runs
from benchmarks.learning import learning_report
from benchmarks.rl_runs import execute


HERE = Path(__file__).resolve().parent


# 3. Main (steps 1-2 and the runs: benchmarks/rl_runs.py) ---------------------------------------------------------


def main(argv=None) -> dict:
    args = rl_runs.parse_args(argv, __doc__.split("\n\n")[0])
    out_dir, work_dir = Path(args.out_dir or HERE), Path(args.work_dir)
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
    raw = {"info": harness.machine_info(), "args": vars(args), "argv": argv_, "sft": sft_meta, "runs": runs}
    raw["warm_start"] = sft_meta

    def save():
        raw["info"]["load_average_end"] = harness.load_average()
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
