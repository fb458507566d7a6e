"""What the benchmark reports share for rendering: the machine block, markdown tables, ratio cells, intervals, goals
judged from the measured numbers, and the implicit critic's columns.

The per-benchmark report modules (`step_cost_report.py`, `learning_report.py`, `reuse_report.py`,
`smollm_compare_report.py`) build their markdown from these and from the JSON a benchmark wrote, so `--report-only`
redoes a report from its JSON alone. A report states no verdict of its own: where a goal is stated, `goal` compares
the measured number with the threshold and prints both.
"""

from __future__ import annotations

import operator
from pathlib import Path

from benchmarks import harness


def machine_markdown(info: dict) -> str:
    """The machine/version block of a results file."""
    lines = [
        f"- date: {info['date']}",
        f"- machine: {info['cpu']}, {info['nproc']} CPU cores, {info['ram_gib']} GiB RAM"
        + (f", GPU {info['gpu']}" if info.get("gpu") else ", no GPU"),
        f"- load average (1/5/15 min) at start: {info['load_average_start']}; at end: "
        f"{info.get('load_average_end', 'n/a')}",
        f"- versions: python {info['python']}, torch {info['torch']}, transformers {info['transformers']}, "
        f"trl {info['trl']}, pacs {info['pacs']}" + (f" (git {info['pacs_git']})" if info.get("pacs_git") else ""),
    ]
    return "\n".join(lines)


def command(argv: list[str], script: str) -> str:
    """The command of a run's `argv`: `python -m benchmarks.<study>.<script> <args>`, the command that reruns it from
    the repository root, for a script at the path the run names (from `benchmarks/` on).

    Runs made before the studies got their folders name `benchmarks/<script>.py`, which is gone: they keep the command
    they ran. `script` (the path today) stands in where argv[0] does not name a folder called benchmarks.

    >>> command(["/work/main/benchmarks/learning.py", "--jobs", "2"], "benchmarks/learning/learning.py")
    'python benchmarks/learning.py --jobs 2'
    >>> command(["/work/main/benchmarks/learning/learning.py", "--smoke"], "benchmarks/learning/learning.py")
    'python -m benchmarks.learning.learning --smoke'
    >>> command(["learning.py", "--smoke"], "benchmarks/learning/learning.py")
    'python -m benchmarks.learning.learning --smoke'
    """
    parts = Path(argv[0]).parts
    if "benchmarks" in parts:
        script = "/".join(parts[len(parts) - 1 - parts[::-1].index("benchmarks") :])
    if (Path(__file__).resolve().parent.parent / script).is_file():  # today's script: run as a module
        return " ".join(["python", "-m", script.removesuffix(".py").replace("/", "."), *argv[1:]])
    return " ".join(["python", script, *argv[1:]])


def table(head: list[str], rows: list[list]) -> str:
    """A markdown table; cells are written with str()."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def ratio_cell(lo_med_hi, spec: str = ".3f") -> str:
    """ "lo / **median** / hi" of a (min, median, max) triple."""
    lo, m, hi = lo_med_hi
    return f"{lo:{spec}} / **{m:{spec}}** / {hi:{spec}}"


def fmt3(values, spec: str = ".3f") -> str:
    """ "median (min–max)" of a sequence, formatted with `spec`."""
    lo, med, hi = harness.min_med_max(values)
    return f"{med:{spec}} ({lo:{spec}}–{hi:{spec}})"


def interval(xs, spec: str = ".3f", none: str = "n/a") -> str:
    """ "mean [low, high]" (95% t-interval over `xs`); the value alone for one, `none` for no values."""
    xs = list(xs)
    if len(xs) < 2:
        return f"{xs[0]:{spec}}" if xs else none
    m, lo, hi = harness.t_interval(xs)
    return f"{m:{spec}} [{lo:{spec}}, {hi:{spec}}]"


_OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}


def goal(claim: str, value: float, op: str, threshold: float, measured: str) -> str:
    """A goal line: `claim` (naming `threshold`), what was measured, and met/missed from `value` `op` `threshold`.

    >>> goal("peak memory ratio < {threshold}", 0.7, "<", 0.95, "0.70")
    '- peak memory ratio < 0.95: 0.70: **met**'
    """
    met = _OPS[op](value, threshold)
    return f"- {claim.format(threshold=threshold)}: {measured}: **{'met' if met else 'missed'}**"


# The implicit critic. Three summaries exist: "pooled" (results before 2026-12-04: |sigma(psi) - 1/2| of every
# completion of the off-policy steps pooled, from a recording subclass), "per_step" (2026-12-04: PACSTrainer's
# per-step metrics, so quantiles are over the steps' medians) and "per_step_ranking" (`harness.critic_summary` since
# issue 31: the same, with the within-group ranking and the Brier score on mixed groups). The first two predate the
# well-posed critic metric: their JSON hold sign accuracies that were compared with always guessing the majority label,
# a comparison withdrawn (CRITIC_WITHDRAWN); reports show only their |sigma(psi) - 1/2| figures. Each report says
# which summary it shows.

RANKING = "per_step_ranking"


def critic_kind(critics) -> str:
    """ "pooled", "per_step" or "per_step_ranking" for a list of `critic` dicts (all of one kind)."""
    kinds = {c.get("summary", "pooled") for c in critics if c}
    if len(kinds) > 1:
        raise ValueError("critic summaries of several kinds in one table; rerun the older runs or report them apart")
    return kinds.pop() if kinds else RANKING


def critic_margins(c: dict) -> list[float]:
    """The 10/50/90% quantiles of |sigma(psi) - 1/2|: over completions (pooled) or over per-step medians."""
    return c.get("abs_sigma_psi_minus_half_q10_q50_q90") or c["critic_margin_step_q10_q50_q90"]


def critic_spread(c: dict) -> float:
    """Pooled: share of completions with |sigma(psi) - 1/2| > 0.05; per step: mean share with |y - sigma(psi)| < 0.1."""
    return c["frac_abs_dev_over_0.05"] if "frac_abs_dev_over_0.05" in c else c["critic_close_frac"]


def num(x, spec: str = ".3f") -> str:
    """`x` formatted, or "—" for None (a metric no step logged, e.g. the fresh ranking with the rollout anchor)."""
    return "—" if x is None else f"{x:{spec}}"


_PER_STEP_HEADS = {
    "margins": "per-step median abs(σ(ψ) − ½): 10% / 50% / 90% quantile over steps",
    "median": "median over steps of the per-step median abs(σ(ψ) − ½)",
    "spread": "share with abs(label − σ(ψ)) < 0.1, mean over steps",
}
CRITIC_HEADS = {
    "pooled": {
        "margins": "abs(σ(ψ) − ½) 10% / 50% / 90% quantile",
        "median": "median abs(σ(ψ) − ½)",
        "spread": "share > 0.05",
    },
    "per_step": _PER_STEP_HEADS,
    RANKING: {
        **_PER_STEP_HEADS,
        "ranking": "within-group ranking, off-policy steps (in-sample)",
        "fresh": "within-group ranking, first step of each generation (out of sample; steps)",
        "brier": "Brier score of σ(ψ) on mixed groups (0.25: ψ = 0)",
    },
}

CRITIC_NOTES = {
    "pooled": "|σ(ψ) − ½| is per completion, pooled over the off-policy steps of a run",
    "per_step": "|σ(ψ) − ½| is first the median over one step's completions (PACSTrainer's `pacs/critic_margin`), "
    "then its quantiles over the off-policy steps of a run; shares are means of per-step values",
    RANKING: "|σ(ψ) − ½| is first the median over one step's completions (PACSTrainer's `pacs/critic_margin`), "
    "then its quantiles over the off-policy steps of a run. The within-group ranking (`pacs/critic_ranking`) is the "
    "share of (correct, incorrect) pairs of one group whose ψ is ordered right, ties ½, over the groups holding both "
    "labels: 0.5 means no information. Off-policy it is in-sample (ψ was fitted to those labels); on each "
    "generation's first step (`pacs/critic_ranking_fresh`) it is out of sample; there it is exactly 0.5 with the "
    "rollout anchor (ψ = 0) and not logged where a reference anchor equals the policy. Rankings, Brier scores and shares are means of per-step values",
}

CRITIC_WITHDRAWN = (
    "These runs predate the well-posed critic metric (`pacs/critic_ranking`, issue 31). Their JSON hold aggregates "
    "only, not each completion's ψ and group, so it cannot be recomputed for them: of the critic, only |σ(ψ) − ½| is "
    "shown. Earlier versions of this report also compared the critic's sign accuracy (the share of completions with "
    "σ(ψ) > ½ exactly when correct) with always guessing the "
    "majority label; that comparison is withdrawn as ill-posed: with the RLOO score ψ sums to zero within every group, "
    'so σ(ψ) cannot say "this whole group is right", a uniform group always has a wrong sign whatever the critic '
    "knows, ψ = 0 counts as a negative guess, and the majority-label baseline is carried by exactly those uniform "
    "groups."
)


def critic_legacy(kind: str) -> bool:
    """True for the summaries that predate the within-group ranking (no well-posed critic measure to show)."""
    return kind != RANKING
