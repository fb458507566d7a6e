"""Verifiable math rewards on math-verify, with a hard time bound that holds in any thread.

PACS needs a label for every completion: `math_reward` gives 1.0 when the completion's final answer is mathematically
equal to the gold answer and 0.0 otherwise (`None` when the gold answer itself cannot be parsed, which TRL treats as
"skip this sample"). It has TRL's reward signature, so it plugs straight into `GRPOTrainer(reward_funcs=...)`.

>>> from pacs.rewards import math_reward
>>> math_reward(["... so the answer is $\\\\boxed{\\\\dfrac{1}{2}}$."], solution=["0.5"])
[1.0]

How an answer is read:

1. The gold answer is parsed as LaTeX; a bare answer (`70`, `\\frac{1}{2}`) is wrapped in `\\boxed{}` first.
2. If the completion has a `\\boxed{...}` (or `\\fbox{...}`), the content of the *last* one is the answer, parsed as
   LaTeX. A boxed answer that parses but is wrong scores 0.0: the fallback below is not a second chance.
3. Otherwise (no box, an unclosed box, or a box that does not parse) the paper's fallback: math-verify's LaTeX and
   plain-expression extraction over the end of the completion (its last `FALLBACK_CHARS` characters).

Which forms count as equal is math-verify's `verify` (see docs/evaluation.md for the table the tests check):
fractions and decimals (`\\frac{1}{2}` = `0.5`, `\\dfrac`/`\\tfrac`), intervals with matching endpoints, sets and
comma lists in any order, `\\text{}` answers compared as text, units and degree signs dropped (`10\\text{ cm}` = `10`),
percentages (`50\\%` = `50` = `0.5`), and symbolic equality (`\\sqrt{18}` = `3\\sqrt{2}`).

Why a process pool: math-verify bounds its work with `signal.alarm`, which only works in the main thread; TRL runs
reward functions in worker threads and turns those timeouts off, and some inputs (`\\boxed{9^{9^{9^{9}}}}`) hang
inside C code where no alarm can reach anyway. Here every verification runs in a small pool of worker processes
(plain `python` running this file, which imports math-verify only, never torch), with a per-item deadline; a worker
that misses it is killed and replaced, and the item scores 0.0. The pool starts lazily, is private to the process
that started it (safe after `fork`, under torchrun and accelerate, from any thread) and is shut down at exit.
"""

from __future__ import annotations

import atexit
import importlib
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
from collections.abc import Callable, Sequence
from typing import Any


logger = logging.getLogger(__name__)

__all__ = [
    "FALLBACK_CHARS",
    "REWARD_FUNCS",
    "extract_answer",
    "boxed_math_reward",
    "format_reward",
    "get_reward_funcs",
    "make_math_reward",
    "math_reward",
    "score_completions",
    "shutdown_verifiers",
]

FALLBACK_CHARS = 3000
"""Without a box, only this many characters at the end of a completion are searched for an answer."""

DEFAULT_TIMEOUT = 3.0
_STARTUP_TIMEOUT = 120.0  # importing sympy on a loaded machine can take a while; not counted against items
_MAX_STARTUP_FAILURES = 3
_MEMORY_LIMIT_BYTES = 4 * 1024**3  # RLIMIT_AS of a worker: a runaway `9^{9^{9}}` dies instead of swapping


# ---------------------------------------------------------------------------------------------------------------------
# Answer extraction: pure Python, linear time, safe in the parent process.
# ---------------------------------------------------------------------------------------------------------------------


def _last_box(text: str) -> tuple[str | None, bool]:
    """Content of the last `\\boxed{...}`/`\\fbox{...}` in `text`, and whether any box command occurs at all."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None, False
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None, True
    if text[i] != "{":  # `\boxed 5`: the answer runs to the next space or `$`
        end = i
        while end < len(text) and text[end] not in " $\n":
            end += 1
        return (text[i:end] or None), True
    depth = 0
    for j in range(i, len(text)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return (text[i + 1 : j] if text[i + 1 : j].strip() else None), True
    return None, True  # unclosed box: the completion was cut off


def extract_answer(text: str) -> str | None:
    """Return the content of the last `\\boxed{}` (or `\\fbox{}`) in `text`, or `None` without a closed, non-empty box.

    Pure Python and linear in `len(text)`: it never hangs. This is the string `math_reward` parses first; completions
    without one are scored through math-verify's fallback extraction instead.

    >>> extract_answer("so $x = \\\\boxed{\\\\frac{1}{2}}$, and then \\\\boxed{3}")
    '3'
    >>> extract_answer("no box here") is None
    True
    """
    if not isinstance(text, str):
        return None
    box, _ = _last_box(text)
    return box


def _completion_text(completion: Any) -> str:
    """The text of a completion given as a string, a conversation (last message) or a list of content parts."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = completion.get("content", "")
    elif isinstance(completion, (list, tuple)):
        if not completion:
            return ""
        last = completion[-1]
        completion = last.get("content", "") if isinstance(last, dict) else last
    if isinstance(completion, (list, tuple)):  # content parts: [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in completion)
    return "" if completion is None else str(completion)


def _prepare(completion: str) -> tuple[str | None, str]:
    """(last box content or None, tail of the completion for the fallback): all a worker needs to see."""
    box, _ = _last_box(completion)
    return box, completion[-FALLBACK_CHARS:]


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
    """(reward, extracted answer) for one completion; the rules are in the module docstring."""
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


# ---------------------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------------------


def score_completions(
    completions: Sequence[Any],
    solutions: Sequence[Any],
    timeout: float = DEFAULT_TIMEOUT,
    num_workers: int | None = None,
) -> list[tuple[float | None, str | None]]:
    """Score completions against gold answers, returning `(reward, extracted answer)` pairs.

    This is what `math_reward` runs; evaluation uses it to also record the answer it read.

    Args:
        completions (`Sequence[str]` or `Sequence[list[dict]]`):
            Completions as strings or conversations (the last message's content is scored).
        solutions (`Sequence[str]`):
            Gold answers, one per completion.
        timeout (`float`, *optional*, defaults to `3.0`):
            Seconds one verification may take; past it the worker is killed and replaced and the item scores 0.0.
        num_workers (`int` or `None`, *optional*, defaults to `None`):
            Worker processes; `None` means `min(4, cpu_count // LOCAL_WORLD_SIZE)`. `0` verifies in this process
            with math-verify's own `signal.alarm` timeouts: only a soft bound, and none at all outside the main
            thread. Use it for debugging, never for training.

    Returns:
        `list[tuple[float | None, str | None]]`: the reward (1.0, 0.0, or `None` when the gold answer does not parse)
        and the extracted answer (the last box's content, else the fallback's match, else `None`).
    """
    if len(completions) != len(solutions):
        raise ValueError(
            f"Got {len(completions)} completions but {len(solutions)} solutions; pass one gold answer per completion "
            "(TRL repeats the dataset's `solution` column for every generation)."
        )
    requests, results, todo = [], [None] * len(completions), []
    for i, (completion, gold) in enumerate(zip(completions, solutions)):
        text = _completion_text(completion)
        if gold is None or (isinstance(gold, float) and math.isnan(gold)):
            results[i] = (None, extract_answer(text))
            continue
        box, tail = _prepare(text)
        requests.append((box, tail, str(gold)))
        todo.append(i)
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
        scored = [_score_safe(box, tail, gold, mv_timeout) for box, tail, gold in requests]
    else:
        scored = _get_pool(num_workers, float(timeout)).map(requests) if requests else []
    for i, result in zip(todo, scored):
        results[i] = result
    return results


def make_math_reward(
    timeout: float = DEFAULT_TIMEOUT,
    num_workers: int | None = None,
    name: str = "math_reward",
    require_box: bool = False,
) -> Callable[..., list[float | None]]:
    """Build a math-verify reward function with its own time bound and worker count.

    Args:
        timeout (`float`, *optional*, defaults to `3.0`):
            Seconds one verification may take before it scores 0.0.
        num_workers (`int` or `None`, *optional*, defaults to `None`):
            Verifier processes, see `score_completions`.
        name (`str`, *optional*, defaults to `"math_reward"`):
            The function's `__name__`; TRL logs the reward as `rewards/<name>/mean`.
        require_box (`bool`, *optional*, defaults to `False`):
            Score 0.0 unless the final answer is in a `\\boxed{}`: no fallback extraction, so a model cannot earn
            the reward by dropping the box (small models do, once the fallback pays for `... = 73.`).

    Returns:
        A function `f(completions, solution, **kwargs) -> list[float | None]`.
    """

    def reward(completions, solution, **kwargs) -> list[float | None]:
        scored = score_completions(completions, solution, timeout=timeout, num_workers=num_workers)
        if not require_box:
            return [r for r, _ in scored]
        boxed = [extract_answer(_completion_text(c)) is not None for c in completions]
        return [r if r is None or has_box else 0.0 for (r, _), has_box in zip(scored, boxed)]

    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = math_reward.__doc__
    return reward


def math_reward(completions, solution, **kwargs) -> list[float | None]:
    """1.0 when a completion's final answer equals the gold answer (math-verify), 0.0 if not, `None` if the gold
    answer does not parse.

    Never raises on model output and never hangs: every verification runs in a worker process with a 3 s deadline
    (see the module docstring and `make_math_reward` to change it).

    Args:
        completions (`list[str]` or `list[list[dict]]`):
            Completions, as strings or as conversations (the last message is scored).
        solution (`list[str]`):
            The gold answers, one per completion (the dataset's `solution` column).

    >>> math_reward([[{"role": "assistant", "content": "The answer is \\\\boxed{70}."}], "It is 71."], ["70", "70"])
    [1.0, 0.0]
    """
    return [r for r, _ in score_completions(completions, solution)]


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 when a completion contains exactly one `\\boxed{...}` answer (closed and non-empty), else 0.0.

    >>> format_reward(["So \\\\boxed{4}.", "\\\\boxed{4} or \\\\boxed{5}", "4"])
    [1.0, 0.0, 0.0]
    """
    rewards = []
    for completion in completions:
        text = _completion_text(completion)
        box = extract_answer(text)
        ok = text.count("\\boxed") + text.count("\\fbox") == 1 and box is not None
        rewards.append(1.0 if ok else 0.0)
    return rewards


boxed_math_reward = make_math_reward(name="boxed_math_reward", require_box=True)
boxed_math_reward.__doc__ = """Like `math_reward`, but 0.0 unless the final answer is in a `\\boxed{}` (no fallback).

    >>> boxed_math_reward(["The answer is \\\\boxed{70}.", "It is 70."], ["70", "70"])
    [1.0, 0.0]
    """

REWARD_FUNCS: dict[str, Callable[..., list]] = {
    "math": math_reward,
    "boxed_math": boxed_math_reward,
    "format": format_reward,
}
"""Reward functions by the short names `get_reward_funcs` accepts."""


def get_reward_funcs(names: Sequence[str | Callable] | str) -> list[Callable]:
    """Look reward functions up by short name (`"math"`, `"format"`) or dotted import path (`"my_pkg.rewards.f"`
    or `"my_pkg.rewards:f"`); callables pass through.

    >>> [f.__name__ for f in get_reward_funcs(["math", "format"])]
    ['math_reward', 'format_reward']
    """
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    funcs = []
    for name in names:
        if callable(name):
            funcs.append(name)
        elif name in REWARD_FUNCS:
            funcs.append(REWARD_FUNCS[name])
        elif "." in name or ":" in name:
            module_name, _, attr = name.rpartition(":") if ":" in name else name.rpartition(".")
            try:
                func = getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError) as e:
                raise ValueError(
                    f"Could not import reward function {name!r} ({e}). Use a dotted path to a function, such as "
                    f"'my_pkg.rewards.my_reward', or one of the names {sorted(REWARD_FUNCS)}."
                ) from e
            if not callable(func):
                raise ValueError(f"{name!r} is not callable; it must be a reward function f(completions, **kwargs).")
            funcs.append(func)
        else:
            raise ValueError(
                f"Unknown reward function {name!r}. Valid names are {sorted(REWARD_FUNCS)}, or a dotted import path "
                "to a function such as 'my_pkg.rewards.my_reward'."
            )
    return funcs
