"""Tests for `pacs.rewards` and `pacs.verifier_pool`: the equivalence table, the time bound on hostile inputs, the
pool's recovery, lookups."""

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pacs import rewards, verifier_pool
from pacs.rewards import extract_answer, format_reward, get_reward_funcs, make_math_reward, math_reward
from tests.hostile_completions import HOSTILE_COMPLETIONS


# (completion, gold, expected reward). Mirrored in docs/evaluation.md; keep the two in sync.
EQUIVALENCE_TABLE = [
    # fractions, decimals, \dfrac / \tfrac, signs
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac34", 1.0),
    ("\\boxed{\\tfrac{3}{4}}", "0.75", 1.0),
    ("\\boxed{-\\frac{1}{2}}", "-0.5", 1.0),
    ("\\boxed{0.33}", "\\frac{1}{3}", 0.0),
    ("\\boxed{0.5}", "0.500001", 0.0),
    # intervals and sets
    ("\\boxed{[1, 3)}", "[1,3)", 1.0),
    ("\\boxed{(1, 3]}", "[1,3)", 0.0),
    ("\\boxed{(-\\infty, 2)}", "(-\\infty,2)", 1.0),
    ("\\boxed{\\{3, 1, 2\\}}", "\\{1,2,3\\}", 1.0),
    ("\\boxed{1, 2, 3}", "3,2,1", 1.0),
    ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
    # \text{} answers
    ("\\boxed{\\text{Monday}}", "\\text{Monday}", 1.0),
    ("\\boxed{Monday}", "\\text{Monday}", 1.0),
    ("\\boxed{\\text{Tuesday}}", "\\text{Monday}", 0.0),
    ("\\boxed{\\textbf{(C)}}", "\\text{(C)}", 1.0),
    # units, degrees, currency, thousands separators
    ("\\boxed{10\\text{ cm}}", "10", 1.0),
    ("\\boxed{10}", "10\\text{ inches}", 1.0),
    ("\\boxed{90^\\circ}", "90", 1.0),
    ("\\boxed{\\$18.90}", "18.90", 1.0),
    ("\\boxed{1,000}", "1000", 1.0),
    # percentages
    ("\\boxed{50\\%}", "50", 1.0),
    ("\\boxed{50\\%}", "0.5", 1.0),
    ("\\boxed{50}", "50\\%", 1.0),
    # symbolic equality
    ("\\boxed{3\\sqrt{2}}", "\\sqrt{18}", 1.0),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}", 1.0),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("\\boxed{x=5}", "5", 1.0),
    ("\\boxed{2\\pi}", "2\\pi", 1.0),
    ("\\boxed{\\pi}", "3.14159", 0.0),
    ("\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", 1.0),
    ("\\boxed{024}", "24", 1.0),
    ("\\boxed{y}", "x", 0.0),
    # multiple boxes: the last one counts, earlier ones are not a second chance
    ("First \\boxed{1}, finally \\boxed{2}", "2", 1.0),
    ("First \\boxed{1}, finally \\boxed{2}", "1", 0.0),
    ("\\boxed{2}.\n\nWait, actually the answer is 3", "3", 0.0),
    # other box spellings
    ("\\fbox{5}", "5", 1.0),
    ("so the answer is \\boxed 5", "5", 1.0),
    # no box: the paper's fallback over the end of the completion
    ("The answer is $42$.", "42", 1.0),
    ("so x = 7", "7", 1.0),
    ("The final answer is $\\frac{7}{2}$", "3.5", 1.0),
    ("I think it is 8.", "7", 0.0),
    # empty, empty box, cut-off box
    ("", "7", 0.0),
    ("\\boxed{}", "7", 0.0),
    ("\\boxed{7", "7", 0.0),
]


def test_equivalence_table():
    assert len(EQUIVALENCE_TABLE) >= 30
    completions = [c for c, _, _ in EQUIVALENCE_TABLE]
    golds = [g for _, g, _ in EQUIVALENCE_TABLE]
    got = math_reward(completions, solution=golds)
    wrong = [(c, g, e, r) for (c, g, e), r in zip(EQUIVALENCE_TABLE, got) if r != e]
    assert not wrong, f"(completion, gold, expected, got): {wrong}"


def test_conversational_completions_and_name():
    completions = [
        [{"role": "assistant", "content": "The answer is \\boxed{70}."}],
        [{"role": "assistant", "content": [{"type": "text", "text": "so \\boxed{71}"}]}],
    ]
    assert math_reward(completions, solution=["70", "70"], prompts=["p", "p"]) == [1.0, 0.0]
    assert math_reward.__name__ == "math_reward"
    custom = make_math_reward(timeout=5.0, num_workers=1, name="accuracy")
    assert custom.__name__ == "accuracy"
    assert custom(["\\boxed{2}"], solution=["2"]) == [1.0]


def test_unparsable_gold_is_none():
    assert math_reward(["\\boxed{5}", "\\boxed{5}", "\\boxed{5}"], solution=["", "}", None]) == [None, None, None]


def test_length_mismatch_raises():
    with pytest.raises(ValueError, match="one gold answer per completion"):
        math_reward(["\\boxed{1}"], solution=["1", "2"])


def test_in_process_path_matches_pool():
    completions = [c for c, _, _ in EQUIVALENCE_TABLE[:8]]
    golds = [g for _, g, _ in EQUIVALENCE_TABLE[:8]]
    in_process = rewards.score_completions(completions, golds, num_workers=0)
    assert in_process == rewards.score_completions(completions, golds)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so $x = \\boxed{\\frac{1}{2}}$, and then \\boxed{3}", "3"),
        ("\\boxed{a{b}c}", "a{b}c"),
        ("\\fbox{4}", "4"),
        ("\\boxed{ }", None),
        ("\\boxed{1", None),
        ("no box", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_format_reward():
    completions = [
        "So \\boxed{4}.",
        "\\boxed{4} or \\boxed{5}",
        "4",
        "\\boxed{}",
        [{"role": "assistant", "content": "\\boxed{1}"}],
    ]
    assert format_reward(completions) == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_get_reward_funcs():
    assert get_reward_funcs(["math", "format"]) == [math_reward, format_reward]
    assert get_reward_funcs("math,format") == [math_reward, format_reward]
    assert get_reward_funcs(["pacs.rewards.format_reward", "pacs.rewards:math_reward"]) == [format_reward, math_reward]
    names = r"\['boxed_math', 'format', 'math', 'soft_overlong_punishment'\]"
    with pytest.raises(ValueError, match=r"Valid names are " + names):
        get_reward_funcs(["accuracy"])
    with pytest.raises(ValueError, match="Could not import"):
        get_reward_funcs(["pacs.rewards.nope"])


def test_soft_overlong_punishment_is_a_named_reward_built_from_the_recipes_lengths():
    # DAPO's Eq. 13 through TRL's function: 0 up to L_max - L_cache, then linearly down to -1 at L_max
    (punish,) = get_reward_funcs(["soft_overlong_punishment"], max_completion_length=100, soft_punish_cache=20)
    assert punish(completion_ids=[[0] * 80, [0] * 90, [0] * 100]) == [0.0, -0.5, -1.0]
    assert punish.__name__ == "soft_overlong_punishment_reward"  # TRL logs rewards/<name>/mean
    # the default buffer is DAPO's share of the length: 4,096 of 20,480 = a fifth
    (default,) = get_reward_funcs("math,soft_overlong_punishment", max_completion_length=20480)[1:]
    assert default.soft_punish_cache == 4096
    with pytest.raises(ValueError, match="needs max_completion_length"):
        get_reward_funcs(["soft_overlong_punishment"])
    for bad in (0, 101, 2.5):
        with pytest.raises(ValueError, match="soft_punish_cache must be an integer between 1 and"):
            get_reward_funcs(["soft_overlong_punishment"], max_completion_length=100, soft_punish_cache=bad)


HOSTILE_BOUND_S = 15.0  # default per-item timeout is 3 s; the rest is slack for a loaded 2-core CI machine


@pytest.mark.parametrize("where", ["main thread", "worker thread"])
def test_hostile_inputs_are_bounded(where):
    timings = {}
    for name, text in HOSTILE_COMPLETIONS.items():
        start = time.perf_counter()
        if where == "main thread":
            result = math_reward([text], solution=["3"])
        else:
            with ThreadPoolExecutor(max_workers=2) as pool:
                result = pool.submit(math_reward, [text], solution=["3"]).result(timeout=60)
        timings[name] = time.perf_counter() - start
        assert result == [0.0], name
    assert max(timings.values()) < HOSTILE_BOUND_S, timings


def test_worker_past_deadline_is_killed_and_replaced():
    # math-verify's in-worker alarm set far away: only the pool's hard deadline can stop the power tower
    pool = verifier_pool._VerifierPool(num_workers=1, timeout=1.0, mv_timeout=60)
    try:
        start = time.perf_counter()
        results = pool.map([("9^{9^{9^{9}}}", "", "3"), ("3", "", "3")])
        assert results == [(0.0, None), (1.0, "3")]
        assert pool.stats["timeouts"] == 1 and pool.stats["restarts"] == 1
        assert time.perf_counter() - start < 30
    finally:
        pool.shutdown()


def test_dead_worker_is_replaced():
    pool = verifier_pool._VerifierPool(num_workers=1, timeout=5.0)
    try:
        assert pool.map([("1", "", "1")]) == [(1.0, "1")]
        os.kill(pool.workers[0].proc.pid, signal.SIGKILL)
        pool.workers[0].proc.wait(timeout=10)
        assert pool.map([("2", "", "2"), ("3", "", "2")]) == [(1.0, "2"), (0.0, "3")]
    finally:
        pool.shutdown()


def test_worker_module_does_not_import_torch():
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('w', {verifier_pool.__file__!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "assert m._score_safe('1', '', '1', 1) == (1.0, '1')\n"
        "print(sorted(k for k in ('torch', 'transformers', 'pacs') if k in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_boxed_math_reward_requires_the_box():
    from pacs.rewards import boxed_math_reward

    completions = [
        "So \\boxed{70}.",
        "43 + 27 = 70.",
        "So \\boxed{71}.",
        [{"role": "assistant", "content": "\\boxed{70}"}],
    ]
    assert boxed_math_reward(completions, ["70"] * 4) == [1.0, 0.0, 0.0, 1.0]
    assert math_reward(completions[1:2], ["70"]) == [1.0]  # the lenient reward's fallback pays for it
    assert boxed_math_reward.__name__ == "boxed_math_reward"
    assert get_reward_funcs(["boxed_math"]) == [boxed_math_reward]
