"""Renders filtering.md (and filtering.png) from filtering.json (`python -m benchmarks.filtering.filtering
--report-only`). Every number is computed here from the runs, with the rules of filtering_protocol.md (written before
the runs). Not run on its own."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks import report as report_md
from benchmarks.anchor.anchor_report import decide, fmt
from benchmarks.harness import t_interval


PAPER = "PACS ref N=8 reset"
FINAL_STEPS = (80, 100, 120)  # per step: mean test accuracy at these steps (the sparsity study's "final")
FIXED_STEPS_ALL = (20, 40, 60, 80, 100, 120)  # where every run, with or without DS, is evaluated
STEP = 1280  # generated-completion thresholds: 1280 k up to 7680 (no-DS evaluations), then 7680 m
ORDER = ("GRPO", "GRPO + DS", "PACS rollout", "PACS rollout + DS", "PACS rollout, uniform out", PAPER,
         f"{PAPER} + DS", f"{PAPER}, uniform out")  # fmt: skip


def thresholds(most: int) -> list[int]:
    out = [STEP * k for k in range(1, 7) if STEP * k <= most]
    m = 2
    while 7680 * m <= most:
        out.append(7680 * m)
        m += 1
    return out


def final(run: dict) -> float:
    """Per step: mean test accuracy at steps 80, 100, 120 (or the run's last 3 fixed evaluations in a smoke run)."""
    points = [c for c in run["curve"] if c[0] in FINAL_STEPS] or run["curve"][-3:]
    return statistics.mean(c[3] for c in points)


def at_generated(run: dict, x: int) -> float | None:
    """Per generated completion: mean test accuracy of the last 3 evaluations at which the run had generated at most
    `x` completions; None when the run never generated `x` (it does not reach the threshold)."""
    if run["generated"] < x:
        return None
    points = [c for c in run["curve"] if c[1] <= x][-3:]
    return statistics.mean(c[3] for c in points)


def collect(raw: dict) -> dict:
    runs = [r for r in raw["runs"] if r["seed"] in raw["args"]["seeds"] or raw["args"].get("smoke")]
    wss = [ws for ws in ("dense-s105", "sparse-s80", "smoke") if any(r["warm_start"] == ws for r in runs)]
    picks = {**raw.get("sparsity_picks", {}), **raw.get("ds_picks", {})}
    at = {}
    for r in runs:
        key = f"{r['warm_start']}|{r['base_arm'] if r['arm'].endswith('uniform out') else r['arm']}"
        pick = picks.get(key)
        if pick is not None and [pick[0], pick[1]] != [r["beta"], r["lr"]]:
            continue  # a tuning run of a DS arm at another lr
        at.setdefault((r["warm_start"], r["arm"]), []).append(r)
    for rs in at.values():
        rs.sort(key=lambda r: r["seed"])
    arms = [a for a in ORDER if any((ws, a) in at for ws in wss)]
    return {"wss": wss, "arms": arms, "at": at}


def paired(c: dict, ws: str, a: str, b: str, fn) -> list[float]:
    ra = {r["seed"]: r for r in c["at"].get((ws, a), [])}
    rb = {r["seed"]: r for r in c["at"].get((ws, b), [])}
    out = []
    for s in sorted(ra.keys() & rb.keys()):
        x, y = fn(ra[s]), fn(rb[s])
        if x is not None and y is not None:
            out.append(x - y)
    return out


def common_threshold(c: dict, ws: str, *arms: str) -> int | None:
    """The largest threshold every seed of every arm in `arms` reaches."""
    rs = [r for a in arms for r in c["at"].get((ws, a), [])]
    if not rs:
        return None
    ts = thresholds(min(r["generated"] for r in rs))
    return ts[-1] if ts else None


def per_completion(c: dict, ws: str, a: str, b: str) -> tuple[int | None, list[float]]:
    x = common_threshold(c, ws, a, b)
    return x, paired(c, ws, a, b, lambda r: at_generated(r, x)) if x else []


def generated_per_trained(run: dict, group: int) -> float:
    """Completions the run generated per completion it trained (1 without DS): a DS generation batch trains
    `groups_generated / rounds` groups of `group` completions."""
    if not run["ds"]:
        return 1.0
    return run["generated"] / sum(d["groups_generated"] / d["rounds"] * group for d in run["ds"])


def cost(rs: list[dict], group: int) -> dict:
    ds = [d for r in rs for d in r["ds"]]
    batches = len(ds)
    per_run = [generated_per_trained(r, group) for r in rs]
    return {
        "generated": statistics.mean(r["generated"] for r in rs),
        "per_trained": statistics.mean(d["generated_per_trained"] for d in ds) if ds else 1.0,
        "per_trained_runs": (min(per_run), max(per_run)),
        "rounds": (min((d["rounds"] for d in ds), default=1), max((d["rounds"] for d in ds), default=1)),
        "fallback_batches": sum(d["fallback_groups"] > 0 for d in ds),
        "batches": batches,
        "fallback_share": (  # of the groups trained: a batch trains groups_generated / rounds groups
            sum(d["fallback_groups"] for d in ds) / sum(d["groups_generated"] / d["rounds"] for d in ds) if ds else 0.0
        ),
        "minutes": statistics.mean(r["seconds"] for r in rs) / 60,
    }


def arms_table(c: dict, group: int) -> str:
    rows = [["warm start", "arm", "β", "lr", "seeds", "final test acc (steps 80-120)", "completions generated",
             "generated / trained: per batch (runs' range)", "rounds per batch", "fallback: batches (groups)",
             "KL to warm start", "min / run"]]  # fmt: skip
    for ws in c["wss"]:
        for a in c["arms"]:
            rs = c["at"].get((ws, a))
            if not rs:
                continue
            k = cost(rs, group)
            fb = f"{k['fallback_batches']}/{k['batches']} ({k['fallback_share']:.1%})" if k["batches"] else "—"
            runs_range = "{:.2f}-{:.2f}".format(*k["per_trained_runs"])
            rounds = "{:g}-{:g}".format(*k["rounds"]) if k["rounds"][0] != k["rounds"][1] else f"{k['rounds'][0]:g}"
            rows.append([
                ws, a, "—" if rs[0]["beta"] is None else f"{rs[0]['beta']:.3g}", f"{rs[0]['lr']:g}", str(len(rs)),
                fmt([final(r) for r in rs]), f"{k['generated']:.0f}", f"{k['per_trained']:.2f} ({runs_range})",
                rounds, fb, f"{statistics.mean(r['kl_to_sft'] for r in rs):.4f}", f"{k['minutes']:.1f}",
            ])  # fmt: skip
    return report_md.table(rows[0], rows[1:])


def tuning_table(raw: dict) -> str:
    rows = [["warm start", "arm", "β", "lr", "tuning score (val, steps 80-120)", "picked"]]
    picks = raw.get("ds_picks", {})
    tune = [r for r in raw["runs"] if r["seed"] == raw["args"]["tune_seed"] and r["arm"].endswith("+ DS")]
    for r in sorted(tune, key=lambda r: (r["warm_start"], r["arm"], r["lr"])):
        fixed = [x for x in r["curve"] if x[0] in FINAL_STEPS]
        score = statistics.mean(x[2] for x in fixed)
        pick = picks.get(f"{r['warm_start']}|{r['arm']}")
        rows.append([r["warm_start"], r["arm"], "—" if r["beta"] is None else f"{r['beta']:.3g}", f"{r['lr']:g}",
                     f"{score:.3f}", "yes" if pick and pick[1] == r["lr"] else ""])  # fmt: skip
    return report_md.table(rows[0], rows[1:]) if len(rows) > 1 else "(no tuning runs)"


def p_value(xs: list[float]) -> float | None:
    """Two-sided p of the paired t-test (mean 0), Student's t in closed form for integer degrees of freedom nu
    (Abramowitz & Stegun 26.7.3-4: P(|T| < t) as a series in cos(theta), theta = atan(t / sqrt(nu)))."""
    import math

    if len(xs) < 2:
        return None
    nu, sd = len(xs) - 1, statistics.stdev(xs)
    if sd == 0:
        return float(statistics.mean(xs) == 0)
    th = math.atan(abs(statistics.mean(xs)) / sd * math.sqrt(len(xs) / nu))
    c, odd = math.cos(th), nu % 2
    term = total = c if odd else 1.0  # even nu: sin(1 + c^2/2 + ...); odd: 2/pi (th + sin (c + 2/3 c^3 + ...))
    for k in range(2 + odd, nu - odd, 2):
        term *= (k - 1) / k * c * c
        total += term
    inside = math.sin(th) * total if not odd else 2 / math.pi * (th + (math.sin(th) * total if nu > 1 else 0.0))
    return max(0.0, 1.0 - inside)


def holm(ps: list[float | None], alpha: float = 0.05) -> list[bool]:
    """Holm's step-down correction over the tests with a p: which ones still exclude 0 at family-wise `alpha`."""
    keep, order = [False] * len(ps), sorted((p, i) for i, p in enumerate(ps) if p is not None)
    for rank, (p, i) in enumerate(order):
        if p > alpha / (len(order) - rank):
            break
        keep[i] = True
    return keep


def evaluation_steps(c: dict, ws: str, arm: str, x: int) -> str:
    """The optimizer steps of the evaluations that `at_generated(run, x)` averages, over the arm's seeds ("16-24")."""
    steps = [p[0] for r in c["at"].get((ws, arm), []) for p in [q for q in r["curve"] if q[1] <= x][-3:]]
    return f"{min(steps)}-{max(steps)}" if steps else "—"


def comparisons(c: dict) -> tuple[list[str], list[list[str]]]:
    """The primary line(s) and the secondary table rows: (warm start, comparison, axis, result, p, Holm). Holm's
    correction runs over every row of the table: the study's tests."""
    primary, rows, tests = [], [], []

    def add(ws, a, b, axis):
        if axis == "per step":
            d, where = paired(c, ws, a, b, final), "final (steps 80-120)"
        else:
            x, d = per_completion(c, ws, a, b)  # with the steps of the evaluations it averages: row / column arm
            steps = f"{evaluation_steps(c, ws, a, x)} / {evaluation_steps(c, ws, b, x)}" if x else ""
            where = f"at {x} generated completions (evaluations at steps {steps})" if x else "no common threshold"
        if d:
            rows.append([ws, f"{a} − {b}", where, decide(d, a, b)])
            tests.append(d)
        return d, where

    for ws in c["wss"]:
        d, where = add(ws, f"{PAPER} + DS", "GRPO + DS", "per completion")
        if ws == "sparse-s80" and d:
            seeds = ", ".join(f"{x:+.3f}" for x in d)
            primary.append(f"`{ws}`, {where}: " + decide(d, f"{PAPER} + DS", "GRPO + DS") + f"; per seed {seeds}.")
        add(ws, "PACS rollout + DS", "GRPO + DS", "per completion")
        for base in ("GRPO", "PACS rollout", PAPER):
            add(ws, f"{base} + DS", base, "per step")
            add(ws, f"{base} + DS", base, "per completion")
        for base in ("PACS rollout", PAPER):  # does DS help PACS as much as GRPO? per seed, difference of gains
            for axis in ("per step", "per completion"):
                gains = gain_difference(c, ws, base, axis)
                if gains:  # per completion: each gain at its own common threshold
                    xs = [per_completion(c, ws, f"{b} + DS", b)[0] for b in (base, "GRPO")]
                    where = axis if axis == "per step" else f"{axis} (each gain at {xs[0]} / {xs[1]} generated)"
                    rows.append([ws, f"({base} + DS − {base}) − (GRPO + DS − GRPO)", where,
                                 decide(gains, f"DS's gain for {base}", "for GRPO")])  # fmt: skip
                    tests.append(gains)
        for base in ("PACS rollout", PAPER):
            add(ws, f"{base}, uniform out", base, "per step")
        add(ws, f"{PAPER} + DS", "GRPO + DS", "per step")
        add(ws, "PACS rollout + DS", "GRPO + DS", "per step")
    ps = [p_value(d) for d in tests]
    head = ["warm start", "comparison (row − column, paired by seed)", "axis", "result", "p (uncorrected)",
            f"excludes 0 after Holm ({sum(p is not None for p in ps)} tests)"]  # fmt: skip
    return primary, [head] + [[*row, "—" if p is None else f"{p:.3f}", "**yes**" if ok else "no"]
                              for row, p, ok in zip(rows, ps, holm(ps))]  # fmt: skip


def post_hoc(c: dict) -> str:
    """Not in the protocol, uncorrected: DS − no DS and uniform out − kept at each fixed evaluation step."""
    pairs = [(f"{b} + DS", b) for b in ("GRPO", "PACS rollout", PAPER)]
    pairs += [(f"{b}, uniform out", b) for b in ("PACS rollout", PAPER)]
    runs = [r for rs in c["at"].values() for r in rs]
    steps = [s for s in FIXED_STEPS_ALL if all(any(p[0] == s for p in r["curve"]) for r in runs)]
    rows = []
    for ws in c["wss"]:
        for a, b in pairs:
            cells = [fmt(paired(c, ws, a, b, lambda r, s=s: next(p[3] for p in r["curve"] if p[0] == s)), signed=True)
                     for s in steps]  # fmt: skip
            if any(x != "—" for x in cells):
                rows.append([ws, f"{a} − {b}", *cells])
    return report_md.table(["warm start", "comparison", *(f"step {s}" for s in steps)], rows) if rows else "(none)"


def recipe_rules(c: dict) -> list[str]:
    """The protocol's recipe rules, applied (filtering_protocol.md, "Decision rule"): "above 0" = an interval above 0."""
    wss, said = ("dense-s105", "sparse-s80"), []
    at_x = lambda xd: (f" at {xd[0]}", xd[1])  # noqa: E731
    rules = [  # (the rule, per warm start: (where, diffs), what follows when met / not met)
        ("dynamic sampling on in the PACS recipes only if, for the paper's method, DS − no DS is above 0 at equal "
         "generated completions on both warm starts", lambda ws: at_x(per_completion(c, ws, f"{PAPER} + DS", PAPER)),
         "the PACS recipes turn dynamic sampling on", "the PACS recipes keep dynamic sampling off"),
        ('`pacs_uniform_groups="drop"` a recipe value only if, for the paper\'s method, drop − keep is above 0 per '
         "step (final) on both warm starts", lambda ws: ("", paired(c, ws, f"{PAPER}, uniform out", PAPER, final)),
         "the recipes set `pacs_uniform_groups: drop`", 'the recipes keep `pacs_uniform_groups="keep"`'),
    ]  # fmt: skip
    for rule, get, yes, no in rules:
        got = {ws: get(ws) for ws in wss}
        met = all((t_interval(d) or (0, 0, 0))[1] > 0 for _, d in got.values())
        cells = "; ".join(f"`{ws}` {fmt(d, signed=True)}{x}" if d else f"`{ws}` not run" for ws, (x, d) in got.items())
        said.append(f"{rule[0].upper()}{rule[1:]}: {cells} → **{'met' if met else 'not met'}: {yes if met else no}**.")
    return said + ["`PACSConfig`'s defaults do not change on this study (the protocol)."]


def gain_difference(c: dict, ws: str, base: str, axis: str) -> list[float]:
    if axis == "per step":
        pacs, grpo = paired(c, ws, f"{base} + DS", base, final), paired(c, ws, "GRPO + DS", "GRPO", final)
    else:  # each gain at its own common threshold: DS arm vs its no-DS arm (7680 where the no-DS arm stops)
        pacs, grpo = per_completion(c, ws, f"{base} + DS", base)[1], per_completion(c, ws, "GRPO + DS", "GRPO")[1]
    n = min(len(pacs), len(grpo))
    return [p - g for p, g in zip(pacs[:n], grpo[:n])]


def plot(c: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(c["wss"]), figsize=(6.5 * len(c["wss"]), 9), squeeze=False)
    for col, ws in enumerate(c["wss"]):
        for a in c["arms"]:
            rs = c["at"].get((ws, a), [])
            if not rs:
                continue
            steps = sorted({p[0] for p in rs[0]["curve"]})
            style = dict(marker="o", ms=2.5, ls="--" if "uniform" in a else "-", label=a)
            mean_at = [statistics.mean(next(p[3] for p in r["curve"] if p[0] == s) for r in rs) for s in steps]
            axes[0][col].plot(steps, mean_at, **style)
            gens = [statistics.mean(next(p[1] for p in r["curve"] if p[0] == s) for r in rs) for s in steps]
            axes[1][col].plot(gens, mean_at, **style)
        axes[0][col].set(xlabel="optimizer step", ylabel="greedy test accuracy", title=f"{ws}: per optimizer step")
        axes[1][col].set(xlabel="completions generated", ylabel="greedy test accuracy", xscale="log",
                         title=f"{ws}: per generated completion (mean over seeds)")  # fmt: skip
        axes[0][col].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def runs_line(raw: dict) -> str:
    """How many runs, and which: reported seeds (reused from sparsity.json or run here) and DS tuning runs."""
    runs, tune = raw["runs"], raw["args"].get("tune_seed")
    reported = [r for r in runs if r["seed"] in raw["args"]["seeds"]]
    reused, tuning = sum(r.get("from") == "sparsity.json" for r in reported), sum(r["seed"] == tune for r in runs)
    return (f"{len(runs)}: {len(reported)} on the reported seeds ({len(reported) - reused} here, {reused} no-DS GRPO / "
            f"PACS rollout / paper runs reused from sparsity.json) and {tuning} DS tuning run(s) on seed {tune}; the "
            "spot rerun apart (below)")  # fmt: skip


def cpu_line(raw: dict) -> str:
    """The CPU each run ran on, where the run records it (`machine`: lscpu model, torch's kernels, flags hash)."""
    cpus = [f"{m['cpu']}, {m['cpu_capability']}, lscpu flags sha256 {m['cpu_flags_sha256']}"
            for m in (r.get("machine") for r in raw["runs"]) if m]  # fmt: skip
    parts = [f"{cpus.count(k)} run(s) on {k}" for k in dict.fromkeys(cpus)]
    if len(cpus) < len(raw["runs"]):
        parts.append(f"{len(raw['runs']) - len(cpus)} of {len(raw['runs'])} runs record no CPU (made before runs "
                     "recorded theirs): the CPU named above is the `--collect` process's, which the JSON cannot show "
                     "to be theirs")  # fmt: skip
    return "; ".join(parts)


def report(raw: dict, out: Path, smoke: bool = False) -> None:
    c = collect(raw)
    info, args = raw["info"], raw["args"]
    stem = "filtering_smoke" if smoke else "filtering"
    primary, rows = comparisons(c)
    spot = raw.get("spot")
    spot_line = (
        "no spot rerun (smoke)"
        if not spot
        else f"spot rerun {spot['spec']}: bit-identical to sparsity.json: **{spot['bit_identical']}** (test curve "
        f"here {[round(x[2], 3) for x in spot['curve_here']]}, there {[round(x[2], 3) for x in spot['curve_sparsity_json']]};"
        f" KL {spot['kl_here']:.6g} vs {spot['kl_sparsity_json']:.6g})"
    )
    gits = sorted({str(r.get("pacs_git")) for r in raw["runs"]})
    lines = [
        "# Does filtering help PACS? Dynamic sampling and the uniform-group term vs GRPO + DS (CPU)",
        "",
        report_md.machine_markdown(info),
        f"- command: `{report_md.command(raw.get('argv') or ['filtering.py'], 'benchmarks/filtering/filtering.py')}`",
        f"- CPU kernels: {info.get('cpu_capability', 'n/a')} (lscpu flags sha256 {info.get('cpu_flags_sha256', 'n/a')}), "
        f"{args.get('threads', 'n/a')} torch thread(s) per run",
        f"- runs: {runs_line(raw)}; code: {', '.join(gits)}; protocol: `filtering_protocol.md` (committed before "
        "the runs); verdict: `filtering_verdict.md`",
        f"- CPU per run: {cpu_line(raw)}",
        "- warm starts: "
        + ", ".join(f"{k} (sha256 {v.get('sha256')})" for k, v in raw.get("warm_starts", {}).items()),
        f"- {spot_line}",
        "",
        "## Arms at their picks (mean [95% t-interval] over seeds; fallback = uniform groups let in after 10 rounds)",
        "",
        arms_table(c, args.get("num_generations", 8)),
        "",
        f"![test accuracy per step and per generated completion]({stem}.png)",
        "",
        f"## DS arms' tuning (seed {args.get('tune_seed')}, lr over pick / 3, pick, pick x 3)",
        "",
        tuning_table(raw),
        "",
        "## Primary comparison (sparse-s80: the paper's method + DS − GRPO + DS, at equal generated completions)",
        "",
        *([f"- {line}" for line in primary] or ["- not computed (missing runs)"]),
        "",
        "## Secondary (uncorrected; Holm's correction beside)",
        "",
        "Per completion: test accuracy (mean of the last 3 evaluations) at the largest generated-completion threshold "
        "both arms reach on every seed, with the optimizer steps those evaluations come from (row arm / column arm); "
        "per step: mean test accuracy at steps 80-120. p: the paired t-test's, uncorrected; Holm: at family-wise 5% "
        "over every row of the table (the primary included), the study's tests.",
        "",
        report_md.table(rows[0], rows[1:]) if len(rows) > 1 else "(none)",
        "",
        "## The protocol's recipe rules, applied",
        "",
        *[f"- {line}" for line in recipe_rules(c)],
        "",
        "## Post hoc (not in the protocol; uncorrected): differences at each fixed evaluation step",
        "",
        "Test accuracy at the step, paired by seed, mean [95% t-interval]; looked at after the results, so read as "
        "exploration, not as findings.",
        "",
        post_hoc(c),
        "",
        "Transfer caveat: a 0.49M-parameter character model on three-digit addition is not Qwen3-4B on DeepScaleR; "
        "generation is a small share of a step here and dominates a real run, so per generated completion is the "
        "axis that transfers.",
        "",
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text("\n".join(lines))
    plot(c, out / f"{stem}.png")


__all__ = ["at_generated", "collect", "final", "report", "thresholds", "t_interval"]
