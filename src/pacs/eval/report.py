"""The tables of an evaluation, in the paper's layout, with the paper's numbers beside the measured ones.

`pacs eval` logs these tables and writes them to `eval_report.md`:

1. pass@1 per benchmark and their average (the paper's Table 1 columns: MATH-500, AMC23, AIME 2024, AIME 2025,
   BeyondAIME, average), with a row of the paper's values when the evaluated model is one whose base row the paper
   reports (Qwen3-4B, Qwen3-8B), so that a user sees whether the setup reproduces the baseline before training;
2. pass@k per benchmark for k = 1, 4, 8, 16, 32, 64 (those <= n), the paper's pass@k layout;
3. the diversity score per benchmark, when it was computed.

>>> paper_reference("Qwen/Qwen3-4B")
'Qwen3-4B'
>>> paper_reference("/models/Qwen3-8B/"), paper_reference("Qwen/Qwen3-4B-Base")
('Qwen3-8B', None)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


__all__ = ["PAPER_BASELINES", "PAPER_KS", "average_metrics", "format_report", "paper_reference"]

PAPER_KS = (1, 4, 8, 16, 32, 64)
"""The k of the paper's pass@k tables."""

DISPLAY_NAMES = {
    "math500": "MATH-500",
    "amc23": "AMC23",
    "aime24": "AIME24",
    "aime25": "AIME25",
    "beyondaime": "BeyondAIME",
}

PAPER_BASELINES: dict[str, dict[str, float]] = {
    "Qwen3-4B": {"math500": 91.01, "aime24": 46.48, "beyondaime": 17.33},
    "Qwen3-8B": {"math500": 89.94, "aime24": 46.98, "beyondaime": 16.28},
}
"""pass@1 (%) of the untrained models in the paper's Table 1 (arXiv:2509.02522v2), as quoted in the project's issue 26.

Only the values quoted there are filled in; AMC23, AIME 2025 and the average of the base rows are left out rather than
guessed (docs/evaluation.md says so), and the table shows "-" for them.
"""


def paper_reference(model: Any) -> str | None:
    """The key of `PAPER_BASELINES` for `model` (a hub id or a local folder named like one), else `None`.

    Matches the last path component exactly, case-insensitively (`Qwen/Qwen3-4B`, `/ckpt/qwen3-4b`, a hub-cache
    folder `models--Qwen--Qwen3-4B`), never a variant such as `Qwen3-4B-Base` or `Qwen3-4B-Instruct-2507`.
    """
    if not isinstance(model, (str, os.PathLike)):
        return None
    parts = [p for p in os.fspath(model).replace("\\", "/").split("/") if p]
    if len(parts) >= 2 and parts[-2] == "snapshots":  # <cache>/models--Qwen--Qwen3-4B/snapshots/<revision>
        parts = parts[:-2]
    name = parts[-1].split("--")[-1].lower() if parts else ""
    return next((key for key in PAPER_BASELINES if key.lower() == name), None)


def average_metrics(metrics: Mapping[str, Mapping[str, Any]]) -> dict[str, float | int]:
    """The unweighted mean over benchmarks of every pass@k they all report (the paper's "Avg." column), and of the
    diversity score when every benchmark has one."""
    if not metrics:
        return {}
    rows = list(metrics.values())
    keys = [k for k in rows[0] if k.startswith("pass@") and all(k in row for row in rows)]
    result: dict[str, float | int] = {"num_benchmarks": len(rows)}
    result.update({k: sum(row[k] for row in rows) / len(rows) for k in keys})
    if all(row.get("diversity") is not None for row in rows):
        result["diversity"] = sum(row["diversity"] for row in rows) / len(rows)
    return result


def _cell(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:  # first column left-aligned, numbers right-aligned
        return "| " + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def format_report(metrics: Mapping[str, Mapping[str, Any]], model_name: str, reference: str | None = None) -> str:
    """Markdown tables of an `eval_metrics.json`-style dict (benchmarks plus `"average"`), see the module docstring.

    Args:
        metrics (`Mapping[str, Mapping]`):
            `{benchmark: {"n", "pass@1", ..., "diversity"?}, "average": {...}}`.
        model_name (`str`):
            The evaluated model, for the row label.
        reference (`str` or `None`, *optional*, defaults to `None`):
            A key of `PAPER_BASELINES`: adds the paper's row under the measured pass@1.
    """
    names = [b for b in metrics if b != "average"]
    average = metrics.get("average", {})
    header = ["pass@1 (%)", *(DISPLAY_NAMES.get(b, b) for b in names), "Average"]
    rows = [[model_name, *(_cell(metrics[b].get("pass@1")) for b in names), _cell(average.get("pass@1"))]]
    if reference is not None:
        paper = PAPER_BASELINES[reference]
        # the paper's average is over its five benchmarks: shown only when all of them are known
        paper_avg = sum(paper.values()) / len(paper) if len(paper) == len(DISPLAY_NAMES) else None
        rows.append([f"paper, {reference} (Table 1)", *(_cell(paper.get(b)) for b in names), _cell(paper_avg)])
    parts = [_table(header, rows)]
    n = min((int(metrics[b]["n"]) for b in names), default=0)
    ks = [k for k in PAPER_KS if k <= n and all(f"pass@{k}" in metrics[b] for b in names)]
    if ks:
        rows = [[DISPLAY_NAMES.get(b, b), *(_cell(metrics[b][f"pass@{k}"]) for k in ks)] for b in names]
        rows.append(["Average", *(_cell(average.get(f"pass@{k}")) for k in ks)])
        parts.append(_table(["pass@k (%)", *(f"k={k}" for k in ks)], rows))
    if any(metrics[b].get("diversity") is not None for b in names):
        header = ["diversity", *(DISPLAY_NAMES.get(b, b) for b in names), "Average"]
        row = [model_name, *(_cell(metrics[b].get("diversity"), 4) for b in names), _cell(average.get("diversity"), 4)]
        parts.append(_table(header, [row]))
    return "\n\n".join(parts) + "\n"
