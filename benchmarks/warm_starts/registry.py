"""The registry of the pinned SFT warm starts (benchmarks/warm_starts/warm_starts.json): what a study loads by name,
every file's sha256 checked, and what its result JSON records of it. Building one is `warm_starts.py`'s job.

    from benchmarks.warm_starts import registry
    path, entry = registry.load("dense-s105")
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


HERE = Path(__file__).resolve().parent

REGISTRY = HERE / "warm_starts.json"
MODEL_FILE = "model.safetensors"


class WarmStartError(RuntimeError):
    """A warm start that is not registered, or whose files differ from the registry."""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def registry() -> dict:
    return json.loads(REGISTRY.read_text()) if REGISTRY.exists() else {}


def load(name: str) -> tuple[str, dict]:
    """The folder of the committed warm start `name` and its registry entry, after checking every file's sha256.

    Raises `WarmStartError` (one line: what differs and what to do) for an unknown name or a file that differs.
    """
    entries = registry()
    if name not in entries:
        raise WarmStartError(
            f"warm start {name!r} is not in {REGISTRY.name}; committed ones: {', '.join(sorted(entries)) or 'none'} "
            f"(build a new one with `python -m benchmarks.warm_starts.warm_starts --build NAME --steps N`)."
        )
    entry, folder = entries[name], HERE / name
    for file, digest in entry["files"].items():
        path = folder / file
        found = sha256(path) if path.exists() else "missing"
        if found != digest:
            raise WarmStartError(
                f"warm start {name!r}: {file} has sha256 {found[:16]}, the registry says {digest[:16]}; a committed "
                f"warm start is never replaced: restore it (`git checkout -- {path.relative_to(HERE.parent.parent)}`) "
                "or build a new one under a new name."
            )
    return str(folder), entry


def record(name: str, entry: dict) -> dict:
    """What a result JSON records of the warm start it ran from: name, model sha256, steps, accuracy, sparsity."""
    keep = ("steps", "dev_acc", "test_acc", "groups", "built_on")
    return {"name": name, "sha256": entry["files"][MODEL_FILE], **{k: entry[k] for k in keep if k in entry}}
