"""Test-only fault injection: a process kills (or stops) itself at a named point of training, so that the restart
tests of `tests/test_restarts.py` hit a chosen moment instead of racing a timer. Never set it in a real run.

    PACS_TEST_KILL_AT=RANK:POINT:STEP[:SIGNAL]

- `RANK`: the process (global rank) that signals itself.
- `POINT`: `generation`, at the first training generation batch at or after optimizer step `STEP` (inside the
  generation, before any token is sampled); `optimizer_shard`, while that process writes its DeepSpeed optimizer shard
  of `checkpoint-STEP` (half of the file is on disk, then the signal).
- `SIGNAL`: `KILL` (default, SIGKILL: a lost worker) or `STOP` (SIGSTOP: a hung worker).

Only the first attempt of an elastic launch is hit (`TORCHELASTIC_RESTART_COUNT` unset or 0), so a restarted group
trains through. The process logs `PACS_TEST_KILL_AT: rank R sends itself SIGKILL at POINT, step S (unix time T)`
just before, which the tests read to time the recovery.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time


logger = logging.getLogger(__name__)

ENV = "PACS_TEST_KILL_AT"
POINTS = ("generation", "optimizer_shard")


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
