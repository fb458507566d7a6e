"""The anchor study's check on a real model: `pacs demo` (SmolLM2-135M-Instruct, LoRA, arithmetic, 24 optimizer steps
= 6 generations of 4) with the rollout anchor vs a named reference arm, each at the better of two learning rates.

    nice python -m benchmarks.anchor.anchor_demo --reference-beta 0.1 --reference-reset 2 --reference-mode keep \\
        --jobs 2 --out-dir OUT --work-dir WORK                      # ~50 min on 2 CPU cores
    python -m benchmarks.anchor.anchor_demo --report-only --out-dir OUT    # redo anchor_demo.md from anchor_demo.json

Protocol: each arm trains seed `--tune-seed` at both `--lrs` and is scored on a validation set of `--num-eval` problems
drawn with `--val-seed` (not the test set); the better rate (ties: the smaller) is the arm's pick. Then both arms
train `--seeds` at their picks and are scored on each seed's own held-out test set (the demo's default, drawn from
seed + 1000003). Paired by seed: both arms see the same training problems, LoRA initialisation and first generation
(the policy is the same until the first update). Reported: accuracy before/after and the paired difference of the
changes (after − before; before is the same model on the same problems for both arms), with a t-interval over seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks import harness


HERE = Path(__file__).resolve().parent


def demo_args(arm: dict, lr: float, seed: int, eval_seed: int | None, args, out: Path) -> argparse.Namespace:
    from pacs.demo import parse_args

    argv = ["--output-dir", str(out), "--overwrite", "--seed", str(seed), "--learning-rate", str(lr)]
    argv += ["--threads", "1", "--num-eval", str(args.num_eval), "--pacs-beta", str(arm["beta"])]
    argv += ["--pacs-anchor", arm["anchor"], "--pacs-reference-reset-generations", str(arm["reset"])]
    argv += ["--pacs-reset-optimizer", str(arm["reset_optimizer"]), "--pacs-reset-warmup-steps", str(arm["warmup"])]
    if eval_seed is not None:
        argv += ["--eval-seed", str(eval_seed)]
    return parse_args(argv + list(args.demo_args))


def run_tag(spec: tuple) -> str:
    """The name of a run's folder and cache file: arm, lr, seed and which held-out set it was scored on."""
    name, _, lr, seed, eval_seed, _ = spec
    return f"{name.replace(' ', '_')}_lr{lr:g}_s{seed}_{'val' if eval_seed else 'test'}"


def run_one(spec: tuple) -> dict:
    """One demo run: (arm name, arm settings, lr, seed, eval seed or None, args)."""
    from pacs.demo import train_and_evaluate

    name, arm, lr, seed, eval_seed, args = spec
    out = Path(args.work_dir) / run_tag(spec)
    out.mkdir(parents=True, exist_ok=True)
    metrics = train_and_evaluate(demo_args(arm, lr, seed, eval_seed, args, out), "pacs", progress=False)
    keep = ("before", "after", "change", "eval_seed", "wall_time_s", "cpu_time_s", "load_average")
    run = {
        "arm": name,
        "lr": lr,
        "seed": seed,
        "split": "val" if eval_seed else "test",
        **{k: metrics[k] for k in keep},
    }
    ranking = [e["pacs/critic_ranking_fresh"] for e in metrics["log_history"] if "pacs/critic_ranking_fresh" in e]
    run["critic_ranking_fresh"] = statistics.mean(ranking) if ranking else None
    print(f"[anchor_demo] {name} lr {lr:g} seed {seed} {run['split']}: {run['before']['accuracy']:.3f} -> "
          f"{run['after']['accuracy']:.3f} in {run['wall_time_s']:.0f}s", flush=True)  # fmt: skip
    return run


def run_all(args, arms: dict) -> list[dict]:
    cache = Path(args.work_dir) / "runs"
    cache.mkdir(parents=True, exist_ok=True)

    def path(spec):
        return cache / f"{run_tag(spec)}.json"

    tune = [(n, a, lr, args.tune_seed, args.val_seed, args) for n, a in arms.items() for lr in args.lrs]
    _run(args, tune, path)
    runs = [json.loads(p.read_text()) for p in sorted(cache.glob("*.json"))]
    picks = pick(runs, list(arms))
    report_specs = [(n, a, picks[n], s, None, args) for s in args.seeds for n, a in arms.items()]
    _run(args, report_specs, path)
    return [json.loads(p.read_text()) for p in sorted(cache.glob("*.json"))]


def _run(args, specs, path) -> None:
    todo = [s for s in specs if not path(s).exists()]
    results = []
    harness.run_all(run_one, todo, args.jobs, results.append)
    for spec, run in zip(todo, results, strict=True):
        path(spec).write_text(json.dumps(run))


def pick(runs: list[dict], arms: list[str]) -> dict:
    """Per arm, the validation run's rate with the best accuracy after training (ties: the smaller rate)."""
    out = {}
    for arm in arms:
        rs = [r for r in runs if r["arm"] == arm and r["split"] == "val"]
        out[arm] = max(rs, key=lambda r: (r["after"]["accuracy"], -r["lr"]))["lr"]
    return out


def report(raw: dict, out: Path) -> None:
    from benchmarks.harness import t_interval

    runs, arms = raw["runs"], list(raw["arms"])
    picks = pick(runs, arms)
    lines = [
        "# The anchor on a real model: `pacs demo`, rollout anchor vs a reference arm (CPU)",
        "",
        f"- date: {raw['info']['date']}, load {raw['info']['load_average_start']} → {raw['info'].get('load_average_end')}",
        f"- versions: torch {raw['info']['torch']}, transformers {raw['info']['transformers']}, trl {raw['info']['trl']}; "
        f"code: {raw['info'].get('code', 'this checkout')}",
        f"- command: `{' '.join(raw['argv'])}`",
        "- arms: " + "; ".join(f"{n}: {a}" for n, a in raw["arms"].items()),
        "",
        f"## Learning-rate pick (validation set, seed {raw['args']['tune_seed']}, {raw['args']['num_eval']} problems)",
        "",
        "| arm | " + " | ".join(f"lr {lr:g}: before → after" for lr in raw["args"]["lrs"]) + " | pick |",
        "|---" * (len(raw["args"]["lrs"]) + 2) + "|",
    ]
    for arm in arms:
        cells = []
        for lr in raw["args"]["lrs"]:
            r = next((r for r in runs if r["arm"] == arm and r["lr"] == lr and r["split"] == "val"), None)
            cells.append(f"{r['before']['accuracy']:.3f} → {r['after']['accuracy']:.3f}" if r else "—")
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {picks[arm]:g} |")
    lines += ["", "## Test (each seed's held-out set), at the picks", "", "| seed | " + " | ".join(
        f"{a}: before → after (change [95% paired])" for a in arms) + " | difference of changes |", "|---" * (len(arms) + 2) + "|"]  # fmt: skip
    diffs = []
    for seed in raw["args"]["seeds"]:
        rs = [next((r for r in runs if r["arm"] == a and r["seed"] == seed and r["split"] == "test" and r["lr"] == picks[a]), None) for a in arms]  # fmt: skip
        if None in rs:
            continue
        cells = [f"{r['before']['accuracy']:.3f} → {r['after']['accuracy']:.3f} ({r['change']['change']:+.3f} "
                 f"[{r['change']['ci95'][0]:+.3f}, {r['change']['ci95'][1]:+.3f}])" for r in rs]  # fmt: skip
        diffs.append(rs[1]["change"]["change"] - rs[0]["change"]["change"])
        lines.append(f"| {seed} | " + " | ".join(cells) + f" | {diffs[-1]:+.3f} |")
    ci = t_interval(diffs)
    lines += ["", f"{arms[1]} − {arms[0]}, change in test accuracy, over {len(diffs)} seeds: " + (
        f"{ci[0]:+.3f} [{ci[1]:+.3f}, {ci[2]:+.3f}] (95% t-interval)" if ci else "too few seeds"), ""]  # fmt: skip
    (out / "anchor_demo.md").write_text("\n".join(lines))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default=str(HERE))
    p.add_argument("--work-dir", default="/tmp/pacs-bench-anchor-demo")
    p.add_argument("--lrs", nargs=2, type=float, default=[2e-4, 5e-4])
    p.add_argument("--tune-seed", dest="tune_seed", type=int, default=0)
    p.add_argument("--val-seed", dest="val_seed", type=int, default=4242)
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--num-eval", dest="num_eval", type=int, default=200)
    p.add_argument("--reference-beta", dest="reference_beta", type=float, default=1.0)
    p.add_argument("--reference-reset", dest="reference_reset", type=int, default=2)
    p.add_argument(
        "--reference-mode", dest="reference_mode", choices=["keep", "reset", "reset+warmup"], default="reset"
    )
    p.add_argument("--rewarmup", type=int, default=4)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--report-only", dest="report_only", action="store_true")
    p.add_argument("--demo-args", dest="demo_args", nargs=argparse.REMAINDER, default=[],
                   help="further `pacs demo` options, last (e.g. --model DIR --max-steps 2 for a smoke run)")  # fmt: skip
    args = p.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        raw = json.loads((out / "anchor_demo.json").read_text())
        report(raw, out)
        return raw
    mode = args.reference_mode
    ref_name = f"reference b={args.reference_beta:g} N={args.reference_reset} {mode}"
    arms = {
        "rollout b=1": {"anchor": "rollout", "beta": 1.0, "reset": 0, "reset_optimizer": 1, "warmup": 0},
        ref_name: {
            "anchor": "reference", "beta": args.reference_beta, "reset": args.reference_reset,
            "reset_optimizer": int(mode != "keep"), "warmup": args.rewarmup if mode == "reset+warmup" else 0,
        },
    }  # fmt: skip
    info = harness.machine_info()
    runs = run_all(args, arms)
    info["load_average_end"] = harness.load_average()
    raw = {"info": info, "args": vars(args), "argv": sys.argv, "arms": arms, "runs": runs}
    (out / "anchor_demo.json").write_text(json.dumps(raw, indent=1))
    report(raw, out)
    return raw


if __name__ == "__main__":
    main()
