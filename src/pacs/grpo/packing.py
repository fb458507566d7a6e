"""Sequence packing: the real tokens of a padded batch, concatenated into a few rows, and the way back.

The one packing primitive of `pacs` (pure torch, no TRL): padding-free forwards (`HardenedGRPOConfig.padding_free`)
and the benchmark use it. A padded batch `(B, T)` (pads on either side, marked 0 in `attention_mask`) becomes `R`
packed rows `(R, L)` holding only real tokens, each sequence with `position_ids` restarting at 0, so that a model
called with `position_ids`, no attention mask and no cache attends within each sequence only (transformers' sdpa /
eager find the sequences from the positions; flash-attention reads `cu_seq_lens` / `max_length`). What the model
returns per packed position goes back to the padded layout with [`unpack`].

Next-token values never cross a sequence boundary: [`shift_labels`] gives each packed position the label of the next
token *of its own sequence* (`-100` at each sequence's last token and on filler), and `unpack(..., shifted=True)`
puts the value computed at position `p` (a prediction of token `p + 1`) on the token it predicts. TRL's fused LM head
takes such pre-shifted labels as `shift_labels`; [`next_token_logps`] does the same from full logits.

The same idea in other frameworks: verl `use_remove_padding` (flash-attn's `unpad_input`), OpenRLHF
`--packing_samples` (`unpad_and_slice_tensor`), TRL `SFTConfig.padding_free` (`DataCollatorWithFlattening`).

>>> ids = torch.tensor([[0, 5, 6], [7, 8, 9]]); mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
>>> p = pack(ids, mask)
>>> p.input_ids.tolist(), p.position_ids.tolist(), p.cu_seq_lens.tolist(), p.max_length
([[5, 6, 7, 8, 9]], [[0, 1, 0, 1, 2]], [0, 2, 5], 3)
>>> unpack(p, p.input_ids * 10, fill=-1).tolist()
[[-1, 50, 60], [70, 80, 90]]
>>> shift_labels(p, ids).tolist()  # position p holds the label of p + 1 within its own sequence
[[6, -100, 8, 9, -100]]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


__all__ = ["Packed", "next_token_logps", "pack", "shift_labels", "unpack"]

IGNORE_INDEX = -100  # the label transformers' and TRL's losses skip


@dataclass(frozen=True)
class Packed:
    """A padded batch's real tokens packed into rows (see [`pack`]).

    Attributes:
        input_ids (`torch.Tensor` of shape `(R, L)`): the packed rows; positions after a row's last sequence (filler,
            so that all rows have length `L`) hold token 0.
        position_ids (`torch.Tensor` of shape `(R, L)`): 0, 1, ... within each sequence; filler counts from 0 as a
            sequence of its own, so it never joins a real one.
        src (`torch.Tensor` of shape `(N,)`): flat index into the padded `(B * T)` layout of each real token.
        dst (`torch.Tensor` of shape `(N,)`): flat index into the packed `(R * L)` layout of the same token.
        first (`torch.Tensor` of shape `(N,)`, bool): the token is its sequence's first (nothing in it predicts it).
        cu_seq_lens (`torch.Tensor` of shape `(S + 1,)`, int32): cumulative segment lengths over the flattened
            `(R * L)` layout, flash-attention style; segments are the non-empty sequences and each row's filler.
        max_length (`int`): the longest segment, computed on the host.
        batch_shape (`tuple[int, int]`): `(B, T)` of the padded batch.
        num_real_tokens (`int`): `N`, the real tokens.
        num_positions (`int`): `R * L`, the positions a forward of the packed rows computes.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    first: torch.Tensor
    cu_seq_lens: torch.Tensor
    max_length: int
    batch_shape: tuple[int, int]
    num_real_tokens: int
    num_positions: int


def _first_fit(lengths: list[int], budget: int | None) -> tuple[list[int], list[int]]:
    """The row of each sequence and each row's used length: first fit decreasing (the longest sequence first, ties in
    sequence order), which leaves less filler than first fit in order; a sequence longer than the budget alone in a
    row of its own. Empty sequences take no room (row 0)."""
    rows, used = [0] * len(lengths), []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        if n == 0:
            continue
        for r, u in enumerate(used):
            if budget is None or u + n <= budget:
                rows[i] = r
                used[r] += n
                break
        else:
            rows[i] = len(used)
            used.append(n)
    return rows, used or [0]


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, max_tokens_per_row: int | None = None) -> Packed:
    """Pack the real tokens (`attention_mask == 1`, in order) of each row of `input_ids` `(B, T)` into rows of at most
    `max_tokens_per_row` tokens (first fit decreasing; one row when `None`; a longer sequence gets a row of its own;
    the sequences of a row follow each other in batch order).

    The row assignment is computed on the host (one device-to-host copy of the `B` lengths), as flash-attention's
    `cu_seq_lens` / `max_length` must be.
    """
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"pack needs input_ids and attention_mask of the same shape (B, T), got {tuple(input_ids.shape)} and "
            f"{tuple(attention_mask.shape)}."
        )
    if max_tokens_per_row is not None and max_tokens_per_row < 1:
        raise ValueError(f"max_tokens_per_row must be >= 1 or None (one row), got {max_tokens_per_row}.")
    B, T = input_ids.shape
    device = input_ids.device
    real = attention_mask.bool()
    lengths = real.sum(dim=1).tolist()  # (B,) on the host
    rows, used = _first_fit(lengths, max_tokens_per_row)
    R, L = len(used), max(max(used), 1)

    # each sequence's start within its row (sequences of a row follow each other in batch order)
    offset, starts = [0] * R, []
    for n, r in zip(lengths, rows, strict=True):
        starts.append(offset[r])
        offset[r] += n
    src = real.reshape(-1).nonzero().squeeze(1)  # (N,) row-major: sequence by sequence, tokens in order
    seq = src // T  # (N,) which sequence each real token is
    rank = torch.cumsum(real.long(), dim=1).reshape(-1)[src] - 1  # (N,) position within its sequence
    row_of = torch.tensor(rows, dtype=torch.long, device=device)
    start_of = torch.tensor(starts, dtype=torch.long, device=device)
    dst = row_of[seq] * L + start_of[seq] + rank  # (N,)

    packed_ids = input_ids.new_zeros(R * L)
    packed_ids[dst] = input_ids.reshape(-1)[src]
    # filler counts from 0 as its own segment; real tokens overwrite with their rank
    col = torch.arange(L, device=device)
    position_ids = (col - torch.tensor(used, device=device).unsqueeze(1)).clamp(min=0).reshape(-1)  # (R * L,)
    position_ids[dst] = rank

    members = [[] for _ in range(R)]  # each row's sequence lengths, in order
    for n, r in zip(lengths, rows, strict=True):
        if n > 0:
            members[r].append(n)
    segments = []  # lengths of the flattened layout's segments, in order: each row's sequences, then its filler
    for r in range(R):
        segments += members[r] + ([L - used[r]] if L > used[r] else [])
    cu = [0]
    for n in segments:
        cu.append(cu[-1] + n)
    return Packed(
        input_ids=packed_ids.view(R, L),
        position_ids=position_ids.view(R, L),
        src=src,
        dst=dst,
        first=rank == 0,
        cu_seq_lens=torch.tensor(cu, dtype=torch.int32, device=device),
        max_length=max(segments, default=0),
        batch_shape=(B, T),
        num_real_tokens=int(src.numel()),
        num_positions=R * L,
    )


def unpack(packed: Packed, values: torch.Tensor, fill: float = 0.0, *, shifted: bool = False) -> torch.Tensor:
    """Scatter per-position `values` `(R, L, ...)` of the packed rows back to the padded layout `(B, T, ...)`, `fill`
    at pads.

    With `shifted=True`, `values` are next-token predictions (computed at position `p` for the token at `p + 1`, as
    with [`shift_labels`]): each goes to the token it predicts within its sequence, and a sequence's first token,
    which nothing in its sequence predicts, gets `fill`. Differentiable in `values`.
    """
    B, T = packed.batch_shape
    flat = values.reshape(packed.num_positions, *values.shape[2:])
    out = flat.new_full((B * T, *values.shape[2:]), fill)
    if shifted:
        keep = ~packed.first
        out = out.index_put((packed.src[keep],), flat[packed.dst[keep] - 1])
    else:
        out = out.index_put((packed.src,), flat[packed.dst])
    return out.view(B, T, *values.shape[2:])


def shift_labels(packed: Packed, labels: torch.Tensor) -> torch.Tensor:
    """Pre-shifted labels `(R, L)` for the packed rows: position `p` gets the label (from `labels`, `(B, T)` in the
    padded layout, `-100` for tokens not to score) of the next token of its own sequence; a sequence's last token and
    filler get `-100`, so no label ever crosses a sequence boundary."""
    keep = ~packed.first
    out = labels.new_full((packed.num_positions,), IGNORE_INDEX)
    out[packed.dst[keep] - 1] = labels.reshape(-1)[packed.src[keep]]
    return out.view_as(packed.input_ids)


def next_token_logps(packed: Packed, logits: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """Log-probability `(B, T)`, in the padded layout, of each real token given the tokens before it in its own
    sequence, from the logits `(R, L, V)` of the packed rows; `fill` at pads and at each sequence's first token."""
    targets = shift_labels(packed, unpack(packed, packed.input_ids, fill=IGNORE_INDEX))
    logps = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return unpack(packed, logps, fill=fill, shifted=True)
