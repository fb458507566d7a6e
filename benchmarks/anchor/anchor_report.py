"""Renders anchor.py's runs (anchor.json) as anchor.md and anchor.png; every number is computed here, never typed, and
the verdict follows the rule written in anchor_protocol.md before the runs."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks import report as report_md
from benchmarks.harness import t_interval


PRIMARY = ("PACS ref N=8 reset", "PACS rollout")
BASELINES = ("PACS rollout", "GRPO", "RLOO")


def fmt(xs: list[float], signed: bool = False) -> str:
    """mean [95% t-interval] over seeds (`report.interval`)."""
    return report_md.interval(xs, "+.3f" if signed else ".3f") if xs else "—"


def final(run: dict, last: int = 3, column: int = 2) -> float:
    return statistics.mean(c[column] for c in run["curve"][-last:])


def auc(run: dict) -> float:
    return statistics.mean(c[2] for c in run["curve"][1:])


def picks(runs: list[dict], arms: list[str], seed: int, grids: dict | None = None) -> dict:
    """Per arm, the (beta, lr) of its tuning-seed run with the best final validation accuracy (inside `grids` when
    given: `{arm: (betas, lrs)}`); ties go to the smaller lr, then the smaller beta."""
    out = {}
    for arm in arms:
        rs = [r for r in runs if r["arm"] == arm and r["seed"] == seed]
        if grids is not None:
            bs, lrs = grids[arm]
            rs = [r for r in rs if r["lr"] in lrs and r["beta"] in bs]
        if rs:
            best = max(rs, key=lambda r: (final(r, column=1), -r["lr"], -(r["beta"] or 0)))
            out[arm] = (best["beta"], best["lr"])
    return out


def run_mean(run: dict, key: str) -> float | None:
    vals = [s[key] for s in run["steps"] if s.get(key) is not None]
    return statistics.mean(vals) if vals else None


def step_mean(run: dict, key: str, lo: int, hi: int) -> float | None:
    vals = [s[key] for s in run["steps"] if s.get(key) is not None and lo < s["step"] <= hi]
    return statistics.mean(vals) if vals else None


WINDOW = 6  # optimizer steps after a reset that reset_shock follows (a re-warmup of K = 4 ends in the 5th)


def reset_shock(run: dict) -> list[float] | None:
    """||dtheta|| of the k-th optimizer step after each reset (k = 0 .. WINDOW - 1; median over the run's resets),
    divided by the median ||dtheta|| of the steps outside those windows (step 1 left out: a run's first Adam step)."""
    norms = {s["step"]: s["update_norm"] for s in run["steps"] if s.get("update_norm") is not None}
    starts, prev = [], 0
    for s in run["steps"]:
        resets = s.get("pacs/reference_resets", 0)
        if resets > prev:
            starts.append(s["step"])
        prev = resets
    inside = {start + k for start in starts for k in range(WINDOW)}
    outside = [v for step, v in norms.items() if step not in inside and step > 1]
    if not starts or not outside:
        return None
    base = statistics.median(outside)
    ks = [[norms[start + k] for start in starts if start + k in norms] for k in range(WINDOW)]
    return [statistics.median(v) / base for v in ks if v]


def shock_cell(shocks: list[list[float]]) -> str:
    """ "first step, peak (at k)" of the seed-mean ratios."""
    if not shocks:
        return "—"
    n = min(len(x) for x in shocks)
    mean = [statistics.mean(x[k] for x in shocks) for k in range(n)]
    peak = max(range(n), key=lambda k: mean[k])
    return f"{mean[0]:.1f}×, peak {mean[peak]:.1f}× (k={peak})"


def other_steps_mean(run: dict, key: str, steps_per_generation: int) -> float | None:
    """Mean of `key` over the steps that did not follow a generation (in-sample: psi fitted to those labels)."""
    vals = [s[key] for s in run["steps"] if s.get(key) is not None and (s["step"] - 1) % steps_per_generation != 0]
    return statistics.mean(vals) if vals else None


def values(rs: list[dict], fn) -> list[float]:
    return [v for r in rs if (v := fn(r)) is not None]


def paired(a: list[dict], b: list[dict], fn=final) -> list[float]:
    bs = {r["seed"]: fn(r) for r in b}
    return [fn(r) - bs[r["seed"]] for r in a if r["seed"] in bs]


def tables(raw: dict) -> dict:
    args, runs = raw["args"], raw["runs"]
    arms = [a for a in args["arms"] if any(r["arm"] == a for r in runs)]
    grids = {a: tuple(g) for a, g in args["grids"].items()} if args.get("grids") else None
    picked = picks(runs, arms, args["tune_seed"], grids)
    at = {
        a: sorted(
            (r for r in runs if r["arm"] == a and (r["beta"], r["lr"]) == picked[a] and r["seed"] in args["seeds"]),
            key=lambda r: r["seed"],
        )
        for a in arms
    }
    out = {"_picked": picked, "_at": at}
    rows = [f"| arm | tuning runs (seed {args['tune_seed']}): val acc at β, lr | pick β, lr |", "|---|---|---|"]
    for a in arms:
        rs = sorted(
            (r for r in runs if r["arm"] == a and r["seed"] == args["tune_seed"]),
            key=lambda r: (r["beta"] or 0, r["lr"]),
        )
        cells = ", ".join(
            (f"β {r['beta']:g} " if r["beta"] is not None else "") + f"lr {r['lr']:g}: {final(r, column=1):.3f}"
            for r in rs
        )
        beta, lr = picked[a]
        rows.append(f"| {a} | {cells} | {'' if beta is None else f'β {beta:g}, '}lr {lr:g} |")
    out["tuning"] = "\n".join(rows)

    rows = [
        "| arm | seeds | final test acc | AUC | critic ranking, fresh | fresh, steps 1-40 → 81-120 | ranking, other "
        "steps | Brier, mixed groups | ψ std | KL to SFT (probe) | entropy, steps 1-20 → 101-120 | ‖Δθ‖ of the k-th "
        "step after a reset / median step away from resets: k=0, peak over k<6 | resets | CPU s/run |",
        "|---" * 14 + "|",
    ]
    for a in arms:
        rs = at[a]
        fresh = values(rs, lambda r: run_mean(r, "pacs/critic_ranking_fresh"))
        early = values(rs, lambda r: step_mean(r, "pacs/critic_ranking_fresh", 0, 40))
        late = values(rs, lambda r: step_mean(r, "pacs/critic_ranking_fresh", 80, 120))
        ranking = values(rs, lambda r: other_steps_mean(r, "pacs/critic_ranking", args["steps_per_generation"]))
        brier = values(rs, lambda r: run_mean(r, "pacs/critic_brier_mixed"))
        psi_std = values(rs, lambda r: run_mean(r, "pacs/psi_std"))
        ent0, ent1 = (
            values(rs, lambda r: step_mean(r, "entropy", 0, 20)),
            values(rs, lambda r: step_mean(r, "entropy", 100, 120)),
        )
        shocks = values(rs, reset_shock)
        resets = [max((s.get("pacs/reference_resets", 0) for s in r["steps"]), default=0) for r in rs]
        rows.append(
            f"| {a} | {len(rs)} | {fmt([final(r) for r in rs])} | {fmt([auc(r) for r in rs])} | {fmt(fresh)} | "
            + (f"{statistics.mean(early):.3f} → {statistics.mean(late):.3f} | " if early and late else "— | ")
            + f"{fmt(ranking)} | {fmt(brier)} | {fmt(psi_std)} | {fmt([r['kl_to_sft'] for r in rs])} | "
            + (f"{statistics.mean(ent0):.3f} → {statistics.mean(ent1):.3f} | " if ent0 and ent1 else "— | ")
            + f"{shock_cell(shocks)} | "
            + (f"{statistics.mean(resets):.0f} | " if a.startswith("PACS ref") else "— | ")
            + f"{statistics.mean(r['cpu_seconds'] for r in rs):.0f} |"
        )
    out["summary"] = "\n".join(rows)

    rows = ["| arm | " + " | ".join(f"− {b}, final test acc | − {b}, AUC" for b in BASELINES) + " |", "|---" * 7 + "|"]
    for a in arms:
        cells = []
        for b in BASELINES:
            if b == a or b not in at:
                cells += ["—", "—"]
                continue
            cells += [fmt(paired(at[a], at[b]), True), fmt(paired(at[a], at[b], auc), True)]
        rows.append(f"| {a} | " + " | ".join(cells) + " |")
    out["paired"] = "\n".join(rows)
    out["verdict"] = verdict(at)
    return out


def decide(diffs: list[float], a: str, b: str) -> str:
    ci = t_interval(diffs)
    if ci is None:
        return f"{a} vs {b}: too few paired seeds"
    m, lo, hi = ci
    if lo > 0 or hi < 0:
        winner, loser = (a, b) if m > 0 else (b, a)
        return f"**{winner}** beats {loser} by {abs(m):.3f} [{lo:+.3f}, {hi:+.3f}] ({a} − {b}, paired, {len(diffs)} seeds)"
    return (
        f"no difference detected between {a} and {b}: {m:+.3f} [{lo:+.3f}, {hi:+.3f}] ({a} − {b}, {len(diffs)} seeds)"
    )


def verdict(at: dict) -> list[str]:
    """The pre-registered rule (anchor_protocol.md), applied to the numbers."""
    lines = []
    a, b = PRIMARY

    def both(label: str, x: str, y: str) -> str:
        return (f"{label}: " + decide(paired(at[x], at[y]), x, y) + "; on AUC (secondary): "
                + decide(paired(at[x], at[y], auc), x, y) + ".")  # fmt: skip

    if a in at and b in at:
        lines.append(both("Primary", a, b))
    for n in (8, 2):
        w, r, k = f"PACS ref N={n} reset+warmup", f"PACS ref N={n} reset", f"PACS ref N={n} keep"
        if w in at and r in at:
            lines.append(both("Re-warmup", w, r))
        if k in at and r in at:
            lines.append(both("Optimizer reset", r, k))
    if "PACS ref N=2 reset" in at and "PACS ref N=8 reset" in at:
        lines.append(both("Interval", "PACS ref N=2 reset", "PACS ref N=8 reset"))
    both = []
    for arm, rs in at.items():
        fresh = values(rs, lambda r: run_mean(r, "pacs/critic_ranking_fresh"))
        ci_f = t_interval(fresh)
        ci_d = t_interval(paired(rs, at.get("PACS rollout", [])))
        if ci_f and ci_f[1] > 0.5 and arm != "PACS rollout" and (ci_d is None or ci_d[2] >= 0):
            both.append(f"{arm} (fresh ranking {ci_f[0]:.3f}, vs rollout {ci_d[0]:+.3f})" if ci_d else arm)
    lines.append(
        "Arms with both an informative critic (fresh ranking interval above 0.5) and final accuracy not below the "
        "rollout anchor (paired interval reaching 0 or above): " + (", ".join(both) if both else "none") + "."
    )
    return lines


def plot(at: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for a, rs in at.items():
        if not rs:
            continue
        steps = [p[0] for p in rs[0]["curve"]]
        mean = [statistics.mean(r["curve"][i][2] for r in rs) for i in range(len(steps))]
        line = axes[0].plot(steps, mean, marker="o", ms=3, label=a)[0]
        for ax, key in ((axes[1], "pacs/critic_ranking_fresh"), (axes[2], "entropy")):
            xs = sorted({s["step"] for r in rs for s in r["steps"] if s.get(key) is not None})
            if not xs:
                continue
            ys = [
                statistics.mean(s[key] for r in rs for s in r["steps"] if s["step"] == x and s.get(key) is not None)
                for x in xs
            ]
            w = 5
            ys = [statistics.mean(ys[max(0, i - w + 1) : i + 1]) for i in range(len(ys))]
            ax.plot(xs, ys, color=line.get_color(), label=a)
    axes[0].set(xlabel="optimizer step", ylabel="greedy test accuracy", title="held-out accuracy (mean over seeds)")
    axes[1].set(
        xlabel="optimizer step", ylabel="within-group ranking", title="critic on fresh completions (5-point avg)"
    )
    axes[1].axhline(0.5, color="grey", lw=0.8, ls="--")
    axes[2].set(xlabel="optimizer step", ylabel="token entropy", title="policy entropy (5-point avg)")
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(raw: dict, out: Path, smoke: bool = False) -> None:
    t = tables(raw)
    info, args = raw["info"], raw["args"]
    protocol = (Path(__file__).parent / "anchor_protocol.md").read_text().split("\n", 2)[2]
    stem = "anchor_smoke" if smoke else "anchor"
    lines = [
        "# The reward proxy's anchor, every arm tuned: π_old of each rollout vs a fixed, periodically reset π_ref (CPU)",
        "",
        report_md.machine_markdown(info),
        f"- command: `{' '.join(raw.get('argv') or [])}`",
        f"- code: {info.get('code', 'this checkout')}",
        f"- SFT warm start: {raw['sft']}",
        "",
        "## Protocol (written before the runs: anchor_protocol.md)",
        "",
        protocol.strip(),
        "",
        "## Tuning",
        "",
        t["tuning"],
        "",
        f"## At each arm's pick (seeds {args['seeds']})",
        "",
        t["summary"],
        "",
        "Paired by seed (same prompt order), final test accuracy and AUC differences, 95% t-intervals:",
        "",
        t["paired"],
        "",
        f"![anchor]({stem}.png)",
        "",
        "## What the rule says",
        "",
        *[f"- {line}" for line in t["verdict"]],
        "",
    ]
    (out / f"{stem}.md").write_text("\n".join(lines))
    plot(t["_at"], out / f"{stem}.png", f"anchor study: {len(raw['runs'])} runs")
