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

Every verification runs in a worker process under a hard per-item deadline that holds in any thread; an answer that
misses it scores 0.0. `pacs.verifier_pool` runs those workers and says why a process pool.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

from .verifier_pool import shutdown_verifiers, verify_batch


__all__ = [
    "FALLBACK_CHARS",
    "REWARD_FACTORIES",
    "REWARD_FUNCS",
    "extract_answer",
    "boxed_math_reward",
    "format_reward",
    "get_reward_funcs",
    "make_math_reward",
    "make_soft_overlong_punishment",
    "math_reward",
    "score_completions",
    "shutdown_verifiers",
]

FALLBACK_CHARS = 3000
"""Without a box, only this many characters at the end of a completion are searched for an answer."""

DEFAULT_TIMEOUT = 3.0


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
    scored = verify_batch(requests, timeout, num_workers)
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


def make_soft_overlong_punishment(max_completion_length: int, soft_punish_cache: int | None = None) -> Callable:
    """DAPO's overlong reward shaping (https://arxiv.org/abs/2503.14476, Eq. 13): 0 up to
    `max_completion_length - soft_punish_cache` tokens, then falling linearly to -1 at `max_completion_length`. TRL's
    `trl.rewards.get_soft_overlong_punishment` (logged as `rewards/soft_overlong_punishment_reward/mean`), with the
    cache checked and defaulting to DAPO's share of the length. verl: `reward_model.overlong_buffer.{enable, len}`
    (with `penalty_factor` 1.0); open-r1: `soft_overlong_punishment` with `max_completion_len` / `soft_punish_cache`.

    Args:
        max_completion_length (`int`):
            L_max, the longest completion generated (the training config's `max_completion_length`).
        soft_punish_cache (`int`, *optional*):
            L_cache, the length of the buffer before L_max in which the punishment grows; between 1 and
            `max_completion_length`. Defaults to a fifth of `max_completion_length`, DAPO's 4,096 of 20,480.

    >>> punish = make_soft_overlong_punishment(100, 20)
    >>> punish(completion_ids=[[1] * 80, [1] * 90, [1] * 100])
    [0.0, -0.5, -1.0]
    """
    from trl.rewards import get_soft_overlong_punishment

    cache = max_completion_length // 5 if soft_punish_cache is None else soft_punish_cache
    if isinstance(cache, bool) or not isinstance(cache, int) or not 0 < cache <= max_completion_length:
        raise ValueError(
            f"soft_punish_cache must be an integer between 1 and max_completion_length ({max_completion_length}), "
            f"got {soft_punish_cache!r}; DAPO punishes the last fifth (4,096 of 20,480 tokens)."
        )
    return get_soft_overlong_punishment(max_completion_len=max_completion_length, soft_punish_cache=cache)


REWARD_FUNCS: dict[str, Callable[..., list]] = {
    "math": math_reward,
    "boxed_math": boxed_math_reward,
    "format": format_reward,
}
"""Reward functions by the short names `get_reward_funcs` accepts."""

REWARD_FACTORIES: dict[str, Callable[..., Callable[..., list]]] = {
    "soft_overlong_punishment": make_soft_overlong_punishment,
}
"""Reward functions with settings, by the short names `get_reward_funcs` accepts; each is built from the settings it
names (`max_completion_length`, `soft_punish_cache`), which `pacs train` takes from the recipe."""


def get_reward_funcs(
    names: Sequence[str | Callable] | str,
    max_completion_length: int | None = None,
    soft_punish_cache: int | None = None,
) -> list[Callable]:
    """Look reward functions up by short name (`"math"`, `"format"`, `"soft_overlong_punishment"`) or dotted import
    path (`"my_pkg.rewards.f"` or `"my_pkg.rewards:f"`); callables pass through.

    Args:
        names (`list` or `str`):
            Names, paths or callables (a string: comma-separated).
        max_completion_length (`int`, *optional*):
            For `soft_overlong_punishment` (`make_soft_overlong_punishment`), which needs it: the training config's.
        soft_punish_cache (`int`, *optional*):
            For `soft_overlong_punishment`: its buffer (default: a fifth of `max_completion_length`).

    >>> [f.__name__ for f in get_reward_funcs(["math", "format"])]
    ['math_reward', 'format_reward']
    >>> get_reward_funcs(["soft_overlong_punishment"], max_completion_length=8192)[0].soft_punish_cache
    1638
    """
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    funcs = []
    for name in names:
        if callable(name):
            funcs.append(name)
        elif name in REWARD_FUNCS:
            funcs.append(REWARD_FUNCS[name])
        elif name in REWARD_FACTORIES:
            if max_completion_length is None:
                raise ValueError(f"The reward {name!r} needs max_completion_length (the training config's).")
            funcs.append(REWARD_FACTORIES[name](max_completion_length, soft_punish_cache))
        elif "." in name or ":" in name:
            module_name, _, attr = name.rpartition(":") if ":" in name else name.rpartition(".")
            try:
                func = getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError) as e:
                raise ValueError(
                    f"Could not import reward function {name!r} ({e}). Use a dotted path to a function, such as "
                    f"'my_pkg.rewards.my_reward', or one of the names {sorted([*REWARD_FUNCS, *REWARD_FACTORIES])}."
                ) from e
            if not callable(func):
                raise ValueError(f"{name!r} is not callable; it must be a reward function f(completions, **kwargs).")
            funcs.append(func)
        else:
            raise ValueError(
                f"Unknown reward function {name!r}. Valid names are {sorted([*REWARD_FUNCS, *REWARD_FACTORIES])}, or "
                "a dotted import path to a function such as 'my_pkg.rewards.my_reward'."
            )
    return funcs
