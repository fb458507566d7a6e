"""The plan's padding section: the positions each micro-batch's forward computes, padded as TRL pads it or packed
(`padding_free`), and, packed on sdpa / eager, the attention mask of a packed row.

TRL 1.16 pads the whole generation batch once, so every micro-batch is as wide as the longest prompt plus the longest
completion of the batch: at the worst case (one completion reaching `max_completion_length`, which a generation batch
of hundreds of rows nearly always holds) `per_device_train_batch_size x (prompt + max_completion_length)` positions.
Packed, a forward computes the real tokens only; what they are depends on the run, so the plan shows them at the
issue's long-tail model (mean completion `LONG_TAIL_MEAN` of the maximum, prompts at theirs): the run logs its own
share as `pacs/real_token_frac`. On sdpa and eager, transformers isolates packed sequences with a dense mask of the
packed row's length squared (and sdpa computes attention over all of it); flash-attention builds none.
"""

from __future__ import annotations

from .report import GiB, Plan, gib
from .resolve import Run


LONG_TAIL_MEAN = 0.2
"""Mean completion length as a share of `max_completion_length` in the plan's long-tail model (issue 54: 10-30%)."""
MASK_WARNING_GIB = 1.0
"""A packed row's mask above this on sdpa / eager is a warning naming a token budget per row."""
DENSE_MASK_ATTENTION = ("sdpa", "eager", None)  # None: transformers' default, sdpa


def packed_row_tokens(run: Run) -> int:
    """The longest packed row: the token budget (a sequence longer than the budget gets a row of its own); without one
    (`pacs.grpo.padding_free.row_budget`), the longest sequence on sdpa / eager and a whole micro-batch at the worst
    case on flash-attention."""
    worst = run.per_device_train_batch_size * run.seq_tokens
    budget = run.padding_free_max_tokens_per_row
    if budget is None:
        return run.seq_tokens if getattr(run, "attn_implementation", None) in DENSE_MASK_ATTENTION else worst
    return max(min(budget, worst), run.seq_tokens)


def padding_section(plan: Plan, run: Run) -> None:
    B, S, C, P = run.per_device_train_batch_size, run.seq_tokens, run.max_completion_length, run.prompt_tokens
    padded = B * S
    real = B * (P + round(LONG_TAIL_MEAN * C))
    rows = plan.section("Padding (per micro-batch forward)")
    rows += [
        ("padded (TRL)", f"{B} x {S} = {padded:,} positions at the worst case (the generation batch padded once)"),
        (
            "packed",
            f"{B} x ({P} + {round(LONG_TAIL_MEAN * C)}) = {real:,} real tokens at a mean completion of "
            f"{LONG_TAIL_MEAN:.0%} of max_completion_length ({real / padded:.0%} of padded); the run logs its own "
            "share as pacs/real_token_frac",
        ),
    ]
    if not run.padding_free:
        rows.append(("padding_free", "off: every forward computes the padded positions"))
        return
    attention = run.attn_implementation or "sdpa (transformers' default)"
    L = packed_row_tokens(run)
    budget = run.padding_free_max_tokens_per_row
    if budget:
        row = f"{budget:,} tokens at most (padding_free_max_tokens_per_row)"
    elif run.attn_implementation in DENSE_MASK_ATTENTION:
        row = f"{L:,} tokens at most (the micro-batch's longest sequence: no more attention than padded)"
    else:
        row = f"{L:,} tokens at the worst case (one row per micro-batch)"
    rows.append(("padding_free", f"on, attention {attention}; packed row {row}"))
    if run.attn_implementation not in DENSE_MASK_ATTENTION:
        rows.append(("packed mask", "none (flash-attention reads cu_seq_lens)"))
        return
    mask = L * L  # bytes: a boolean (L, L) mask; eager's additive mask is L^2 x the dtype's bytes
    rows.append(
        (
            "packed mask",
            f"{L:,}^2 = {gib(mask)} per packed row (boolean; eager's additive mask x2 in bf16), built in every "
            "forward, and sdpa computes attention over all of it",
        )
    )
    if mask > MASK_WARNING_GIB * GiB:
        plan.warning(
            "padding_free_max_tokens_per_row",
            f"packed rows of up to {L:,} tokens need a {gib(mask)} attention mask on {attention} and attention over "
            f"{L:,}^2 positions; leave padding_free_max_tokens_per_row unset (rows no longer than the longest "
            f"sequence, {S:,} tokens: a {gib(S * S)} mask) or use attn_implementation: flash_attention_2 (no mask).",
        )
