"""`PACSConfig`: TRL's `GRPOConfig` plus the settings of the PACS objective and of its labels."""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field

from trl import GRPOConfig

from ._compat import GRPO_ONLY_LOSS_SETTINGS
from .anchors import ANCHOR_CHOICES, ANCHORS, anchor_description
from .grpo.config import HardenedGRPOConfig
from .labels import label_transforms
from .loss import CLASS_WEIGHTS, REWARD_PROXIES, SCORES, UNIFORM_GROUPS


logger = logging.getLogger(__name__)

# Optimizer steps per generation when neither `steps_per_generation` nor `generation_batch_size` is given: the
# paper's 1024 prompts per rollout in mini-batches of 256.
DEFAULT_OPTIMIZER_STEPS_PER_GENERATION = 4


@dataclass
class PACSConfig(HardenedGRPOConfig):
    r"""
    Configuration class for the [`PACSTrainer`].

    Everything of [`~trl.GRPOConfig`] (through [`~pacs.grpo.HardenedGRPOConfig`]) keeps its meaning (generation, vLLM, batch arithmetic, logging, reward
    functions and `reward_weights`, `mask_truncated_completions`, TRL's KL term, the entropy bonus), with one changed
    default. PACS replaces GRPO's clipped surrogate loss by a supervised one: each completion's label is its reward
    $R_i \in [0, 1]$ (the `reward_weights`-weighted sum of the reward functions, each mapped to [0, 1] by
    `pacs_label_transform`) and its logit is the group-relative score $\psi_i$ of the reward proxy
    $r_i = \beta \sum_t (\log \pi_\theta - \log \pi_{old})$. Hence:

    - **`pacs_beta` is not TRL's `beta`.** `pacs_beta` scales the reward proxy (the paper's $\beta$, 1 or 2);
      TRL's `beta` stays the coefficient of the KL penalty to a reference model (default 0.0, as in the paper).
    - **Several optimizer steps per generation by default.** With one optimizer step per generation every step is
      on-policy, $\psi \equiv 0$ and the update is exactly (class-weighted) RLOO's. So when neither
      `steps_per_generation` nor `generation_batch_size` is given, `steps_per_generation` defaults to
      `4 * gradient_accumulation_steps` (TRL counts it in micro-batches): 4 optimizer steps per generation, as in the
      paper, instead of GRPOConfig's `gradient_accumulation_steps`. A setting that leaves every step on-policy
      (`gradient_accumulation_steps % (steps_per_generation * num_iterations) == 0`) logs a warning.
    - Every optimizer step must hold whole groups: `world_size * per_device_train_batch_size *
      gradient_accumulation_steps` must be a multiple of `num_generations` (a group may span micro-batches and
      processes).
    - GRPO-only loss settings are ignored (`loss_type`, `epsilon`, `epsilon_high`, `delta`, `scale_rewards`,
      `importance_sampling_level`, `multi_objective_aggregation`, `top_entropy_quantile`,
      `off_policy_mask_threshold`, `sapo_*`, `vespo_*`); changing one logs a warning.
    - With vLLM's importance-sampling correction the weight is applied per completion, so
      `vllm_importance_sampling_mode` must be `"sequence_mask"` (the default) or `"sequence_truncate"`.
    - `use_liger_kernel=True` only swaps in Liger's layer kernels (TRL 1.15+ has no fused GRPO loss), so the PACS
      loss still runs and it is allowed.

    Parameters:
        pacs_beta (`float`, *optional*, defaults to `1.0`):
            Scale $\beta$ of the reward proxy, i.e. the inverse temperature of the implicit critic
            $\sigma(\psi)$. Must be > 0. The paper uses 1.0 or 2.0.
        pacs_reward_proxy (`str`, *optional*, defaults to `"log_ratio"`):
            `"log_ratio"`: $r_i = \beta \sum_t (\log \pi_\theta - \log \pi_{old})$ over completion tokens (the
            paper); `"mean_logp"`: $r_i = \beta \cdot \mathrm{mean}_t \log \pi_\theta$.
        pacs_score (`str`, *optional*, defaults to `"rloo"`):
            How the reward proxy becomes the critic's logit $\psi_i$ within a group: `"rloo"` (minus the mean of the
            other completions), `"grpo"` (standardised by the group mean and unbiased std), `"dr_grpo"` (minus the
            group mean, no std: Dr. GRPO, the paper's Appendix D.3 ablation), or `"naive"` ($\psi_i = r_i$). With
            `"grpo"`, near $r \approx 0$ (the first steps after a generation) $\psi$ is standardised noise and its
            gradient can be ~1e5 times RLOO's; keep gradient clipping (`max_grad_norm`) on, a warning is logged
            otherwise.
        pacs_class_weight (`str` or `None`, *optional*, defaults to `"balanced"`):
            Weight of each completion's BCE term: `"balanced"` (per group, positives and negatives weigh the same
            in total), `"positive_only"`, `"negative_only"`, or `"none"` / `None` (all 1).
        pacs_uniform_groups (`str`, *optional*, defaults to `"keep"`):
            What the loss does with a uniform group, one whose scored completions all carry the same label (all
            correct or all wrong; a group with fewer than 2 scored completions counts as uniform): `"keep"` (the
            paper: the group's label-free term, which pulls its completions' scores psi together, stays in the
            gradient) or `"drop"` (every completion of the group gets sample weight 0, so the group adds no
            gradient; the loss is still divided by the number of all completions of the batch). `"drop"` generates
            nothing more, unlike dynamic sampling.
        pacs_label_transform (`str` or `list[str]`, *optional*, defaults to `"none"`):
            How each reward function's score becomes a label in [0, 1], applied per function before the
            `reward_weights`-weighted sum: `"none"` (the score must already lie in [0, 1]: verifiers, 0/1 rewards),
            `"sigmoid"` ($\sigma((s - b) / \tau)$ with $b$ = `pacs_label_offset`, $\tau$ = `pacs_label_temperature`:
            learned reward models, e.g. Bradley-Terry ones) or `"clip"` (clamped to [0, 1]). One name applies to
            every reward function; a list gives one per function, in the order of `reward_funcs`.
        pacs_label_temperature (`float`, *optional*, defaults to `1.0`):
            Temperature $\tau$ of the `"sigmoid"` label transform; must be > 0.
        pacs_label_offset (`float`, *optional*, defaults to `0.0`):
            Baseline $b$ of the `"sigmoid"` label transform: a score of $b$ becomes the label 0.5.
        pacs_anchor (`str`, *optional*, defaults to `"rollout"`):
            What the reward proxy's log-ratio is taken against: `"rollout"` ($\pi_{old}$, the policy that sampled
            each generation: the authors' code and the paper's first version) or `"reference"` (a fixed reference
            policy $\pi_{ref}$, the paper's revised version, Eq. 7), hard-reset to the policy every
            `pacs_reference_reset_generations` generations (see `pacs.anchors.reference`).
        pacs_reference_reset_generations (`int`, *optional*, defaults to `0`):
            With `pacs_anchor="reference"`: $\pi_{ref} \leftarrow \pi_\theta$ at the generation boundary after every
            N generations (before generations N+1, 2N+1, ...); 0 = never ($\pi_{ref}$ stays the initial model).
        pacs_reset_optimizer (`bool`, *optional*, defaults to `True`):
            At each reference reset, re-initialise the optimizer's states (Adam's moments and step count), as the
            paper does after ProRL; the learning-rate schedule goes on.
        pacs_reset_warmup_steps (`int`, *optional*, defaults to `0`):
            With `pacs_reset_optimizer`: the first K optimizer steps Adam takes after each reference reset run at
            $\frac{1}{K+1}, \frac{2}{K+1}, \dots, \frac{K}{K+1}$ of the scheduled learning rate (a re-warmup: with
            its moments zeroed, Adam's first step moves every parameter by about the full learning rate). Counted in
            Adam's own steps, so a step the gradient guard skips does not advance it; 0 = no re-warmup (the paper).
        pacs_max_skipped_steps (`int`, *optional*, defaults to `5`):
            (From `HardenedGRPOConfig`.)
            An optimizer step whose gradient norm is not finite is skipped (weights and optimizer states untouched,
            counted in `pacs/skipped_steps`, see `pacs.grpo.guards`); this many skipped in a row stop training with an
            error saying what to check. `0` never stops.
        steps_per_generation (`int`, *optional*):
            TRL's setting, counted in micro-batches: a generation feeds
            `steps_per_generation / gradient_accumulation_steps * num_iterations` optimizer steps. If neither it nor
            `generation_batch_size` is given, PACS sets it to `4 * gradient_accumulation_steps` (4 optimizer steps
            per generation, the paper's setting), where GRPOConfig would set `gradient_accumulation_steps`.
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
            "the other completions), 'grpo' (standardised by the group mean and unbiased std), 'dr_grpo' (minus the "
            "group mean, no std: Dr. GRPO, the paper's Appendix D.3 ablation), or 'naive' (psi_i = r_i). With "
            "'grpo', near r = 0 (the first steps after a generation) psi is standardised noise and its gradient can "
            "be ~1e5 times RLOO's: keep gradient clipping (max_grad_norm) on; a warning is logged otherwise.",
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
    pacs_uniform_groups: str = field(
        default="keep",
        metadata={
            "help": (
                "What the loss does with a uniform group, one whose scored completions all carry the same label (all "
                "correct or all wrong; a group with fewer than 2 scored completions counts as uniform): 'keep' (the "
                "paper: the group's label-free term, which pulls its completions' scores psi together, stays in the "
                "gradient) or 'drop' (every completion of the group gets sample weight 0, so the group adds no "
                "gradient; the loss is still divided by the number of all completions of the batch). 'drop' generates "
                "nothing more, unlike dynamic sampling."
            ),
            "choices": list(UNIFORM_GROUPS),
        },
    )
    pacs_label_transform: str | list[str] = field(
        default="none",
        metadata={
            "help": "How each reward function's score becomes a label in [0, 1], applied per function before the "
            "reward_weights-weighted sum: 'none' (the score must already lie in [0, 1]: verifiers, 0/1 rewards), "
            "'sigmoid' (sigmoid((s - pacs_label_offset) / pacs_label_temperature): learned reward models, e.g. "
            "Bradley-Terry ones) or 'clip' (clamped to [0, 1]). One name applies to every reward function; a list "
            "gives one per function, in the order of reward_funcs."
        },
    )
    pacs_label_temperature: float = field(
        default=1.0,
        metadata={"help": "Temperature tau of the 'sigmoid' label transform; must be > 0."},
    )
    pacs_label_offset: float = field(
        default=0.0,
        metadata={"help": "Baseline b of the 'sigmoid' label transform: a score of b becomes the label 0.5."},
    )
    pacs_anchor: str = field(
        default="rollout",
        metadata={
            "help": "Anchor of the reward proxy's log-ratio: 'rollout' (pi_old of each generation: the authors' code, "
            "the paper's first version) or 'reference' (a fixed reference policy pi_ref, hard-reset to the policy "
            "every pacs_reference_reset_generations generations: the paper's revised version).",
            "choices": ANCHOR_CHOICES,  # the registry (`pacs.anchors`), read when parsed
        },
    )
    pacs_reference_reset_generations: int = field(
        default=0,
        metadata={
            "help": "With pacs_anchor='reference': copy the policy into pi_ref at the generation boundary after every "
            "N generations (before generations N+1, 2N+1, ...); 0 = never (pi_ref stays the initial model)."
        },
    )
    pacs_reset_optimizer: bool = field(
        default=True,
        metadata={
            "help": "With pacs_anchor='reference': re-initialise the optimizer's states (Adam's moments and step "
            "count) at each reference reset, as the paper does (after ProRL); the learning-rate schedule goes on."
        },
    )
    pacs_reset_warmup_steps: int = field(
        default=0,
        metadata={
            "help": "With pacs_reset_optimizer: the first K optimizer steps after each reference reset run at 1/(K+1), "
            "2/(K+1), ..., K/(K+1) of the scheduled learning rate (Adam's first step after its states are zeroed moves "
            "every parameter by about the full learning rate); counted in Adam's steps. 0 = no re-warmup (the paper)."
        },
    )
    steps_per_generation: int | None = field(
        default=None,
        metadata={
            "help": "Number of micro-batches per generation: a generation feeds steps_per_generation / "
            "gradient_accumulation_steps * num_iterations optimizer steps. If neither it nor generation_batch_size "
            "is given, PACS sets it to 4 * gradient_accumulation_steps (4 optimizer steps per generation, the "
            "paper's setting); GRPOConfig would set gradient_accumulation_steps, which makes every step on-policy "
            "and PACS reduce to RLOO."
        },
    )

    def __post_init__(self):
        if isinstance(self.pacs_class_weight, str) and self.pacs_class_weight.lower() in ("none", "null", ""):
            self.pacs_class_weight = None
        if self.pacs_label_transform is None:  # the command line's default for a list-typed field
            self.pacs_label_transform = "none"
        elif not isinstance(self.pacs_label_transform, str) and len(self.pacs_label_transform) == 1:
            self.pacs_label_transform = self.pacs_label_transform[0]  # the command line gives a list
        self._validate_pacs()
        if self.steps_per_generation is None and self.generation_batch_size is None:
            self.steps_per_generation = DEFAULT_OPTIMIZER_STEPS_PER_GENERATION * self.gradient_accumulation_steps
        super().__post_init__()
        self._validate_step_batch()
        self.split_layout()  # the split path's layout exists (or a ValueError names a valid setting)
        self._warn_on_policy()
        self._warn_ignored_grpo_settings()
        if self.pacs_score == "grpo" and (self.max_grad_norm is None or self.max_grad_norm <= 0):
            logger.warning(
                "pacs_score='grpo' without gradient clipping (max_grad_norm=%s): right after a generation the reward "
                "proxy is ~0 and the standardised score psi is noise whose gradient can be ~1e5 times RLOO's. Set "
                "max_grad_norm=1.0 (the default), or use pacs_score='rloo'.",
                self.max_grad_norm,
            )

    def _validate_pacs(self) -> None:
        for name, value, choices in (
            ("pacs_reward_proxy", self.pacs_reward_proxy, REWARD_PROXIES),
            ("pacs_score", self.pacs_score, SCORES),
            ("pacs_class_weight", self.pacs_class_weight, CLASS_WEIGHTS),
            ("pacs_uniform_groups", self.pacs_uniform_groups, UNIFORM_GROUPS),
        ):
            if value not in choices:
                valid = ", ".join(repr("none" if c is None else c) for c in choices)
                raise ValueError(f"Unknown {name} {value!r}; use one of {valid}.")
        self._validate_anchor()
        transform = self.pacs_label_transform
        label_transforms(transform, 1 if isinstance(transform, str) else len(transform))  # names; counts: trainer
        if not (self.pacs_label_temperature > 0 and math.isfinite(self.pacs_label_temperature)):
            raise ValueError(
                f"pacs_label_temperature must be a finite number > 0 (it divides the score in the 'sigmoid' label "
                f"transform), got {self.pacs_label_temperature}; use 1.0 for a Bradley-Terry reward model's own scale."
            )
        if not math.isfinite(self.pacs_label_offset):
            raise ValueError(f"pacs_label_offset must be a finite number, got {self.pacs_label_offset}.")
        if not self.pacs_beta > 0:
            raise ValueError(
                f"pacs_beta must be > 0 (it scales the implicit critic's logit), got {self.pacs_beta}; the paper "
                "uses 1.0 or 2.0. (TRL's `beta`, the KL coefficient, is a different setting.)"
            )
        G = self.num_generations
        if G is not None and G < 2 and self.pacs_score != "naive":
            raise ValueError(
                f"pacs_score={self.pacs_score!r} compares the completions of a prompt with each other and needs "
                f"num_generations >= 2, got {G}; use num_generations=8 as in the paper."
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

    def _validate_anchor(self) -> None:
        if self.pacs_anchor not in ANCHORS:
            raise ValueError(f"Unknown pacs_anchor {self.pacs_anchor!r}; use {anchor_description()}.")
        if not isinstance(self.pacs_reference_reset_generations, int) or self.pacs_reference_reset_generations < 0:
            raise ValueError(
                "pacs_reference_reset_generations must be an integer >= 0 (0 = never reset the reference policy; N = "
                f"reset it after every N generations), got {self.pacs_reference_reset_generations!r}."
            )
        if not isinstance(self.pacs_reset_warmup_steps, int) or self.pacs_reset_warmup_steps < 0:
            raise ValueError(
                f"pacs_reset_warmup_steps must be an integer >= 0 (0: no re-warmup), got {self.pacs_reset_warmup_steps!r}."
            )
        reset_setting = ANCHORS[self.pacs_anchor].reset_setting  # the anchor's copy changes during the run
        resets = reset_setting is not None and getattr(self, reset_setting) > 0
        if self.pacs_reset_warmup_steps and not (resets and self.pacs_reset_optimizer):
            raise ValueError(
                f"pacs_reset_warmup_steps={self.pacs_reset_warmup_steps} re-warms the optimizer after a reference reset, "
                "and this run has none: it needs pacs_anchor='reference', pacs_reference_reset_generations > 0 and "
                "pacs_reset_optimizer=True. Set those, or pacs_reset_warmup_steps=0."
            )

    def _validate_step_batch(self) -> None:
        # Each optimizer step must see whole groups, so that the gradient of every group is complete at the step; a
        # group may still span micro-batches and processes.
        G, W = self.num_generations, self.world_size
        per_step = W * self.per_device_train_batch_size * self.gradient_accumulation_steps
        if G is None or per_step % G == 0:
            return
        ga = G // math.gcd(G, W * self.per_device_train_batch_size)  # smallest gradient_accumulation_steps that works
        unit = G // math.gcd(G, W * self.gradient_accumulation_steps)
        bs = unit * -(-self.per_device_train_batch_size // unit)  # next per_device_train_batch_size that works
        raise ValueError(
            f"An optimizer step holds world_size x per_device_train_batch_size x gradient_accumulation_steps = {W} x "
            f"{self.per_device_train_batch_size} x {self.gradient_accumulation_steps} = {per_step} completions, not a "
            f"multiple of num_generations ({G}), so a completion group would straddle two optimizer steps; use "
            f"gradient_accumulation_steps={ga} (or a multiple), or per_device_train_batch_size={bs}."
        )

    def split_layout(self) -> str | None:
        """Where the rows of an optimizer step live on the split path (`pacs.split.split_layout`: `"local"` or
        `"exchange"`), for this config's world size; `None` when `per_device_train_batch_size` is a multiple of
        `num_generations` (every micro-batch holds whole groups). A `ValueError` names a valid setting; it is first
        raised by `__post_init__`."""
        from .split import split_layout

        P, G = self.per_device_train_batch_size, self.num_generations
        if G is None or P % G == 0:
            return None
        GA, S = self.gradient_accumulation_steps, self.steps_per_generation
        return split_layout(P, GA, S, self.world_size, G)

    def _warn_on_policy(self) -> None:
        generate_every = self.steps_per_generation * self.num_iterations  # micro-batches per generation (TRL's test)
        if self.gradient_accumulation_steps % generate_every == 0:
            logger.warning(
                "Every optimizer step is on-policy (gradient_accumulation_steps=%d, steps_per_generation=%d, "
                "num_iterations=%d): psi == 0 and the update is class-weighted RLOO, not PACS. Set "
                "steps_per_generation to k * gradient_accumulation_steps with k >= 2 (k optimizer steps per "
                "generation), e.g. %d as in the paper (the default when neither steps_per_generation nor "
                "generation_batch_size is given), or num_iterations > 1.",
                self.gradient_accumulation_steps,
                self.steps_per_generation,
                self.num_iterations,
                DEFAULT_OPTIMIZER_STEPS_PER_GENERATION * self.gradient_accumulation_steps,
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


__all__ = ["DEFAULT_OPTIMIZER_STEPS_PER_GENERATION", "PACSConfig"]
