"""What `pacs demo` reports: held-out accuracy with its 95% Wilson interval, the paired change before -> after with
its 95% interval, the table printed on stdout and the three panels of `demo.png`.

The intervals are pure functions of the outcomes (`benchmarks/smollm_compare/smollm_compare_report.py` reuses
`paired_change`); the table and the plot read the `demo_metrics.json` dict that `pacs.demo.train_and_evaluate` returns.
"""

from __future__ import annotations

import math
import os


__all__ = ["format_table", "paired_change", "plot", "wilson_interval"]


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (sane at 0 and n, unlike the normal one).

    >>> [round(x, 3) for x in wilson_interval(30, 100)]
    [0.219, 0.396]
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z**2 / n
    center = (p + z**2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def paired_change(before: dict, after: dict, z: float = 1.96) -> dict:
    """After minus before accuracy on the same problems, with a 95% interval that uses the pairing.

    Each problem is a pair (right before?, right after?); only the discordant ones move the difference:
    `fixed` (wrong -> right) and `broken` (right -> wrong). The interval is the Wald interval of a paired
    difference, (fixed - broken) / n +- z * sqrt(fixed + broken - (fixed - broken)^2 / n) / n, much narrower than
    two overlapping Wilson intervals when most problems keep their outcome.

    >>> r = paired_change({"per_problem": [0, 0, 1, 1]}, {"per_problem": [1, 0, 1, 0]})
    >>> r["fixed"], r["broken"], r["change"]
    (1, 1, 0.0)
    """
    pairs = list(zip(before["per_problem"], after["per_problem"]))
    n = len(pairs)
    fixed = sum(1 for b, a in pairs if a and not b)
    broken = sum(1 for b, a in pairs if b and not a)
    diff = (fixed - broken) / n if n else 0.0
    half = z * math.sqrt(max(fixed + broken - n * diff**2, 0.0)) / n if n else 1.0
    return {"change": diff, "ci95": [diff - half, diff + half], "fixed": fixed, "broken": broken, "n": n}


def format_table(metrics: dict) -> str:
    """The summary printed at the end of the demo."""
    before, after = metrics["before"], metrics["after"]
    lines = [
        f"pacs demo  model={metrics['model_name']}  algorithm={metrics.get('algorithm', 'pacs')}  "
        f"seed={metrics['seed']}  steps={metrics['max_steps']}  "
        f"wall={metrics['wall_time_s'] / 60:.1f} min",
        "",
        f"{'held-out accuracy':<20}{'acc':>8}{'95% CI':>18}{'correct/n':>12}{'boxed':>8}",
    ]
    for name, r in (("before", before), ("after", after)):
        ci = f"[{r['ci95'][0]:.1%}, {r['ci95'][1]:.1%}]"
        lines.append(f"{name:<20}{r['accuracy']:>8.1%}{ci:>18}{r['correct']:>7}/{r['n']:<4}{r['boxed']:>8.0%}")
    change = metrics.get("change") or paired_change(before, after)
    ci = f"[{change['ci95'][0]:+.1%}, {change['ci95'][1]:+.1%}]"
    lines.append(
        f"{'change':<20}{change['change']:>+8.1%}{ci:>18}   paired: {change['fixed']} fixed, {change['broken']} broken"
    )
    lines.append(
        "acc counts an answer only when it is boxed and right (the training reward); the pass@1 tables logged by the "
        "evaluation also count right answers without a box."
    )
    # Rewards come from the step that generated; the critic's within-group ranking from every step with a mixed group.
    lines += ["", f"{'step':>6}{'reward':>9}{'critic rank':>12}"]
    reward = {int(step): value for step, value in metrics["per_step"]["reward"]}
    critic = {int(step): value for step, value in metrics["per_step"]["critic_ranking"]}
    for step in sorted(reward.keys() | critic.keys()):
        r, c = reward.get(step), critic.get(step)
        lines.append(f"{step:>6}{'' if r is None else f'{r:.3f}':>9}{'' if c is None else f'{c:.3f}':>12}")
    return "\n".join(lines)


def plot(metrics: dict, path: str | os.PathLike, trainer_name: str = "PACSTrainer") -> None:
    """Three panels: training reward per step, implicit critic's within-group ranking per step (`pacs/critic_ranking`),
    held-out accuracy before/after; `trainer_name` (the trainer's class name) goes in the title. Metrics saved before
    the ranking existed (`critic_accuracy`, withdrawn) leave its panel empty, saying so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, key, title in (
        (axes[0], "reward", "training reward (mean over completions)"),
        (axes[1], "critic_ranking", "implicit critic: within-group ranking (0.5: none)"),
    ):
        points = metrics["per_step"].get(key)
        if points is None:  # metrics of a run from before the metric existed: say so, plot nothing in its place
            ax.text(0.5, 0.5, f"not in these metrics\n(a run from before {key})", ha="center", va="center",
                    transform=ax.transAxes, color="#777777")  # fmt: skip
        elif points:
            steps, values = zip(*points)
            ax.plot(steps, values, "o-", ms=3, lw=1)
            window = max(1, len(values) // 5)
            if window > 1:
                smooth = [
                    sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
                    for i in range(len(values))
                ]
                ax.plot(steps, smooth, "-", lw=2, label=f"running mean ({window})")
                ax.legend(loc="best", fontsize=8)
        ax.set_xlabel("optimizer step")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    before, after = metrics["before"], metrics["after"]
    values = [before["accuracy"], after["accuracy"]]
    errors = [
        [v - r["ci95"][0] for v, r in zip(values, (before, after))],
        [r["ci95"][1] - v for v, r in zip(values, (before, after))],
    ]
    axes[2].bar(["before", "after"], values, yerr=errors, capsize=6, color=["#999999", "#2a7ab9"])
    for i, v in enumerate(values):
        axes[2].text(i, v / 2, f"{v:.1%}", ha="center", color="white", fontweight="bold")
    axes[2].set_ylim(0, 1)
    axes[2].set_title(f"held-out accuracy, n={after['n']} (95% CI)", fontsize=10)
    fig.suptitle(
        f"pacs demo: {metrics['model_name']}, {trainer_name}, seed {metrics['seed']}, "
        f"{metrics['max_steps']} steps, {metrics['wall_time_s'] / 60:.1f} min",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
