"""PACS vs GRPO vs RLOO on a real pretrained model: SmolLM2-135M-Instruct + LoRA on the demo's arithmetic, on CPU.

    python -m benchmarks.smollm_compare.smollm_compare                    # 3 algorithms x seeds 0 1: ~40 CPU-min
    python -m benchmarks.smollm_compare.smollm_compare --seeds 0 1 2 3 4  # what smollm_compare.md ran (~1 h 45 min)
    python -m benchmarks.smollm_compare.smollm_compare --smoke            # the tiny test model, 2 steps (smoke test)
    python -m benchmarks.smollm_compare.smollm_compare --report-only      # redo smollm_compare.md from its JSON

Each run is exactly `pacs demo --algorithm <a> --seed <s>` (`pacs.demo.train_and_evaluate`): the same converted
model, training problems, held-out problems, LoRA, batch, learning rate, optimizer steps, steps per generation and
sampling seed; only the trainer differs (TRL's KL penalty off for all three). Steps:

1. Per seed, the untrained model's greedy held-out accuracy is measured once and shared by the three algorithms (it
   is the same model on the same problems with the same decoding).
2. Per (seed, algorithm), train and measure held-out accuracy again; the change comes with a paired 95% interval.
3. Per algorithm, from the run's log (one entry per optimizer step): for PACS the implicit critic on off-policy
   steps (`harness.critic_summary`: per-step medians of |sigma(psi) - 1/2|, the within-group ranking of psi), for
   all the fraction of steps where gradient clipping was active (TRL logs the norm before clipping).
4. Write smollm_compare.json to --out-dir; `smollm_compare_report.py` renders smollm_compare.md from it. Finished
   runs are kept in --work-dir and reused, so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmarks import harness
from benchmarks.smollm_compare import smollm_compare_report


HERE = Path(__file__).resolve().parent
ALGORITHMS = smollm_compare_report.ALGORITHMS


def demo_args(argv: list[str]) -> argparse.Namespace:
    """The demo's own settings, parsed by the demo's own parser, so that a run here is a `pacs demo` run."""
    from pacs import demo

    return demo.parse_args(argv)


def run_one(args, seed: int, algorithm: str, before: dict | None) -> dict:
    """One `pacs demo` run; its metrics, plus the critic (from the log) and clipping summaries."""
    from pacs import demo

    out = Path(args.work_dir) / f"{algorithm}-s{seed}"
    out.mkdir(parents=True, exist_ok=True)
    trainer = {"grpo": "trl_grpo", "rloo": "trl_rloo"}.get(algorithm, algorithm)  # `pacs demo`'s names: TRL's own
    dargs = demo_args(
        ["--algorithm", trainer, "--seed", str(seed), "--output-dir", str(out), "--threads", str(args.threads),
         *args.demo_args]
    )  # fmt: skip
    metrics = demo.train_and_evaluate(dargs, trainer, before=before, progress=False) | {"algorithm": algorithm}
    # TRL generates every steps_per_generation optimizer steps (the demo's gradient accumulation is 1)
    metrics["critic"] = harness.critic_summary(metrics["log_history"], dargs.steps_per_generation)
    metrics["clip_fraction"] = harness.clip_fraction(metrics["log_history"], 1.0)
    metrics["load_average_end"] = harness.load_average()
    (out / "demo_metrics.json").write_text(json.dumps(metrics, indent=1))
    return metrics


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out-dir", default=str(HERE))
    p.add_argument("--work-dir", default="/tmp/pacs-bench-smollm")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--algorithms", nargs="+", default=ALGORITHMS, choices=ALGORITHMS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--smoke", action="store_true", help="tiny fixture model from pacs.testing, 2 steps")
    p.add_argument("--report-only", dest="report_only", action="store_true")
    args, rest = p.parse_known_args(argv)
    args.demo_args = rest  # anything else goes to `pacs demo` (e.g. --max-steps 24)
    if args.smoke:
        from pacs.testing import build_tiny_model

        model = build_tiny_model(Path(args.work_dir) / "tiny-model")
        args.seeds, args.threads = [0], 1
        args.demo_args = ["--model", model, "--max-steps", "2", "--steps-per-generation", "2"]
        args.demo_args += ["--num-generations", "2", "--num-train", "8", "--num-eval", "6", "--eval-batch-size", "6"]
        args.demo_args += ["--max-completion-length", "6"]
    return args


def main(argv=None) -> dict:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw_path = out_dir / ("smollm_compare_smoke.json" if args.smoke else "smollm_compare.json")
    if args.report_only:
        raw = json.loads(raw_path.read_text())
    else:
        raw = {"info": harness.machine_info(), "argv": sys.argv if argv is None else ["x", *argv], "runs": []}
        for seed in args.seeds:  # seed-major: a partial run still compares the algorithms on the seeds it covers
            before = None
            for algorithm in args.algorithms:
                done = Path(args.work_dir) / f"{algorithm}-s{seed}" / "demo_metrics.json"
                if done.exists() and not args.smoke:
                    metrics = json.loads(done.read_text())
                    spg = metrics["settings"]["steps_per_generation"]  # the critic as this version summarises it
                    metrics["critic"] = harness.critic_summary(metrics["log_history"], spg)
                    print(f"[smollm] reusing {done}", flush=True)
                else:
                    t0 = time.perf_counter()
                    metrics = run_one(args, seed, algorithm, before)
                    print(
                        f"[smollm] {algorithm} seed {seed}: {metrics['before']['accuracy']:.3f} -> "
                        f"{metrics['after']['accuracy']:.3f} ({time.perf_counter() - t0:.0f}s, load "
                        f"{harness.load_average()})",
                        flush=True,
                    )
                before = before or metrics["before"]
                metrics.pop("log_history_full", None)
                raw["runs"].append(metrics)
                raw["info"]["load_average_end"] = harness.load_average()
                raw_path.write_text(json.dumps(raw, indent=1))
    smollm_compare_report.write(raw, out_dir, args.smoke)
    return raw


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
