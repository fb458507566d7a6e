"""Crash-safe checkpoints and the rollout buffer that makes a resumed run continue exactly.

Two things the `transformers` checkpoint leaves out, for a run that is preempted, OOM-killed or crashes:

1. **Completeness.** `resume_from_checkpoint=True` picks the newest `checkpoint-N` folder whatever its state, so a
   run killed while it was writing one (minutes for a 4B/8B ZeRO-3 checkpoint with optimizer states) cannot resume.
   `HardenedGRPOTrainer` (and so `PACSTrainer`) fsyncs every file of a checkpoint once every process has written its share, then writes
   [`COMPLETE_MARKER`] last, recording each file's name and size; on resume [`last_complete_checkpoint`] picks the
   newest folder that has the marker and whose files still have those sizes (a file truncated by a full disk or a
   copy cut short is caught without reading it), and says which ones it skipped and why. Nothing is deleted.
   Checkpoints saved without the marker (by `GRPOTrainer`, or by pacs before the marker existed) are used only where
   no checkpoint of that output directory has one, and only with a `trainer_state.json`.
2. **The rollout buffer.** With `steps_per_generation` > `gradient_accumulation_steps` (PACS's default: 4 optimizer
   steps per generation) a checkpoint often falls in the middle of a generation batch; resuming without it would
   generate new completions for the rest of that batch (a different run, and wasted generation time). Each process
   saves its share of the buffered generation batch as [`rollout_file`] (token ids, masks, per-token log-probs,
   labels: never logits) and its position in it; at a generation boundary nothing extra is written.

The functions here are file handling: writing a checkpoint, vouching for it, and telling a complete one from an
incomplete one. Which checkpoint a run resumes from, and whether it is finished, are rules of `pacs.grpo.resume`
(decided once, in `resume_decision`); `pacs.grpo.HardenedGRPOTrainer` holds the trainer hooks that use them (`train`,
`_save_checkpoint`, `_load_optimizer_and_scheduler`, `save_model`), which `PACSTrainer` inherits.

>>> import tempfile, os
>>> out = tempfile.mkdtemp()
>>> os.makedirs(os.path.join(out, "checkpoint-2")); os.makedirs(os.path.join(out, "checkpoint-4"))
>>> write_complete_marker(os.path.join(out, "checkpoint-2"), global_step=2)
>>> path, skipped = last_complete_checkpoint(out)
>>> os.path.basename(path), skipped
('checkpoint-2', [('checkpoint-4', 'its save did not finish (no pacs_checkpoint_complete.json, no trainer_state.json)')])
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any

from accelerate.utils import send_to_device


__all__ = [
    "COMPLETE_MARKER",
    "TRAINER_STATE",
    "ROLLOUT_DIR",
    "RUN_IDENTITY_KEYS",
    "checkpoint_folders",
    "checkpoint_problem",
    "identity_mismatch",
    "last_complete_checkpoint",
    "load_rollout",
    "missing_rank_files",
    "read_marker",
    "rollout_file",
    "run_identity",
    "save_rollout",
    "sync_checkpoint_files",
    "sync_own_files",
    "write_complete_marker",
]

COMPLETE_MARKER = "pacs_checkpoint_complete.json"
"""Written last into a checkpoint folder, after every process has saved its share: the folder is complete."""

ROLLOUT_DIR = "pacs_rollout"
"""Sub-folder of a mid-generation checkpoint holding one `rank<r>.pt` per process."""

TRAINER_STATE = "trainer_state.json"
RUN_IDENTITY_KEYS = (
    "model",
    "world_size",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "steps_per_generation",
    "seed",
)
"""What makes a checkpoint this run's: [`run_identity`]'s keys, recorded in the completion marker under `"run"`. The seed
is one: it orders every epoch's prompts (`pacs.grpo.sampler`), so a resume under another seed would train on other
prompts than the run that saved the checkpoint. A marker written before a key existed matches on the others."""
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
_FORMAT = 1


def rollout_file(checkpoint_dir: str | os.PathLike, process_index: int) -> str:
    """The file holding process `process_index`'s share of the buffered generation batch."""
    return os.path.join(str(checkpoint_dir), ROLLOUT_DIR, f"rank{process_index}.pt")


def save_rollout(
    checkpoint_dir: str | os.PathLike,
    process_index: int,
    world_size: int,
    step: int,
    global_step: int,
    buffered_inputs: list[dict[str, Any]],
) -> int:
    """Save this process's buffered generation batch (moved to CPU) and its micro-step counter; returns its bytes.

    Args:
        checkpoint_dir (`str`): The `checkpoint-N` folder being written.
        process_index (`int`) / world_size (`int`): This process and the number of processes.
        step (`int`): `GRPOTrainer._step`, the number of micro-batches trained so far.
        global_step (`int`): The optimizer step of the checkpoint (checked on load).
        buffered_inputs (`list[dict]`): `GRPOTrainer._buffered_inputs`, one dict of tensors per micro-batch slot.
    """
    import torch

    path = rollout_file(checkpoint_dir, process_index)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    payload = {
        "format": _FORMAT,
        "step": step,
        "global_step": global_step,
        "world_size": world_size,
        "process_index": process_index,
        "buffered_inputs": send_to_device(buffered_inputs, "cpu"),
    }
    torch.save(payload, path + ".tmp")
    os.replace(path + ".tmp", path)  # never a half-written rollout under its final name
    return os.path.getsize(path)


def load_rollout(checkpoint_dir: str | os.PathLike, process_index: int, world_size: int, device) -> dict | None:
    """This process's saved rollout (tensors on `device`), or `None` when the checkpoint is at a generation boundary.

    Raises `ValueError` when the checkpoint was saved mid-generation by a different number of processes: each process
    holds its own share of the generation batch, so the rest of that generation cannot be redistributed exactly.
    """
    import torch

    folder = os.path.join(str(checkpoint_dir), ROLLOUT_DIR)
    if not os.path.isdir(folder):
        return None
    saved = sorted(f for f in os.listdir(folder) if re.fullmatch(r"rank\d+\.pt", f))
    if len(saved) != world_size:
        raise ValueError(
            f"{checkpoint_dir} was saved in the middle of a generation batch by {len(saved)} process(es), and this run "
            f"has {world_size}: each process saved its own share of that batch, so it cannot continue exactly. Resume "
            f"with {len(saved)} process(es), or from a checkpoint at a generation boundary (one without {ROLLOUT_DIR}/)."
        )
    payload = torch.load(rollout_file(checkpoint_dir, process_index), map_location="cpu", weights_only=True)
    if payload.get("format") != _FORMAT:
        raise ValueError(
            f"{rollout_file(checkpoint_dir, process_index)} has an unknown format {payload.get('format')}."
        )
    payload["buffered_inputs"] = send_to_device(payload["buffered_inputs"], device)
    return payload


def sync_checkpoint_files(checkpoint_dir: str | os.PathLike) -> dict[str, int]:
    """fsync every file under `checkpoint_dir` (and its folders); returns `{relative path: size in bytes}`.

    Called once every process has closed its files, before [`write_complete_marker`]: the marker must not reach the
    disk before the files it vouches for (a power loss or a node crash would otherwise leave a "complete" checkpoint
    with empty files).
    """
    root = str(checkpoint_dir)
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if rel in (COMPLETE_MARKER, COMPLETE_MARKER + ".tmp") or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                os.fsync(f.fileno())
                files[rel.replace(os.sep, "/")] = os.fstat(f.fileno()).st_size
        _fsync_folder(folder)
    return dict(sorted(files.items()))


def sync_own_files(checkpoint_dir: str | os.PathLike) -> int:
    """fsync, on this process, the files of `checkpoint_dir` it sees; returns how many. Every process calls it once
    it has closed its own files and before the barrier that precedes the completion marker.

    On one machine this is the page cache every process shares and duplicates cost nothing; on a filesystem shared
    between machines (NFS, Lustre: `output_dir` must be one, docs/recipes.md "Multi-node and failures") a machine's
    fsync is what pushes the files it wrote (its optimizer and weight shards, its RNG state, its rollout) to the
    server before process 0 writes the marker. A file another process renames meanwhile is skipped.
    """
    count = 0
    for folder, _, names in os.walk(str(checkpoint_dir)):
        for name in names:
            if name.startswith(COMPLETE_MARKER):
                continue
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                with open(os.path.join(folder, name), "rb") as f:
                    os.fsync(f.fileno())
                    count += 1
        _fsync_folder(folder)
    return count


def missing_rank_files(checkpoint_dir: str | os.PathLike, world_size: int) -> list[str]:
    """The per-process files (`rng_state_<r>.pth`, which transformers writes on every process of a multi-process
    run) that `checkpoint_dir` lacks: not empty on process 0 means the other machines wrote elsewhere."""
    if world_size <= 1:
        return []
    names = [f"rng_state_{r}.pth" for r in range(world_size)]
    return [n for n in names if not os.path.isfile(os.path.join(str(checkpoint_dir), n))]


def _fsync_folder(folder: str) -> None:
    # a file's name lives in its folder: fsync the folder too, so that a new or renamed file survives a power loss
    with contextlib.suppress(OSError):  # some filesystems (and Windows) cannot open a folder for fsync
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_complete_marker(checkpoint_dir: str | os.PathLike, files: dict[str, int] | None = None, **info: Any) -> None:
    """Mark `checkpoint_dir` complete (atomically: a crash leaves either no marker or the whole one).

    Args:
        checkpoint_dir (`str`): The `checkpoint-N` folder, every file of it written and synced.
        files (`dict[str, int]`, *optional*): `{relative path: size}` from [`sync_checkpoint_files`]; a resume checks
            that the files still have these sizes. Without it only the marker's presence is checked.
        **info: Recorded as is (`global_step`, `world_size`, `rollout`).
    """
    path = os.path.join(str(checkpoint_dir), COMPLETE_MARKER)
    if files is not None:
        info["files"] = files
    with open(path + ".tmp", "w") as f:
        json.dump(info, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    _fsync_folder(str(checkpoint_dir))


def run_identity(model_name_or_path: str, world_size: int, args) -> dict[str, Any]:
    """The settings that make a checkpoint this run's: the model, the world size and the batch settings.

    A checkpoint resumes exactly only into the run that saved it: another number of processes cannot load its
    optimizer shards or its rollout, and another model or batch layout would train a different run from its state.
    `HardenedGRPOTrainer` records this dict in every completion marker (`"run"`), and `pacs train` compares it with
    the launch's before any model loads ([`identity_mismatch`]; `pacs.grpo.resume.resume_decision`). Call it with
    the same values wherever a run is compared with a checkpoint.

    Args:
        model_name_or_path (`str`): The model as given to the trainer: a hub id, or a local directory (compared by
            its real path, so that `./m` and `/abs/m` are one model).
        world_size (`int`): The number of processes of the launch (all machines together).
        args (`GRPOConfig`): Its `per_device_train_batch_size`, `gradient_accumulation_steps`, `num_generations`,
            `steps_per_generation` and `seed` are read.

    Returns:
        `dict`: one entry per [`RUN_IDENTITY_KEYS`], JSON-serialisable.

    >>> import types
    >>> args = types.SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=1, num_generations=4,
    ...                              steps_per_generation=2, seed=42)
    >>> run_identity("Qwen/Qwen3-4B", 2, args)["world_size"]
    2
    """
    model = str(model_name_or_path)
    if os.path.isdir(model):
        model = os.path.realpath(model)
    identity = {"model": model, "world_size": int(world_size)}
    for key in RUN_IDENTITY_KEYS[2:]:
        identity[key] = getattr(args, key)
    return identity


def identity_mismatch(recorded: dict[str, Any] | None, current: dict[str, Any]) -> str | None:
    """How a checkpoint's recorded [`run_identity`] differs from the current one (`"world_size 2 there, 1 here"`),
    or `None` when it is the same run; a marker without one (an older pacs) matches."""
    if not recorded:
        return None
    differ = [
        f"{key} {recorded[key]} there, {current[key]} here"
        for key in RUN_IDENTITY_KEYS
        if key in recorded and key in current and recorded[key] != current[key]
    ]
    return "; ".join(differ) or None


def read_marker(checkpoint_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The completion marker of `checkpoint_dir` as a dict, or `None` when it has none or it cannot be read."""
    try:
        with open(os.path.join(str(checkpoint_dir), COMPLETE_MARKER)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _files_problem(path: str) -> str | None:
    """Which file of a marked checkpoint is missing or has another size than the marker recorded, or `None`."""
    try:
        with open(os.path.join(path, COMPLETE_MARKER)) as f:
            recorded = json.load(f).get("files", {})
    except (OSError, ValueError, AttributeError) as e:
        return f"its {COMPLETE_MARKER} cannot be read ({e})"
    problems = []
    for rel, size in recorded.items():
        file = os.path.join(path, *rel.split("/"))
        if not os.path.isfile(file):
            problems.append(f"{rel} is missing")
        elif os.path.getsize(file) != size:
            problems.append(f"{rel} has {os.path.getsize(file)} bytes, {size} when the checkpoint was saved")
    if not problems:
        return None
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "its files do not match its completion marker: " + "; ".join(problems[:3]) + more


def checkpoint_problem(checkpoint_dir: str | os.PathLike, require_marker: bool = True) -> str | None:
    """Why `checkpoint_dir` cannot be resumed from, or `None` when it is complete.

    A checkpoint with [`COMPLETE_MARKER`] is complete when every file the marker lists is there with its recorded
    size (a marker of an older pacs lists none: its presence suffices).

    Args:
        checkpoint_dir (`str`): A `checkpoint-N` folder.
        require_marker (`bool`, *optional*, defaults to `True`): If `False`, a folder without [`COMPLETE_MARKER`] but
            with a `trainer_state.json` (saved by `GRPOTrainer` or an older pacs) counts as complete.
    """
    path = str(checkpoint_dir)
    if not os.path.isdir(path):
        return "no such folder"
    if os.path.isfile(os.path.join(path, COMPLETE_MARKER)):
        return _files_problem(path)
    if not os.path.isfile(os.path.join(path, TRAINER_STATE)):
        return f"its save did not finish (no {COMPLETE_MARKER}, no {TRAINER_STATE})"
    if require_marker:
        return f"its save did not finish (no {COMPLETE_MARKER})"
    return None


def checkpoint_folders(output_dir: str) -> list[tuple[int, str]]:
    """The `checkpoint-N` folders of `output_dir`, complete or not, as `(N, name)` from the oldest step."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        match = _CHECKPOINT_RE.match(name)
        if match and os.path.isdir(os.path.join(output_dir, name)):
            found.append((int(match.group(1)), name))
    return sorted(found)


def _marked(output_dir: str) -> bool:
    # the run that wrote these checkpoints marks complete ones: a checkpoint without the marker is then incomplete
    return any(
        os.path.isfile(os.path.join(output_dir, name, COMPLETE_MARKER)) for _, name in checkpoint_folders(output_dir)
    )


def last_complete_checkpoint(output_dir: str | os.PathLike) -> tuple[str | None, list[tuple[str, str]]]:
    """The newest complete `checkpoint-N` folder of `output_dir`, and the newer ones skipped with the reason.

    A folder is complete when it holds [`COMPLETE_MARKER`]. If no checkpoint of `output_dir` has one (a run saved by
    `GRPOTrainer` or by pacs before the marker), a `trainer_state.json` is taken as the sign of completeness instead,
    as transformers does.
    """
    output_dir = str(output_dir)
    checkpoints = checkpoint_folders(output_dir)
    marked = _marked(output_dir)
    skipped = []
    for _, name in reversed(checkpoints):
        problem = checkpoint_problem(os.path.join(output_dir, name), require_marker=marked)
        if problem is None:
            return os.path.join(output_dir, name), skipped
        skipped.append((name, problem))
    return None, skipped


def rotate_after_marker(run_dir: str, save_total_limit, best_model_checkpoint, legacy_rotate=None) -> None:
    """transformers' checkpoint rotation, run after the completion marker (`HardenedGRPOTrainer._save_checkpoint`), so
    that the newest complete checkpoint is never the one deleted; `legacy_rotate`: transformers < 5's trainer method."""
    if legacy_rotate is not None:
        legacy_rotate(use_mtime=True, output_dir=run_dir)
        return
    from transformers.trainer_utils import rotate_checkpoints

    rotate_checkpoints(
        output_dir=run_dir, save_total_limit=save_total_limit, best_model_checkpoint=best_model_checkpoint,
        use_mtime=True,
    )  # fmt: skip
