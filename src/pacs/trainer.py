"""`PACSTrainer`: the PACS loss on `HardenedGRPOTrainer` (TRL's `GRPOTrainer`, hardened: `pacs.grpo`).

PACS (https://arxiv.org/abs/2509.02522) treats RLVR as supervised learning: the verifiable reward of each completion
is a label, and the policy's own group-relative log-ratio score $\\psi$ is the logit that predicts it, so the policy
is actor and critic at once (see `pacs.loss`).

What changes w.r.t. `GRPOTrainer`: the loss, and what the loss needs of the batch: the generation batch is shuffled
by whole groups instead of by rows, and, when a group does not fit in one micro-batch, rows are exchanged between
processes and each optimizer step carries its groups' closed-form coefficients (the split path, `pacs.split`).
Generation (transformers, vLLM colocate or server), reward functions, reference model / KL, PEFT, DeepSpeed and
logging are inherited unchanged, and the checks, guards, checkpoints and vLLM hardening come from
`HardenedGRPOTrainer`. PACS extends that layer's named points, overrides two TRL methods no other class
overrides, and adds GRPO's other loss terms with `pacs.loss_terms.GRPOLossTerms` (a mixin that overrides
nothing). The split path's layout comes with the config (`PACSConfig.split_layout`, checked when the config is
built, so before the model loads).

1. `_after_rewards` returns each completion's label (the `reward_weights`-weighted sum of the reward functions, each
   mapped by `pacs_label_transform`), checked to lie in [0, 1], with its scorable flag and row number: columns the
   GRPO layer attaches to the batch;
   `_before_generation` / `_after_scoring` run the anchor (`pacs.anchors`: a reset, pi_ref's log-probs);
   `_after_monitors` exchanges rows on the split path.
2. `_prepare_inputs` shuffles the generation batch by whole groups instead of by rows, so that a micro-batch (or,
   when `per_device_train_batch_size` is not a multiple of `num_generations`, an optimizer step) holds whole groups;
   on that split path it also attaches each optimizer step's closed-form whole-group coefficients (`pacs.split`).
3. `_compute_loss` evaluates `pacs_loss` (or, on the split path, backpropagates sum_i c_i r_i: the exact whole-group
   gradient), adds TRL's KL term, entropy bonus and auxiliary loss (`_add_grpo_terms`), and logs the implicit critic.
4. `_save_extra_state` / `_load_extra_state`: the anchor's state rides in every checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch
import torch.nn.functional as F

from ._compat import check_trl, group_shuffle, shuffle_groups
from .anchors import make_anchor
from .config import PACSConfig
from .critic import CriticTally, critic_metrics, ranking_sums
from .grpo.terms import loss_mask
from .grpo.trainer import HardenedGRPOTrainer
from .labels import label_range_error, reward_to_label, soft_label_message
from .loss import compute_reward_proxy, pacs_loss
from .loss_terms import GRPOLossTerms
from .split import attach_step_coefficients, exchange_order, exchange_rows, split_layout


logger = logging.getLogger(__name__)


check_trl()  # what only PACS needs of TRL's private API (`pacs._compat`)


class PACSTrainer(GRPOLossTerms, HardenedGRPOTrainer):
    """
    Trainer for PACS, implicit actor-critic coupling via a supervised learning framework for RLVR.

    PACS (https://arxiv.org/abs/2509.02522) labels each completion with its verifiable reward $R_i$ and trains the
    policy to predict it with $\\sigma(\\psi_i)$, where $\\psi_i$ is the group-relative score of the reward proxy
    $r_i = \\beta \\sum_t (\\log \\pi_\\theta - \\log \\pi_{old})$. On an on-policy step the gradient is RLOO's; on the
    further optimizer steps of the same rollout the implicit critic's calibration term kicks in.

    What changes w.r.t. [`~trl.GRPOTrainer`] is the loss and what it needs of the batch (shuffled by whole groups;
    on the split path, rows exchanged between processes and each step's whole-group coefficients: the module's
    docstring); everything else is inherited unchanged, with the checks, guards and checkpoints of
    [`~pacs.grpo.HardenedGRPOTrainer`]. Takes the same arguments as `GRPOTrainer`, with `args` a [`PACSConfig`].

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
    _config_class = PACSConfig
    _nonfinite_hint = "the loss and pacs/loss, pacs/psi_* (a reward proxy that overflows: lower pacs_beta)"
    _name = "PACS"
    _paper = {  # the model card (TRL's `create_model_card`) cites this paper, not GRPO's
        "title": "Implicit Actor Critic Coupling via a Supervised Learning Framework for RLVR",
        "id": "2509.02522",
        # docstyle-ignore
        "citation": (
            "@article{li2025implicit,\n"
            "    title        = {{Implicit Actor Critic Coupling via a Supervised Learning Framework for RLVR}},\n"
            "    author       = {Jiaming Li and Longze Chen and Ze Gong and Yukun Chen and Lu Wang and Wanwei He and "
            "Run Luo and Min Yang},\n"
            "    year         = 2025,\n"
            "    eprint       = {arXiv:2509.02522},\n"
            "}"
        ),
    }

    def __init__(self, model, reward_funcs=None, args: PACSConfig | None = None, **kwargs):
        super().__init__(model, reward_funcs, args=args, **kwargs)  # the checks, GRPOTrainer
        self._split_layout = self.args.split_layout()  # checked when the config was built (`PACSConfig.__post_init__`)
        self._critic_tally = CriticTally()  # the within-group ranking, pooled over an optimizer step
        self._soft_labels_said = False  # rewards in (0, 1) are soft labels: a warning, once (`soft_label_message`)
        self._pacs_anchor = make_anchor(
            self.args.pacs_anchor, self.args, self.model, self.accelerator, self._logps_without_grad, self.ref_model
        )  # pi_old, or pi_ref and its resets (`pacs_anchor`, `pacs.anchors`)
        for callback in self._pacs_anchor.callbacks():
            self.add_callback(callback)

    @property
    def _pacs_layout(self) -> str | None:
        """Split path: where the rows of an optimizer step live (`PACSConfig.split_layout`); `None`: whole groups."""
        return self._split_layout

    @property
    def _pacs_split(self) -> bool:
        """A micro-batch holds part of a group (see `pacs.split`)."""
        return self._pacs_layout is not None

    # 1. labels, the anchor, the rows of this process (HardenedGRPOTrainer's extension points) ----------------------
    def _before_generation(self, mode: str) -> None:
        super()._before_generation(mode)
        if mode == "train":  # evaluation keeps psi == 0 (see `_compute_loss`)
            self._pacs_anchor.before_generation(self.model, self.optimizer, self.lr_scheduler)  # a reset, on schedule

    def _after_rewards(self, rewards_per_func: torch.Tensor, scorable: torch.Tensor, mode: str) -> dict:
        columns = super()._after_rewards(rewards_per_func, scorable, mode)
        args = self.args
        labels_per_func = reward_to_label(
            rewards_per_func, args.pacs_label_transform, args.pacs_label_temperature, args.pacs_label_offset
        )  # (B_glob, F), each function's score mapped to [0, 1] (identity for "none")
        weights = self.reward_weights.to(rewards_per_func.device)
        labels = (labels_per_func * weights.unsqueeze(0)).nansum(dim=1)  # (B_glob,)
        bad = scorable & ((labels < 0) | (labels > 1) | ~torch.isfinite(labels))
        if bad.any():
            row, names, transform = int(bad.nonzero()[0]), self.reward_func_names, args.pacs_label_transform
            raise label_range_error(row, names, rewards_per_func, labels_per_func, labels, weights, transform)
        if not self._soft_labels_said and (message := soft_label_message(labels, scorable, args.pacs_label_transform)):
            self._soft_labels_said = True
            if self.accelerator.is_main_process:
                logger.warning(message)
        # labels are already gathered over processes (TRL gathers the rewards), so this needs no collective; TRL logs
        # `reward` and `rewards/<function>/mean` from the raw scores, not the labels
        count = scorable.sum().clamp(min=1)
        mean = (labels * scorable).sum() / count
        std = (((labels - mean) ** 2 * scorable).sum() / count).sqrt()
        self._record(mode, {"pacs/rollout_label_mean": mean.item(), "pacs/rollout_label_std": std.item()})
        return {**columns, "pacs_labels": labels, "pacs_scorable": scorable.float()}  # (B_glob,)

    def _sampling_signal(self, output, rewards_per_func, scorable):
        # dynamic sampling's "uniform" for PACS: equal labels (the loss's targets; a named reward function's score
        # instead where one is named) over the rows the PACS loss counts: a weight > 0 (`_sample_weight`: scored, a
        # non-empty loss mask, vLLM's sequence-level importance weight not 0), as `pacs.loss.mixed_group_mask` decides
        values, valid = super()._sampling_signal(output, rewards_per_func, scorable)
        if self.args.dynamic_sampling_metric == "reward":
            values = output["pacs_labels"]
        counted = self._sample_weight(output, loss_mask(output), torch.float32) > 0  # (n,)
        return values, valid & counted

    def _after_scoring(self, output: dict, mode: str) -> dict:
        output = super()._after_scoring(output, mode)
        # Row number in the gathered generation batch (as assembled, with dynamic sampling), where rows g*G .. g*G+G-1
        # are one prompt's group: it lets the split path reassemble groups whatever the shuffle and the micro-batch
        # and process boundaries. Rows p*n .. p*n+n-1 are process p's (TRL's slice).
        n = output["prompt_ids"].size(0)
        start = self.accelerator.process_index * n
        output["pacs_index"] = torch.arange(start, start + n, device=output["prompt_ids"].device)  # (n,)
        if mode == "train":  # pi_ref's log-probs, before the row exchange
            output = self._pacs_anchor.after_generation(output, self.model)
        return output

    def _after_monitors(self, output: dict, mode: str) -> dict:
        output = super()._after_monitors(output, mode)
        if self._pacs_layout == "exchange" and mode == "train":
            rows_per_step = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps
            pad_id = self._tokenizer.pad_token_id
            output = exchange_rows(output, self.accelerator, pad_id, rows_per_step, self.num_generations)
        return output

    def _save_extra_state(self, folder: str) -> None:
        super()._save_extra_state(folder)
        self._pacs_anchor.save(folder, self.model)

    def _load_extra_state(self, checkpoint: str) -> None:
        super()._load_extra_state(checkpoint)
        self._pacs_anchor.load(checkpoint, self.model)

    # 2. whole groups -------------------------------------------------------------------------------------------
    def _prepare_inputs(self, generation_batch):
        # Shuffled by whole groups, except: on the split path with one optimizer step per pass over the generation
        # batch, the step holds whole groups whatever the row order, so TRL's row shuffle stays (groups may then span
        # processes, which `pacs_index` handles); rows exchanged into optimizer-step order (`exchange_rows`) stay.
        row_shuffle = self._pacs_split and self.args.steps_per_generation == self.args.gradient_accumulation_steps
        group_size = None if self._pacs_layout == "exchange" else self.num_generations
        with contextlib.nullcontext() if row_shuffle else group_shuffle(group_size):
            inputs = super()._prepare_inputs(generation_batch)
        if self._pacs_split and self.model.training:
            batches, position = self._optimizer_step_batches()
            if position == 0 or "pacs_coef" not in inputs:  # the step's first micro-batch: before any graph of it
                fresh, args = self._fresh_step(), self.args
                loss, stats, labels = attach_step_coefficients(
                    batches, functools.partial(self._reward_proxy_without_grad, on_policy=fresh),
                    functools.partial(self._sample_weight, dtype=torch.float32), self.accelerator.gather,
                    self.num_generations, args.generation_batch_size, args.pacs_score, args.pacs_class_weight,
                    args.pacs_uniform_groups,
                )  # fmt: skip
                self._log_pacs_metrics("train", loss, stats, labels, fresh=fresh, whole_step=True)
        return inputs

    def _balance_unit(self) -> int | None:
        # balancing by tokens (`padding_free`) keeps whole groups in a micro-batch, as the PACS loss needs; on the
        # split path the step's coefficients ride with each row (`pacs_coef`), so any row may go anywhere
        unit = super()._balance_unit()
        return unit if unit is None or self._pacs_split else self.num_generations

    def _reward_proxy_without_grad(self, batch: dict, mask: torch.Tensor, on_policy: bool) -> torch.Tensor:
        # r of the batch under the current policy, (B,): exactly 0 without a forward where the policy is the anchor
        if self._pacs_anchor.proxy_is_zero(batch, on_policy):
            return torch.zeros(mask.size(0), device=mask.device)
        with self.compute_loss_context_manager():  # as the loss's own forward: r must equal the loss's r
            logps = self._logps_without_grad(self.model, batch)
        args = self.args
        return compute_reward_proxy(
            logps, self._pacs_anchor.logps(batch), mask, args.pacs_beta, args.pacs_reward_proxy
        )

    # 3. the loss -----------------------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        mode = self._mode
        mask = loss_mask(inputs)  # (B, T)
        per_token_logps, entropies, aux_loss = self._per_token_logps(
            model, inputs, compute_entropy=True, compute_aux_loss=self.aux_loss_enabled
        )  # (B, T), (B, T)
        if not self._entropy_bonus_enabled:
            entropies = entropies.detach()  # only logged: keep no graph for it
        if mode == "eval":
            # No update between sampling and scoring, so psi == 0 and every BCE term is log 2 by construction; the
            # loss needs no groups (any per_device_eval_batch_size, num_generations_eval=1 included).
            labels = inputs["pacs_labels"].to(per_token_logps.dtype)
            loss = F.binary_cross_entropy_with_logits(torch.zeros_like(labels), labels)
            valid = self.accelerator.gather(self._sample_weight(inputs, mask, labels.dtype) > 0)
            labels = self.accelerator.gather(inputs["pacs_labels"])  # the critic metrics carry no information here
            self._metrics[mode]["pacs/label_mean"].append(labels[valid].mean().item() if valid.any() else 0.0)
        elif self._pacs_split:  # the step's coefficients come with the batch (`_prepare_inputs`)
            loss = self._split_loss(per_token_logps, inputs, mask)
        else:
            loss = self._whole_group_loss(per_token_logps, inputs, mask)
        policy_loss = loss.detach()  # this micro-batch's PACS loss (the step's on the split path)
        if mode == "train":
            self._record(mode, self._pacs_anchor.metrics(per_token_logps, inputs, mask))  # pi_ref's KL and resets
        return self._add_grpo_terms(mode, loss, policy_loss, per_token_logps, entropies, aux_loss, inputs, mask)

    def _whole_group_loss(self, per_token_logps, inputs, mask) -> torch.Tensor:
        loss, stats = pacs_loss(
            per_token_logps,
            self._pacs_anchor.logps(inputs),  # None when on-policy: the proxy detaches
            mask,
            inputs["pacs_labels"],
            self.num_generations,
            beta=self.args.pacs_beta,
            reward_proxy=self.args.pacs_reward_proxy,
            score=self.args.pacs_score,
            class_weight=self.args.pacs_class_weight,
            sample_weight=self._sample_weight(inputs, mask, per_token_logps.dtype),
            uniform_groups=self.args.pacs_uniform_groups,
        )
        gather = self.accelerator.gather
        keys = ("psi", "counted", "rewards") + (("mixed",) if self.args.pacs_uniform_groups == "drop" else ())
        gathered = {key: gather(stats[key]) for key in keys}
        fresh = self._fresh_step()  # this micro-batch's step: the first after a generation? (the split path's rule)
        labels = gather(inputs["pacs_labels"])
        self._log_pacs_metrics("train", gather(loss.detach()).mean(), gathered, labels, fresh)
        return loss

    def _split_loss(self, per_token_logps, inputs, mask) -> torch.Tensor:
        # Groups cut by this micro-batch: backpropagate sum_i c_i r_i with the whole-group coefficients c of this
        # optimizer step (`pacs.split.attach_step_coefficients`). c is the gradient of the step's loss, already
        # averaged over processes and micro-batches, which the factor undoes: after the averaging of gradients over
        # processes and the division by gradient_accumulation_steps (`_add_grpo_terms`) the step's gradient is exact.
        rewards = compute_reward_proxy(
            per_token_logps, self._pacs_anchor.logps(inputs), mask, self.args.pacs_beta, self.args.pacs_reward_proxy
        )  # (B,) with grad
        scale = self.accelerator.num_processes * self.current_gradient_accumulation_steps
        surrogate = scale * (inputs["pacs_coef"].to(rewards.dtype) * rewards).sum()
        # value: the step's PACS loss (each micro-batch's, after the division by gradient_accumulation_steps, sums to
        # it); gradient: the exact whole-group gradient
        return surrogate - surrogate.detach() + inputs["pacs_step_loss"]

    @staticmethod
    def _sample_weight(inputs, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # A completion that no reward function could score carries no label: weight 0, out of the class counts (it
        # stays in its group's statistics: a real sample). A completion whose mask is empty (truncated with
        # mask_truncated_completions, or all tool output) is not a sample at all: `pacs_loss` leaves it out of the
        # group statistics too. vLLM's sequence-level importance weight multiplies in.
        sample_weight = inputs["pacs_scorable"].to(dtype) * (mask.sum(-1) > 0).to(dtype)  # (B,)
        is_ratio = inputs.get("importance_sampling_ratio")  # (B, 1) in the sequence modes
        if is_ratio is not None:
            sample_weight = sample_weight * is_ratio.reshape(is_ratio.size(0), -1)[:, 0].to(dtype)
        return sample_weight

    def _log_pacs_metrics(self, mode, loss, stats: dict, labels: torch.Tensor, fresh: bool, whole_step=False) -> None:
        """Log the PACS loss and `critic_metrics` of a micro-batch (`whole_step`: of an optimizer step); `stats`
        (`psi`, `counted`, `rewards`) and `labels` are whole groups gathered over processes. The within-group ranking
        pools the step's micro-batches (`pacs.critic`); `fresh`: the step is a generation's first."""
        metrics = self._metrics[mode]
        metrics["pacs/loss"].append(float(loss))
        if self.args.pacs_uniform_groups == "drop":  # the share of groups the loss left out
            mixed = stats["mixed"].view(-1, self.num_generations)[:, 0]  # (groups,)
            metrics["pacs/uniform_groups_dropped_frac"].append(1.0 - mixed.float().mean().item())
        # the samples whatever their class weight: with positive_only / negative_only, half of them weigh 0
        counted = stats["counted"]
        for key, value in critic_metrics(
            stats["psi"], labels, counted, stats["rewards"], self.num_generations
        ).items():
            metrics[key].append(value)
        self._critic_tally.add(ranking_sums(stats["psi"], labels, counted, self.num_generations))
        if whole_step or self.accelerator.sync_gradients:  # the step's last micro-batch
            fresh = fresh and not self._pacs_anchor.at_policy  # psi == 0 there by construction: nothing to measure
            for key, value in self._critic_tally.flush(fresh).items():
                metrics[key].append(value)


__all__ = ["PACSTrainer", "critic_metrics", "exchange_order", "shuffle_groups", "split_layout"]
