"""Moving a batch's rows between processes: one primitive, its padding rules written once.

A generation batch lives in TRL's layout: process `p` holds rows `p*n .. p*n+n-1` of the global batch, each a tensor
whose first dimension is the row and whose second (if any) is padded: prompts on the left, everything else on the
right. Dynamic sampling's assembly (`pacs.grpo.dynamic_sampling.assemble_rows`) and PACS's split-path exchange
(`pacs.split.exchange_rows`) both move rows to new global positions; `move_rows` does it for both: each process says
where each of its rows goes, and receives the rows of its own slice, padded to the widest over processes.

Transport: with `torch.distributed` initialised and more than one process, every process scatters to each other one
only the rows that one takes (`W` scatters of at most the largest share), so a process receives about its own `n`
rows, never the whole batch; otherwise (one process, or a `gather` stand-in in tests) rows travel through `gather`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


__all__ = ["move_rows", "pad_value", "pads_left"]


def pads_left(key: str) -> bool:
    """Whether a row tensor named `key` is padded on the left: TRL pads prompts left (`prompt_ids`, `prompt_mask`)."""
    return key.startswith("prompt")


def pad_value(key: str, pad_token_id: int) -> Any:
    """The padding value of a row tensor named `key`: the pad token for token ids, 1 for `tool_mask` (TRL pads it with
    1), 0 for everything else (masks, log-probs).

    >>> pad_value("completion_ids", 7), pad_value("tool_mask", 7), pad_value("old_per_token_logps", 7)
    (7, 1, 0)
    """
    if key.endswith("_ids"):
        return pad_token_id
    return 1 if key == "tool_mask" else 0


def _pad_width(tensor: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
    missing = width - tensor.size(1)
    if missing == 0:
        return tensor
    filler = tensor.new_full((tensor.size(0), missing, *tensor.shape[2:]), value)
    return torch.cat([filler, tensor] if left else [tensor, filler], dim=1)


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def move_rows(
    parts: Sequence[dict[str, torch.Tensor]],
    targets: torch.Tensor,
    rows_per_process: int,
    process_index: int,
    gather: Callable[[torch.Tensor], torch.Tensor],
    pad: Callable[[str], Any],
) -> dict[str, torch.Tensor]:
    """This process's rows `p*n .. p*n+n-1` of a batch whose rows every process scatters.

    Args:
        parts (`Sequence[dict]`): this process's rows, in one or more parts (e.g. one per generation round) with the
            same keys; every value a tensor whose first dimension is the part's rows. Their concatenation is the rows
            this process gives.
        targets (`torch.Tensor` of shape `(k,)`): the global position of each given row (`k` rows in all); over all
            processes, every position `0 .. W*n-1` exactly once.
        rows_per_process (`int`): `n`.
        process_index (`int`): this process, `p`.
        gather (`Callable`): all-gather along dimension 0 (tensors of equal shape over processes); the identity on one.
            Used for the row counts and widths, and for the rows themselves where `torch.distributed` is not set up.
        pad (`Callable[[str], Any]`): a key's padding value; TRL's batches: `lambda key: pad_value(key, pad_token_id)`.

    Returns:
        `dict`: per key, `(n, width, ...)`, rows in global order, padded to the widest over all parts and processes
        ([`pads_left`], [`pad_value`]); bool tensors stay bool.
    """
    n, p = rows_per_process, process_index
    keys = list(parts[0])
    device = targets.device
    # 1. the widest over parts and processes, per key
    widths = torch.tensor([max((part[k].size(1) if part[k].dim() > 1 else 0) for part in parts) for k in keys])
    widths = gather(widths.to(device)).view(-1, len(keys)).amax(dim=0).tolist()
    rows = {}
    for key, width in zip(keys, widths, strict=True):
        values = [part[key] for part in parts]
        if values[0].dim() > 1:
            values = [_pad_width(v, width, pad(key), pads_left(key)) for v in values]
        rows[key] = torch.cat(values)  # (k, width, ...)
    destination = targets.to(device) // n  # (k,) the process each row goes to
    if _distributed() and torch.distributed.get_world_size() > 1:
        return _scatter(rows, targets.to(device), destination, n, p, torch.distributed.get_world_size(), gather)
    # 2. through `gather`: every row to every process, padded to the same count; each takes its slice
    most = int(gather(torch.tensor([targets.numel()], device=device)).max())
    position = torch.cat([targets.to(device), targets.new_full((most - targets.numel(),), -1).to(device)])
    everywhere = gather(position)  # (W * most,)
    mine = ((everywhere >= p * n) & (everywhere < (p + 1) * n)).nonzero().flatten()
    mine = mine[everywhere[mine].argsort()]
    if mine.numel() != n:
        raise RuntimeError(f"moving rows gave process {p} {mine.numel()} rows, not {n}.")
    output = {}
    for key, value in rows.items():
        filler = value.new_zeros((most - value.size(0), *value.shape[1:]))
        padded = torch.cat([value, filler])
        is_bool = padded.dtype == torch.bool
        gathered = gather(padded.to(torch.uint8) if is_bool else padded)
        output[key] = (gathered.bool() if is_bool else gathered)[mine]
    return output


def _scatter(rows, targets, destination, n, p, world, gather) -> dict[str, torch.Tensor]:
    # the rows that stay here are not sent; each process scatters to every other one the rows it takes, padded to the
    # largest share between two processes (one scatter per source): a process receives its own rows and little more
    dist = torch.distributed
    counts = torch.stack([(destination == q).sum() for q in range(world)])  # (W,) rows this process sends to each
    counts = gather(counts).view(world, world).cpu()  # [source, destination]
    most = int((counts * (1 - torch.eye(world, dtype=counts.dtype))).max())  # between two processes
    sent = [(destination == q).nonzero().flatten() for q in range(world)]  # this process's rows for each

    def exchange(value: torch.Tensor) -> torch.Tensor:
        received = [value[sent[p]]]  # the rows that stay
        for source in range(world):
            if most == 0:
                break
            buffer = value.new_zeros((most, *value.shape[1:]))
            chunks = None
            if source == p:
                chunks = [
                    buffer if q == p else torch.cat([value[sent[q]], buffer[: most - sent[q].numel()]])
                    for q in range(world)
                ]
            dist.scatter(buffer, chunks, src=source)
            if source != p:
                received.append(buffer[: int(counts[source, p])])
        return torch.cat(received)

    position = exchange(targets)  # the global position of each row received
    index = (position - p * n).argsort()
    if not torch.equal(position[index], torch.arange(p * n, (p + 1) * n, device=index.device)):
        raise RuntimeError(f"moving rows gave process {p} the rows {sorted(position.tolist())}, not its {n}.")
    output = {}
    for key, value in rows.items():
        is_bool = value.dtype == torch.bool
        received = exchange(value.to(torch.uint8) if is_bool else value)[index]
        output[key] = received.bool() if is_bool else received
    return output
