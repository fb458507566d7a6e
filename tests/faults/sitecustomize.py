"""Test-only fault injection, installed by the restart tests (tests/test_resume.py) on their launches: with this
folder first on a launch's `PYTHONPATH` (Python imports `sitecustomize` at start-up, in every process of the launch)
and `PACS_TEST_KILL_AT` in its environment, a process kills (or stops) itself at a named point of training, so that a
test hits a chosen moment instead of racing a timer. The wheel carries none of it.

    PACS_TEST_KILL_AT=RANK:POINT:STEP[:SIGNAL]

- `RANK`: the process (global rank) that signals itself.
- `POINT`: `generation`, at the first training generation batch at or after optimizer step `STEP` (inside
  `HardenedGRPOTrainer._generate_and_score_completions`, before any token is sampled); `optimizer_shard`, while that
  process writes its DeepSpeed optimizer shard of `checkpoint-STEP` (half of the file is on disk, then the signal).
- `SIGNAL`: `KILL` (default, SIGKILL: a lost worker) or `STOP` (SIGSTOP: a hung worker).

Only the first attempt of an elastic launch is hit (`TORCHELASTIC_RESTART_COUNT` unset or 0), so a restarted group
trains through. The process logs `PACS_TEST_KILL_AT: rank R sends itself SIGKILL at POINT, step S (unix time T)`
just before, which the tests read to time the recovery.

How: when `pacs.grpo.trainer` is imported, [`install`] wraps two methods of `HardenedGRPOTrainer` (a finder first on
`sys.meta_path` runs it right after the module executes); without `PACS_TEST_KILL_AT` nothing is installed.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import logging
import os
import signal
import sys
import time


logger = logging.getLogger("pacs.test_faults")

ENV = "PACS_TEST_KILL_AT"
POINTS = ("generation", "optimizer_shard")
TARGET = "pacs.grpo.trainer"


def _target() -> tuple[int, str, int, signal.Signals] | None:
    """The parsed `PACS_TEST_KILL_AT`, or `None` when unset or on a restarted attempt."""
    value = os.environ.get(ENV)
    if not value or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
        return None
    parts = value.split(":")
    name = parts[3] if len(parts) == 4 else "KILL"
    well_formed = len(parts) in (3, 4) and parts[1] in POINTS and (parts[0] + parts[2]).isdigit()
    if not well_formed or name not in ("KILL", "STOP"):
        raise ValueError(
            f"{ENV}={value!r} is not RANK:POINT:STEP[:KILL|STOP] with POINT one of {', '.join(POINTS)}; fix or unset it."
        )
    return int(parts[0]), parts[1], int(parts[2]), getattr(signal, f"SIG{name}")


def _signal_self(sig: signal.Signals, point: str, step: int, rank: int) -> None:
    logger.warning(
        "%s: rank %d sends itself %s at %s, step %d (unix time %.3f)", ENV, rank, sig.name, point, step, time.time()
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), sig)


def fault_point(point: str, global_step: int, rank: int) -> None:
    """Signal this process if `PACS_TEST_KILL_AT` names this `point` at `global_step` (or after, for `generation`)."""
    target = _target()
    if target is None:
        return
    want_rank, want_point, want_step, sig = target
    if rank == want_rank and point == want_point and global_step >= want_step:
        _signal_self(sig, point, global_step, rank)


@contextlib.contextmanager
def optimizer_shard_fault(global_step: int, rank: int):
    """While the checkpoint of `global_step` is written: if `PACS_TEST_KILL_AT` names `optimizer_shard` at this step
    and rank, this process's DeepSpeed optimizer shard is written, cut to half its size, and the process signalled."""
    target = _target()
    if target is None or target[:3] != (rank, "optimizer_shard", global_step):
        yield
        return
    import torch

    save = torch.save

    def half_save(obj, f, *args, **kwargs):
        save(obj, f, *args, **kwargs)
        if isinstance(f, (str, os.PathLike)) and str(f).endswith("optim_states.pt"):
            with open(f, "r+b") as file:  # the shard as a kill in the middle of its write leaves it
                file.truncate(os.path.getsize(f) // 2)
            _signal_self(target[3], "optimizer_shard", global_step, rank)

    torch.save = half_save
    try:
        yield
    finally:
        torch.save = save


def install(trainer_cls) -> None:
    """Wrap `trainer_cls`'s generation batch and checkpoint save with the two fault points."""
    generate, save_checkpoint = trainer_cls._generate_and_score_completions, trainer_cls._save_checkpoint

    def _generate_and_score_completions(self, inputs):
        if self.model.training:  # training batches only, as the layer reads the batch's mode
            fault_point("generation", self.state.global_step, self.accelerator.process_index)
        return generate(self, inputs)

    def _save_checkpoint(self, model, trial):
        with optimizer_shard_fault(self.state.global_step, self.accelerator.process_index):
            return save_checkpoint(self, model, trial)

    trainer_cls._generate_and_score_completions = _generate_and_score_completions
    trainer_cls._save_checkpoint = _save_checkpoint
    trainer_cls._test_faults_installed = True


class _InstallOnImport(importlib.abc.MetaPathFinder):
    """First on `sys.meta_path`: finds `pacs.grpo.trainer` with the other finders and runs [`install`] once the module
    has executed."""

    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None:
                break
        else:
            return None
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            install(module.HardenedGRPOTrainer)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get(ENV) and not any(isinstance(f, _InstallOnImport) for f in sys.meta_path):
    _target()  # a malformed value fails at start-up, naming itself
    sys.meta_path.insert(0, _InstallOnImport())
