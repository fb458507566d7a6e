"""Pure pieces of `GRPOTrainer._compute_loss` the layer needs outside it: TRL 1.16 builds a batch's multimodal forward
inputs and the mask of the completion tokens that count inline in `_compute_loss`. They are re-done here to
GRPOTrainer's definitions for `HardenedGRPOTrainer._per_token_logps` and the vLLM sampling monitor; remove this module
if TRL factors them out.
"""

from __future__ import annotations

import torch

from ._compat import MULTIMODAL_KEYS


__all__ = ["forward_inputs", "loss_mask"]


def forward_inputs(inputs: dict) -> dict:
    """The optional multimodal forward inputs of a batch, as `GRPOTrainer._compute_loss` passes them."""
    return {key: inputs.get(key) for key in MULTIMODAL_KEYS}


def loss_mask(inputs: dict) -> torch.Tensor:
    """The completion tokens that count, `(B, T)`: tool output (multi-turn) is not the policy's."""
    mask = inputs["completion_mask"]
    return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask
