"""The rollout anchor (`pacs_anchor="rollout"`, the default): the reward proxy's log-ratio is taken against pi_old,
the policy that sampled each generation, as in the authors' code and the paper's first version."""

from __future__ import annotations

import torch


__all__ = ["RolloutAnchor"]


class RolloutAnchor:
    """`pacs_anchor="rollout"`: the reward proxy's log-ratio is taken against pi_old, the policy that sampled each
    generation (the authors' code): `None` on-policy, where r detaches and is exactly 0. Keeps no state.

    The simplest case of the interface every anchor has (`pacs.anchors.Anchor`).
    """

    at_policy = False  # the fresh ranking is logged on every first step (0.5 there: psi == 0 on-policy)

    def __init__(self, args, model=None, accelerator=None, logps=None, kl_ref_model=None):
        self.args = args

    def logps(self, inputs: dict) -> torch.Tensor | None:
        """The log-probs `(B, T)` the reward proxy r compares the policy with; `None`: on-policy, r detaches."""
        return inputs.get("old_per_token_logps")

    def proxy_is_zero(self, inputs: dict, on_policy: bool) -> bool:
        """r is exactly 0 on this split-path step, so its coefficients need no forward."""
        return self.args.pacs_reward_proxy == "log_ratio" and (on_policy or self.logps(inputs) is None)

    def before_generation(self, model, optimizer, lr_scheduler) -> None:
        pass

    def after_generation(self, output: dict, model) -> dict:
        return output

    def metrics(self, per_token_logps: torch.Tensor, inputs: dict, mask: torch.Tensor) -> dict[str, float]:
        return {}

    def callbacks(self) -> list:
        return []

    def save(self, folder: str, model) -> None:
        pass

    def load(self, checkpoint: str, model) -> None:
        pass
