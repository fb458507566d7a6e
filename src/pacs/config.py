"""`PACSConfig`: TRL's `GRPOConfig` plus the four settings of the PACS objective."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

from trl import GRPOConfig

from .loss import CLASS_WEIGHTS, REWARD_PROXIES, SCORES


logger = logging.getLogger(__name__)

# GRPOConfig settings that only shape GRPO's clipped surrogate loss or its advantages. PACSTrainer replaces that loss,
# so these have no effect; a user who changed one is warned rather than silently ignored.
GRPO_ONLY_LOSS_SETTINGS = (
    "loss_type",
    "epsilon",
    "epsilon_high",
    "delta",
    "scale_rewards",
    "importance_sampling_level",
    "multi_objective_aggregation",
    "top_entropy_quantile",
    "off_policy_mask_threshold",
    "entropy_coef",
    "use_adaptive_entropy",
    "sapo_temperature_neg",
    "sapo_temperature_pos",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
)


def _multiples(n: int, limit: int = 3) -> str:
    return " or ".join(str(n * k) for k in range(1, limit + 1))


@dataclass
class PACSConfig(GRPOConfig):
    r"""
    Configuration class for the [`PACSTrainer`].

    Everything of [`~trl.GRPOConfig`] keeps its meaning (generation, vLLM, batch arithmetic, logging, reward
    functions and `reward_weights`, `mask_truncated_completions`, TRL's KL term). PACS replaces GRPO's clipped
    surrogate loss by a supervised one: each completion's label is its verifiable reward $R_i \in [0, 1]$ (the
    `reward_weights`-weighted sum of the reward functions) and its logit is the group-relative score $\psi_i$ of the
    reward proxy $r_i = \beta \sum_t (\log \pi_\theta - \log \pi_{old})$. Hence:

    - **`pacs_beta` is not TRL's `beta`.** `pacs_beta` scales the reward proxy (the paper's $\beta$, 1 or 2);
      TRL's `beta` stays the coefficient of the KL penalty to a reference model (default 0.0, as in the paper).
    - Every micro-batch must hold whole groups, so `per_device_train_batch_size` (and the eval batch) must be a
      multiple of `num_generations`.
    - GRPO-only loss settings are ignored (`loss_type`, `epsilon`, `epsilon_high`, `delta`, `scale_rewards`,
      `importance_sampling_level`, `multi_objective_aggregation`, `top_entropy_quantile`,
      `off_policy_mask_threshold`, `entropy_coef`, `use_adaptive_entropy`, `sapo_*`, `vespo_*`); changing one logs a
      warning.
    - PACS takes several optimizer steps per generation to use its off-policy terms: set `steps_per_generation` to
      a multiple of `gradient_accumulation_steps` (or `num_iterations > 1`). With one optimizer step per generation,
      $\psi \equiv 0$ and the update is exactly RLOO's.
    - With vLLM's importance-sampling correction the weight is applied per completion, so
      `vllm_importance_sampling_mode` must be `"sequence_mask"` (the default) or `"sequence_truncate"`.

    Parameters:
        pacs_beta (`float`, *optional*, defaults to `1.0`):
            Scale $\beta$ of the reward proxy, i.e. the inverse temperature of the implicit critic
            $\sigma(\psi)$. Must be > 0. The paper uses 1.0 or 2.0.
        pacs_reward_proxy (`str`, *optional*, defaults to `"log_ratio"`):
            `"log_ratio"`: $r_i = \beta \sum_t (\log \pi_\theta - \log \pi_{old})$ over completion tokens (the
            paper); `"mean_logp"`: $r_i = \beta \cdot \mathrm{mean}_t \log \pi_\theta$.
        pacs_score (`str`, *optional*, defaults to `"rloo"`):
            How the reward proxy becomes the critic's logit $\psi_i$ within a group: `"rloo"` (minus the mean of the
            other completions), `"grpo"` (standardised by the group mean and unbiased std), or `"naive"`
            ($\psi_i = r_i$).
        pacs_class_weight (`str` or `None`, *optional*, defaults to `"balanced"`):
            Weight of each completion's BCE term: `"balanced"` (per group, positives and negatives weigh the same
            in total), `"positive_only"`, `"negative_only"`, or `"none"` / `None` (all 1).
    """

    pacs_beta: float = field(
        default=1.0,
        metadata={
            "help": "Scale beta of the reward proxy, i.e. the inverse temperature of the implicit critic sigma(psi). "
            "Must be > 0. The paper uses 1.0 or 2.0. Not TRL's `beta`, which stays the KL coefficient."
        },
    )
    pacs_reward_proxy: str = field(
        default="log_ratio",
        metadata={
            "help": "'log_ratio': r_i = beta * sum_t (log pi_theta - log pi_old) over completion tokens (the paper); "
            "'mean_logp': r_i = beta * mean_t log pi_theta.",
            "choices": list(REWARD_PROXIES),
        },
    )
    pacs_score: str = field(
        default="rloo",
        metadata={
            "help": "How the reward proxy becomes the critic's logit psi_i within a group: 'rloo' (minus the mean of "
            "the other completions), 'grpo' (standardised by the group mean and unbiased std), or 'naive' "
            "(psi_i = r_i).",
            "choices": list(SCORES),
        },
    )
    pacs_class_weight: str | None = field(
        default="balanced",
        metadata={
            "help": "Weight of each completion's BCE term: 'balanced' (per group, positives and negatives weigh the "
            "same in total), 'positive_only', 'negative_only', or 'none' (all 1)."
        },
    )

    def __post_init__(self):
        if isinstance(self.pacs_class_weight, str) and self.pacs_class_weight.lower() in ("none", "null", ""):
            self.pacs_class_weight = None
        self._validate_pacs()
        super().__post_init__()
        self._warn_ignored_grpo_settings()

    def _validate_pacs(self) -> None:
        for name, value, choices in (
            ("pacs_reward_proxy", self.pacs_reward_proxy, REWARD_PROXIES),
            ("pacs_score", self.pacs_score, SCORES),
            ("pacs_class_weight", self.pacs_class_weight, CLASS_WEIGHTS),
        ):
            if value not in choices:
                valid = ", ".join(repr("none" if c is None else c) for c in choices)
                raise ValueError(f"Unknown {name} {value!r}; use one of {valid}.")
        if not self.pacs_beta > 0:
            raise ValueError(
                f"pacs_beta must be > 0 (it scales the implicit critic's logit), got {self.pacs_beta}; the paper "
                "uses 1.0 or 2.0. (TRL's `beta`, the KL coefficient, is a different setting.)"
            )
        G = self.num_generations
        if G is not None and G < 2 and self.pacs_score in ("rloo", "grpo"):
            raise ValueError(
                f"pacs_score={self.pacs_score!r} compares the completions of a prompt with each other and needs "
                f"num_generations >= 2, got {G}; use num_generations=8 as in the paper."
            )
        if G is not None and self.per_device_train_batch_size % G != 0:
            raise ValueError(
                f"per_device_train_batch_size ({self.per_device_train_batch_size}) must be a multiple of "
                f"num_generations ({G}) so that each completion group lands whole in one micro-batch; use "
                f"{_multiples(G)}."
            )
        G_eval = self.num_generations_eval or G
        if G_eval is not None and self.per_device_eval_batch_size % G_eval != 0:
            raise ValueError(
                f"per_device_eval_batch_size ({self.per_device_eval_batch_size}) must be a multiple of the number of "
                f"generations used for evaluation ({G_eval}) so that each completion group lands whole in one "
                f"evaluation batch; use {_multiples(G_eval)}."
            )
        if self.use_liger_kernel:
            raise ValueError(
                "use_liger_kernel=True swaps in Liger's fused GRPO loss, which is not the PACS objective; set "
                "use_liger_kernel=False."
            )
        if (
            self.use_vllm
            and self.vllm_importance_sampling_correction
            and not str(self.vllm_importance_sampling_mode).startswith("sequence")
        ):
            raise ValueError(
                f"vllm_importance_sampling_mode={self.vllm_importance_sampling_mode!r} weights tokens, but the PACS loss "
                "is one term per completion; use 'sequence_mask' (the default) or 'sequence_truncate', or set "
                "vllm_importance_sampling_correction=False."
            )

    def _warn_ignored_grpo_settings(self) -> None:
        defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
        changed = [
            f"{name}={getattr(self, name)!r}"
            for name in GRPO_ONLY_LOSS_SETTINGS
            if name in defaults and getattr(self, name) != defaults[name]
        ]
        if changed:
            logger.warning(
                "PACSTrainer replaces GRPO's loss, so these GRPO-only settings have no effect: %s.", ", ".join(changed)
            )
