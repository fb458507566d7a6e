"""How a run resumes, decided once per process: [`resume_decision`], and its answer, [`Resume`].

One function turns the user's `resume_from_checkpoint` setting, the output folder and the run identity into a small
frozen answer: the checkpoint folder to resume from (or `None`: a fresh start), whether the run is already finished
there, and why. Every process decides once and everyone else reads the answer: `pacs train`'s launching process
(before `accelerate launch`: its refusals end the command with one line, exit 2), every process it starts (before
the model loads; `pacs train` hands the answer to the trainer), and `HardenedGRPOTrainer.train` when it is called
with a setting instead of an answer (then `save_model` reads it too). The policy:

1. **An elastic restart resumes by itself.** A worker group restarted by torchrun's agent (`--max_restarts N`,
   `TORCHELASTIC_RESTART_COUNT` > 0) takes `auto` whatever the recipe says: the newest complete checkpoint of
   `output_dir`, so that the restarted run continues where the first attempt's last complete checkpoint stands.
2. **`auto`** resumes from the newest complete checkpoint of `output_dir` if there is one, else starts fresh: a recipe
   can carry it from the first launch on. `true` insists on a checkpoint; a folder names one
   (`pacs.grpo.checkpoints.resolve_resume_checkpoint`: incomplete checkpoints are skipped, saying why).
3. **Another run's checkpoint is refused.** The checkpoint's completion marker records its run identity
   (`pacs.grpo.checkpoints.run_identity`: model, world size, batch settings); a resume whose identity differs is
   refused, and a world size that differs says what can be done instead (the optimizer shards and a rollout are per
   process): DeepSpeed's universal checkpoint, or a weights-only restart from the checkpoint's model.
4. **A finished run trains nothing** (`pacs.grpo.checkpoints.finished_run`): resumed from a checkpoint at `max_steps`
   (or at the end of its last epoch), transformers would train one more step and the script would rewrite the final
   model; the answer says `finished`, and the trainer keeps the final model. A larger `max_steps` extends the run.
5. **A fresh start does not write over checkpoints** (`pacs train`: `overwrite_output_dir` given). Starting without
   a resume in an `output_dir` that holds `checkpoint-N` folders is refused unless `overwrite_output_dir` is set,
   which deletes them first (so that a later `auto` cannot pick up the old run's). A trainer built in Python passes
   no `overwrite_output_dir`: it writes into the folder as transformers does.

One run per output folder is `pacs.grpo.run_lock`'s: `pacs train` takes the folder's lock before it decides.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass

from .checkpoints import (
    AUTO,
    _checkpoints,
    finished_run,
    identity_mismatch,
    last_complete_checkpoint,
    read_marker,
    resolve_resume_checkpoint,
)


logger = logging.getLogger(__name__)

__all__ = ["Resume", "ResumeRefused", "remove_checkpoints", "restart_count", "resume_decision"]


class ResumeRefused(ValueError):
    """A resume (or a fresh start) that `pacs train` refuses before any model loads; the message is one line."""


def restart_count() -> int:
    """How many times torchrun's elastic agent has restarted this worker group (0: the first attempt, or no agent)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def _asked(resume) -> bool:
    return resume not in (None, False, "") and str(resume).lower() not in ("false", "no", "none")


@dataclass(frozen=True)
class Resume:
    """The resume decision of one process ([`resume_decision`]'s answer; everyone else reads it).

    Attributes:
        checkpoint (`str` or `None`): The checkpoint folder to resume from; `None`: a fresh start.
        finished (`bool`): The run is finished at `checkpoint`: train nothing and keep the final model in `output_dir`.
        reason (`str`): Why, in one sentence (logged where it is decided).
    """

    checkpoint: str | None
    finished: bool
    reason: str


def resume_decision(
    resume_from_checkpoint: str | bool | None,
    args,
    identity: dict,
    overwrite_output_dir: bool | None = None,
    verbose: bool = True,
) -> Resume:
    """How this process's run resumes (see the module docstring): call it once per process, and pass the answer on.

    Args:
        resume_from_checkpoint (`str` or `bool`): The user's setting: unset, `auto`, `true`, or a checkpoint folder.
        args (`TrainingArguments`): The run's; `output_dir`, `max_steps` and `num_train_epochs` are read.
        identity (`dict`): This run's `pacs.grpo.checkpoints.run_identity` (its world size: all processes).
        overwrite_output_dir (`bool`, *optional*): `pacs train`'s setting: with `False`, a fresh start in an
            `output_dir` holding checkpoints is refused; with `True`, allowed (the caller deletes them). `None`: no
            such policy (a trainer built in Python writes into the folder as transformers does).
        verbose (`bool`): Log at warning/info level (the launching process, or process 0); the others log at debug.

    Returns:
        [`Resume`]

    Raises:
        [`ResumeRefused`]: a one-line reason and what to do.
    """
    output_dir = args.output_dir
    log = logger.warning if verbose else logger.debug
    if restart_count() > 0:
        log("Elastic restart %d: resuming from the newest complete checkpoint of %s.", restart_count(), output_dir)
        resume_from_checkpoint = AUTO
    if not _asked(resume_from_checkpoint):
        found = _checkpoints(output_dir)
        if found and overwrite_output_dir is False:
            raise ResumeRefused(
                f"{output_dir} already holds the checkpoints of a run (newest: {found[-1][1]}): pass "
                "--resume_from_checkpoint auto to continue it, --overwrite_output_dir true to delete them and start "
                "anew, or another --output_dir."
            )
        answer = Resume(None, False, "a fresh start: no resume asked for")
    else:
        path = _resolve(resume_from_checkpoint, output_dir, verbose)
        if path is not None:
            _check_identity(path, identity)
        finished = finished_run(path, args)
        if finished is not None:
            answer = Resume(path, True, finished)
        elif path is not None:
            answer = Resume(path, False, f"resuming from {path}")
        else:
            answer = Resume(None, False, f"a fresh start: {output_dir} has no complete checkpoint")
    (logger.info if verbose and not answer.finished else log)("Resume decision: %s.", answer.reason.rstrip("."))
    return answer


def _resolve(resume_from_checkpoint, output_dir: str, verbose: bool) -> str | None:
    """The checkpoint folder the setting names (`auto`, `true`, a folder), or a one-line refusal."""
    named = str(resume_from_checkpoint).lower() not in (AUTO, "true", "last", "latest")
    if named and not os.path.isdir(str(resume_from_checkpoint)):
        newest = last_complete_checkpoint(output_dir)[0]
        hint = f"the newest complete one in {output_dir} is {newest}" if newest else f"{output_dir} has none"
        raise ResumeRefused(
            f"resume_from_checkpoint {resume_from_checkpoint} does not exist ({hint}): name an existing checkpoint "
            "folder, or pass --resume_from_checkpoint auto."
        )
    try:
        return resolve_resume_checkpoint(resume_from_checkpoint, output_dir, verbose=verbose)
    except ValueError as error:
        raise ResumeRefused(str(error)) from None


def _processes(n: int) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


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
            f"{path} was saved by {_processes(saved_w)} and this launch has {here_w}: its optimizer shards (and "
            f"rollout) are per process. Relaunch with {_processes(saved_w)}; or convert it to a DeepSpeed universal "
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
