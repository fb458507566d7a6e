"""PACS vs GRPO vs RLOO on a real pretrained model: SmolLM2-135M-Instruct + LoRA on the demo's arithmetic, on CPU.

    python benchmarks/smollm_compare.py                       # 3 algorithms x seeds 0 1: ~40 min of CPU, 1 thread
    python benchmarks/smollm_compare.py --seeds 0 1 2 3 4     # what results/smollm_compare.md reports (~1 h 45 min)
    python benchmarks/smollm_compare.py --smoke               # the tiny test model, 2 steps (tests/test_benchmarks.py)
    python benchmarks/smollm_compare.py --report-only         # redo smollm_compare.md from smollm_compare.json

Each run is exactly `pacs demo --algorithm <a> --seed <s>` (`pacs.demo.train_and_evaluate`): the same converted
model, training problems, held-out problems, LoRA, batch, learning rate, optimizer steps, steps per generation and
sampling seed; only the trainer differs (TRL's KL penalty off for all three). Steps:

1. Per seed, the untrained model's greedy held-out accuracy is measured once and shared by the three algorithms (it
   is the same model on the same problems with the same decoding).
2. Per (seed, algorithm), train and measure held-out accuracy again; the change comes with a paired 95% interval.
3. Per algorithm, record what the issue asks: for PACS the distribution of |sigma(psi) - 1/2| and the implicit
   critic's accuracy on off-policy steps (`_common.recording`), for all the fraction of steps where gradient
   clipping was active (TRL logs the norm before clipping).
4. Write smollm_compare.{json,md} to --out-dir. Finished runs are kept in --work-dir and reused, so an interrupted
   run resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import _common  # sets the offline environment before transformers is imported


HERE = Path(__file__).resolve().parent
ALGORITHMS = ["pacs", "grpo", "rloo"]
NAMES = {"pacs": "PACS (β=1, balanced)", "grpo": "GRPO", "rloo": "RLOO"}


def demo_args(argv: list[str]) -> argparse.Namespace:
    """The demo's own settings, parsed by the demo's own parser, so that a run here is a `pacs demo` run."""
    from pacs import demo

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    demo.add_parser(sub)
    return parser.parse_args(["demo", *argv])


def trainer_class(algorithm: str):
    if algorithm == "pacs":
        from pacs import PACSTrainer as cls
    elif algorithm == "grpo":
        from trl import GRPOTrainer as cls
    else:
        from trl import RLOOTrainer as cls
    return _common.recording(cls)


def run_one(args, seed: int, algorithm: str, before: dict | None) -> dict:
    """One `pacs demo` run (with a recording trainer); its metrics, plus critic and clipping summaries."""
    from pacs import demo

    out = Path(args.work_dir) / f"{algorithm}-s{seed}"
    out.mkdir(parents=True, exist_ok=True)
    dargs = demo_args(
        [
            "--algorithm",
            algorithm,
            "--seed",
            str(seed),
            "--output-dir",
            str(out),
            "--threads",
            str(args.threads),
            *args.demo_args,
        ]
    )
    cls = trainer_class(algorithm)
    records: list[dict] = []

    class Keep(cls):  # hands the records out even though train_and_evaluate drops the trainer
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.critic_records = records

    metrics = demo.train_and_evaluate(dargs, algorithm, before=before, trainer_cls=Keep, progress=False)
    metrics["critic"] = _common.critic_summary_pooled(records, dargs.steps_per_generation)
    metrics["clip_fraction"] = _common.clip_fraction(metrics["log_history"], 1.0)
    metrics["load_average_end"] = _common.load_average()
    (out / "demo_metrics.json").write_text(json.dumps(metrics, indent=1))
    return metrics


def t_interval(xs) -> str:
    """mean [95% t-interval] of per-seed differences, in percentage points."""
    if len(xs) < 2:
        return f"{xs[0]:+.1%}" if xs else "—"
    t = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571}.get(len(xs), 2.0)
    m, sd = statistics.mean(xs), statistics.stdev(xs)
    half = t * sd / math.sqrt(len(xs))
    return f"{m:+.1%} [{m - half:+.1%}, {m + half:+.1%}]"


def summarize(runs: list[dict]) -> str:
    """Per-run table, per-algorithm pooled table, and the critic/clipping table."""
    lines = [
        "| algorithm | seed | before (95% CI) | after (95% CI) | change, paired 95% CI | fixed / broken | "
        "clip active | train CPU s | wall s | load avg at end |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        b, a, c = r["before"], r["after"], r["change"]
        lines.append(
            f"| {NAMES[r['algorithm']]} | {r['seed']} | {b['accuracy']:.1%} [{b['ci95'][0]:.1%}, {b['ci95'][1]:.1%}] "
            f"| {a['accuracy']:.1%} [{a['ci95'][0]:.1%}, {a['ci95'][1]:.1%}] | {c['change']:+.1%} "
            f"[{c['ci95'][0]:+.1%}, {c['ci95'][1]:+.1%}] | {c['fixed']} / {c['broken']} | "
            f"{r['clip_fraction']:.0%} | {r['train_cpu_s']:.0f} | {r['wall_time_s']:.0f} | {r['load_average_end']} |"
        )
    lines += [
        "",
        "Pooled over seeds (all held-out problems of all seeds; the change's interval pools the paired differences):",
        "",
        "| algorithm | seeds | before | after | change, paired 95% CI | after − GRPO's after, paired over problems "
        "| after − GRPO's after, per-seed mean [95% t-interval over seeds] |",
        "|---|---|---|---|---|---|---|",
    ]
    by_alg = {alg: sorted((r for r in runs if r["algorithm"] == alg), key=lambda r: r["seed"]) for alg in ALGORITHMS}
    pooled = {}
    for alg, rs in by_alg.items():
        if not rs:
            continue
        before = {"per_problem": [x for r in rs for x in r["before"]["per_problem"]]}
        after = {"per_problem": [x for r in rs for x in r["after"]["per_problem"]]}
        pooled[alg] = (rs, before, after)
    from pacs.demo import paired_change

    for alg, (rs, before, after) in pooled.items():
        c = paired_change(before, after)
        n = c["n"]
        vs = by_seed = "—"
        if alg != "grpo" and "grpo" in pooled:
            seeds = {r["seed"] for r in rs} & {r["seed"] for r in pooled["grpo"][0]}
            mine = [x for r in rs if r["seed"] in seeds for x in r["after"]["per_problem"]]
            grpo = [x for r in pooled["grpo"][0] if r["seed"] in seeds for x in r["after"]["per_problem"]]
            d = paired_change({"per_problem": grpo}, {"per_problem": mine})
            vs = f"{d['change']:+.1%} [{d['ci95'][0]:+.1%}, {d['ci95'][1]:+.1%}] (seeds {sorted(seeds)})"
            grpo_after = {r["seed"]: r["after"]["accuracy"] for r in pooled["grpo"][0]}
            by_seed = t_interval([r["after"]["accuracy"] - grpo_after[r["seed"]] for r in rs if r["seed"] in seeds])
        lines.append(
            f"| {NAMES[alg]} | {len(rs)} | {sum(before['per_problem']) / n:.1%} | {sum(after['per_problem']) / n:.1%} "
            f"| {c['change']:+.1%} [{c['ci95'][0]:+.1%}, {c['ci95'][1]:+.1%}] | {vs} | {by_seed} |"
        )
    lines += [
        "",
        "The paired-over-problems interval counts only the evaluation noise of each run; the per-seed interval also "
        "counts how much a training run varies with its seed, which dominates here.",
        "",
        "PACS's implicit critic on off-policy steps (steps 2-4 of each generation round), per seed (runs made through "
        "the `pacs demo` command itself have no per-completion record):",
        "",
        "| seed | off-policy steps | completions | abs(σ(ψ) − ½): 10% / 50% / 90% quantile | share > 0.05 | "
        "critic accuracy | majority-label accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in by_alg["pacs"]:
        c = r.get("critic")
        if not c:
            continue
        q = c["abs_sigma_psi_minus_half_q10_q50_q90"]
        lines.append(
            f"| {r['seed']} | {c['off_policy_steps']} | {c['completions']} | {q[0]:.3f} / {q[1]:.3f} / {q[2]:.3f} | "
            f"{c['frac_abs_dev_over_0.05']:.0%} | {c['critic_accuracy_off_policy']:.3f} | "
            f"{c['majority_label_accuracy']:.3f} |"
        )
    return "\n".join(lines)


def markdown(raw: dict, table: str) -> str:
    s = raw["runs"][0]["settings"] if raw["runs"] else {}
    return "\n".join(
        [
            "# PACS vs GRPO vs RLOO on SmolLM2-135M-Instruct (CPU, LoRA, the demo's arithmetic)",
            "",
            _common.machine_markdown(raw["info"]),
            f"- command: `python {' '.join(['benchmarks/smollm_compare.py', *raw['argv'][1:]])}`",
            "- code: the frozen copy of commit f240b2f (`PYTHONPATH=/work/bench_src`) plus this branch's "
            "`pacs/demo.py` and `pacs/tasks.py`",
            f"- every run is `pacs demo --algorithm <a> --seed <s>`: {s.get('max_steps')} optimizer steps, "
            f"{s.get('prompts_per_step')} prompts x {s.get('num_generations')} completions per step, "
            f"{s.get('steps_per_generation')} optimizer steps per generation, temperature {s.get('temperature')}, "
            f"LoRA r={s.get('lora_r')} on all linear layers, AdamW lr {s.get('learning_rate')} constant (the demo's; "
            "not tuned per algorithm), grad clip 1.0, TRL beta (KL) 0, reward = boxed and right; GRPO and RLOO keep "
            "TRL's other defaults (GRPO: loss_type dapo, scale_rewards group, epsilon 0.2; RLOO: epsilon 0.2)",
            f"- held-out: {s.get('num_eval')} problems per seed (drawn from seed + 1000003, never trained on), greedy, "
            f"at most {s.get('max_completion_length')} new tokens; the 'before' figure is measured once per seed",
            f"- {s.get('threads')} torch thread(s) per run; the machine was shared with other developers' test runs",
            "",
            table,
            "",
        ]
    )


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out-dir", default=str(HERE / "results"))
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
        raw = {"info": _common.machine_info(), "argv": sys.argv if argv is None else ["x", *argv], "runs": []}
        for seed in args.seeds:  # seed-major: a partial run still compares the algorithms on the seeds it covers
            before = None
            for algorithm in args.algorithms:
                done = Path(args.work_dir) / f"{algorithm}-s{seed}" / "demo_metrics.json"
                if done.exists() and not args.smoke:
                    metrics = json.loads(done.read_text())
                    print(f"[smollm] reusing {done}", flush=True)
                else:
                    t0 = time.perf_counter()
                    metrics = run_one(args, seed, algorithm, before)
                    print(
                        f"[smollm] {algorithm} seed {seed}: {metrics['before']['accuracy']:.3f} -> "
                        f"{metrics['after']['accuracy']:.3f} ({time.perf_counter() - t0:.0f}s, load "
                        f"{_common.load_average()})",
                        flush=True,
                    )
                before = before or metrics["before"]
                metrics.pop("log_history_full", None)
                raw["runs"].append(metrics)
                raw["info"]["load_average_end"] = _common.load_average()
                raw_path.write_text(json.dumps(raw, indent=1))
    table = summarize(raw["runs"])
    print(table)
    if not args.smoke:
        verdict = out_dir / "smollm_compare_verdict.md"  # the reading, written by a person after looking at the tables
        text = markdown(raw, table) + (
            "\n## Verdict\n\n" + verdict.read_text().strip() + "\n" if verdict.exists() else ""
        )
        (out_dir / "smollm_compare.md").write_text(text)
    return raw


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
