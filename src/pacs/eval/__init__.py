"""Evaluation: the unbiased pass@k estimator, the `pacs eval` run (the paper's protocol), its tables and plots, and
the paper's diversity score.

>>> from pacs.eval import pass_at_k
>>> round(pass_at_k(n=4, c=2, k=2), 4)
0.8333
"""

from .diversity import DEFAULT_DIVERSITY_MODEL, diversity_score, pairwise_cosine_distance
from .passk import compute_metrics, default_ks, mean_pass_at_k, pass_at_k
from .plot import plot_pass_at_k
from .report import PAPER_BASELINES, PAPER_KS
from .run import DEFAULT_BENCHMARKS, evaluate
from .settings import EvalSettings


__all__ = [
    "DEFAULT_BENCHMARKS",
    "DEFAULT_DIVERSITY_MODEL",
    "PAPER_BASELINES",
    "PAPER_KS",
    "EvalSettings",
    "compute_metrics",
    "default_ks",
    "diversity_score",
    "evaluate",
    "mean_pass_at_k",
    "pairwise_cosine_distance",
    "pass_at_k",
    "plot_pass_at_k",
]
