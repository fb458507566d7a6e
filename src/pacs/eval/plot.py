"""pass@k curves: one line per benchmark, k on a log-2 axis."""

from __future__ import annotations

import os


__all__ = ["plot_pass_at_k"]


def plot_pass_at_k(metrics: dict[str, dict], path: str | os.PathLike, title: str | None = None) -> str:
    """Draw pass@k (in %) against k for every benchmark of an `eval_metrics.json`-style dict and save it as a PNG.

    Args:
        metrics (`dict[str, dict]`):
            `{benchmark: {"pass@1": float, "pass@2": float, ...}}`, as returned by `pacs.eval.evaluate`.
        path (`str` or `os.PathLike`):
            Where to write the PNG.
        title (`str` or `None`, *optional*, defaults to `None`):
            Figure title.

    Returns:
        `str`: the path written.
    """
    # The object-oriented API with an explicit Agg canvas: no global backend switch, works headless and in threads.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4.2), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    all_ks: set[int] = set()
    for name, values in metrics.items():
        points = sorted((int(key.split("@", 1)[1]), v) for key, v in values.items() if key.startswith("pass@"))
        if not points:
            continue
        ks, ys = zip(*points)
        all_ks.update(ks)
        ax.plot(ks, ys, marker="o", label=f"{name} ({values.get('num_problems', '?')} problems)")
    if all_ks:
        ax.set_xscale("log", base=2)
        ticks = sorted(all_ks)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(k) for k in ticks])
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("k (samples)")
    ax.set_ylabel("pass@k (%)")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(os.fspath(path))
    return os.fspath(path)
