"""From reward scores to PACS labels: pure torch, no trl import.

PACS uses each completion's reward as the label $R_i \\in [0, 1]$ of a binary cross-entropy. A verifier's 0/1 score
is a label as it is; a learned reward model's score is a real number. `reward_to_label` maps every reward function's
score onto [0, 1] before the `reward_weights`-weighted sum, one transform per function:

- `"none"`: the score is the label and must already lie in [0, 1] (verifiers, 0/1 rewards);
- `"sigmoid"`: $\\sigma((s - b) / \\tau)$, the probability a Bradley-Terry reward model assigns to "better than a
  completion of score $b$" at temperature $\\tau$ (soft labels: the class weights count them fractionally);
- `"clip"`: $\\min(\\max(s, 0), 1)$, for scores that are meant to lie in [0, 1] but may overshoot.

A score of `None` (NaN in TRL's reward tensor: "this function does not apply") stays NaN under every transform.

>>> import torch
>>> reward_to_label(torch.tensor([[0.0, 2.0], [1.0, -3.0]]), ["none", "clip"])
tensor([[0., 1.],
        [1., 0.]])
>>> reward_to_label(torch.tensor([[0.0], [2.0]]), "sigmoid", temperature=2.0, offset=2.0)
tensor([[0.2689],
        [0.5000]])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


LABEL_TRANSFORMS = ("none", "sigmoid", "clip")


def label_transforms(transform: str | Sequence[str], num_funcs: int) -> list[str]:
    """One transform per reward function: a single name applies to all of them, a list names one for each.

    >>> label_transforms("sigmoid", 2)
    ['sigmoid', 'sigmoid']
    """
    names = [transform] if isinstance(transform, str) else list(transform)
    if len(names) == 1:
        names = names * num_funcs
    if len(names) != num_funcs:
        raise ValueError(
            f"pacs_label_transform names {len(names)} transforms ({names}) for {num_funcs} reward functions; give "
            "one name for all of them or exactly one per reward function, in the order of reward_funcs."
        )
    unknown = [name for name in names if name not in LABEL_TRANSFORMS]
    if unknown:
        raise ValueError(
            f"Unknown pacs_label_transform {unknown[0]!r}; use one of {', '.join(map(repr, LABEL_TRANSFORMS))}."
        )
    return names


def reward_to_label(
    rewards_per_func: torch.Tensor,
    transform: str | Sequence[str] = "none",
    temperature: float = 1.0,
    offset: float = 0.0,
) -> torch.Tensor:
    """Map each reward function's scores to [0, 1] labels (before the `reward_weights`-weighted sum).

    Args:
        rewards_per_func (`torch.Tensor` of shape `(B, F)`):
            Score of every completion under each of the `F` reward functions, NaN where a function returned `None`.
        transform (`str` or `list[str]`, *optional*, defaults to `"none"`):
            `"none"`, `"sigmoid"` or `"clip"`, for all functions or one per function (see the module docstring).
        temperature (`float`, *optional*, defaults to `1.0`):
            $\\tau$ of the `"sigmoid"` transform; must be > 0.
        offset (`float`, *optional*, defaults to `0.0`):
            Baseline $b$ of the `"sigmoid"` transform: a score of $b$ maps to the label 0.5.

    Returns:
        `torch.Tensor` of shape `(B, F)`: the labels, NaN where the score was NaN.
    """
    names = label_transforms(transform, rewards_per_func.size(1))
    columns = []
    for f, name in enumerate(names):
        scores = rewards_per_func[:, f]  # (B,)
        if name == "sigmoid":
            scores = torch.sigmoid((scores - offset) / temperature)
        elif name == "clip":
            scores = scores.clamp(0.0, 1.0)  # NaN stays NaN
        columns.append(scores)
    return torch.stack(columns, dim=1)  # (B, F)


def soft_label_message(labels: torch.Tensor, scorable: torch.Tensor, transform: str | Sequence[str]) -> str | None:
    """The one warning for rewards strictly between 0 and 1 taken as labels as they are: PACS then trains a soft
    label (a cross-entropy towards, say, 0.7), where the paper's labels are a verifier's binary 0/1. `None` when
    every scored label is 0 or 1, or when every reward function's score goes through the `"sigmoid"` transform
    (soft labels are then what was asked for).

    >>> soft_label_message(torch.tensor([1.0, 0.0]), torch.tensor([True, True]), "none") is None
    True
    >>> soft_label_message(torch.tensor([0.5, 0.0]), torch.tensor([True, True]), "none")[:48]
    'PACS trains 1 of 2 scored completions on rewards'
    """
    if all(name == "sigmoid" for name in ([transform] if isinstance(transform, str) else transform)):
        return None
    soft = scorable & (labels > 0) & (labels < 1)  # (B,)
    if not soft.any():
        return None
    return (
        f"PACS trains {int(soft.sum())} of {int(scorable.sum())} scored completions on rewards strictly between 0 "
        "and 1 (e.g. {:g}), as soft labels of its cross-entropy: the paper (arXiv:2509.02522) trains on a "
        "verifier's binary 0/1 labels. This is fine for a partial-credit reward; for the paper's setting, make the "
        "reward functions return 0 or 1 (said once per run).".format(labels[soft][0].item())
    )


def label_range_error(
    row: int, names: Sequence[str], rewards_per_func, labels_per_func, labels, weights, transform: str
) -> ValueError:
    """The error for a label outside [0, 1]: completion `row`'s score from each reward function, and the fixes."""
    parts = ", ".join(
        f"{name}={rewards_per_func[row, i].item():g}"
        + (f" -> label {labels_per_func[row, i].item():g}" if transform != "none" else "")
        + f" (weight {weights[i].item():g})"
        for i, name in enumerate(names)
    )
    return ValueError(
        f"PACS uses the reward as a label and needs it in [0, 1], but completion {row} of this batch got "
        f"{labels[row].item():g} from the reward functions {parts} with pacs_label_transform={transform!r}. For a "
        "learned reward model or any unbounded score, set pacs_label_transform='sigmoid' (label "
        "sigmoid((score - pacs_label_offset) / pacs_label_temperature)) or 'clip'; otherwise make the reward "
        "functions return values in [0, 1] (e.g. 1.0 correct / 0.0 wrong). The reward_weights must be >= 0 and "
        f"sum to at most 1, e.g. reward_weights={[round(1 / len(weights), 4)] * len(weights)}."
    )


__all__ = ["LABEL_TRANSFORMS", "label_range_error", "label_transforms", "reward_to_label", "soft_label_message"]
