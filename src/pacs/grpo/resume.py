"""Which checkpoint a launch resumes from, decided before any model loads, and whether it may.

`pacs train` calls [`resume_checkpoint`] twice: in the launching process (before `accelerate launch`) and on every
process it starts (before the trainer, so before the model loads). It turns the run's `resume_from_checkpoint` into
a checkpoint folder or `None`, and refuses with a one-line [`ResumeRefused`] (`pacs train` exits 2):

1. **An elastic restart resumes by itself.** A worker group restarted by torchrun's agent (`--max_restarts N`,
   `TORCHELASTIC_RESTART_COUNT` > 0) takes `auto` whatever the recipe says: the newest complete checkpoint of
   `output_dir`, so that the restarted run continues where the first attempt's last complete checkpoint stands.
2. **`auto`** resumes from the newest complete checkpoint of `output_dir` if there is one, else starts fresh: a recipe
   can carry it from the first launch on. `true` insists on a checkpoint; a folder names one.
3. **Another run's checkpoint is refused.** The checkpoint's completion marker records its run identity
   (`pacs.grpo.checkpoints.run_identity`: model, world size, batch settings); a resume whose identity differs is
   refused, and a world size that differs says what can be done instead (the optimizer shards and a rollout are per
   process): DeepSpeed's universal checkpoint, or a weights-only restart from the checkpoint's model.
4. **A fresh start does not write over checkpoints.** Starting without a resume in an `output_dir` that holds
   `checkpoint-N` folders is refused unless `overwrite_output_dir` is set, which deletes them first (so that a later
   `auto` cannot pick up the old run's).
"""

from __future__ import annotations

import logging
import os
import shutil

from .checkpoints import (
    AUTO,
    _checkpoints,
    identity_mismatch,
    last_complete_checkpoint,
    read_marker,
    resolve_resume_checkpoint,
)


logger = logging.getLogger(__name__)

__all__ = ["ResumeRefused", "remove_checkpoints", "restart_count", "resume_checkpoint"]


class ResumeRefused(ValueError):
    """A resume (or a fresh start) that `pacs train` refuses before any model loads; the message is one line."""


def restart_count() -> int:
    """How many times torchrun's elastic agent has restarted this worker group (0: the first attempt, or no agent)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def _asked(resume) -> bool:
    return resume not in (None, False, "") and str(resume).lower() not in ("false", "no", "none")


def resume_checkpoint(
    resume_from_checkpoint: str | bool | None,
    output_dir: str,
    identity: dict,
    overwrite_output_dir: bool = False,
    verbose: bool = True,
) -> str | None:
    """The checkpoint folder this launch resumes from, or `None` for a fresh start (see the module docstring).

    Args:
        resume_from_checkpoint (`str` or `bool`): The run's setting: unset, `auto`, `true`, or a folder.
        output_dir (`str`): The run's `output_dir`.
        identity (`dict`): This launch's `pacs.grpo.checkpoints.run_identity`.
        overwrite_output_dir (`bool`): A fresh start may write over the checkpoints of `output_dir`.
        verbose (`bool`): Log (the launching process, or process 0); other processes only check.

    Raises:
        [`ResumeRefused`]: a one-line reason and what to do.
    """
    log = logger.warning if verbose else logger.debug
    if restart_count() > 0:
        log("Elastic restart %d: resuming from the newest complete checkpoint of %s.", restart_count(), output_dir)
        resume_from_checkpoint = AUTO
    if not _asked(resume_from_checkpoint):
        found = _checkpoints(output_dir)
        if found and not overwrite_output_dir:
            raise ResumeRefused(
                f"{output_dir} already holds the checkpoints of a run (newest: {found[-1][1]}): pass "
                "--resume_from_checkpoint auto to continue it, --overwrite_output_dir true to delete them and start "
                "anew, or another --output_dir."
            )
        return None
    named = str(resume_from_checkpoint).lower() not in (AUTO, "true", "last", "latest")
    if named and not os.path.isdir(str(resume_from_checkpoint)):
        newest = last_complete_checkpoint(output_dir)[0]
        hint = f"the newest complete one in {output_dir} is {newest}" if newest else f"{output_dir} has none"
        raise ResumeRefused(
            f"resume_from_checkpoint {resume_from_checkpoint} does not exist ({hint}): name an existing checkpoint "
            "folder, or pass --resume_from_checkpoint auto."
        )
    try:
        path = resolve_resume_checkpoint(resume_from_checkpoint, output_dir, verbose=verbose)
    except ValueError as error:
        raise ResumeRefused(str(error)) from None
    if path is not None:
        _check_identity(path, identity)
    elif verbose:
        logger.info("resume_from_checkpoint auto: %s has no complete checkpoint; starting fresh.", output_dir)
    return path


def _check_identity(path: str, identity: dict) -> None:
    """Refuse `path` when its marker's run identity is not `identity`'s (a marker without one checks nothing)."""
    marker = read_marker(path) or {}
    recorded = marker.get("run") or ({"world_size": marker["world_size"]} if "world_size" in marker else None)
    mismatch = identity_mismatch(recorded, identity)
    if mismatch is None:
        return
    saved_w, here_w = (recorded or {}).get("world_size"), identity["world_size"]
    if saved_w is not None and saved_w != here_w:
        raise ResumeRefused(
            f"{path} was saved by {saved_w} processes and this launch has {here_w}: its optimizer shards (and "
            f"rollout) are per process. Relaunch with {saved_w} processes; or convert it to a DeepSpeed universal "
            f"checkpoint (deepspeed.checkpoint.ds_to_universal) and load that yourself; or restart weights-only with "
            f"--model_name_or_path {path} and a new --output_dir (a fresh optimizer: not exact), rescaling the batch "
            "(docs/recipes.md, 'Multi-node and failures')."
        )
    raise ResumeRefused(
        f"{path} is another run's checkpoint ({mismatch}): resume it with the settings it was saved with, or start "
        "this run in another --output_dir."
    )


def remove_checkpoints(output_dir: str) -> list[str]:
    """Delete the `checkpoint-N` folders of `output_dir` (`overwrite_output_dir` on a fresh start); returns them."""
    removed = []
    for _, name in _checkpoints(output_dir):
        shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)
        removed.append(name)
    if removed:
        logger.warning("overwrite_output_dir: deleted %s of %s before starting anew.", ", ".join(removed), output_dir)
    return removed
