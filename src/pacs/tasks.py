"""Seeded arithmetic problems for the CPU demo: small integer sums, differences, products and word problems.

The level is set so that SmolLM2-135M-Instruct, asked to box its answer, solves a fair share but not most of them,
which leaves room for RL to show a gain within minutes on a CPU. Every problem comes from a `random.Random(seed)`,
so a seed fully determines a set; the demo draws its training and held-out sets from different seeds.

>>> ds = make_arithmetic_dataset(3, seed=0)
>>> sorted(ds.column_names)
['id', 'prompt', 'solution']
>>> ds[0]["prompt"][-1]["role"]
'user'
>>> make_arithmetic_dataset(3, seed=0)["solution"] == ds["solution"]
True
"""

from __future__ import annotations

import random


SYSTEM_PROMPT = "Box the final answer."

# One short worked example before every question. Without it SmolLM2-135M-Instruct rambles and rarely boxes its
# answer; with it, it answers in one line and boxes ~90% of the time.
# Kept short because on a CPU the prompt is a large part of the compute.
FEW_SHOT = [
    {"role": "user", "content": "Mia has 12 shells and finds 7 more. How many shells does Mia have?"},
    {"role": "assistant", "content": "12 + 7 = 19. \\boxed{19}"},
]

_NAMES = ["Tom", "Ana", "Liam", "Mia", "Omar", "Sara", "Ben", "Lena", "Ravi", "Zoe"]
_ITEMS = ["apples", "marbles", "stickers", "books", "coins", "pencils", "cards", "shells"]


def _sum(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 49), rng.randint(10, 49)
    return f"What is {a} + {b}?", a + b


def _difference(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(20, 99), rng.randint(2, 19)
    return f"What is {a} - {b}?", a - b


def _product(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 9), rng.randint(2, 12)
    return f"What is {a} * {b}?", a * b


def _word_more(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = rng.randint(5, 40), rng.randint(2, 20)
    return f"{name} has {a} {item} and finds {b} more. How many {item} does {name} have?", a + b


def _word_left(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a = rng.randint(10, 40)
    b = rng.randint(2, a - 2)
    return f"{name} has {a} {item} and gives {b} away. How many {item} does {name} have left?", a - b


# Greedy accuracy of SmolLM2-135M-Instruct with the prompt above, 2 x 50 problems: products ~85%, sums ~45%,
# differences ~25%, word problems ~10-15% (it often copies the example's numbers); ~35% overall.
PROBLEM_KINDS = {
    "sum": _sum,
    "difference": _difference,
    "product": _product,
    "word_more": _word_more,
    "word_left": _word_left,
}


def make_arithmetic_dataset(
    num_problems: int,
    seed: int,
    kinds: list[str] | None = None,
    system_prompt: str | None = SYSTEM_PROMPT,
    few_shot: list[dict] | None = FEW_SHOT,
):
    """Draw `num_problems` problems from `random.Random(seed)`, cycling through the problem kinds.

    Args:
        num_problems (`int`):
            Number of problems.
        seed (`int`):
            Seed of the generator; the same seed gives the same problems in the same order.
        kinds (`list[str]`, *optional*):
            Problem kinds to draw from (keys of `PROBLEM_KINDS`); all of them by default.
        system_prompt (`str` or `None`, *optional*, defaults to `SYSTEM_PROMPT`):
            System message put before each question; `None` leaves it out.
        few_shot (`list[dict]` or `None`, *optional*, defaults to `FEW_SHOT`):
            Worked user/assistant turns put between the system message and the question; `None` leaves them out.

    Returns:
        `datasets.Dataset` with columns `prompt` (a conversation), `solution` (the integer answer as a string) and
        `id` (`"<kind>-<seed>-<index>"`).
    """
    from datasets import Dataset

    kinds = list(PROBLEM_KINDS) if kinds is None else kinds
    unknown = [kind for kind in kinds if kind not in PROBLEM_KINDS]
    if unknown:
        raise ValueError(f"Unknown problem kinds {unknown}; choose from {list(PROBLEM_KINDS)}.")
    rng = random.Random(seed)
    rows = {"prompt": [], "solution": [], "id": []}
    for index in range(num_problems):
        kind = kinds[index % len(kinds)]
        question, answer = PROBLEM_KINDS[kind](rng)
        prompt = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
        prompt += [dict(turn) for turn in few_shot or []] + [{"role": "user", "content": question}]
        rows["prompt"].append(prompt)
        rows["solution"].append(str(answer))
        rows["id"].append(f"{kind}-{seed}-{index}")
    return Dataset.from_dict(rows)
