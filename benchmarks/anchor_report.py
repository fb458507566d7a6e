"""Renders anchor.py's runs (anchor.json) as anchor.md and anchor.png; the numbers are computed here, never typed."""

from __future__ import annotations

import statistics
from pathlib import Path

import report as report_md


def fmt(xs: list[float], signed: bool = False) -> str:
    """mean [95% t-interval] over seeds (`report.interval`)."""
    return report_md.interval(xs, "+.3f" if signed else ".3f")


def final(run: dict, last: int = 3, column: int = 2) -> float:
    return statistics.mean(c[column] for c in run["curve"][-last:])


def auc(run: dict) -> float:
    return statistics.mean(c[2] for c in run["curve"][1:])


def picked_lrs(runs: list[dict], configs: list[str], seed0: int, lr_grid: list[float]) -> dict:
    """Per config, the grid rate whose `seed0` run has the best final validation accuracy (mean of the last 3
    evaluations): how anchor.py picks the rate the other seeds run at, and how this report finds it again."""
    picked = {}
    for c in configs:
        rs = [r for r in runs if r["config"] == c and r["seed"] == seed0 and r["lr"] in lr_grid]
        if rs:
            picked[c] = max(rs, key=lambda r: final(r, column=1))["lr"]
    return picked


def step_mean(run: dict, key: str, lo: int, hi: int) -> float | None:
    vals = [s[key] for s in run["steps"] if key in s and lo < s["step"] <= hi]
    return statistics.mean(vals) if vals else None


def tables(raw: dict) -> dict[str, str]:
    args, runs = raw["args"], raw["runs"]
    configs = [c for c in args["configs"] if any(r["config"] == c for r in runs)]
    picked = picked_lrs(runs, configs, args["seeds"][0], args["lr_grid"])
    at = {
        c: sorted((r for r in runs if r["config"] == c and r["lr"] == picked[c]), key=lambda r: r["seed"])
        for c in configs
    }
    out = {}
    grid = sorted({r["lr"] for r in runs if r["seed"] == args["seeds"][0] and True})
    rows = [
        "| config | " + " | ".join(f"val acc, lr {lr:g}" for lr in grid) + " | picked lr |",
        "|---" * (len(grid) + 2) + "|",
    ]
    for c in configs:
        if True:
            val = {r["lr"]: final(r, column=1) for r in runs if r["config"] == c and r["seed"] == args["seeds"][0]}
            rows.append(
                f"| {c} | " + " | ".join(f"{val[lr]:.3f}" if lr in val else "—" for lr in grid) + f" | {picked[c]:g} |"
            )
    out["lr"] = "\n".join(rows)

    rows = [
        "| config | lr | seeds | final test acc (last 3 evals) | AUC | critic: median abs(σ(ψ) − ½), all steps | "
        "on each generation's first step | critic sign accuracy (majority label) | share abs(R − σ(ψ)) < 0.1 | "
        "entropy, steps 1-20 → 101-120 | mean abs(r), last 20 steps | resets | CPU s/run |",
        "|---" * 13 + "|",
    ]
    for c in configs:
        rs = at[c]
        crit = [r["critic_all"] for r in rs if r.get("critic_all")]
        first = [r["critic_first_step"] for r in rs if r.get("critic_first_step")]
        ent0 = [v for r in rs if (v := step_mean(r, "entropy", 0, 20)) is not None]
        ent1 = [v for r in rs if (v := step_mean(r, "entropy", 100, 120)) is not None]
        prox = [v for r in rs if (v := step_mean(r, "pacs/proxy_abs_mean", 100, 120)) is not None]
        resets = [max((s.get("pacs/reference_resets", 0) for s in r["steps"]), default=0) for r in rs]
        rows.append(
            f"| {c} | {picked[c]:g} | {len(rs)} | {fmt([final(r) for r in rs])} | {fmt([auc(r) for r in rs])} | "
            + (f"{statistics.median(x['margin_q10_q50_q90'][1] for x in crit):.3f} | " if crit else "— | ")
            + (f"{statistics.median(x['margin_q10_q50_q90'][1] for x in first):.3f} | " if first else "— | ")
            + (
                f"{statistics.mean(x['critic_accuracy'] for x in crit):.3f} ({statistics.mean(x['majority_accuracy'] for x in crit):.3f}) | "
                if crit
                else "— | "
            )
            + (f"{statistics.mean(x['close_frac'] for x in crit):.3f} | " if crit else "— | ")
            + (f"{statistics.mean(ent0):.3f} → {statistics.mean(ent1):.3f} | " if ent0 and ent1 else "— | ")
            + (f"{statistics.mean(prox):.2f} | " if prox else "— | ")
            + (f"{statistics.mean(resets):.0f} | " if c.startswith("PACS ref") else "— | ")
            + f"{statistics.mean(r['cpu_seconds'] for r in rs):.0f} |"
        )
    out["summary"] = "\n".join(rows)

    rows = [
        "| config | seeds | − PACS rollout, final test acc | − GRPO, final test acc | − RLOO, final test acc |",
        "|---|---|---|---|---|",
    ]
    for c in configs:
        cells = []
        for base in ("PACS rollout", "GRPO", "RLOO"):
            if base == c or base not in at:
                cells.append("—")
                continue
            bs = {r["seed"]: final(r) for r in at[base]}
            diffs = [final(r) - bs[r["seed"]] for r in at[c] if r["seed"] in bs]
            cells.append(fmt(diffs, signed=True) if diffs else "—")
        rows.append(f"| {c} | {len(at[c])} | " + " | ".join(cells) + " |")
    out["paired"] = "\n".join(rows)
    out["_picked"] = picked
    out["_at"] = at
    return out


def plot(at: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for c, rs in at.items():
        steps = [p[0] for p in rs[0]["curve"]]
        mean = [statistics.mean(r["curve"][i][2] for r in rs) for i in range(len(steps))]
        line = axes[0].plot(steps, mean, marker="o", ms=3, label=c)[0]
        lo = [min(r["curve"][i][2] for r in rs) for i in range(len(steps))]
        hi = [max(r["curve"][i][2] for r in rs) for i in range(len(steps))]
        axes[0].fill_between(steps, lo, hi, alpha=0.12, color=line.get_color())
        for ax, key in ((axes[1], "entropy"), (axes[2], "pacs/psi_std")):
            xs = sorted({s["step"] for r in rs for s in r["steps"] if key in s})
            if not xs:
                continue
            ys = [statistics.mean(s[key] for r in rs for s in r["steps"] if s["step"] == x and key in s) for x in xs]
            w = 4  # one generation
            ys = [statistics.mean(ys[max(0, i - w + 1) : i + 1]) for i in range(len(ys))]
            ax.plot(xs, ys, color=line.get_color(), label=c)
    axes[0].set(xlabel="optimizer step", ylabel="greedy test accuracy", title="held-out accuracy (mean, min-max)")
    axes[1].set(xlabel="optimizer step", ylabel="token entropy", title="policy entropy (mean over seeds, 4-step avg)")
    axes[2].set(xlabel="optimizer step", ylabel="std of psi in a step", title="critic logit spread (PACS)")
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(raw: dict, out: Path, smoke: bool = False) -> dict:
    t = tables(raw)
    print("\n\n".join(v for k, v in t.items() if not k.startswith("_")))
    if smoke:
        return t
    plot(
        t["_at"], out / "anchor.png", "PACS anchors vs GRPO/RLOO, 3-digit addition with scratchpad, 0.49M Qwen3 (CPU)"
    )
    verdict = out / "anchor_verdict.md"
    a = raw["args"]
    md = [
        "# The reward proxy's anchor: pi_old of each generation vs a fixed, periodically reset pi_ref (CPU)",
        "",
        report_md.machine_markdown(raw["info"]),
        f"- command: `{' '.join(raw['argv'])}`",
        f"- code: {raw['info'].get('code', 'this checkout')}",
        "- task, model, SFT warm start, RL settings: as in [learning.md](learning.md) "
        f"(SFT dev acc {raw['sft']['dev_acc']:.3f}, test {raw['sft']['test_acc']:.3f}); {a['max_steps']} optimizer steps "
        f"of {a['prompts_per_step']} prompts x {a['num_generations']} completions, {a['steps_per_generation']} optimizer "
        "steps per generation: every run generates the same completions",
        f"- seeds {a['seeds']}; learning rates: each config its own, picked on seed {a['seeds'][0]} by validation "
        f"accuracy from {a['lr_grid']}",
        "- critic statistics: "
        + (
            "per run, the quantiles of the per-step median abs(σ(ψ) − ½) and the means of per-step accuracies and "
            "shares (PACSTrainer's logged metrics)"
            if any((r.get("critic_all") or {}).get("summary") == "per_step" for r in raw["runs"])
            else "per run, pooled over every completion of every optimizer step"
        )
        + "; then the median (margins) or mean (accuracies, shares) over seeds",
        "",
        "## Learning-rate pick (validation)",
        "",
        t["lr"],
        "",
        "## At the picked learning rates",
        "",
        t["summary"],
        "",
        "Paired by seed (same prompt order):",
        "",
        t["paired"],
        "",
        "![anchor](anchor.png)",
        "",
    ]
    if verdict.exists():
        md += ["## Verdict", "", verdict.read_text().strip(), ""]
    (out / "anchor.md").write_text("\n".join(md))
    return t
