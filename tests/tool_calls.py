"""The tool, the reward and the scripted generation of the tool-calling tests (TRL's test_train_with_tools):
`multiply`, which a completion may call, `called_a_tool`, 1 for a completion that called one, and `scripted_generate`,
a stand-in for `model.generate`. One definition for tests/test_checks.py, tests/test_dynamic_sampling_paths.py and
tests/test_padding_free.py."""

import torch


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


def scripted_generate(tokenizer, reply):
    """A stand-in for `model.generate`: row i of the batch gets `reply(prompt text, i)` (then eos and padding)."""

    def generate(input_ids, **kwargs):
        prompts = tokenizer.batch_decode(input_ids)
        rows = [tokenizer.encode(reply(text, i)) + [tokenizer.eos_token_id] for i, text in enumerate(prompts)]
        width = max(map(len, rows))
        rows = [row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows]
        return torch.cat([input_ids, torch.tensor(rows, device=input_ids.device)], dim=1)

    return generate
