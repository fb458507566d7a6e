"""Per-batch metrics of the GRPO layer that TRL does not log: how a generation batch's groups split by outcome.

TRL logs `frac_reward_zero_std` (groups whose rewards are all equal) and PACS `pacs/frac_mixed_groups`; neither says
whether a uniform group is all wrong (no correct completion: the sparse-reward case, nothing to learn from for GRPO) or
all right (already solved). Pure torch, no TRL import.
"""

from __future__ import annotations

import torch


CORRECT_AT = 0.5  # a completion whose (weighted, summed) reward is at least this counts as correct


def group_outcome_shares(rewards: torch.Tensor, scorable: torch.Tensor, num_generations: int) -> dict[str, float]:
    """The shares of a batch's groups with no correct completion and with only correct completions.

    Args:
        rewards (`torch.Tensor` of shape `(B,)`):
            Each completion's reward as TRL sums it (`(rewards_per_func * reward_weights).nansum(1)`), groups of
            `num_generations` consecutive rows (TRL's gathered order).
        scorable (`torch.Tensor` of shape `(B,)`, bool):
            False where no reward function scored the completion: such a row is neither correct nor wrong.
        num_generations (`int`): the group size G.

    Returns:
        `dict`: `pacs/frac_all_wrong_groups` (groups with at least one scored completion and none with a reward
        >= 0.5) and `pacs/frac_all_right_groups` (groups with at least one scored completion, all of them >= 0.5),
        as shares of all groups.

    >>> r = torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    >>> group_outcome_shares(r, torch.ones(6, dtype=torch.bool), 2)
    {'pacs/frac_all_wrong_groups': 0.3333333432674408, 'pacs/frac_all_right_groups': 0.3333333432674408}
    """
    if rewards.numel() % num_generations:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of num_generations={num_generations}.")
    correct = ((rewards >= CORRECT_AT) & scorable).view(-1, num_generations)  # (groups, G)
    scored = scorable.view(-1, num_generations)  # (groups, G)
    any_scored = scored.any(dim=1)  # (groups,)
    all_wrong = any_scored & ~correct.any(dim=1)
    all_right = any_scored & (correct | ~scored).all(dim=1)
    return {
        "pacs/frac_all_wrong_groups": all_wrong.float().mean().item(),
        "pacs/frac_all_right_groups": all_right.float().mean().item(),
    }
