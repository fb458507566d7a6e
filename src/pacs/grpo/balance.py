"""Rows balanced by tokens: one optimizer step's rows regrouped over its micro-batches so that each computes about the
same number of real tokens.

With padding-free training (`padding_free=True`) a micro-batch costs what its real tokens cost, so TRL's random split
of the generation batch leaves the step as slow as its heaviest micro-batch, and under ZeRO-3 or DDP every process
waits for the slowest. verl (`use_dynamic_bsz`, `ppo_max_token_len_per_gpu`) and OpenRLHF (`--dynamic_batch_enable`,
`--max_tokens_per_gpu`) balance by tokens too, but change the number of rows per micro-batch; here the shapes stay:
rows per micro-batch and micro-batches per step are unchanged (TRL's and PACS's per-row gathers need the same shapes
on every process, ZeRO-3 the same number of forwards), only which rows share a micro-batch changes. Every loss whose
normalisers are global to the optimizer step then gives the step the same gradient (`HardenedGRPOTrainer.
_balance_unit` says which settings keep today's grouping).

1. `balanced_partition`: which units (rows, or whole groups of rows) go to which micro-batch: the greedy "largest
   first into the lightest micro-batch that still has room" (LPT with a cardinality bound), deterministic.
2. `balance_micro_batches`: a step's micro-batches (TRL's dicts) regrouped by that partition.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


__all__ = ["balance_micro_batches", "balanced_partition", "row_tokens"]


def balanced_partition(weights: Sequence[float], num_bins: int) -> list[list[int]]:
    """Split units with `weights` into `num_bins` bins of equal count so that the bins' weight sums are even.

    Largest first, each unit into the lightest bin that still has room (ties: the lower bin); each bin's units in
    their original order. Deterministic: the same weights in the same order give the same bins.

    Args:
        weights (`Sequence[float]`): one weight per unit (e.g. a row's real tokens); its length a multiple of
            `num_bins`.
        num_bins (`int`): how many bins (micro-batches).

    Returns:
        `list[list[int]]`: for each bin, the indices of its units, ascending.

    >>> balanced_partition([9, 1, 1, 9], 2)
    [[0, 1], [2, 3]]
    >>> balanced_partition([9, 9, 1, 1], 2)
    [[0, 2], [1, 3]]
    """
    n = len(weights)
    if num_bins < 1 or n % num_bins != 0:
        raise ValueError(f"Cannot split {n} units into {num_bins} bins of equal count.")
    room = n // num_bins
    loads, bins = [0.0] * num_bins, [[] for _ in range(num_bins)]
    for unit in sorted(range(n), key=lambda i: (-float(weights[i]), i)):
        target = min((b for b in range(num_bins) if len(bins[b]) < room), key=lambda b: (loads[b], b))
        bins[target].append(unit)
        loads[target] += float(weights[unit])
    return [sorted(units) for units in bins]


def row_tokens(batch: dict) -> torch.Tensor:
    """Real tokens of each row of a TRL micro-batch, `(B,)`: its prompt's and its completion's (what a packed forward
    computes: the attention mask's ones)."""
    return batch["prompt_mask"].sum(1) + batch["completion_mask"].sum(1)


def balance_micro_batches(batches: list[dict], unit: int = 1) -> list[dict]:
    """One optimizer step's micro-batches, regrouped so that their real tokens (`row_tokens`) are even.

    Each micro-batch keeps its number of rows; rows `u*unit .. u*unit + unit - 1` of the step (micro-batches in order,
    then rows) move together and in order (`unit=num_generations`: whole groups, as PACS's loss needs). All
    micro-batches of a step have the same keys and widths (TRL's `split_tensor_dict` of one padded batch): tensors
    with a row dimension and lists are regrouped, scalars (`num_items_in_batch`) and `None` kept as they are.

    Args:
        batches (`list[dict]`): the step's micro-batches, each with `prompt_mask` and `completion_mask` `(B, T)`.
        unit (`int`, *optional*, defaults to `1`): rows that stay together; must divide the rows of a micro-batch.

    Returns:
        `list[dict]`: new micro-batches (the inputs are not modified); the same ones when there is one.
    """
    if len(batches) < 2:
        return list(batches)
    rows = batches[0]["prompt_mask"].size(0)
    if rows % unit != 0 or any(batch["prompt_mask"].size(0) != rows for batch in batches):
        raise ValueError(
            f"Cannot balance micro-batches of {[batch['prompt_mask'].size(0) for batch in batches]} rows by units of "
            f"{unit} rows: every micro-batch of a step must hold the same number of rows, a multiple of {unit}."
        )
    tokens = torch.cat([row_tokens(batch) for batch in batches]).view(-1, unit).sum(1)  # (units,)
    bins = balanced_partition(tokens.tolist(), len(batches))
    offsets = torch.arange(unit)
    regrouped = []
    for units in bins:
        index = (torch.tensor(units)[:, None] * unit + offsets).reshape(-1)  # (rows,) into the step's rows
        regrouped.append({key: _take(batches, key, index) for key in batches[0]})
    return regrouped


def _take(batches: list[dict], key: str, index: torch.Tensor):
    first = batches[0][key]
    if isinstance(first, torch.Tensor) and first.dim() > 0:
        return torch.cat([batch[key] for batch in batches])[index.to(first.device)]
    if isinstance(first, list):
        step = [row for batch in batches for row in batch[key]]
        return [step[i] for i in index.tolist()]
    return first  # a scalar (num_items_in_batch: the generation batch's) or None
