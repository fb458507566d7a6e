"""`PACSTrainer`: TRL's `GRPOTrainer` with the PACS loss.

PACS (https://arxiv.org/abs/2509.02522) treats RLVR as supervised learning: the verifiable reward of each completion
is a label, and the policy's own group-relative log-ratio score $\\psi$ is the logit that predicts it, so the policy
is actor and critic at once (see `pacs.loss`).

The only change w.r.t. `GRPOTrainer` is the loss; generation (transformers, vLLM colocate or server), reward
functions, reference model / KL, PEFT, DeepSpeed and logging are inherited unchanged. Three narrow overrides carry what
the loss needs:

1. `_calculate_rewards` keeps each completion's label (the `reward_weights`-weighted sum of the reward functions),
   checked to lie in [0, 1]; `_generate_and_score_completions` attaches this process's slice of the labels.
2. `_prepare_inputs` shuffles the generation batch by whole groups instead of by rows, so every micro-batch that
   reaches the loss holds whole groups of `num_generations` completions of one prompt.
3. `_compute_loss` evaluates `pacs_loss` (plus TRL's KL term when `beta > 0`) and logs the implicit critic.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Sequence

import torch
import trl
from packaging.version import Version
from trl import GRPOConfig, GRPOTrainer
from trl.trainer import grpo_trainer as _grpo_module
from trl.trainer.utils import get_config_model_id

from .config import PACSConfig
from .loss import pacs_loss


logger = logging.getLogger(__name__)

_TRL_RANGE = (Version("1.15"), Version("2"))
_OVERRIDDEN = ("_calculate_rewards", "_generate_and_score_completions", "_prepare_inputs", "_compute_loss")
_USED = ("_get_per_token_logps_and_entropies",)
# Optional forward inputs (vision-language models) that GRPOTrainer passes through to the model.
_MULTIMODAL_KEYS = (
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


def _check_trl() -> None:
    """Fail at import, with a fix, if the installed TRL lacks what `PACSTrainer` overrides or calls."""
    version = Version(trl.__version__)
    missing = [name for name in _OVERRIDDEN + _USED if not callable(getattr(GRPOTrainer, name, None))]
    if not hasattr(_grpo_module, "shuffle_sequence_dict"):
        missing.append("trl.trainer.grpo_trainer.shuffle_sequence_dict")
    if missing or not (_TRL_RANGE[0] <= version < _TRL_RANGE[1]):
        raise ImportError(
            f"pacs needs trl>={_TRL_RANGE[0]},<{_TRL_RANGE[1]} (GRPOTrainer with {', '.join(_OVERRIDDEN + _USED)}); "
            f"found trl {trl.__version__}"
            + (f" without {', '.join(missing)}" if missing else "")
            + '. Install a supported version: pip install "trl>=1.15,<2".'
        )


_check_trl()


def shuffle_groups(seq_dict: dict[str, Sequence | None], group_size: int) -> dict[str, Sequence | None]:
    """Shuffle all sequence values of `seq_dict` along the first dimension by whole groups of `group_size` rows.

    The group-preserving twin of TRL's `shuffle_sequence_dict`: rows `g*G .. g*G+G-1` stay together and in order.

    >>> shuffle_groups({"x": torch.arange(4), "y": ["a", "b", "c", "d"], "n": torch.tensor(7)}, 2)["n"]
    tensor(7)
    """
    batch_size = len(next(v for v in seq_dict.values() if v is not None))
    if batch_size % group_size != 0:
        raise ValueError(f"Cannot shuffle {batch_size} rows by whole groups of {group_size}.")
    group_perm = torch.randperm(batch_size // group_size)
    permutation = (group_perm[:, None] * group_size + torch.arange(group_size)).reshape(-1)  # (B,)

    def permute(v):
        if v is None or (isinstance(v, torch.Tensor) and v.ndim == 0):
            return v
        if isinstance(v, torch.Tensor):
            return v[permutation.to(v.device)]
        return [v[i] for i in permutation.tolist()]

    return {key: permute(val) for key, val in seq_dict.items()}


@contextlib.contextmanager
def _group_shuffle(group_size: int):
    # GRPOTrainer._prepare_inputs shuffles the generation batch row by row through this module-level name; swapping
    # it for the group-preserving twin while the parent method runs keeps groups whole without copying the method.
    original = _grpo_module.shuffle_sequence_dict
    _grpo_module.shuffle_sequence_dict = functools.partial(shuffle_groups, group_size=group_size)
    try:
        yield
    finally:
        _grpo_module.shuffle_sequence_dict = original


class PACSTrainer(GRPOTrainer):
    """
    Trainer for PACS, implicit actor-critic coupling via a supervised learning framework for RLVR.

    PACS (https://arxiv.org/abs/2509.02522) labels each completion with its verifiable reward $R_i$ and trains the
    policy to predict it with $\\sigma(\\psi_i)$, where $\\psi_i$ is the group-relative score of the reward proxy
    $r_i = \\beta \\sum_t (\\log \\pi_\\theta - \\log \\pi_{old})$. On an on-policy step the gradient is RLOO's; on the
    further optimizer steps of the same rollout the implicit critic's calibration term kicks in.

    The only change w.r.t. [`~trl.GRPOTrainer`] is the loss; everything else is inherited unchanged. Takes the same
    arguments as `GRPOTrainer`, with `args` a [`PACSConfig`].

    Example:

    ```python
    from pacs import PACSConfig, PACSTrainer
    from pacs.data import load_train_dataset
    from pacs.rewards import math_reward

    trainer = PACSTrainer(
        model="Qwen/Qwen3-4B-Base",
        reward_funcs=math_reward,
        args=PACSConfig(output_dir="qwen3-4b-pacs", steps_per_generation=4),
        train_dataset=load_train_dataset("deepscaler"),
    )
    trainer.train()
    ```
    """

    _tag_names = ["trl", "pacs"]
    _name = "PACS"

    def __init__(self, model, reward_funcs=None, args: PACSConfig | None = None, **kwargs):
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = PACSConfig(f"{model_name.split('/')[-1]}-PACS")
        elif not isinstance(args, PACSConfig):
            kind = type(args).__name__
            hint = (
                " Build one with PACSConfig(**{k: v for k, v in grpo_args.to_dict().items() if not k.startswith('_')})"
                " or construct PACSConfig directly."
                if isinstance(args, GRPOConfig)
                else ""
            )
            raise TypeError(f"PACSTrainer needs args=PACSConfig(...), got {kind}.{hint}")
        self._pacs_labels: torch.Tensor | None = None  # (B_global,) labels of the last scored generation batch
        self._pacs_scorable: torch.Tensor | None = None  # (B_global,) False where every reward function gave None
        super().__init__(model, reward_funcs, args=args, **kwargs)

    # 1. labels -------------------------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # (B_glob, F)
        weights = self.reward_weights.to(rewards_per_func.device)
        scorable = ~torch.isnan(rewards_per_func).all(dim=1)  # (B_glob,)
        labels = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # (B_glob,)
        bad = scorable & ((labels < 0) | (labels > 1) | ~torch.isfinite(labels))
        if bad.any():
            row = int(bad.nonzero()[0])
            parts = ", ".join(
                f"{name}={rewards_per_func[row, i].item():g} (weight {weights[i].item():g})"
                for i, name in enumerate(self.reward_func_names)
            )
            raise ValueError(
                f"PACS uses the reward as a label and needs it in [0, 1], but completion {row} of this batch got "
                f"{labels[row].item():g} from the reward functions {parts}. Make the reward functions return values in "
                "[0, 1] (e.g. 1.0 correct / 0.0 wrong) and the reward_weights sum to at most 1, e.g. "
                f"reward_weights={[round(1 / len(weights), 4)] * len(weights)}."
            )
        self._pacs_labels, self._pacs_scorable = labels, scorable
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        n = output["prompt_ids"].size(0)  # this process's rows, in the order of the gathered rewards
        local = slice(self.accelerator.process_index * n, (self.accelerator.process_index + 1) * n)
        output["pacs_labels"] = self._pacs_labels[local]  # (B,)
        output["pacs_scorable"] = self._pacs_scorable[local].float()  # (B,)
        return output

    # 2. whole groups -------------------------------------------------------------------------------------------
    def _prepare_inputs(self, generation_batch):
        with _group_shuffle(self.num_generations):
            inputs = super()._prepare_inputs(generation_batch)
        return inputs

    # 3. the loss -----------------------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]  # (B, T)

        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),  # logits_to_keep: only the completion tokens
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in _MULTIMODAL_KEYS},
        )  # (B, T), (B, T)
        old_per_token_logps = inputs.get("old_per_token_logps")  # None when on-policy: pacs_loss detaches

        # A completion that no reward function could score, or that masking emptied (truncated with
        # mask_truncated_completions), carries no label: weight 0, left out of the class counts.
        sample_weight = inputs["pacs_scorable"] * (mask.sum(-1) > 0).to(per_token_logps.dtype)  # (B,)
        is_ratio = inputs.get("importance_sampling_ratio")  # vLLM correction: (B, 1) in the sequence modes
        if is_ratio is not None:
            sample_weight = sample_weight * is_ratio.reshape(is_ratio.size(0), -1)[:, 0]

        loss, stats = pacs_loss(
            per_token_logps,
            old_per_token_logps,
            mask,
            inputs["pacs_labels"],
            num_generations,
            beta=self.args.pacs_beta,
            reward_proxy=self.args.pacs_reward_proxy,
            score=self.args.pacs_score,
            class_weight=self.args.pacs_class_weight,
            sample_weight=sample_weight,
        )
        pacs_value = loss.detach()

        if self.beta != 0.0:  # TRL's KL penalty to the reference model, per-sequence token mean as in GRPO
            ref_per_token_logps = inputs["ref_per_token_logps"]
            delta = ref_per_token_logps - per_token_logps
            per_token_kl = torch.exp(delta) - delta - 1  # (B, T)
            if self.args.use_bias_correction_kl:
                reference = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
                per_token_kl = per_token_kl * torch.exp(per_token_logps - reference)
            loss = loss + self.beta * ((per_token_kl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()

        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0  # no accumulation in eval
        loss = loss / normalizer
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / normalizer

        self._log_pacs_metrics(mode, pacs_value, stats, inputs["pacs_labels"], sample_weight, num_generations)
        self._log_token_metric(mode, "entropy", entropies, mask)
        if self.beta != 0.0:
            self._log_token_metric(mode, "kl", per_token_kl, mask)
        if self.aux_loss_enabled:
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather(aux_loss.detach()).mean().item())
        return loss

    def _log_token_metric(self, mode: str, name: str, values: torch.Tensor, mask: torch.Tensor) -> None:
        totals = self.accelerator.reduce(torch.stack([(values.detach() * mask).sum(), mask.sum().float()]), "sum")
        self._metrics[mode][name].append((totals[0] / totals[1].clamp(min=1.0)).item())

    def _log_pacs_metrics(self, mode, loss, stats, labels, sample_weight, num_generations) -> None:
        # Every rank runs the same gathers, whatever its data: no early return here.
        gather = self.accelerator.gather
        psi, probs = gather(stats["psi"]), gather(stats["probs"])  # (B_world,)
        labels, valid = gather(labels.to(psi.dtype)), gather((sample_weight > 0).to(psi.dtype))  # (B_world,)
        count = valid.sum().clamp(min=1.0)

        def valid_mean(x: torch.Tensor) -> float:
            return ((x * valid).sum() / count).item()

        psi_mean = valid_mean(psi)
        groups_valid = valid.view(-1, num_generations).sum(-1)  # (groups,)
        groups_pos = (labels * valid).view(-1, num_generations).sum(-1)  # (groups,)
        mixed = ((groups_pos > 0) & (groups_pos < groups_valid)).float()
        metrics = self._metrics[mode]
        metrics["pacs/loss"].append(gather(loss).mean().item())
        metrics["pacs/psi_mean"].append(psi_mean)
        metrics["pacs/psi_std"].append(valid_mean((psi - psi_mean) ** 2) ** 0.5)
        metrics["pacs/critic_accuracy"].append(valid_mean(((probs > 0.5) == (labels > 0.5)).to(psi.dtype)))
        metrics["pacs/critic_brier"].append(valid_mean((probs - labels) ** 2))
        metrics["pacs/label_mean"].append(valid_mean(labels))
        metrics["pacs/frac_mixed_groups"].append(mixed.mean().item())


__all__ = ["PACSTrainer", "shuffle_groups"]
