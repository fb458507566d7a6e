"""GRPO's other loss terms, for a trainer that replaces GRPO's loss: TRL 1.16 computes its KL term, its entropy bonus
(with the adaptive controller) and the auxiliary loss inline in `GRPOTrainer._compute_loss` and has no helper for them,
so a subclass that overrides `_compute_loss` (PACS) re-does them here, to GRPOTrainer's definitions
(tests/test_loss_terms.py compares the result with `GRPOTrainer._compute_loss` on the same batch).

[`GRPOLossTerms`] is a mixin for a subclass of `pacs.grpo.HardenedGRPOTrainer` (`PACSTrainer(GRPOLossTerms,
HardenedGRPOTrainer)`): it overrides no TRL method, and reads GRPOTrainer's entropy-controller state, which
`pacs._compat.check_trl` checks at import. Remove it when TRL factors these terms out of `_compute_loss`.
"""

from __future__ import annotations

import torch


__all__ = ["GRPOLossTerms", "per_token_kl", "token_mean"]


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


class GRPOLossTerms:
    """GRPOTrainer's KL term, entropy bonus and auxiliary loss for a `_compute_loss` that replaces GRPO's (see the
    module docstring). Mixed in before `HardenedGRPOTrainer`; overrides nothing of TRL."""

    def _add_grpo_terms(self, mode, loss, policy_loss, per_token_logps, entropies, aux_loss, inputs, mask):
        """`loss` (this micro-batch's policy loss) plus GRPOTrainer's other terms, scaled for gradient accumulation.

        In GRPOTrainer's order: + `beta` x the KL to the reference model (per-sequence token mean, then batch mean),
        / `gradient_accumulation_steps` (train), - the entropy bonus, + `router_aux_loss_coef` x the auxiliary loss.
        Logs `policy_loss` (the value of `policy_loss`, with the entropy bonus), `aux_loss`, `entropy` and `kl` as
        GRPOTrainer does (tests/test_loss_terms.py compares them with `GRPOTrainer._compute_loss`).
        """
        metrics, gather = self._metrics[mode], self.accelerator.gather
        if self.beta != 0.0:
            old = inputs.get("old_per_token_logps")
            kl = per_token_kl(per_token_logps, inputs["ref_per_token_logps"], old, self.args.use_bias_correction_kl)
            loss = loss + self.beta * ((kl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
            metrics["kl"].append(token_mean(self.accelerator, kl, mask))
        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0  # no accumulation in eval
        loss = loss / normalizer
        if self._entropy_bonus_enabled:
            loss = loss - self._entropy_bonus(mode, entropies, mask)
            metrics["policy_loss"].append(gather(policy_loss.detach()).mean().item())
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / normalizer
            metrics["aux_loss"].append(gather(aux_loss.detach()).mean().item())
        metrics["entropy"].append(token_mean(self.accelerator, entropies, mask))
        return loss

    def _entropy_bonus(self, mode: str, entropies: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """TRL's entropy regularisation (static `entropy_coef` or adaptive), scaled and logged as GRPOTrainer does,
        with GRPOTrainer's controller state (`entropy_coef`, `_entropy_window_stats`, `_last_world_entropy`)."""
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        entropy_loss = (entropies * mask).sum() / mask.sum().clamp(min=1.0) / accumulation
        # the coefficient and gate of the previous optimizer step, so every micro-batch of this one uses the same
        adaptive, args = self.use_adaptive_entropy, self.args
        coef = self.entropy_coef if not adaptive or self._last_world_entropy <= args.entropy_target else 0.0
        if adaptive and mode == "train":
            stats = torch.stack([(entropies * mask).sum(), mask.sum()]).detach()
            window = self._entropy_window_stats
            self._entropy_window_stats = stats if window is None else window + stats
            if self.accelerator.sync_gradients:  # optimizer-step boundary: update the coefficient for the next one
                totals = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                world_entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
                if world_entropy <= args.entropy_target:
                    self.entropy_coef = min(self.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max)
                else:
                    self.entropy_coef = max(self.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min)
                self._last_world_entropy = world_entropy
                self._entropy_window_stats = None
        if mode == "train" and self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        return coef * entropy_loss
