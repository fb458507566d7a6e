"""Pure pieces of `GRPOTrainer._compute_loss` for a loss that replaces GRPO's: TRL 1.16 computes its KL term, token
metrics and forward inputs inline in `_compute_loss` and has no helper for them. They are re-done here to GRPOTrainer's
definitions, and `HardenedGRPOTrainer._add_grpo_terms` puts them together (tests/test_trainer_grpo_terms.py compares
the result with `GRPOTrainer._compute_loss` on the same batch): remove this module if TRL factors them out.
"""

from __future__ import annotations

import torch

from .._compat import MULTIMODAL_KEYS


__all__ = [
    "forward_inputs",
    "loss_mask",
    "per_token_kl",
    "token_mean",
]


def forward_inputs(inputs: dict) -> dict:
    """The optional multimodal forward inputs of a batch, as `GRPOTrainer._compute_loss` passes them."""
    return {key: inputs.get(key) for key in MULTIMODAL_KEYS}


def loss_mask(inputs: dict) -> torch.Tensor:
    """The completion tokens that count, `(B, T)`: tool output (multi-turn) is not the policy's."""
    mask = inputs["completion_mask"]
    return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask


def per_token_kl(
    per_token_logps: torch.Tensor,
    ref_per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor | None,
    bias_correction: bool,
) -> torch.Tensor:
    """TRL's k3 estimate of KL(pi_theta || pi_ref) per token, `(B, T)`, with its optional importance correction."""
    delta = ref_per_token_logps - per_token_logps
    kl = torch.exp(delta) - delta - 1  # (B, T)
    if bias_correction:  # GRPO's coef_1 = pi_theta / pi_old (pi_old = pi_theta, detached, on-policy)
        reference = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
        kl = kl * torch.exp(per_token_logps - reference)
    return kl


def token_mean(accelerator, values: torch.Tensor, mask: torch.Tensor) -> float:
    """GRPOTrainer's `global_masked_mean` of a per-token metric: token-weighted over all processes."""
    totals = accelerator.reduce(torch.stack([(values.detach() * mask).sum(), mask.sum().float()]), "sum")
    return (totals[0] / totals[1].clamp(min=1.0)).item()
