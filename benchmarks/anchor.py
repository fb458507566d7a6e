"""Does anchoring the reward proxy to a fixed reference policy (the revised paper) wake PACS's critic, and does it help?

    nice -n 10 python benchmarks/anchor.py --jobs 2            # the study (~30 min on 2 shared CPU cores)
    python benchmarks/anchor.py --smoke                         # one tiny run per config (tests/test_benchmarks.py)
    python benchmarks/anchor.py --report-only                   # redo anchor.{md,png} from anchor.json

The task, model, SFT warm start and RL settings are learning.py's (three-digit addition with a 32-token scratchpad,
a 0.49M-parameter Qwen3, 120 optimizer steps of 8 prompts x 8 completions, 4 optimizer steps per generation, so every
run generates the same 3,840 completions). Configs:

- `PACS rollout`: the reward proxy against pi_old of each generation (the authors' code; `pacs`'s first anchor);
- `PACS ref never` / `PACS ref N=8` / `PACS ref N=2`: against a fixed pi_ref (`pacs_anchor="reference"`), never reset,
  or hard-reset with the optimizer states after every 8 / 2 generations (32 / 8 optimizer steps);
- `GRPO`, `RLOO`: TRL's trainers.

Learning rates: each config picks its own on the first seed from `--lr-grid` by validation accuracy (learning.py's
protocol; the test set plays no part). Then every config runs seeds `--seeds` at its rate; runs are cached one JSON file each under `--work-dir`, so the study can be resumed or extended.
Per run: held-out test accuracy every 20 steps, the implicit critic on every step (|sigma(psi) - 1/2|, its sign
accuracy against always guessing the majority label, the share of completions with |R - sigma(psi)| < 0.1), the
policy's token entropy, mean |r|, the k3 KL to pi_ref and the resets. Writes anchor.json, anchor.md, anchor.png.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import _common  # sets the offline environment before transformers is imported
import _tasks
import anchor_report
import learning


HERE = Path(__file__).resolve().parent
PACS = {"pacs_beta": 1.0, "pacs_class_weight": "balanced"}
CONFIGS = {
    "PACS rollout": ("pacs", {**PACS, "pacs_anchor": "rollout"}),
    "PACS ref never": ("pacs", {**PACS, "pacs_anchor": "reference", "pacs_reference_reset_generations": 0}),
    "PACS ref N=8": ("pacs", {**PACS, "pacs_anchor": "reference", "pacs_reference_reset_generations": 8}),
    "PACS ref N=2": ("pacs", {**PACS, "pacs_anchor": "reference", "pacs_reference_reset_generations": 2}),
    "GRPO": ("grpo", {}),
    "RLOO": ("rloo", {}),
}
learning.CONFIGS.update(CONFIGS)  # built by learning.make_trainer ("PACS rollout" is its "PACS b=1 balanced")
STEP_KEYS = ("entropy", "pacs/proxy_abs_mean", "pacs/reference_kl", "pacs/reference_resets", "pacs/psi_std", "reward")


def critic_stats(log: list[dict], steps_per_generation: int, which: str) -> dict | None:
    """The implicit critic over a run's optimizer steps (`which`: "all", "off_policy", or "first": each generation's
    first step) from PACSTrainer's per-step metrics in `log_history` (transformers logs optimizer step k as
    `"step": k`; TRL generated before it when k - 1 is a multiple of `steps_per_generation`): quantiles of the per-step
    median |sigma(psi) - 1/2|, and the means of the per-step sign accuracy, majority-label accuracy and share of
    completions with |R - sigma(psi)| < 0.1. (The committed anchor.json pooled completions instead: its runs,
    without a `summary` key, came from the frozen study copy, see anchor.md.)"""
    rows = _common.critic_steps(log, steps_per_generation, which)
    if not rows:
        return None
    return {
        "summary": "per_step",
        "steps": len(rows),
        "margin_q10_q50_q90": _common.quantiles([e["pacs/critic_margin"] for e in rows]),
        "critic_accuracy": statistics.mean(e["pacs/critic_accuracy"] for e in rows),
        "majority_accuracy": statistics.mean(e["pacs/majority_accuracy"] for e in rows),
        "close_frac": statistics.mean(e["pacs/critic_close_frac"] for e in rows),
    }


def run_one(name: str, lr: float, seed: int, args, model_path: str) -> dict:
    """One RL run from the SFT checkpoint; its test curve, per-step logs and critic statistics."""
    from transformers import PrinterCallback, TrainerCallback

    t = _tasks.task(args)
    curve, steps = [], []

    class Watch(TrainerCallback):
        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "grad_norm" in logs:
                steps.append({"step": state.global_step, **{k: logs[k] for k in STEP_KEYS if k in logs}})

    out = os.path.join(args.work_dir, "runs", learning.run_tag(name, lr, seed))
    trainer = learning.make_trainer(name, lr, args, model_path, t["train"], seed, out)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(_tasks.eval_callback(args, curve))
    trainer.add_callback(Watch())
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    log = [e for e in trainer.state.log_history if "step" in e and "train_runtime" not in e]
    spg = args.steps_per_generation
    run = {
        "config": name, "lr": lr, "seed": seed, "curve": curve, "steps": steps, "seconds": seconds, "cpu_seconds": cpu,
        "load": _common.load_average(), "critic_all": critic_stats(log, spg, "all"),
        "critic_off_policy": critic_stats(log, spg, "off_policy"), "critic_first_step": critic_stats(log, spg, "first"),
    }  # fmt: skip
    print(
        f"[anchor] {name:15s} lr {lr:g} seed {seed}: test {curve[0][2]:.3f} -> {curve[-1][2]:.3f}"
        + (f", critic margin q50 {run['critic_all']['margin_q10_q50_q90'][1]:.3f}" if run["critic_all"] else "")
        + f" in {seconds:.0f}s (cpu {cpu:.0f}s, load {_common.load_average()})",
        flush=True,
    )
    return run


def _cache_path(cache: Path, name: str, lr: float, seed: int) -> Path:
    return cache / f"{learning.run_tag(name, lr, seed)}.json"


def _run_and_store(spec: tuple[str, float, int], args, model_path: str, cache: Path) -> None:
    _cache_path(cache, *spec).write_text(json.dumps(run_one(*spec, args, model_path)))


def run_all(args, model_path: str) -> list[dict]:
    """Every run the study needs, cached one JSON each (`--jobs` at a time, `_common.run_all`); every config picks its
    learning rate on the first seed first."""
    cache = Path(args.work_dir) / "anchor_runs"
    cache.mkdir(parents=True, exist_ok=True)
    store = functools.partial(_run_and_store, args=args, model_path=model_path, cache=cache)

    def run_batch(specs: list[tuple[str, float, int]]) -> None:
        todo = [spec for spec in specs if not _cache_path(cache, *spec).exists()]
        _common.run_all(store, todo, args.jobs, lambda _: None)

    seeds = args.seeds
    run_batch([(c, lr, seeds[0]) for lr in args.lr_grid for c in args.configs])
    runs = [json.loads(p.read_text()) for p in sorted(cache.glob("*.json"))]
    picked = anchor_report.picked_lrs(runs, args.configs, seeds[0], args.lr_grid)
    run_batch([(c, picked[c], s) for s in seeds[1:] for c in args.configs])
    return [json.loads(p.read_text()) for p in sorted(cache.glob("*.json"))]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default=str(HERE / "results"))
    p.add_argument("--work-dir", default="/tmp/pacs-bench-anchor")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--lr-grid", dest="lr_grid", nargs="+", type=float, default=[1e-5, 3e-5, 1e-4])
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--report-only", dest="report_only", action="store_true")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--sft-max-steps", dest="sft_max_steps", type=int, default=100, help="SFT steps (warm start)")
    args, rest = p.parse_known_args(argv)
    largs = learning.parse_args(rest + (["--smoke"] if args.smoke else []))
    for k, v in vars(args).items():
        setattr(largs, k, v)
    if args.smoke:
        largs.seeds, largs.lr_grid, largs.sft_max_steps = [0], [1e-4], 25
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw_path = out / ("anchor_smoke.json" if args.smoke else "anchor.json")
    if args.report_only:
        raw = json.loads(raw_path.read_text())
    else:
        info = _common.machine_info()
        t = _tasks.task(largs)
        sft_meta = _tasks.sft_warm_start(largs, t["tokenizer"], t["sft"], t["dev"], t["test"])
        runs = run_all(largs, str(Path(largs.work_dir) / "sft"))
        raw = {"info": info, "args": vars(largs), "argv": sys.argv, "sft": sft_meta, "runs": runs}
        raw["info"]["load_average_end"] = _common.load_average()
        raw_path.write_text(json.dumps(raw, indent=1))
    anchor_report.report(raw, out, smoke=args.smoke)
    return raw


if __name__ == "__main__":
    main()
