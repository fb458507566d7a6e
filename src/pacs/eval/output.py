"""The output directory of a `pacs eval` run: its files, the check that it can be written, the rollouts of an earlier
run (refused, replaced, or kept to resume), the scored records appended batch by batch, and `eval_config.json`.

Nothing here writes before [`_prepare_output_dir`], which `evaluate` calls once the model has loaded, so that a run
that fails early leaves the directory as it was.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


logger = logging.getLogger(__name__)

__all__ = ["OUTPUT_FILES"]

ROLLOUTS_FILE = "eval_rollouts.jsonl"
METRICS_FILE = "eval_metrics.json"
REPORT_FILE = "eval_report.md"
PLOT_FILE = "eval_passk.png"
CONFIG_FILE = "eval_config.json"
OUTPUT_FILES = (ROLLOUTS_FILE, METRICS_FILE, REPORT_FILE, PLOT_FILE, CONFIG_FILE)
_SAMPLING_KEYS = ("model", "max_new_tokens", "temperature", "top_p", "chat_template", "system_prompt")


def _read_output_dir(output_dir: Path, overwrite: bool, resume: bool) -> tuple[list[str], list[dict], int]:
    """Refuse to clobber a previous evaluation; return the files there, the rollouts to keep and the lines dropped.

    Reads only: nothing in `output_dir` changes until [`_prepare_output_dir`], which runs once the model has loaded.
    """
    existing = [f for f in OUTPUT_FILES if (output_dir / f).exists()]
    if existing and not (overwrite or resume):
        raise FileExistsError(
            f"{output_dir} already holds an evaluation ({', '.join(existing)}). Pass --overwrite (overwrite=True) to "
            "replace it, --resume (resume=True) to add only the missing samples, or choose another --output_dir."
        )
    path = output_dir / ROLLOUTS_FILE
    if overwrite or not path.exists():
        return existing, [], 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
            record["benchmark"], record["problem_id"], record["correct"]  # noqa: B018 -- the keys we rely on
            kept.append(record)
        except (json.JSONDecodeError, KeyError, TypeError):
            dropped += 1
    logger.info("Resuming: %d samples already in %s", len(kept), path)
    return existing, kept, dropped


def _prepare_output_dir(output_dir: Path, existing: list[str], overwrite: bool, kept: list[dict], dropped: int):
    """Create `output_dir`, delete an earlier evaluation when overwriting, drop unreadable rollout lines."""
    output_dir.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for f in existing:
            (output_dir / f).unlink()
    elif dropped:  # typically the last line of a run that was killed mid-write
        path = output_dir / ROLLOUTS_FILE
        logger.warning("Dropped %d unreadable line(s) of %s", dropped, path)
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept), encoding="utf-8")
        os.replace(tmp, path)


def _check_writable(output_dir: Path) -> None:
    """`output_dir` is a folder, or can be made one, that this process may write to (checked without writing)."""
    if output_dir.exists() and not output_dir.is_dir():
        raise NotADirectoryError(f"The output directory {output_dir} is a file; choose another --output_dir.")
    existing = output_dir.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(
            f"Cannot create the output directory {output_dir}: {existing} is a file. Choose another --output_dir."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(
            f"Cannot write the output directory {output_dir}: {existing} is not writable by this user. Choose another "
            "--output_dir, or change its permissions."
        )


def _recorder(rollouts_path: Path, golds: dict, reward_timeout: float, sink: list[dict]):
    """A callback that scores a batch of completions and appends its records to `rollouts_path` and `sink`."""
    from ..rewards import score_completions

    def on_batch(keys: list[tuple[str, str, int]], texts: list[str]) -> None:
        scored = score_completions(texts, [golds[(b, p)] for b, p, _ in keys], timeout=reward_timeout)
        records = [
            {
                "benchmark": b,
                "problem_id": p,
                "sample_index": i,
                "completion": text,
                "extracted_answer": answer,
                "correct": reward == 1.0,
                "solution": golds[(b, p)],
            }
            for (b, p, i), text, (reward, answer) in zip(keys, texts, scored)
        ]
        with open(rollouts_path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        sink.extend(records)

    return on_batch


def _run_config(model: Any, sets: Mapping[str, Any], cfg: Any, config_path: Path) -> dict:
    """The settings (`cfg`, the run's `EvalSettings` dataclass) written to `eval_config.json`; on resume, a warning for
    each sampling setting that changed."""
    run_config = {
        "model": os.fspath(model) if isinstance(model, (str, os.PathLike)) else type(model).__name__,
        "benchmarks": list(sets),
        **{k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("progress", "plot", "overwrite", "resume")},
    }
    if not cfg.diversity:
        run_config.pop("diversity_model")
    if cfg.resume and config_path.exists():
        old = json.loads(config_path.read_text())
        changed = {k: (old.get(k), run_config[k]) for k in _SAMPLING_KEYS if old.get(k) != run_config[k]}
        if changed:
            logger.warning("Resuming with different settings than the earlier run (old, new): %s", changed)
    return run_config
