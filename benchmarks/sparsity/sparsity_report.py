"""Renders sparsity.md from sparsity.json (`python benchmarks/sparsity/sparsity.py --report-only`), and the tuning
picks the runner uses. Not run on its own."""

from __future__ import annotations

import json
from pathlib import Path

import anchor_report


def picks(runs: list[dict], grids: dict, seed: int) -> dict:
    """Per (warm start, arm), the (beta, lr) of its tuning-seed run with the best final validation accuracy inside its
    grid (anchor.py's rule: ties go to the smaller lr, then the smaller beta)."""
    out = {}
    for (ws, arm), grid in grids.items():
        rs = [r for r in runs if r["warm_start"] == ws]
        out.update({(ws, a): pick for a, pick in anchor_report.picks(rs, [arm], seed, {arm: grid}).items()})
    return out


def report(raw: dict, out: Path, smoke: bool = False) -> None:
    """The runs as JSON lines, until the renderer of the verdict's tables is written (after the runs)."""
    name = "sparsity_smoke.md" if smoke else "sparsity.md"
    lines = [json.dumps({k: r[k] for k in ("warm_start", "arm", "beta", "lr", "seed")}) for r in raw["runs"]]
    (out / name).write_text("# sparsity (raw)\n\n" + "\n".join(lines) + "\n")
