"""`pacs train`'s output folder: one run at a time, a fresh start that does not write over an earlier run's
checkpoints, and no orphaned workers.

Two runs writing into one `output_dir` corrupt each other's checkpoints without a word (a rerun after `kill -9` of a
launcher whose workers trained on did exactly that), and a fresh start among an earlier run's checkpoints leaves them
for a later `--resume_from_checkpoint auto` to pick up. So, around the resume decision (`pacs.grpo.resume`), which
`pacs train` makes after these:

- [`hold_output_dir`]: the run's first process (global rank 0) takes the folder's lock, [`LOCK_FILE`] in `output_dir`,
  recording its host, process id and start time, before any model loads, and holds it until it exits (an `atexit`
  handler removes it; a thread refreshes its time every [`REFRESH_S`] seconds). Another run finding a live lock is
  refused with one line ([`OutputDirInUse`]); a stale lock -- its process gone (this host), or another host's not
  refreshed for longer than the process-group timeout (`ddp_timeout`) -- is taken over with a warning that says so.
  The lock is re-entrant within a process. [`check_output_dir`] refuses the same way without taking the lock: what a
  launching process does before it starts the workers (one of which takes it).
- [`clear_for_fresh_start`]: a fresh start (no resume asked for, not an elastic restart) in an `output_dir` that holds
  `checkpoint-N` folders is refused ([`OutputDirInUse`], one line) unless `overwrite_output_dir` is set, which deletes
  them first. A trainer built in Python has no such policy: it writes into the folder as transformers does.
- [`stop_with_launcher`]: a launched worker stops when its launcher is gone (`prctl(PR_SET_PDEATHSIG, SIGKILL)` on
  Linux, a watch on the parent process elsewhere), so a rerun after `kill -9` of the launcher never races orphans.
  torchrun's agent starts the workers in sessions of their own: killing the launcher's process group does not reach
  them.

>>> import tempfile
>>> folder = tempfile.mkdtemp()
>>> lock = hold_output_dir(folder, timeout_s=1800)
>>> read_lock(folder)["pid"] == os.getpid()
True
>>> lock.release(); read_lock(folder) is None
True
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field


logger = logging.getLogger(__name__)

__all__ = [
    "LOCK_FILE",
    "OutputDirInUse",
    "RunLock",
    "check_output_dir",
    "clear_for_fresh_start",
    "hold_output_dir",
    "read_lock",
    "release_output_dir",
    "stop_with_launcher",
]

LOCK_FILE = "_pacs_run.lock"
"""In `output_dir` while a run holds it (the leading underscore keeps it out of `push_to_hub`'s upload)."""
REFRESH_S = 60.0
"""How often the holder refreshes the lock's time, so that another host can tell a live lock from a stale one."""


class OutputDirInUse(ValueError):
    """The output folder is another run's: a live run holds it, or a fresh start would write over an earlier run's
    checkpoints; the message is one line."""


@dataclass
class RunLock:
    """A held lock on `output_dir` (see the module docstring); `release()` removes it (also at exit)."""

    output_dir: str
    token: str
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def path(self) -> str:
        return os.path.join(self.output_dir, LOCK_FILE)

    def release(self) -> None:
        """Remove the lock if it is still this one's."""
        self._stop.set()
        _HELD.pop(os.path.realpath(self.output_dir), None)
        if (read_lock(self.output_dir) or {}).get("token") == self.token:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH_S):
            with contextlib.suppress(OSError):
                if (read_lock(self.output_dir) or {}).get("token") == self.token:
                    os.utime(self.path)


_HELD: dict[str, RunLock] = {}  # realpath(output_dir) -> this process's lock


def read_lock(output_dir: str) -> dict | None:
    """The lock of `output_dir` as a dict (host, pid, started, token; plus `age_s` since its last refresh), or `None`."""
    path = os.path.join(output_dir, LOCK_FILE)
    try:
        with open(path) as f:
            lock = json.load(f)
        lock["age_s"] = time.time() - os.path.getmtime(path)
    except (OSError, ValueError, TypeError):
        return None
    return lock if isinstance(lock, dict) else None


def _alive(pid: int) -> bool:
    """Whether process `pid` of this host runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _stale(lock: dict, timeout_s: float) -> str | None:
    """Why `lock` is stale (a sentence), or `None` when its run may be alive."""
    if lock.get("host") == socket.gethostname():
        pid = int(lock.get("pid", -1))
        return None if _alive(pid) else f"its process {pid} on this host is gone"
    if lock["age_s"] > timeout_s:
        return (
            f"host {lock.get('host')} has not refreshed it for {lock['age_s']:.0f} s (> the {timeout_s:.0f} s timeout)"
        )
    return None


def _describe(lock: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(lock.get("started", 0)))
    return f"process {lock.get('pid')} on {lock.get('host')}, started {started}"


def _create(output_dir: str, token: str) -> bool:
    """Create the lock file if there is none (atomically); whether this call created it."""
    try:
        fd = os.open(os.path.join(output_dir, LOCK_FILE), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "token": token}
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    return True


def _in_use(output_dir: str, lock: dict) -> OutputDirInUse:
    return OutputDirInUse(
        f"{output_dir} is in use by a live run ({_describe(lock)}): wait for it to finish or stop it, or pass another "
        f"--output_dir (a stale lock is taken over by itself; {LOCK_FILE} holds it)."
    )


def check_output_dir(output_dir: str, timeout_s: float) -> None:
    """Raise [`OutputDirInUse`] (one line) when a live run, other than this process's, holds `output_dir`; take
    nothing (see [`hold_output_dir`])."""
    lock = read_lock(output_dir)
    if lock is None or os.path.realpath(output_dir) in _HELD:
        return
    if _stale(lock, timeout_s) is None:
        raise _in_use(output_dir, lock)


def hold_output_dir(output_dir: str, timeout_s: float) -> RunLock:
    """Take `output_dir`'s lock for this process's run, or raise [`OutputDirInUse`] (one line) when a live run holds
    it. A stale lock is taken over with a warning; a lock this process already holds is returned as it is.

    Args:
        output_dir (`str`): The run's output folder (created if missing).
        timeout_s (`float`): The process-group timeout (`ddp_timeout`): another host's lock not refreshed for longer
            is stale.
    """
    key = os.path.realpath(output_dir)
    if key in _HELD:
        return _HELD[key]
    os.makedirs(output_dir, exist_ok=True)
    token = uuid.uuid4().hex
    for _ in range(3):  # a lock that vanishes between our looks, or a takeover raced by another process
        if _create(output_dir, token):
            break
        lock = read_lock(output_dir)
        if lock is None:
            continue
        ours = lock.get("host") == socket.gethostname() and lock.get("pid") == os.getpid()
        reason = "this process's own, left by an earlier run in it" if ours else _stale(lock, timeout_s)
        if reason is None:
            raise _in_use(output_dir, lock)
        (logger.debug if ours else logger.warning)(
            "Taking over the lock of %s from %s: %s.", output_dir, _describe(lock), reason
        )
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(output_dir, LOCK_FILE))
    else:
        raise OutputDirInUse(f"Could not take the lock of {output_dir} ({LOCK_FILE}): another run keeps taking it.")
    held = _HELD[key] = RunLock(output_dir, token)
    atexit.register(held.release)
    threading.Thread(target=held._refresh, name="pacs-run-lock", daemon=True).start()
    return held


def release_output_dir(output_dir: str) -> None:
    """Release this process's lock of `output_dir`, if it holds one (the run is over; exit releases it too)."""
    held = _HELD.get(os.path.realpath(output_dir))
    if held is not None:
        held.release()


def clear_for_fresh_start(
    output_dir: str, resume_from_checkpoint, overwrite_output_dir: bool, delete: bool = False
) -> list[str]:
    """`pacs train`'s overwrite policy, before the resume decision: a fresh start in an `output_dir` holding
    `checkpoint-N` folders is refused unless `overwrite_output_dir`; with it, `delete=True` (the one process that may:
    machine 0's first) deletes them. A resume asked for (`auto`, `true`, a folder) or an elastic restart is left to
    the resume decision. Returns the deleted folders' names; raises [`OutputDirInUse`] (one line)."""
    from pacs.grpo.checkpoints import checkpoint_folders  # the lock itself stays quick to import (stdlib only)
    from pacs.grpo.resume import restart_count, resume_asked

    if resume_asked(resume_from_checkpoint) or restart_count() > 0:
        return []
    found = checkpoint_folders(output_dir)
    if not found:
        return []
    if not overwrite_output_dir:
        raise OutputDirInUse(
            f"{output_dir} already holds the checkpoints of a run (newest: {found[-1][1]}): pass "
            "--resume_from_checkpoint auto to continue it, --overwrite_output_dir true to delete them and start "
            "anew, or another --output_dir."
        )
    if not delete:
        return []
    for _, name in found:
        shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)
    removed = [name for _, name in found]
    logger.warning("overwrite_output_dir: deleted %s of %s before starting anew.", ", ".join(removed), output_dir)
    return removed


def stop_with_launcher() -> None:
    """In a launched worker: stop (SIGKILL) when the process that started it exits, however it exits.

    On Linux the kernel does it (`prctl(PR_SET_PDEATHSIG)`, set here through ctypes); elsewhere a daemon thread
    watches the parent process id. A parent already gone by the time this runs stops the worker at once.
    """
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            logger.warning(
                "prctl(PR_SET_PDEATHSIG) failed (errno %d); watching the launcher instead", ctypes.get_errno()
            )
            _watch_parent(parent)
    else:
        _watch_parent(parent)
    if os.getppid() != parent:  # the launcher died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)


def _watch_parent(parent: int) -> None:
    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="pacs-launcher-watch", daemon=True).start()
