"""How a run resumes, decided once per process: [`resume_decision`], and its answer, [`Resume`].

One function turns the user's `resume_from_checkpoint` setting, the output folder and the run identity into a small
frozen answer: the checkpoint folder to resume from (or `None`: a fresh start), whether the run is already finished
there, and why. Every process decides once and everyone else reads the answer: `pacs train`'s launching process
(before `accelerate launch`: its refusals end the command with one line, exit 2), every process it starts (before
the model loads; `pacs train` hands the answer to the trainer), and `HardenedGRPOTrainer.train` when it is called
with a setting instead of an answer (then `save_model` reads it too). The rules, each here:

1. **An elastic restart resumes by itself.** A worker group restarted by torchrun's agent (`--max_restarts N`,
   `TORCHELASTIC_RESTART_COUNT` > 0) takes `auto` whatever the recipe says: the newest complete checkpoint of
   `output_dir`, so that the restarted run continues where the first attempt's last complete checkpoint stands.
2. **`auto`** resumes from the newest complete checkpoint of `output_dir` if there is one, else starts fresh: a recipe
   can carry it from the first launch on. `true` insists on a checkpoint; a folder names one
   ([`resolve_resume_checkpoint`]: incomplete checkpoints are skipped, saying why; which are complete is
   `pacs.grpo.checkpoints`').
3. **Another run's checkpoint is refused.** The checkpoint's completion marker records its run identity
   (`pacs.grpo.checkpoints.run_identity`: model, world size, batch settings); a resume whose identity differs is
   refused, and a world size that differs says what can be done instead (the optimizer shards and a rollout are per
   process): DeepSpeed's universal checkpoint, or a weights-only restart from the checkpoint's model.
4. **A finished run trains nothing** ([`finished_run`]): resumed from a checkpoint at `max_steps` (or at the end of
   its last epoch), transformers would train one more step and the script would rewrite the final model; the answer
   says `finished`, and the trainer keeps the final model. A larger `max_steps` extends the run.

A trainer built in Python writes a fresh start into its folder as transformers does. What `pacs train` adds around
the decision, one run per output folder and a fresh start that does not write over an earlier run's checkpoints
(`overwrite_output_dir`), is `pacs.run_lock`'s.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

from .checkpoints import (
    COMPLETE_MARKER,
    TRAINER_STATE,
    _marked,
    checkpoint_problem,
    identity_mismatch,
    last_complete_checkpoint,
    read_marker,
)


logger = logging.getLogger(__name__)

__all__ = [
    "AUTO",
    "Resume",
    "ResumeRefused",
    "finished_run",
    "resolve_resume_checkpoint",
    "restart_count",
    "resume_asked",
    "resume_decision",
]

AUTO = "auto"
"""`resume_from_checkpoint: auto`: the newest complete checkpoint of `output_dir` if there is one, else a fresh start."""


class ResumeRefused(ValueError):
    """A resume that is refused before any model loads (`pacs train`: exit 2); the message is one line."""


def restart_count() -> int:
    """How many times torchrun's elastic agent has restarted this worker group (0: the first attempt, or no agent)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def resume_asked(resume_from_checkpoint) -> bool:
    """Whether the setting asks for a resume at all (`auto`, `true`, a folder), as opposed to a fresh start (unset,
    `false`, `none`)."""
    resume = resume_from_checkpoint
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
    *,
    verbose: bool = True,
) -> Resume:
    """How this process's run resumes (see the module docstring): call it once per process, and pass the answer on.

    Args:
        resume_from_checkpoint (`str` or `bool`): The user's setting: unset, `auto`, `true`, or a checkpoint folder.
        args (`TrainingArguments`): The run's; `output_dir`, `max_steps` and `num_train_epochs` are read.
        identity (`dict`): This run's `pacs.grpo.checkpoints.run_identity` (its world size: all processes).
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
    if not resume_asked(resume_from_checkpoint):
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


def resolve_resume_checkpoint(
    resume_from_checkpoint: str | bool | None, output_dir: str, verbose: bool = True
) -> str | None:
    """The checkpoint folder a `resume_from_checkpoint` setting names: the newest complete checkpoint for `True` (one
    piece of [`resume_decision`], which is the function to call).

    `True` (or the strings "true", "last", "latest" of a command line) picks [`last_complete_checkpoint`] of
    `output_dir` and logs each newer folder it skipped; a named folder that is incomplete is a `ValueError` saying
    what is missing. `"auto"` is `True` when `output_dir` has a complete checkpoint and `None` (start fresh) when it
    has none. `None` / `False` resume nothing. `verbose=False` logs nothing (processes other than the main).
    """
    log = logger.warning if verbose else logger.debug
    if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.lower() in ("true", "last", "latest"):
        resume_from_checkpoint = True
    if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.lower() == AUTO:
        resume_from_checkpoint = last_complete_checkpoint(output_dir)[0] is not None or None
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is True:
        path, skipped = last_complete_checkpoint(output_dir)
        for name, reason in skipped:
            log("Not resuming from %s: %s.", os.path.join(output_dir, name), reason)
        if path is None:
            detail = "; ".join(f"{name}: {reason}" for name, reason in skipped) or "no checkpoint-N folder"
            raise ValueError(
                f"resume_from_checkpoint=True found no complete checkpoint in {output_dir} ({detail}). Start without "
                "resume_from_checkpoint, or name a checkpoint folder."
            )
        logger.debug("The newest complete checkpoint is %s.", path)  # the resume decision logs what it decides
        return path
    path = str(resume_from_checkpoint)
    run_dir = os.path.dirname(os.path.abspath(path))
    problem = checkpoint_problem(path, require_marker=_marked(run_dir))
    if problem is not None:
        newest, _ = last_complete_checkpoint(run_dir)
        fix = (
            f"The newest complete checkpoint there is {newest}: name it, or pass resume_from_checkpoint=True to take "
            "it."
            if newest is not None
            else f"{run_dir} has no complete checkpoint: start without resume_from_checkpoint."
        )
        raise ValueError(f"Cannot resume from {path}: {problem}. {fix}")
    if not os.path.isfile(os.path.join(path, COMPLETE_MARKER)):
        log(
            "%s has no %s: saved by another trainer or an older pacs; resuming from it as transformers would.",
            path,
            COMPLETE_MARKER,
        )
    return path


def finished_run(checkpoint: str | os.PathLike | None, args) -> str | None:
    """Why a run resumed from `checkpoint` with training arguments `args` has nothing left to train, or `None`.

    Finished means the checkpoint's step is at least `args.max_steps` or, without `max_steps`, that its epoch has
    reached `args.num_train_epochs` (read from its `trainer_state.json`). Resumed from there, transformers would train
    one step more than asked; the caller trains nothing instead, and keeps the final model it saved before.

    >>> import json, os, tempfile, types
    >>> ckpt = os.path.join(tempfile.mkdtemp(), "checkpoint-4")
    >>> os.makedirs(ckpt)
    >>> with open(os.path.join(ckpt, "trainer_state.json"), "w") as f:
    ...     json.dump({"global_step": 4, "epoch": 0.5}, f)
    >>> args = types.SimpleNamespace(output_dir="out", max_steps=4, num_train_epochs=3.0)
    >>> finished_run(ckpt, args).split(":")[0]
    'The run is finished'
    >>> args.max_steps = 6  # extends the run
    >>> finished_run(ckpt, args) is None
    True
    """
    if checkpoint is None:
        return None
    try:
        with open(os.path.join(str(checkpoint), TRAINER_STATE)) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None  # nothing to judge by; transformers' own loading reports an unreadable state
    step, epoch = state.get("global_step", 0), state.get("epoch") or 0.0
    if args.max_steps > 0:
        if step < args.max_steps:
            return None
        where = f"step {step}, and max_steps is {args.max_steps}"
    else:
        if epoch < args.num_train_epochs - 1e-9:  # the last step's epoch is num_train_epochs up to rounding
            return None
        where = f"epoch {epoch:g}, and num_train_epochs is {args.num_train_epochs:g}"
    return (
        f"The run is finished: {checkpoint} is at {where}. Nothing is trained and the final model in "
        f"{args.output_dir} is kept; pass a larger max_steps (or num_train_epochs) to train further."
    )
