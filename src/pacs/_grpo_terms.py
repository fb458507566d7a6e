"""The parts of `GRPOTrainer._compute_loss` that PACS keeps but cannot inherit: TRL 1.16 computes its KL term, entropy
bonus, auxiliary (router) loss and token metrics inline in `_compute_loss`, which PACS replaces, and has no helper for
them. They are re-done here, in one place, to GRPOTrainer's definitions (tests/test_trainer.py compares them with
`GRPOTrainer._compute_loss` on the same batch): remove this module if TRL factors them out.
"""

from __future__ import annotations

import torch
from trl.models.utils import disable_gradient_checkpointing


__all__ = [
    "MULTIMODAL_KEYS",
    "add_grpo_terms",
    "entropy_bonus",
    "forward_inputs",
    "logps_without_grad",
    "loss_mask",
    "per_token_kl",
    "token_mean",
]

# Optional forward inputs (vision-language models) that GRPOTrainer passes through to the model.
MULTIMODAL_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


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


def logps_without_grad(trainer, model, batch: dict, batch_size: int | None = None) -> torch.Tensor:
    """Per-token log-probs `(B, T)` of `batch`'s completion tokens under `model`, as GRPOTrainer computes its old and
    reference log-probs: without grad and without activation checkpointing (which a forward without grad does not
    need, and which warns with use_reentrant=True)."""
    with torch.no_grad(), disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        return trainer._per_token_logps(model, batch, batch_size=batch_size)[0]


def token_mean(accelerator, values: torch.Tensor, mask: torch.Tensor) -> float:
    """GRPOTrainer's `global_masked_mean` of a per-token metric: token-weighted over all processes."""
    totals = accelerator.reduce(torch.stack([(values.detach() * mask).sum(), mask.sum().float()]), "sum")
    return (totals[0] / totals[1].clamp(min=1.0)).item()


def entropy_bonus(trainer, mode: str, entropies: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL's entropy regularisation (static `entropy_coef` or adaptive), scaled and logged as GRPOTrainer does.

    Reads and updates GRPOTrainer's controller state (`entropy_coef`, `_entropy_window_stats`, `_last_world_entropy`).
    """
    accumulation = trainer.current_gradient_accumulation_steps if mode == "train" else 1.0
    entropy_loss = (entropies * mask).sum() / mask.sum().clamp(min=1.0) / accumulation
    # the coefficient and gate of the previous optimizer step, so every micro-batch of this one uses the same
    adaptive, args = trainer.use_adaptive_entropy, trainer.args
    coef = trainer.entropy_coef if not adaptive or trainer._last_world_entropy <= args.entropy_target else 0.0
    if adaptive and mode == "train":
        stats = torch.stack([(entropies * mask).sum(), mask.sum()]).detach()
        window = trainer._entropy_window_stats
        trainer._entropy_window_stats = stats if window is None else window + stats
        if trainer.accelerator.sync_gradients:  # optimizer-step boundary: update the coefficient for the next one
            totals = trainer.accelerator.reduce(trainer._entropy_window_stats, reduction="sum")
            world_entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
            if world_entropy <= args.entropy_target:
                trainer.entropy_coef = min(trainer.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max)
            else:
                trainer.entropy_coef = max(trainer.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min)
            trainer._last_world_entropy = world_entropy
            trainer._entropy_window_stats = None
    if mode == "train" and trainer.accelerator.sync_gradients:
        trainer._metrics[mode]["entropy_coef"].append(trainer.entropy_coef)
    return coef * entropy_loss


def add_grpo_terms(
    trainer,
    mode: str,
    loss: torch.Tensor,
    policy_loss: torch.Tensor,
    per_token_logps: torch.Tensor,
    entropies: torch.Tensor,
    aux_loss: torch.Tensor | None,
    inputs: dict,
    mask: torch.Tensor,
) -> torch.Tensor:
    """`loss` (this micro-batch's policy loss) plus GRPOTrainer's other terms, scaled for gradient accumulation.

    In GRPOTrainer's order: + `beta` x the KL to the reference model (per-sequence token mean, then batch mean),
    / `gradient_accumulation_steps` (train), - the entropy bonus, + `router_aux_loss_coef` x the auxiliary loss.
    Logs `policy_loss` (the value of `policy_loss`, with the entropy bonus), `aux_loss`, `entropy` and `kl` as
    GRPOTrainer does.
    """
    metrics, gather = trainer._metrics[mode], trainer.accelerator.gather
    if trainer.beta != 0.0:
        old = inputs.get("old_per_token_logps")
        kl = per_token_kl(per_token_logps, inputs["ref_per_token_logps"], old, trainer.args.use_bias_correction_kl)
        loss = loss + trainer.beta * ((kl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
        metrics["kl"].append(token_mean(trainer.accelerator, kl, mask))
    normalizer = trainer.current_gradient_accumulation_steps if mode == "train" else 1.0  # no accumulation in eval
    loss = loss / normalizer
    if trainer._entropy_bonus_enabled:
        loss = loss - entropy_bonus(trainer, mode, entropies, mask)
        metrics["policy_loss"].append(gather(policy_loss.detach()).mean().item())
    if trainer.aux_loss_enabled:
        loss = loss + trainer.router_aux_loss_coef * aux_loss / normalizer
        metrics["aux_loss"].append(gather(aux_loss.detach()).mean().item())
    metrics["entropy"].append(token_mean(trainer.accelerator, entropies, mask))
    return loss
