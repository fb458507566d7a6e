"""Padding-free forwards (`HardenedGRPOConfig.padding_free`): a padded batch's per-token log-probs, entropies and MoE
load-balancing loss, computed on its real tokens only, through TRL's fused LM head.

TRL 1.16's `GRPOTrainer._get_per_token_logps_and_entropies` forwards each chunk of `batch_size` rows as it is padded
(prompts on the left, completions on the right, as wide as the generation batch's longest prompt plus longest
completion). [`packed_logps_and_entropies`] computes the same `(B, logits_to_keep)` outputs from packed rows
(`pacs.grpo.packing`): each chunk's sequences concatenated, positions restarting at 0 per sequence, no attention mask,
no cache (what makes transformers' sdpa / eager attend within each sequence), `cu_seq_lens` / `max_length` computed on
the host for flash-attention; the fused head scores pre-shifted labels (`shift_labels`) that never cross a sequence
boundary, and the values go back to TRL's layout, 0 where TRL's are 0 (tokens it does not score). Every loss reading
them is unchanged; only the RoPE offset of left padding, which TRL's padded forward adds, is gone (rounding noise).

[`check_packing`]: the self-check a trainer runs on first use (as unsloth does): a few rows packed against the same rows
forwarded one by one; beyond the tolerance, an error naming the attention implementation and the way out.

The MoE load-balancing loss is computed by TRL's fused forward over every position it is given: over a chunk's real
tokens when the chunk is one packed row (as TRL's padded forward computes it over the real tokens, through its mask),
but over the filler too when a token budget splits it into rows of unequal length; the trainer refuses that pairing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from .packing import IGNORE_INDEX, Packed, pack, shift_labels, unpack


__all__ = ["PACKED_ATTENTION", "VARLEN_ATTENTION", "check_packing", "packed_logps_and_entropies", "row_budget"]

VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")
"""Attention implementations that isolate packed sequences given `cu_seq_lens` / `max_length` (transformers'
`_flash_attention_forward`, varlen)."""
PACKED_ATTENTION = ("sdpa", "eager", *VARLEN_ATTENTION)
"""Attention implementations that isolate packed sequences in transformers 5: sdpa and eager from `position_ids`
(with no attention mask and no cache), flash-attention from `cu_seq_lens`."""


def _packed_forward(model, packed: Packed, labels: torch.Tensor, varlen: bool, autocast, **kwargs):
    """TRL's fused-head forward of `packed`, scoring `labels` (`(B, T)`, padded layout, -100: not scored)."""
    inputs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids, "use_cache": False}
    if varlen:  # computed once on the host, not derived from the positions in every layer
        inputs |= {"cu_seq_lens_q": packed.cu_seq_lens, "cu_seq_lens_k": packed.cu_seq_lens}
        inputs |= {"max_length_q": packed.max_length, "max_length_k": packed.max_length}
    with autocast():
        return model(**inputs, **kwargs, shift_labels=shift_labels(packed, labels), fused_lm_head=True)


def packed_logps_and_entropies(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    batch_size: int | None = None,
    compute_entropy: bool = False,
    compute_aux_loss: bool = False,
    *,
    max_tokens_per_row: int | None = None,
    varlen: bool = False,
    autocast: Callable = contextlib.nullcontext,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, int]:
    """`GRPOTrainer._get_per_token_logps_and_entropies`' outputs from packed forwards: `(logps (B, logits_to_keep),
    entropies (B, logits_to_keep) or None, aux_loss or None, positions)`, `positions` the number the backbone computed.

    `model` carries TRL's fused LM head (`trl.trainer.utils.add_fused_lm_head`, which scales by the temperature); each
    chunk of `batch_size` rows (all when `None`) is packed into rows of at most `max_tokens_per_row` real tokens;
    `varlen` passes `cu_seq_lens` / `max_length` (flash-attention); `autocast` is the trainer's autocast context.
    `max_tokens_per_row=None` chooses by attention implementation ([`row_budget`]).
    """
    batch_size = batch_size or input_ids.size(0)
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)  # only the completion tokens are scored
    labels[:, :-logits_to_keep] = IGNORE_INDEX
    logps, entropies, aux_losses, positions = [], [], [], 0
    for start in range(0, input_ids.size(0), batch_size):
        rows = slice(start, start + batch_size)
        budget = row_budget(attention_mask[rows], max_tokens_per_row, varlen, compute_aux_loss)
        packed = pack(input_ids[rows], attention_mask[rows], budget)
        extra = {"output_router_logits": True} if compute_aux_loss else {}
        outputs = _packed_forward(model, packed, labels[rows], varlen, autocast, **extra)
        positions += packed.num_positions
        logps.append(unpack(packed, outputs.log_probs, shifted=True)[:, -logits_to_keep:])  # (b, logits_to_keep)
        if compute_entropy:
            entropies.append(unpack(packed, outputs.entropy, shifted=True)[:, -logits_to_keep:])
        if compute_aux_loss:
            aux_losses.append(outputs.aux_loss)
    return (
        torch.cat(logps, dim=0),
        torch.cat(entropies, dim=0) if compute_entropy else None,
        torch.stack(aux_losses).mean() if compute_aux_loss else None,
        positions,
    )


def row_budget(
    attention_mask: torch.Tensor, max_tokens_per_row: int | None, varlen: bool, aux_loss: bool
) -> int | None:
    """The token budget per packed row of a chunk whose padding is `attention_mask` `(b, T)`: `max_tokens_per_row` when
    set; else none (one packed row) on flash-attention (`varlen`, which attends within each sequence at no extra cost)
    and with the MoE load-balancing loss (which would count the filler of rows of unequal length); else, on sdpa /
    eager, the chunk's longest sequence. Those two attend over each packed row whole, through a dense mask of its
    length squared: rows no longer than the longest sequence keep the mask and the attention within the padded
    forward's while the pad positions go (one row of 8 equal sequences would cost 8x the padded attention); the rows
    are filled longest first (`pacs.grpo.packing.pack`), so little filler is left.

    >>> row_budget(torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]), None, varlen=False, aux_loss=False)
    3
    >>> row_budget(torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]), None, varlen=True, aux_loss=False) is None
    True
    """
    if max_tokens_per_row is not None:
        return max_tokens_per_row
    if varlen or aux_loss:
        return None
    return max(int(attention_mask.sum(dim=1).max()), 1)


@contextlib.contextmanager
def _eval_mode(model):
    """Dropout off (the comparison must be deterministic), the module's mode restored after."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


def check_packing(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    attn_implementation: str,
    tolerance: float,
    num_rows: int = 3,
    max_tokens_per_row: int | None = None,
    varlen: bool = False,
    autocast: Callable = contextlib.nullcontext,
) -> float:
    """Forward the first `num_rows` rows of a padded batch packed, and each of them alone; return the mean |Δ log p|
    over their tokens, or raise a one-line `RuntimeError` beyond `tolerance`.

    Always `1 + num_rows` forwards (rows repeat when the batch has fewer), so that every process of a ZeRO-3 run runs
    the same number. Runs without grad and with dropout off.
    """
    rows = [min(i, input_ids.size(0) - 1) for i in range(num_rows)]
    ids, mask = input_ids[rows], attention_mask[rows]
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)  # every real token scored, prompts too

    def logps(packed: Packed, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = _packed_forward(model, packed, labels, varlen, autocast)
        scored = unpack(packed, shift_labels(packed, labels) != IGNORE_INDEX, fill=False, shifted=True)
        return unpack(packed, out.log_probs.float(), shifted=True), scored

    with torch.no_grad(), _eval_mode(model):
        together, scored = logps(pack(ids, mask, max_tokens_per_row), labels)
        alone = torch.cat(
            [logps(pack(ids[i : i + 1], mask[i : i + 1]), labels[i : i + 1])[0] for i in range(num_rows)]
        )
    deviation = (together - alone).abs()[scored].mean().item() if scored.any() else 0.0
    if not deviation <= tolerance:  # NaN fails too
        raise RuntimeError(
            f"padding_free: packed sequences do not match the same sequences forwarded one by one under "
            f"attn_implementation={attn_implementation!r} (mean |delta log p| {deviation:.2e} > {tolerance:.0e}), so "
            f"this model does not isolate packed sequences; set padding_free: false."
        )
    return deviation
