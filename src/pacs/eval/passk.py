"""The unbiased pass@k estimator of Chen et al. (2021), "Evaluating Large Language Models Trained on Code".

With `n` samples of which `c` are correct, the probability that at least one of `k` samples drawn without
replacement is correct is

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i),

and the product form never builds the huge binomials, so it is exact to float precision for any `n` (1024 and far
beyond). A benchmark's pass@k is the mean over its problems; [`compute_metrics`] computes it per benchmark from the
records of a run.

>>> pass_at_k(4, 1, 1)
0.25
>>> round(pass_at_k(1024, 3, 512), 6)
0.875367
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


__all__ = ["compute_metrics", "default_ks", "mean_pass_at_k", "pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from `n` samples with `c` correct.

    Args:
        n (`int`):
            Number of samples drawn for the problem (`n >= 1`).
        c (`int`):
            Number of correct samples (`0 <= c <= n`).
        k (`int`):
            Budget of attempts (`1 <= k <= n`).

    Returns:
        `float` in [0, 1]: `1 - C(n - c, k) / C(n, k)`.
    """
    n, c, k = int(n), int(c), int(k)
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs n >= 1 and 0 <= c <= n, got n={n}, c={c}.")
    if not 1 <= k <= n:
        raise ValueError(
            f"pass_at_k needs 1 <= k <= n (k={k}, n={n}): pass@k cannot be estimated from fewer than k samples."
        )
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean pass@k over problems given as `(n, c)` pairs; per-problem `n` may differ (each must be `>= k`)."""
    values = [pass_at_k(n, c, k) for n, c in counts]
    if not values:
        raise ValueError("mean_pass_at_k needs at least one problem.")
    return sum(values) / len(values)


def default_ks(n: int) -> list[int]:
    """The k reported for `n` samples: 1, 2, 4, ... up to `n`, plus `n` itself when it is not a power of two.

    >>> default_ks(32), default_ks(6)
    ([1, 2, 4, 8, 16, 32], [1, 2, 4, 6])
    """
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if n >= 1 and ks[-1] != n:
        ks.append(n)
    return ks


def compute_metrics(
    rollouts: Iterable[Mapping[str, Any]], problems: Mapping[str, Sequence[str]] | None = None
) -> dict[str, dict[str, float | int]]:
    """pass@k per benchmark from rollout records (`benchmark`, `problem_id`, `correct`).

    Problems may have different sample counts (a resumed run, a larger `n` than before): each problem's pass@k uses
    its own `n_i`, and the reported k go up to `n = min_i n_i`, so that every problem counts for every k.

    Args:
        rollouts (`Iterable[Mapping]`):
            Records as written to `eval_rollouts.jsonl`.
        problems (`Mapping[str, Sequence[str]]` or `None`, *optional*, defaults to `None`):
            The problem ids to report per benchmark; other records are ignored. A listed problem without samples is
            an error. `None` reports every problem found.

    Returns:
        `dict`: `{benchmark: {"num_problems", "n", "pass@1", ..., "pass@<n>"}}`, pass@k in percent.
    """
    counts: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))  # [n_i, c_i]
    for r in rollouts:
        entry = counts[r["benchmark"]][str(r["problem_id"])]
        entry[0] += 1
        entry[1] += int(bool(r["correct"]))
    metrics: dict[str, dict[str, float | int]] = {}
    for benchmark in problems if problems is not None else counts:
        per_problem = counts.get(benchmark, {})
        ids = [str(i) for i in problems[benchmark]] if problems is not None else list(per_problem)
        missing = [i for i in ids if i not in per_problem]
        if missing:
            raise ValueError(
                f"{benchmark}: no samples for problems {missing[:5]} (and {max(0, len(missing) - 5)} more)."
            )
        if not ids:
            continue
        nc = [per_problem[i] for i in ids]
        n = min(n_i for n_i, _ in nc)
        result: dict[str, float | int] = {"num_problems": len(ids), "n": n}
        for k in default_ks(n):
            result[f"pass@{k}"] = 100.0 * sum(pass_at_k(n_i, c_i, k) for n_i, c_i in nc) / len(nc)
        metrics[benchmark] = result
    return metrics
