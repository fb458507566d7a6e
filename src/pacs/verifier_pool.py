"""The verifier process pool: math-verify under a hard time bound that holds in any thread.

`verify_batch` scores `(box, tail, gold)` requests (what `pacs.rewards` extracts from each completion) and returns
`(reward, extracted answer)` pairs; `pacs.rewards.score_completions` calls it. The rules it applies are in
`pacs.rewards`' module docstring.

Why a process pool: math-verify bounds its work with `signal.alarm`, which only works in the main thread; TRL runs
reward functions in worker threads and turns those timeouts off, and some inputs (`\\boxed{9^{9^{9^{9}}}}`) hang
inside C code where no alarm can reach anyway. Here every verification runs in a small pool of worker processes
(plain `python` running this file, which imports math-verify only, never torch), with a per-item deadline; a worker
that misses it is killed and replaced, and the item scores 0.0. The pool starts lazily, is private to the process
that started it (safe after `fork`, under torchrun and accelerate, from any thread) and is shut down at exit.

This file is the workers' program as well as the pool: keep its imports to the standard library (math-verify is
imported inside the functions that use it), so that a worker never loads `pacs`, torch or transformers.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import select
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any


logger = logging.getLogger(__name__)

__all__ = ["shutdown_verifiers", "verify_batch"]

_STARTUP_TIMEOUT = 120.0  # importing sympy on a loaded machine can take a while; not counted against items
_MAX_STARTUP_FAILURES = 3
_MEMORY_LIMIT_BYTES = 4 * 1024**3  # RLIMIT_AS of a worker: a runaway `9^{9^{9}}` dies instead of swapping


# ---------------------------------------------------------------------------------------------------------------------
# Scoring: runs inside a worker process (or in-process when `num_workers=0`). Imports math-verify only.
# ---------------------------------------------------------------------------------------------------------------------

_GOLD_CACHE: dict[str, Any] = {}


def _parse_gold(gold: str, mv_timeout: int | None):
    if gold in _GOLD_CACHE:
        return _GOLD_CACHE[gold]
    from math_verify import LatexExtractionConfig, parse

    # a gold answer already in math mode or boxed is parsed as is; `\$36` (an escaped dollar) is not math mode
    in_math_mode = "\\boxed" in gold or "$" in gold.replace("\\$", "")
    text = gold if in_math_mode else "\\boxed{" + gold + "}"
    parsed = parse(text, [LatexExtractionConfig()], parsing_timeout=mv_timeout) or None
    if len(_GOLD_CACHE) > 4096:
        _GOLD_CACHE.clear()
    _GOLD_CACHE[gold] = parsed
    return parsed


def _answer_string(parsed: list) -> str | None:
    # math-verify returns [sympy object, extracted string] on success, [string] when only the fallback string exists
    strings = [p for p in parsed if isinstance(p, str)]
    return strings[-1] if strings else str(parsed[0])


def _score(box: str | None, tail: str, gold: str, mv_timeout: int | None) -> tuple[float | None, str | None]:
    """(reward, extracted answer) for one completion; the rules are in `pacs.rewards`' module docstring."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold_parsed = _parse_gold(gold, mv_timeout)
    if gold_parsed is None:
        return None, box
    # 1. the last box, parsed as LaTeX
    if box is not None:
        pred = parse("\\boxed{" + box + "}", [LatexExtractionConfig()], parsing_timeout=mv_timeout)
        if pred:
            return (1.0 if verify(gold_parsed, pred, timeout_seconds=mv_timeout) else 0.0), box
    # 2. the paper's fallback: LaTeX and plain expressions anywhere in the end of the completion
    pred = parse(tail, [LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=mv_timeout)
    if not pred:
        return 0.0, box
    return (1.0 if verify(gold_parsed, pred, timeout_seconds=mv_timeout) else 0.0), _answer_string(pred)


def _score_safe(box, tail, gold, mv_timeout) -> tuple[float | None, str | None]:
    try:
        return _score(box, tail, gold, mv_timeout)
    except BaseException as e:  # noqa: B036 -- RecursionError, MemoryError, math-verify's TimeoutException...
        if isinstance(e, KeyboardInterrupt):
            raise
        return 0.0, box


def _worker_main(argv: list[str]) -> None:
    """Entry point of a worker process: one JSON request per stdin line, one JSON reply per stdout line."""
    mv_timeout, memory_limit = int(argv[0]), int(argv[1])
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    if memory_limit > 0:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
        except (ImportError, ValueError, OSError):
            pass
    sys.setrecursionlimit(10_000)
    _score_safe("1", "1", "1", mv_timeout)  # warm up sympy and the LaTeX grammar before saying "ready"
    out = sys.stdout.buffer
    try:
        out.write(b'"ready"\n')
        out.flush()
        for line in sys.stdin.buffer:
            try:
                box, tail, gold = json.loads(line)
                reply = _score_safe(box, tail, gold, mv_timeout)
            except Exception:
                reply = (0.0, None)
            out.write(json.dumps(reply).encode("ascii") + b"\n")
            out.flush()
    except (BrokenPipeError, KeyboardInterrupt):  # the parent is gone: exit quietly
        os._exit(0)


_BOOTSTRAP = (
    "import importlib.util, json, sys\n"
    "sys.path[:] = json.loads(sys.argv[2])\n"
    "spec = importlib.util.spec_from_file_location('_pacs_verify_worker', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "module._worker_main(sys.argv[3:])\n"
)


# ---------------------------------------------------------------------------------------------------------------------
# The pool: subprocesses talking JSON lines over pipes, driven by `select` from whichever thread calls it.
# ---------------------------------------------------------------------------------------------------------------------


class _Worker:
    def __init__(self, mv_timeout: int, memory_limit: int):
        # A plain interpreter running this file by path: it does not import the `pacs` package (and so not torch),
        # nor the parent's `__main__` (which multiprocessing's spawn/forkserver would re-run under torchrun).
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _BOOTSTRAP,
                os.path.abspath(__file__),
                json.dumps([p for p in sys.path if p]),
                str(mv_timeout),
                str(memory_limit),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            close_fds=True,
            start_new_session=True,  # Ctrl-C reaches the parent only; workers exit when their stdin closes
        )
        self.fd = self.proc.stdout.fileno()
        self.buffer = b""
        self.ready = False
        self.item: int | None = None
        self.deadline = time.monotonic() + _STARTUP_TIMEOUT

    def send(self, item: int, payload: bytes, timeout: float) -> None:
        self.item = item
        view = memoryview(payload)
        while view:
            view = view[os.write(self.proc.stdin.fileno(), view) :]
        self.deadline = time.monotonic() + timeout

    def read_lines(self) -> list[bytes] | None:
        """Complete lines available now; `None` at end of file (the worker died)."""
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            return None
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return lines

    def kill(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass


class _VerifierPool:
    def __init__(
        self, num_workers: int, timeout: float, memory_limit: int = _MEMORY_LIMIT_BYTES, mv_timeout: int | None = None
    ):
        self.num_workers = num_workers
        self.timeout = timeout
        # math-verify's own signal.alarm timeouts (whole seconds) stop most slow items inside the worker cheaply;
        # the pool's deadline is the hard bound for the rest (C-level loops, crashes).
        self.mv_timeout = mv_timeout if mv_timeout is not None else max(1, math.floor(timeout / 3))
        self.memory_limit = memory_limit
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.workers: list[_Worker] = []
        self.startup_failures = 0
        self.stats = {"items": 0, "timeouts": 0, "crashes": 0, "restarts": 0}

    def _spawn(self) -> _Worker:
        return _Worker(self.mv_timeout, self.memory_limit)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self.workers[self.workers.index(worker)] = self._spawn()
        self.stats["restarts"] += 1

    def map(self, requests: Sequence[tuple[str | None, str, str]]) -> list[tuple[float | None, str | None]]:
        results: list[tuple[float | None, str | None]] = [(0.0, None)] * len(requests)
        payloads = [json.dumps(r).encode("ascii") + b"\n" for r in requests]
        pending = deque(range(len(requests)))
        with self.lock:
            while len(self.workers) < self.num_workers:
                self.workers.append(self._spawn())
            while pending or any(w.item is not None for w in self.workers):
                # 1. hand out work to idle workers
                for w in self.workers:
                    if w.ready and w.item is None and pending:
                        if w.proc.poll() is not None:  # died while idle (killed, OOM): nothing lost, replace it
                            self._replace(w)
                            continue
                        i = pending.popleft()
                        try:
                            w.send(i, payloads[i], self.timeout)
                        except OSError:  # died while idle: give the item to the next worker
                            pending.appendleft(i)
                            w.item = None
                            self._replace(w)
                # 2. wait for replies, until the nearest deadline
                waiting = [w for w in self.workers if w.item is not None or not w.ready]
                if not waiting:
                    continue
                wait = max(0.0, min(w.deadline for w in waiting) - time.monotonic())
                readable, _, _ = select.select([w.fd for w in waiting], [], [], wait)
                for w in [w for w in waiting if w.fd in readable]:
                    lines = w.read_lines()
                    if lines is None:  # the worker died (segfault, GMP abort, OOM): its item scores 0.0
                        self._on_failure(w, "crashes", requests)
                        continue
                    for line in lines:
                        if not w.ready:
                            w.ready, self.startup_failures = True, 0
                        elif w.item is not None:
                            reward, answer = json.loads(line)
                            results[w.item] = (reward, answer)
                            w.item = None
                            self.stats["items"] += 1
                # 3. kill whoever is past its deadline
                now = time.monotonic()
                for w in list(self.workers):
                    if (w.item is not None or not w.ready) and now >= w.deadline:
                        self._on_failure(w, "timeouts", requests)
        return results

    def _on_failure(self, worker: _Worker, kind: str, requests) -> None:
        if not worker.ready:
            self.startup_failures += 1
            if self.startup_failures >= _MAX_STARTUP_FAILURES:
                for w in self.workers:
                    w.kill()
                self.workers.clear()
                raise RuntimeError(
                    f"The math-verify worker processes failed to start {_MAX_STARTUP_FAILURES} times in a row "
                    f"(interpreter {sys.executable}). Check that `python -c 'import math_verify'` works in this "
                    "environment, or pass `num_workers=0` to `make_math_reward` to verify in-process (no time bound)."
                )
        elif worker.item is not None:
            self.stats[kind] += 1
            box = requests[worker.item][0]
            logger.warning(
                "math-verify %s on an answer (scored 0.0, worker replaced): %.80r",
                "timed out" if kind == "timeouts" else "crashed",
                box if box is not None else requests[worker.item][1][-80:],
            )
            worker.item = None
        self._replace(worker)

    def shutdown(self) -> None:
        # at exit a daemon thread may still sit in `map` holding the lock: do not wait for it forever
        locked = self.lock.acquire(timeout=5)
        try:
            for w in self.workers:
                w.kill()
            self.workers.clear()
        finally:
            if locked:
                self.lock.release()


_POOLS: dict[tuple[int, float], _VerifierPool] = {}
_POOLS_LOCK = threading.Lock()


def _get_pool(num_workers: int, timeout: float) -> _VerifierPool:
    with _POOLS_LOCK:
        pool = _POOLS.get((num_workers, timeout))
        if pool is None or pool.pid != os.getpid():  # a forked child never shares its parent's pipes
            pool = _POOLS[(num_workers, timeout)] = _VerifierPool(num_workers, timeout)
        return pool


def shutdown_verifiers() -> None:
    """Stop every verifier worker process started by this process (also runs at interpreter exit)."""
    with _POOLS_LOCK:
        for pool in _POOLS.values():
            if pool.pid == os.getpid():
                pool.shutdown()
        _POOLS.clear()


atexit.register(shutdown_verifiers)


_WARNED_NT = False


def _default_num_workers() -> int:
    # torchrun/accelerate start one process per device: share the CPUs between them
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, min(4, (os.cpu_count() or 2) // max(1, local_world_size)))


def verify_batch(
    requests: Sequence[tuple[str | None, str, str]], timeout: float, num_workers: int | None = None
) -> list[tuple[float | None, str | None]]:
    """Score `(last box content or None, tail of the completion, gold answer)` requests.

    Args:
        requests (`Sequence[tuple[str | None, str, str]]`):
            One request per completion, as `pacs.rewards` prepares them.
        timeout (`float`):
            Seconds one verification may take; past it the worker is killed and replaced and the item scores 0.0.
        num_workers (`int` or `None`, *optional*, defaults to `None`):
            Worker processes; `None` means `min(4, cpu_count // LOCAL_WORLD_SIZE)`, `0` verifies in this process
            (see `pacs.rewards.score_completions`).

    Returns:
        `list[tuple[float | None, str | None]]`: `(reward, extracted answer)` per request, in order.
    """
    if num_workers is None:
        num_workers = _default_num_workers()
    if num_workers > 0 and os.name == "nt":  # `select` on pipes is POSIX-only
        global _WARNED_NT
        if not _WARNED_NT:
            logger.warning(
                "The bounded verifier pool needs a POSIX system; verifying in-process without a hard bound."
            )
            _WARNED_NT = True
        num_workers = 0
    if num_workers <= 0:
        in_main = threading.current_thread() is threading.main_thread()
        mv_timeout = max(1, math.floor(timeout)) if in_main else None
        return [_score_safe(box, tail, gold, mv_timeout) for box, tail, gold in requests]
    return _get_pool(num_workers, float(timeout)).map(requests) if requests else []
