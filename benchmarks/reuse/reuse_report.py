"""The markdown report and plot of `reuse.py`, rendered from the JSON it writes (see that script for the runs).

    python -m benchmarks.reuse.reuse --report-only           # redo reuse.md / reuse.png from reuse.json

The verdict is a person's reading, kept in reuse_verdict.md and appended as it is; everything else here is computed
from the runs.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from benchmarks import report
from benchmarks.learning import learning_report


RATIO_CLIP = "clip_ratio/region_mean"  # GRPO's and RLOO's share of tokens whose importance ratio was clipped
MEDIAN_HEAD = {
    "pooled": "median abs(σ(ψ) − ½), off-policy",
    "per_step": "median of per-step median abs(σ(ψ) − ½), off-policy",
    report.RANKING: "median of per-step median abs(σ(ψ) − ½), off-policy",
}
RANKING_HEAD = "critic within-group ranking: off-policy / first step (out of sample)"
CRITIC_TEXT = {
    "pooled": "|σ(ψ) − ½| per completion pooled over the off-policy steps. " + report.CRITIC_WITHDRAWN,
    "per_step": "the median over the off-policy steps of each step's median |σ(ψ) − ½| (PACSTrainer's "
    "`pacs/critic_margin`). " + report.CRITIC_WITHDRAWN,
    report.RANKING: "the median over the off-policy steps of each step's median |σ(ψ) − ½| (PACSTrainer's "
    "`pacs/critic_margin`), and the within-group ranking of ψ (`pacs/critic_ranking`: the share of (correct, "
    "incorrect) pairs of one group ordered right, ties ½, 0.5 = no information) on the off-policy steps (in-sample) "
    "and on each generation's first step (out of sample; exactly 0.5 with the rollout anchor, where ψ = 0), "
    "each a mean of per-step values over the steps with a group holding both labels.",
}
# the learning rates reuse.json of 2026-12-03 centred its grids on (later runs record theirs in args["lr_center"])
LEGACY_LR_CENTER = {"PACS b=1 balanced": 1e-5, "GRPO": 3e-5, "RLOO": 1e-5}


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


def completions_curve(run: dict, rows: int) -> list[tuple[int, float, float]]:
    """The run's (generated completions, validation acc, test acc) evaluations."""
    return [(step * rows // run["num_iterations"], v, t) for step, v, t in run["curve"]]


def pick_lrs(runs: list[dict], seed: int) -> dict:
    """Per cell (algorithm, steps_per_generation, num_iterations): the grid lr with the best seed-`seed` validation."""
    picked = {}
    for r in runs:
        c = (r["config"], r["steps_per_generation"], r["num_iterations"])
        best = picked.get(c)
        if r["seed"] == seed and (best is None or learning_report.final(r["curve"], 1) > best[1]):
            picked[c] = (r["lr"], learning_report.final(r["curve"], 1))
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
            cells_.append("—" if r is None else f"{learning_report.final(r['curve'], 1):.3f}")
        cells_.append(f"{picked[c]:g}")
        rows.append("| " + " | ".join(cells_) + " |")
    return "\n".join(rows)


def acc_at(run: dict, rows: int, completions: int) -> float | None:
    """Test accuracy of the evaluation at exactly `completions` generated completions, if there was one."""
    return next((t for n, _, t in completions_curve(run, rows) if n == completions), None)


def summary_table(args, fr: dict) -> str:
    rows_ = rows_per_step(args)
    half, at_steps = args.completions // 2, args.completions // rows_
    kind = report.critic_kind(r.get("critic") for rs in fr.values() for r in rs)
    head = ["algorithm", "knob", "lr", "seeds", "optimizer steps", "generations", "final test acc (last 3 evals), "
            "mean [95% CI]", f"test acc at {half} completions", f"test acc at optimizer step {at_steps}",
            f"completions (optimizer steps) to {args.threshold:.0%}, seeds reaching", "grad-norm clip active",
            "ratio-clipped tokens", MEDIAN_HEAD[kind], *([] if report.critic_legacy(kind) else [RANKING_HEAD]),
            "CPU s/run"]  # fmt: skip
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in ordered(args, fr):
        rs = fr[c]
        if not rs:
            continue
        hits = [h for h in (steps_to(r, rows_, args.threshold) for r in rs) if h is not None]
        ratio = [x for r in rs for e in r["train_log"] if (x := e.get(RATIO_CLIP)) is not None]
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
                    str(c[2] * args.completions // rows_),  # each completion feeds mu optimizer steps
                    str(args.completions // (rows_ * c[1])),
                    report.interval([learning_report.final(r["curve"], 2) for r in rs]),
                    report.interval([acc_at(r, rows_, half) for r in rs]),
                    report.interval(at_step) if at_step else "—",
                    f"{statistics.mean(hits):.0f} ({statistics.mean(hits) * c[2] / rows_:.0f}), {len(hits)}/{len(rs)}"
                    if hits
                    else f"—, 0/{len(rs)}",
                    f"{statistics.mean(r['clip_fraction'] for r in rs):.0%}",
                    f"{statistics.mean(ratio):.2%}" if ratio else "—",
                    f"{statistics.mean(report.critic_margins(x)[1] for x in crit):.3f}" if crit else "—",
                    *([] if report.critic_legacy(kind) else [ranking_cell(crit)]),
                    f"{statistics.median(r['cpu_seconds'] for r in rs):.0f}",
                ]
            )
            + " |"
        )
    return "\n".join(out)


def ranking_cell(crit: list[dict]) -> str:
    """ "off-policy / fresh" within-group ranking, each the mean over the seeds that logged it ("—": none did)."""

    def mean(key: str) -> str:
        xs = [x[key] for x in crit if x.get(key) is not None]
        return report.num(statistics.mean(xs) if xs else None)

    return f"{mean('critic_ranking_off_policy')} / {mean('critic_ranking_fresh')}" if crit else "—"


def steps_to(run: dict, rows: int, threshold: float) -> int | None:
    """Generated completions at the first evaluation whose test accuracy is >= threshold, or None."""
    return next((n for n, _, t in completions_curve(run, rows) if t >= threshold), None)


def paired(fr: dict, a: tuple, b: tuple, rows: int, half: int) -> tuple[int, str, str]:
    """Cell a minus cell b on the same seeds: (seeds, final test acc difference, difference at `half` completions)."""
    ra = {r["seed"]: r for r in fr.get(a, [])}
    rb = {r["seed"]: r for r in fr.get(b, [])}
    seeds = sorted(set(ra) & set(rb))
    d = [learning_report.final(ra[s]["curve"], 2) - learning_report.final(rb[s]["curve"], 2) for s in seeds]
    dh = [acc_at(ra[s], rows, half) - acc_at(rb[s], rows, half) for s in seeds]
    return len(seeds), report.interval(d) if d else "—", report.interval(dh) if dh else "—"


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
    center = a.get("lr_center", LEGACY_LR_CENTER)
    return "\n".join(
        [
            "# Reuse: accuracy per generated completion as each generation feeds more optimizer steps (CPU)",
            "",
            report.machine_markdown(info),
            f"- command: `{raw['command']}`",
            f"- code: {info.get('code', 'this checkout')}",
            f"- model, task, warm start: as in [learning.md](../learning/learning.md) (SFT: {sft['steps']} steps, dev "
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
            f"({', '.join(f'{n} {center[n]:g}' for n in a['algorithms'])}): {a['lr_steps']} half-decade steps "
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
            "TRL's `clip_ratio/region_mean` (GRPO and RLOO), averaged over steps. Critic (PACS): "
            + CRITIC_TEXT[report.critic_kind(r.get("critic") for r in raw["runs"])],
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


def write(args, raw: dict, out_dir: Path) -> dict:
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
