"""Evaluation: the unbiased pass@k estimator, the `pacs eval` run and its plots.

>>> from pacs.eval import pass_at_k
>>> round(pass_at_k(n=4, c=2, k=2), 4)
0.8333
"""

from .passk import default_ks, mean_pass_at_k, pass_at_k
from .plot import plot_pass_at_k
from .run import DEFAULT_BENCHMARKS, compute_metrics, evaluate


__all__ = [
    "DEFAULT_BENCHMARKS",
    "compute_metrics",
    "default_ks",
    "evaluate",
    "mean_pass_at_k",
    "pass_at_k",
    "plot_pass_at_k",
]
