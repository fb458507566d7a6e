"""Where PACS pays: accuracy per generated completion as each generation feeds more optimizer steps (CPU).

    nice -n 10 python benchmarks/reuse.py --jobs 2 --seeds 0 1 2 3 4 5 6 7   # what results/reuse.md ran: 113 runs,
                                                   # ~111 CPU-min, ~95 min on 2 shared cores
    python benchmarks/reuse.py --smoke                 # one tiny iteration (what tests/test_benchmarks.py runs)
    python benchmarks/reuse.py --report-only           # redo reuse.md / reuse.png from reuse.json
    python benchmarks/reuse.py --cached-only --seeds ...  # collect cached runs into reuse.json, run nothing

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
   gradient norm was clipped (and GRPO's/RLOO's share of importance-ratio-clipped tokens), and for PACS the critic on
   off-policy steps (|sigma(psi) - 1/2|, critic accuracy against the majority label). Paired by seed: PACS minus
   GRPO/RLOO per cell, and each algorithm's k=16 (and mu) minus its k=1.

Each finished run is cached as JSON in `--work-dir`/reuse_runs (keyed by every setting that changes it), so an
interrupted or extended invocation redoes nothing; reuse.json collects them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import _common  # sets the offline environment before transformers is imported
import learning
import torch


HERE = Path(__file__).resolve().parent
ALGORITHMS = ["PACS b=1 balanced", "GRPO", "RLOO"]  # names of learning.CONFIGS
PICKED_LR = {"PACS b=1 balanced": 1e-5, "GRPO": 3e-5, "RLOO": 1e-5}  # learning.md: validation pick at k=4, 120 steps
LR_LADDER = [1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3]


def lr_grid(name: str, offsets: list[int]) -> list[float]:
    """The rates `offsets` half-decade steps away from PICKED_LR[name].

    >>> lr_grid("GRPO", [-1, 0, 1])
    [1e-05, 3e-05, 0.0001]
    """
    i = LR_LADDER.index(PICKED_LR[name])
    return [LR_LADDER[i + o] for o in offsets]


def cells(args) -> list[tuple[str, int, int]]:
    """(algorithm, steps_per_generation, num_iterations) of every cell, the num_iterations ones last."""
    out = [(name, k, 1) for k in args.reuse for name in args.algorithms]
    if args.num_iterations_at > 1:
        out += [(name, 1, args.num_iterations_at) for name in args.algorithms if name in args.num_iterations_for]
    return out


def cell_label(spg: int, mu: int) -> str:
    return f"num_iterations {mu}" if mu > 1 else f"k={spg}"


def rows_per_step(args) -> int:
    return args.prompts_per_step * args.num_generations


def run_settings(args, spg: int, mu: int) -> argparse.Namespace:
    """`args` as learning.run_one reads them for one cell: the same completions, the cell's knob and step count."""
    rows = rows_per_step(args)
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


def run_key(args) -> dict:
    """Every setting that changes a run's result (not which runs are made, nor how they are reported)."""
    keys = ("hidden_size", "num_layers", "sft_lr", "sft_target", "sft_max_steps", "sft_batch_size", "threads")
    keys += ("num_generations", "prompts_per_step", "completions", "eval_every_completions")
    return {k: getattr(args, k) for k in keys}


def run_path(args, name: str, spg: int, mu: int, lr: float, seed: int) -> Path:
    tag = f"{name.replace(' ', '_').replace('=', '')}-k{spg}-mu{mu}-lr{lr:g}-s{seed}"
    return Path(args.work_dir) / "reuse_runs" / f"{tag}.json"


def cached(args, spec) -> dict | None:
    path = run_path(args, *spec)
    if path.exists():
        saved = json.loads(path.read_text())
        if saved["key"] == run_key(args):
            return saved["run"]
    return None


# 1. Runs, in this process or in a pool of workers (each builds the task once) --------------------------------------

_TASK: dict = {}


def _task(args) -> dict:
    """Tokenizer, problem splits and the RL dataset, built once per process."""
    if not _TASK:
        from datasets import Dataset

        torch.set_num_threads(args.threads)
        test, val, dev, sft, rl = learning.make_problems()
        _TASK.update(
            tokenizer=learning.build_char_tokenizer(),
            val=val,
            test=test,
            dev=dev,
            sft=sft,
            train=Dataset.from_dict(
                {"prompt": [p for p, _ in rl], "answer": [learning.final_answer(a) for _, a in rl]}
            ),
        )
    return _TASK


def run_cell(args, spec) -> dict:
    """One (algorithm, steps_per_generation, num_iterations, lr, seed) run, cached as JSON in the work dir."""
    name, spg, mu, lr, seed = spec
    t = _task(args)
    model_path = str(Path(args.work_dir) / "sft")
    run = learning.run_one(
        name, lr, seed, run_settings(args, spg, mu), model_path, t["tokenizer"], t["train"], t["val"], t["test"]
    )
    run.update(steps_per_generation=spg, num_iterations=mu)
    path = run_path(args, *spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": run_key(args), "run": run}))
    return json.loads(path.read_text())["run"]  # as a later invocation will read it from the cache


def execute(args, specs: list[tuple], runs: list[dict], save) -> None:
    """Run the specs that are not cached yet (`args.jobs` at a time, costliest first); append every result to runs."""
    todo = []
    for spec in specs:
        run = cached(args, spec)
        if run is None:
            todo.append(spec)
        elif run not in runs:
            runs.append(run)
    if args.cached_only:
        return
    todo.sort(key=lambda spec: -spec[2])  # a num_iterations mu run takes mu times the optimizer steps
    if args.jobs <= 1 or len(todo) <= 1:
        for spec in todo:
            runs.append(run_cell(args, spec))
            save()
        return
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        for run in pool.map(run_cell, [args] * len(todo), todo):
            runs.append(run)
            save()


# 2. Report ---------------------------------------------------------------------------------------------------------


def completions_curve(run: dict, rows: int) -> list[tuple[int, float, float]]:
    """The run's (generated completions, validation acc, test acc) evaluations."""
    return [(step * rows // run["num_iterations"], v, t) for step, v, t in run["curve"]]


def pick_lrs(runs: list[dict], seed: int) -> dict:
    """Per cell (algorithm, steps_per_generation, num_iterations): the grid lr with the best seed-`seed` validation."""
    picked = {}
    for r in runs:
        c = (r["config"], r["steps_per_generation"], r["num_iterations"])
        best = picked.get(c)
        if r["seed"] == seed and (best is None or learning.final(r["curve"], 1) > best[1]):
            picked[c] = (r["lr"], learning.final(r["curve"], 1))
    return {c: lr for c, (lr, _) in picked.items()}


def final_runs(runs: list[dict], picked: dict) -> dict:
    """Per cell, its runs at the picked lr, ordered by seed."""
    out = {c: [] for c in picked}
    for r in sorted(runs, key=lambda r: r["seed"]):
        c = (r["config"], r["steps_per_generation"], r["num_iterations"])
        if c in picked and r["lr"] == picked[c]:
            out[c].append(r)
    return out


def ordered(args, table: dict) -> list:
    """The cells of `table` in the order of `cells(args)`."""
    return [c for c in cells(args) if c in table]


def grid_table(args, runs: list[dict], picked: dict) -> str:
    lrs = sorted({r["lr"] for r in runs if r["seed"] == args.seeds[0]})
    head = ["algorithm", "knob", *[f"val acc, lr {lr:g}" for lr in lrs], "picked lr"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in ordered(args, picked):
        cells_ = [c[0], cell_label(c[1], c[2])]
        for lr in lrs:
            r = next((r for r in runs if (r["config"], r["steps_per_generation"], r["num_iterations"]) == c
                      and r["seed"] == args.seeds[0] and r["lr"] == lr), None)  # fmt: skip
            cells_.append("—" if r is None else f"{learning.final(r['curve'], 1):.3f}")
        cells_.append(f"{picked[c]:g}")
        rows.append("| " + " | ".join(cells_) + " |")
    return "\n".join(rows)


def acc_at(run: dict, rows: int, completions: int) -> float | None:
    """Test accuracy of the evaluation at exactly `completions` generated completions, if there was one."""
    return next((t for n, _, t in completions_curve(run, rows) if n == completions), None)


def summary_table(args, fr: dict) -> str:
    rows_ = rows_per_step(args)
    half, at_steps = args.completions // 2, args.completions // rows_
    head = ["algorithm", "knob", "lr", "seeds", "optimizer steps", "generations", "final test acc (last 3 evals), "
            "mean [95% CI]", f"test acc at {half} completions", f"test acc at optimizer step {at_steps}",
            f"completions (optimizer steps) to {args.threshold:.0%}, seeds reaching", "grad-norm clip active",
            "ratio-clipped tokens", "median abs(σ(ψ) − ½), off-policy", "critic acc (majority label)",
            "CPU s/run"]  # fmt: skip
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in ordered(args, fr):
        rs = fr[c]
        if not rs:
            continue
        a = run_settings(args, c[1], c[2])
        hits = [h for h in (steps_to(r, rows_, args.threshold) for r in rs) if h is not None]
        ratio = [x for r in rs for e in r["train_log"] if (x := e.get(learning.RATIO_CLIP)) is not None]
        crit = [r["critic"] for r in rs if r.get("critic")]
        at_step = [x for r in rs if (x := next((t for s, _, t in r["curve"] if s == at_steps), None)) is not None]
        out.append(
            "| "
            + " | ".join(
                [
                    c[0],
                    cell_label(c[1], c[2]),
                    f"{rs[0]['lr']:g}",
                    str(len(rs)),
                    str(a.max_steps),
                    str(args.completions // (rows_ * c[1])),
                    learning.t_interval([learning.final(r["curve"], 2) for r in rs]),
                    learning.t_interval([acc_at(r, rows_, half) for r in rs]),
                    learning.t_interval(at_step) if at_step else "—",
                    f"{statistics.mean(hits):.0f} ({statistics.mean(hits) * c[2] / rows_:.0f}), {len(hits)}/{len(rs)}"
                    if hits
                    else f"—, 0/{len(rs)}",
                    f"{statistics.mean(r['clip_fraction'] for r in rs):.0%}",
                    f"{statistics.mean(ratio):.2%}" if ratio else "—",
                    f"{statistics.mean(x['abs_sigma_psi_minus_half_q10_q50_q90'][1] for x in crit):.3f}"
                    if crit
                    else "—",
                    f"{statistics.mean(x['critic_accuracy_off_policy'] for x in crit):.3f} "
                    f"({statistics.mean(x['majority_label_accuracy'] for x in crit):.3f})"
                    if crit
                    else "—",
                    f"{statistics.median(r['cpu_seconds'] for r in rs):.0f}",
                ]
            )
            + " |"
        )
    return "\n".join(out)


def steps_to(run: dict, rows: int, threshold: float) -> int | None:
    """Generated completions at the first evaluation whose test accuracy is >= threshold, or None."""
    return next((n for n, _, t in completions_curve(run, rows) if t >= threshold), None)


def paired(fr: dict, a: tuple, b: tuple, rows: int, half: int) -> tuple[int, str, str]:
    """Cell a minus cell b on the same seeds: (seeds, final test acc difference, difference at `half` completions)."""
    ra = {r["seed"]: r for r in fr.get(a, [])}
    rb = {r["seed"]: r for r in fr.get(b, [])}
    seeds = sorted(set(ra) & set(rb))
    d = [learning.final(ra[s]["curve"], 2) - learning.final(rb[s]["curve"], 2) for s in seeds]
    dh = [acc_at(ra[s], rows, half) - acc_at(rb[s], rows, half) for s in seeds]
    return len(seeds), learning.t_interval(d) if d else "—", learning.t_interval(dh) if dh else "—"


def paired_table(args, fr: dict) -> str:
    rows_, half = rows_per_step(args), args.completions // 2
    pacs, others = args.algorithms[0], args.algorithms[1:]
    head = (
        "| comparison, same seeds | seeds | final test acc difference, mean [95% CI] | at " + f"{half} completions |"
    )
    out = [head, "|---|---|---|---|"]
    knobs = sorted({(c[1], c[2]) for c in fr}, key=lambda k: (k[1], k[0]))
    for spg, mu in knobs:
        for other in others:
            n, d, dh = paired(fr, (pacs, spg, mu), (other, spg, mu), rows_, half)
            if n:
                out.append(f"| {pacs} − {other}, {cell_label(spg, mu)} | {n} | {d} | {dh} |")
    for name in args.algorithms:
        for spg, mu in knobs:
            if (spg, mu) != (1, 1):
                n, d, dh = paired(fr, (name, spg, mu), (name, 1, 1), rows_, half)
                if n:
                    out.append(f"| {name}: {cell_label(spg, mu)} − k=1 | {n} | {d} | {dh} |")
    return "\n".join(out)


def plot(args, fr: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows_ = rows_per_step(args)
    fig, axes = plt.subplots(2, len(args.algorithms), figsize=(4.2 * len(args.algorithms), 7), sharey=True)
    axes = axes.reshape(2, -1)
    for j, name in enumerate(args.algorithms):
        for c in ordered(args, fr):
            rs = fr[c]
            if c[0] != name or not rs:
                continue
            curves = [completions_curve(r, rows_) for r in rs]
            accs = torch.tensor([[t for _, _, t in cu] for cu in curves])  # (seeds, evals)
            for i, xs in enumerate(([n for n, _, _ in curves[0]], [s for s, _, _ in rs[0]["curve"]])):
                label = f"{cell_label(c[1], c[2])}, lr {rs[0]['lr']:g} (n={len(rs)})"
                (line,) = axes[i, j].plot(xs, accs.mean(0), marker=".", label=label, ls="--" if c[2] > 1 else "-")
                axes[i, j].fill_between(xs, accs.min(0).values, accs.max(0).values, color=line.get_color(), alpha=0.12)
        axes[0, j].set_title(name, fontsize=10)
        axes[0, j].set_xlabel("generated completions")
        axes[1, j].set_xlabel("optimizer step")
        for i in range(2):
            axes[i, j].grid(alpha=0.3)
            axes[i, j].legend(fontsize=7)
        axes[1, j].set_xscale("log", base=2)
    for i in range(2):
        axes[i, 0].set_ylabel("held-out greedy accuracy (test)")
    fig.suptitle(
        f"3-digit addition with scratchpad, {args.completions} completions per run ({args.prompts_per_step} prompts x "
        f"{args.num_generations} per step); k = optimizer steps per generation; mean and min-max over seeds",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def reuse_markdown(args, raw: dict, tables: dict) -> str:
    a, sft, info = raw["args"], raw["sft"], raw["info"]
    return "\n".join(
        [
            "# Reuse: accuracy per generated completion as each generation feeds more optimizer steps (CPU)",
            "",
            _common.machine_markdown(info),
            f"- command: `{raw['command']}`",
            f"- code: {info.get('code', 'this checkout')}",
            f"- model, task, warm start: as in [learning.md](learning.md) (SFT: {sft['steps']} steps, dev "
            f"{sft['dev_acc']:.3f}, held-out test {sft['test_acc']:.3f}; every RL run starts from it)",
            f"- budget: **{a['completions']} generated completions per run** ({a['prompts_per_step']} prompts x "
            f"{a['num_generations']} completions per optimizer step); k = `steps_per_generation` in {a['reuse']} with "
            "`num_iterations` 1 (each completion used once, so the same number of optimizer steps for every k, "
            f"k x fewer and larger generations), and `num_iterations` {a['num_iterations_at']} with "
            f"`steps_per_generation` 1 (each completion used {a['num_iterations_at']} times, so "
            f"{a['num_iterations_at']}x the optimizer steps)",
            "- RL otherwise as in learning.md: temperature 1, AdamW constant lr, grad clip 1.0, TRL beta (KL) 0, TRL "
            "defaults (GRPO: loss_type dapo, scale_rewards group, epsilon 0.2; RLOO: epsilon 0.2); PACS β=1, balanced",
            f"- learning rate: each cell's own, picked on seed {a['seeds'][0]} by validation accuracy (200 problems, "
            "mean of the last 3 evaluations) from the half-decade grid around learning.md's pick "
            f"({', '.join(f'{n} {PICKED_LR[n]:g}' for n in a['algorithms'])}): {a['lr_steps']} half-decade steps "
            "from it, plus the next rate past the edge where the pick sat on one; the num_iterations cell takes the rate picked for the same k; the test set played no part",
            f"- seeds {a['seeds']}; evaluation: greedy accuracy on 500 held-out test problems every "
            f"{a['eval_every_completions']} generated completions (the same points for every cell; one evaluation has "
            "a sampling std of ~0.02)",
            f"- runs: {len(raw['runs'])}, CPU time {sum(r['cpu_seconds'] for r in raw['runs']) / 60:.0f} min in all "
            f"(one torch thread each, {a['jobs']} at a time, nice 10); load average per run in reuse.json",
            "",
            "## Learning-rate pick (validation, seed 0)",
            "",
            tables["grid"],
            "",
            "## Held-out test accuracy at the picked learning rates",
            "",
            tables["summary"],
            "",
            "Intervals are 95% t-intervals over seeds. Completions to a threshold: mean over the seeds that reached it. "
            "Grad-norm clip: share of optimizer steps whose pre-clip gradient norm exceeded 1. Ratio-clipped tokens: "
            "TRL's `clip_ratio/region_mean` (GRPO and RLOO), averaged over steps. Critic (PACS): |σ(ψ) − ½| per "
            "completion pooled over the off-policy steps, and the share of completions whose sign of ψ matches the "
            "reward, against always guessing the majority label.",
            "",
            "## Paired by seed (same prompt order)",
            "",
            tables["paired"],
            "",
            "![held-out accuracy vs generated completions and vs optimizer step](reuse.png)",
            "",
            "## Verdict",
            "",
            raw.get("verdict", "(written after the run: reuse_verdict.md)"),
            "",
        ]
    )


def report(args, raw: dict, out_dir: Path) -> dict:
    """Tables to stdout; markdown + plot to out_dir (smoke: reuse_smoke.md, no plot)."""
    picked = pick_lrs(raw["runs"], args.seeds[0])
    fr = final_runs(raw["runs"], picked)
    tables = {
        "grid": grid_table(args, raw["runs"], picked),
        "summary": summary_table(args, fr),
        "paired": paired_table(args, fr),
    }
    print("\n\n".join(tables.values()))
    if not args.smoke:
        plot(args, fr, out_dir / "reuse.png")
    (out_dir / ("reuse_smoke.md" if args.smoke else "reuse.md")).write_text(reuse_markdown(args, raw, tables))
    return tables


# 3. Main -----------------------------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out-dir", default=str(HERE / "results"), help="where reuse.{json,png,md} go")
    p.add_argument(
        "--work-dir", default="/tmp/pacs-bench-learning", help="SFT checkpoint, cached runs (shared with learning.py)"
    )
    p.add_argument("--algorithms", nargs="+", default=ALGORITHMS, choices=ALGORITHMS, help="the first is compared")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="the first one also picks the lr")
    p.add_argument("--reuse", nargs="+", type=int, default=[1, 4, 16], help="steps_per_generation values")
    p.add_argument("--num-iterations-at", dest="num_iterations_at", type=int, default=4, help="0: no such cell")
    p.add_argument(
        "--num-iterations-for", dest="num_iterations_for", nargs="+", default=ALGORITHMS, choices=ALGORITHMS
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
    learning.add_task_args(p)
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
        raw = learning.load_raw(raw_path, out_dir / "reuse_verdict.md")
        report(argparse.Namespace(**{**vars(args), **raw["args"], "smoke": args.smoke}), raw, out_dir)
        return raw
    torch.set_num_threads(args.threads)
    work_dir.mkdir(parents=True, exist_ok=True)
    t = _task(args)
    sft_meta = learning.sft_warm_start(args, t["tokenizer"], t["sft"], t["dev"], t["test"])
    info = {**_common.machine_info(), "code": os.environ.get("PACS_BENCH_CODE", "this checkout")}
    runs: list[dict] = []
    command = " ".join(["python benchmarks/reuse.py", *sys.argv[1:]]) if argv is None else f"reuse.main({argv})"
    raw = {"info": info, "args": vars(args), "command": command, "sft": sft_meta, "runs": runs}

    def save():
        raw["info"]["load_average_end"] = _common.load_average()
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
    report(args, raw, out_dir)
    return raw


if __name__ == "__main__":
    main()
