"""Completions that must score 0.0 within a few seconds, in any thread: huge numbers, deep or broken nesting, sheer
length, random unicode. Used by tests/test_rewards.py and benchmarks/reward_throughput/reward_throughput.py."""

HOSTILE_COMPLETIONS = {
    "power tower": "\\boxed{9^{9^{9^{9}}}}",
    "huge power": "\\boxed{2^{2^{40}}}",
    "factorial": "\\boxed{10000!}",
    "huge factorial": "\\boxed{(10^{10})!}",
    "nested braces": "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",
    "unclosed braces": "\\boxed{" + "{\\frac{" * 3000,
    "200k characters": "x + y = " * 25_000,
    "random unicode": "".join(chr(c) for c in range(0x20, 0x20 + 60_000) if not 0xD800 <= c < 0xE000) * 3,
}
