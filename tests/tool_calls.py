"""The tool and the reward of the tool-calling tests (TRL's test_train_with_tools): `multiply`, which a completion may
call, and `called_a_tool`, 1 for a completion that called one. One definition for tests/test_checks.py,
tests/test_dynamic_sampling_paths.py and tests/test_padding_free.py."""


def multiply(a: int, b: int) -> int:
    """
    Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


def called_a_tool(completions, **kwargs):
    return [float(any(message.get("tool_calls") for message in completion)) for completion in completions]
