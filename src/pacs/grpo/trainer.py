"""`HardenedGRPOTrainer`: TRL's `GRPOTrainer` hardened for long runs, and the layer `PACSTrainer` is built on.

Nothing here is PACS: a GRPO run gets all of it (`pacs train --algorithm grpo`), and each piece could go to TRL as it
is. On top of `GRPOTrainer`, unchanged in its loss, generation and logging:

- **Checks before work** (`pacs.grpo.checks`): model path, config class, datasets against the reward functions'
  signatures, evaluation batch. **Guards while it runs** (`pacs.grpo.guards`): reward outputs, batches without a
  reward, non-finite gradient norms (skipped and counted; `pacs_max_skipped_steps` in a row stop the run).
- **Crash-safe, exact checkpoints** (`pacs.grpo.checkpoints`): fsynced files and a completion marker, mid-generation
  resume with the buffered rollout, no training past a finished run (`pacs.grpo.resume.resume_decision`, made once),
  TRL's prompt order in every epoch after a resume (`pacs.grpo.sampler`).
- **vLLM** (`pacs.grpo.vllm_sync`): the drift-free LoRA push, the stale-weights monitor, `pacs/is_*` metrics;
  **mixture-of-experts generation** without router logits (`_compat.no_router_logits`).
- **Dynamic sampling** (`dynamic_sampling`, `pacs.grpo.dynamic_sampling.DynamicSampling`, which the layer holds):
  generation batches of groups whose rewards differ, topped up with rounds of fresh prompts, with the old and
  reference log-probs and the counters of the batch that trains; `_per_token_logps` / `_logps_without_grad`: a batch's
  log-probs.
- **Padding-free forwards** (`padding_free`, `pacs.grpo.padding_free`): every forward packs its rows' real tokens,
  checked on first use against the rows forwarded one by one; `pacs/real_token_frac` shows the waste, on or off.
- **Rows balanced by tokens** (with `padding_free`, `pacs.grpo.balance`): each optimizer step's rows regrouped over its
  micro-batches so that their real tokens are even, at the step's first micro-batch (`compute_loss`), where the loss
  does not depend on the grouping (`_balance_unit`).

Each TRL method below is overridden here and nowhere else (`_compat.check_trl` checks at import that TRL still
has them). A subclass extends the named points instead; each receives what it acts on and returns what it adds, and
none reads another's data from the trainer. None runs before `GRPOTrainer.__init__` (what a subclass derives from
its config belongs to the config: its `__post_init__` checks it). In this order, for every generation batch of mode
`mode` ("train" / "eval", read once when the batch starts and passed to every point):

1. `_before_generation(mode)`: before the batch is generated (PACS: reset pi_ref when its schedule says so);
2. `_after_rewards(rewards_per_func, scorable, mode) -> columns`: right after the reward functions, with TRL's
   `(B_global, F)` rewards and which completions any function scored, before TRL turns them into advantages; returns
   per-row columns `{name: (B_global, ...) tensor}`, which this layer slices to the process's rows (TRL's slice) and
   attaches to the batch (PACS: the labels); with dynamic sampling it runs once per generation round, and
   `_sampling_signal(output, rewards_per_func, scorable)` then says, for the round's rows on this process, what must
   differ within a group and which rows count (PACS: the labels, over the rows its loss counts);
3. `_after_scoring(output, mode) -> output`: the batch as TRL generated and scored it (with dynamic sampling, as
   assembled from its rounds), with those columns, before this layer's monitors read it (PACS: pi_ref's log-probs and
   the rows' numbers, which ride with the batch);
4. `_after_monitors(output, mode) -> output`: last; returns the batch (this process's rows) to train or evaluate on
   (PACS: the split path's row exchange);

Points 1, 3 and 4 run once per generation batch whatever its number of rounds; TRL's generation, its per-call
metrics and point 2 once per round. At every checkpoint, `_save_extra_state(folder)` (after the checkpoint's own
files, before its completion marker, so a complete checkpoint has it) and `_load_extra_state(checkpoint)` (after the
optimizer and scheduler are restored).

The model's mode is the batch's from generation to the loss and the logs: TRL's continuous batching calls
`unwrapped_model.train()` after generating, even in evaluation, and TRL reads `model.training` again in
`_prepare_inputs`, `_compute_loss` and `log`, so this layer puts the mode back right after TRL's generation.
TRL's rollout buffer (a generation every `steps_per_generation * num_iterations` micro-batches, one buffered batch per
micro-batch) is read in one place: `_generate_every`, `_mid_generation`, `_optimizer_step_batches`, `_fresh_step`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import RepeatSampler

from . import dynamic_sampling as ds
from ._compat import check_trl, no_router_logits, only_tied_keys_missing
from .balance import balance_micro_batches
from .checkpoints import (
    COMPLETE_MARKER,
    ROLLOUT_DIR,
    TRAINER_STATE,
    load_rollout,
    missing_rank_files,
    rotate_after_marker,
    run_identity,
    save_rollout,
    sync_checkpoint_files,
    sync_own_files,
    write_complete_marker,
)
from .checks import (
    check_eval_batch,
    check_importance_sampling,
    check_model_path,
    check_padding_free,
    check_trainer_args,
    check_trainer_datasets,
)
from .config import HardenedGRPOConfig
from .guards import NonFiniteGradientGuard, UnlabeledBatchTracker, stopped_rank_error, validated_reward_func
from .metrics import group_outcome_shares
from .padding_free import VARLEN_ATTENTION, check_packing, packed_logps_and_entropies
from .resume import Resume, resume_decision
from .sampler import EpochRepeatSampler
from .terms import forward_inputs
from .vllm_sync import SamplingGapMonitor, add_read_timeout, importance_sampling_metrics, install_lora_push


check_trl()
logger = logging.getLogger(__name__)

__all__ = ["HardenedGRPOTrainer", "first_step_of_generation"]


def first_step_of_generation(micro_batch: int, accumulation: int, steps_per_generation: int, iterations: int) -> bool:
    """Whether micro-batch number `micro_batch` (0-based, TRL's `_step`) belongs to the first optimizer step after a
    generation: that step's completions are fresh (the policy has not trained on them).

    >>> [first_step_of_generation(k, 2, 4, 1) for k in range(6)]
    [True, True, False, False, True, True]
    """
    start = micro_batch - micro_batch % accumulation  # the optimizer step's first micro-batch
    return start % (steps_per_generation * iterations) < accumulation


class HardenedGRPOTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` with checks before work, runtime guards, crash-safe exact checkpoints, a drift-free LoRA push
    to vLLM and a stale-weights monitor (see the module docstring). Takes the same arguments as `GRPOTrainer`, with
    `args` a [`HardenedGRPOConfig`] (or a subclass: `_config_class`).

    Example:

    ```python
    from pacs.data import load_train_dataset
    from pacs.grpo import HardenedGRPOConfig, HardenedGRPOTrainer
    from pacs.rewards import math_reward

    trainer = HardenedGRPOTrainer(
        model="Qwen/Qwen3-4B-Base", reward_funcs=math_reward, args=HardenedGRPOConfig("qwen3-4b-grpo"),
        train_dataset=load_train_dataset("deepscaler"),
    )
    trainer.train(resume_from_checkpoint=True)  # the newest complete checkpoint, if any
    ```
    """

    _config_class: type = HardenedGRPOConfig
    _nonfinite_hint = "the loss"  # what the gradient guard's error tells to check first (a subclass names its own)

    def __init__(self, model, reward_funcs=None, args=None, **kwargs):
        if isinstance(model, str):
            check_model_path(model)  # "no such model directory", not transformers' "Repo id must be in the form"
        args = check_trainer_args(model, args, self._config_class, type(self).__name__, self._name)
        check_trainer_datasets(kwargs, reward_funcs, args)  # before the model loads or anything is generated
        check_padding_free(model, args)
        check_importance_sampling(args)  # TRL #6789: a warning
        super().__init__(model, reward_funcs, args=args, **kwargs)
        if args.padding_free and args.padding_free_max_tokens_per_row is not None and self.aux_loss_enabled:
            raise ValueError(
                "padding_free_max_tokens_per_row splits micro-batches into packed rows whose filler the MoE "
                "load-balancing loss would count; set padding_free_max_tokens_per_row: null (one packed row per "
                "micro-batch) or router_aux_loss_coef: 0.0."
            )
        self._packing_checked = False  # padding_free: the self-check runs on the first forward
        # NaN, strings or a bare scalar from a reward function: an error naming it, not a silent "skip"
        self.reward_funcs = [validated_reward_func(f) for f in self.reward_funcs]
        self._unlabeled_batches = UnlabeledBatchTracker()
        self._sampling_monitor = SamplingGapMonitor()
        self._resume: Resume | None = None  # the resume decision `train` read (`pacs.grpo.resume`)
        self._final_weights_loaded = False  # the run was finished, and `train` loaded its weights into the model
        self._batch_mode: str | None = None  # the mode of the generation batch being made
        # what `_calculate_rewards` scored inside TRL's generation call, until `_generate_round` returns it
        self._round_scores: tuple[torch.Tensor, torch.Tensor, dict] | None = None
        self._dynamic_sampling = ds.DynamicSampling(
            args.seed, args.shuffle_dataset, self.num_generations, args.dynamic_sampling_max_rounds
        )  # its stream, rounds, assembly, metrics and checkpoint file
        self._topup_view = None  # the training set as the Trainer's dataloader shows it (`remove_unused_columns`)
        self._train_sampler: EpochRepeatSampler | None = None  # TRL's order in every epoch (`pacs.grpo.sampler`)
        # the run identity its checkpoints record (`pacs.grpo.checkpoints.run_identity`): the model as it was given
        self._model_id = model if isinstance(model, str) else getattr(self.model.config, "_name_or_path", "")
        install_lora_push(self)  # LoRA weights to vLLM without the in-place merge that moves the base weights
        if args.use_vllm and args.vllm_mode == "server":  # TRL's client waits for ever on a hung server
            client = getattr(getattr(self, "vllm_generation", None), "vllm_client", None)
            add_read_timeout(client, args.vllm_server_read_timeout)

    @property
    def _mode(self) -> str:
        return "train" if self.model.training else "eval"

    def _record(self, mode: str, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)

    # extension points (see the module docstring), in the order they run --------------------------------------------
    def _before_generation(self, mode: str) -> None:
        """Before each generation batch of `mode` ("train" or "eval") is generated."""

    def _after_rewards(self, rewards_per_func: torch.Tensor, scorable: torch.Tensor, mode: str) -> dict:
        """Right after the reward functions: `rewards_per_func` `(B_global, F)`, NaN where a function gave `None`;
        `scorable` `(B_global,)`, False where every function did. Returns per-row columns `{name: (B_global, ...)}`
        (`{}` here; a subclass adds its own to `super()`'s), attached to the batch as this process's rows."""
        return {}

    def _after_scoring(self, output: dict, mode: str) -> dict:
        """The batch as TRL generated and scored it (this process's rows, with `_after_rewards`' columns), before the
        monitors: returns it."""
        return output

    def _after_monitors(self, output: dict, mode: str) -> dict:
        """Last, after the monitors: returns the batch (this process's rows) to train or evaluate on."""
        return output

    def _save_extra_state(self, folder: str) -> None:
        """A subclass's own state, on every process, after the checkpoint is written and before its marker."""

    def _load_extra_state(self, checkpoint: str) -> None:
        """Restores what `_save_extra_state` wrote, after the optimizer and scheduler are loaded."""

    # TRL's methods, each overridden here only ------------------------------------------------------------------------
    def create_optimizer(self, *args, **kwargs):
        # a step whose gradient norm is not finite is skipped and counted, not applied (`pacs.grpo.guards`)
        optimizer = super().create_optimizer(*args, **kwargs)
        NonFiniteGradientGuard.install(self, optimizer, self.args.pacs_max_skipped_steps, self._nonfinite_hint)
        return optimizer

    def evaluate(self, *args, **kwargs):
        W, G = self.accelerator.num_processes, self.num_generations_eval
        check_eval_batch(self.args.per_device_eval_batch_size, W, G)  # TRL's eval advantages need whole groups
        return super().evaluate(*args, **kwargs)

    def _get_train_sampler(self, dataset=None):
        # TRL's sampler and order, drawn by epoch: a resume in epoch e draws epoch e's order (`pacs.grpo.sampler`)
        sampler = super()._get_train_sampler(dataset)
        if isinstance(sampler, RepeatSampler):
            sampler = self._train_sampler = EpochRepeatSampler.from_sampler(sampler)
        return sampler

    def _init_training_state(self, *args, **kwargs):
        # transformers' own count of the epochs a resumed checkpoint trained: the sampler starts there, however deeply
        # accelerate wraps it (transformers' `set_epoch` misses it under a mid-epoch resume on several processes)
        epochs_trained, steps_in_epoch = super()._init_training_state(*args, **kwargs)
        if self._train_sampler is not None:
            self._train_sampler.set_epoch(epochs_trained)
        return epochs_trained, steps_in_epoch

    def _generate_single_turn(self, *args, **kwargs):
        training = self.model.training
        with no_router_logits(self.model):  # MoE generation with router logits fails (see `_compat`)
            result = super()._generate_single_turn(*args, **kwargs)
        if self.model.training != training:  # TRL's continuous batching calls `train()` after generating, even in eval
            self.model.train(training)
        return result

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # (B_glob, F)
        mode = self._batch_mode or self._mode
        scorable = ~torch.isnan(rewards_per_func).all(dim=1)  # (B_glob,), gathered: every process stops together
        if not (mode == "train" and self.args.dynamic_sampling):  # dynamic sampling counts its batch's rounds at once
            self._unlabeled_batches.update(int(scorable.sum()), scorable.numel(), mode)
        # all-wrong / all-right groups: the batch's reward sparsity, which TRL's frac_reward_zero_std does not separate
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)  # (B_glob,)
        G = self.num_generations if mode == "train" else self.num_generations_eval
        self._record(mode, group_outcome_shares(rewards, scorable, G))
        # TRL calls this inside its generation: `_generate_round` takes what was scored when that call returns
        self._round_scores = (rewards_per_func, scorable, self._after_rewards(rewards_per_func, scorable, mode))
        return rewards_per_func

    def _sampling_signal(self, output, rewards_per_func, scorable) -> tuple[torch.Tensor, torch.Tensor]:
        """With `dynamic_sampling`, for one round: each completion's value `(n,)` that must differ within a group, and
        which completions count `(n,)` bool, for this process's rows: `output` (the round's batch, with
        `_after_rewards`' columns), `rewards_per_func` `(n, F)` and `scorable` `(n,)` (NaN / False where no function
        scored). Here as TRL computes advantages: `dynamic_sampling_metric` "reward", the weighted reward sum over the
        scored completions, or one reward function's score where it gave one. The layer gathers them: a group is
        uniform when its counted values are equal (`pacs.grpo.dynamic_sampling.uniform_signal`)."""
        metric = self.args.dynamic_sampling_metric
        if metric == "reward":
            weights = self.reward_weights.to(rewards_per_func.device)
            return (rewards_per_func * weights).nansum(dim=1), scorable
        values = rewards_per_func[:, self.reward_func_names.index(metric)]
        return values, ~torch.isnan(values)

    def _generate_and_score_completions(self, inputs):
        # 1. the batch: TRL's generation and scoring (with dynamic sampling, its rounds and their assembly)
        mode = self._batch_mode = self._mode  # once, at the batch's start (see the module docstring)
        try:
            self._before_generation(mode)
            if mode == "train" and self.args.dynamic_sampling:
                output = self._dynamically_sampled(inputs)
            else:
                output = self._generate_round(inputs, mode)[0]
        finally:
            self._batch_mode = None
        # 2. the points after scoring, the monitors (vLLM's sampling log-probs vs the trainer's: `pacs.grpo.vllm_sync`)
        output = self._after_scoring(output, mode)
        self._record(mode, self._sampling_monitor(self, output, mode))
        output = self._after_monitors(output, mode)
        self._record(mode, importance_sampling_metrics(output, self.accelerator.gather))  # vLLM's correction
        return output

    def _generate_round(self, inputs, mode: str) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """TRL's generation and scoring of `inputs` (this process's rows): the batch, with `_after_rewards`' columns
        attached (this process's slice), and what the reward functions gave, `(B_glob, F)` and `(B_glob,)`."""
        self._round_scores = None
        output = super()._generate_and_score_completions(inputs)
        rewards_per_func, scorable, columns = self._round_scores
        self._round_scores = None
        n = output["prompt_ids"].size(0)  # this process's rows: TRL's slice of the gathered batch
        start = self.accelerator.process_index * n
        for key, column in columns.items():
            output[key] = column[start : start + n]
        return output, rewards_per_func, scorable

    # dynamic sampling (`pacs.grpo.dynamic_sampling`) ----------------------------------------------------------------
    def _dynamically_sampled(self, inputs) -> dict:
        """This process's rows of a dynamically sampled generation batch: round after round until enough groups differ
        or `dynamic_sampling_max_rounds` is reached, assembled; its counters and log-probs those of the rows it
        holds. One round whose groups all differ is the batch as TRL generated it."""
        accelerator, args = self.accelerator, self.args
        if self._topup_view is None:  # the columns the Trainer's dataloader keeps, so top-ups see what round 1 sees
            import datasets

            data = self.train_dataset
            is_table = isinstance(data, datasets.Dataset)  # the Trainer strips only these (`Trainer._get_dataloader`)
            self._topup_view = self._remove_unused_columns(data, description="dynamic sampling") if is_table else data
        seen_tokens = self.state.num_input_tokens_seen
        sampled = self._dynamic_sampling.generate(
            inputs, self._sampled_round, self._topup_view, accelerator.process_index, accelerator.num_processes,
            accelerator.gather, gather_object, self._tokenizer.pad_token_id,
        )  # fmt: skip
        rounds, output = sampled.rounds, sampled.output
        self._unlabeled_batches.update(sum(r.scored for r in rounds), sum(r.total for r in rounds), "train")
        if len(rounds) > 1 or not sampled.as_generated:  # TRL counted every round's tokens: the batch's instead
            tokens = ds.token_count(output, accelerator.gather, args.max_completion_length)
            self.state.num_input_tokens_seen = seen_tokens + tokens
            self._metrics["train"]["num_tokens"] = [self.state.num_input_tokens_seen]
        output = self._batch_logps(output, sampled.as_generated)
        table = sampled.table(self.num_generations)
        if table is not None:  # the completions table: the rows trained on (TRL's holds the last round's)
            for (group, name), values in table.items():
                column = self._logs[group] if name is None else self._logs[group][name]
                column.clear()
                column.extend(values)
        metrics = self._dynamic_sampling.metrics(sampled)
        self._metrics["train"]["pacs/ds/generated_completions"] = [metrics.pop("pacs/ds/generated_completions")]
        self._record("train", metrics)
        return output

    def _sampled_round(self, rows: list[dict]) -> tuple[dict, ds.Round]:
        # one round of a dynamically sampled batch: TRL's generation and scoring without the old and reference
        # log-probs TRL would compute of every row (`_batch_logps` computes them of the batch's rows), and which
        # groups are uniform by `_sampling_signal`, gathered so that every process agrees
        with self._round_without_logps():
            output, rewards_per_func, scorable = self._generate_round(rows, "train")
        n = output["prompt_ids"].size(0)
        start = self.accelerator.process_index * n
        mine = slice(start, start + n)
        values, valid = self._sampling_signal(output, rewards_per_func[mine], scorable[mine])  # (n,), (n,)
        both = self.accelerator.gather(torch.stack([values.float(), valid.float()], dim=1))  # (B_glob, 2)
        uniform = ds.uniform_signal(both[:, 0], both[:, 1] > 0, self.num_generations)  # (groups,)
        return output, ds.Round(uniform.cpu(), int(scorable.sum()), scorable.numel(), self._round_table())

    def _round_table(self) -> dict:
        # TRL's completions table of the round just generated: `_logs`' columns, each a deque of the last
        # generation_batch_size rows, keyed (column, None) or, for the per-function ones, (column, name)
        B, logs, table = self.args.generation_batch_size, self._logs, {}
        for group in ("prompt", "completion", "advantages", "images"):
            if len(logs[group]) == B:
                table[(group, None)] = list(logs[group])
        for group in ("rewards", "extra"):
            for name, values in logs[group].items():
                if len(values) == B:
                    table[(group, name)] = list(values)
        return table

    @contextlib.contextmanager
    def _round_without_logps(self):
        # TRL 1.16's `_generate_and_score_completions` computes the reference log-probs when `self.beta != 0`, and the
        # old ones (first) when its steps are misaligned or vLLM's importance sampling needs them: the ratio of that
        # round is computed there, so those stay; every other forward is left to the assembled batch
        beta, keep_old = self.beta, self.use_vllm and self.vllm_importance_sampling_correction
        self.beta = 0.0
        if not keep_old:
            self._get_per_token_logps_and_entropies = lambda *args, **kwargs: (None, None, None)
        try:
            yield
        finally:
            self.beta = beta
            self.__dict__.pop("_get_per_token_logps_and_entropies", None)

    def _batch_logps(self, output: dict, as_generated: bool) -> dict:
        """The old and reference log-probs TRL attaches (`old_per_token_logps`, `ref_per_token_logps`), of the
        assembled batch on its own layout: at unchanged weights they equal the policy's own in the loss."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        vllm_is = self.use_vllm and self.vllm_importance_sampling_correction
        batch_size = self.args.per_device_train_batch_size
        if self.args.gradient_accumulation_steps % generate_every != 0 or vllm_is:  # TRL's rule for old log-probs
            if not (as_generated and "old_per_token_logps" in output):
                output["old_per_token_logps"] = self._logps_without_grad(self.model, output, batch_size)
        if self.beta != 0.0:
            if self.ref_model is not None:
                output["ref_per_token_logps"] = self._logps_without_grad(self.ref_model, output, batch_size)
            else:  # PEFT: the base model (adapters off), or the adapter "ref" when one is loaded, as TRL
                from trl.trainer.utils import use_adapter

                model = self.accelerator.unwrap_model(self.model)
                with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                    output["ref_per_token_logps"] = self._logps_without_grad(self.model, output, batch_size)
        return output

    # checkpoints (`pacs.grpo.checkpoints`) ---------------------------------------------------------------------------
    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """`Trainer.train`, resuming from the newest *complete* checkpoint for `resume_from_checkpoint=True`.

        `resume_from_checkpoint` is the setting (`None`, `True`, `"auto"`, a folder), which this process's resume
        decision (`pacs.grpo.resume.resume_decision`) turns into a checkpoint; or that decision itself, a
        [`~pacs.grpo.resume.Resume`], made before the trainer was built (`pacs train` does). A checkpoint whose save
        was interrupted is skipped with a warning that says why; a named incomplete one, or another run's, is an error
        (`ResumeRefused`). A decision that the run is finished trains nothing: the state is the checkpoint's, the
        model gets the checkpoint's weights (what the script does next sees the final model; under DeepSpeed or FSDP,
        where no engine exists yet, it keeps the initial ones and says so), and `save_model` keeps the final model
        already in `output_dir`.
        """
        if not isinstance(resume_from_checkpoint, Resume):
            identity = run_identity(self._model_id, self.accelerator.num_processes, self.args)
            verbose = self.accelerator.is_main_process
            resume_from_checkpoint = resume_decision(resume_from_checkpoint, self.args, identity, verbose=verbose)
        self._resume = resume = resume_from_checkpoint
        self._final_weights_loaded = False
        if resume.finished:  # transformers would train one step past the end
            from transformers import TrainerState
            from transformers.trainer_utils import TrainOutput

            self.state = TrainerState.load_from_json(os.path.join(resume.checkpoint, TRAINER_STATE))
            self._final_weights_loaded = self._load_final_weights(resume.checkpoint)
            return TrainOutput(self.state.global_step, float("nan"), {})
        try:
            return super().train(
                resume_from_checkpoint=resume.checkpoint, trial=trial, ignore_keys_for_eval=ignore_keys_for_eval,
                **kwargs,
            )  # fmt: skip
        except RuntimeError as error:  # torch.distributed's errors too: a collective that timed out names the cause
            stopped = stopped_rank_error(error, self.args.ddp_timeout, self.accelerator.num_processes)
            if stopped is None:
                raise
            raise stopped from error

    def _load_final_weights(self, checkpoint: str) -> bool:
        # a finished run's model: the weights of its last checkpoint, as transformers loads them before resuming
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:  # loaded by the engine, which `train` never builds
            if self.accelerator.is_main_process:
                logger.warning(
                    "The run is finished; this trainer's model keeps its initial weights (under DeepSpeed or FSDP "
                    "they load with the engine). The final model is in %s.", self.args.output_dir,
                )  # fmt: skip
            return False
        self._load_from_checkpoint(checkpoint)
        return True

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """`Trainer.save_model`, except after `train` found the run finished: the final model already in
        `output_dir` is kept (and pushed by `push_to_hub`); saving to another folder writes the final weights `train`
        loaded, or is an error where it could not load them (DeepSpeed, FSDP)."""
        if self._resume is None or not self._resume.finished:
            return super().save_model(output_dir, _internal_call=_internal_call)
        finished = self._resume.checkpoint
        target = output_dir if output_dir is not None else self.args.output_dir
        if os.path.abspath(target) == os.path.abspath(self.args.output_dir):
            if self.accelerator.is_main_process:
                logger.info("Kept the final model in %s: this run was finished and trained nothing.", target)
            return None
        if self._final_weights_loaded:
            return super().save_model(output_dir, _internal_call=_internal_call)
        raise ValueError(
            f"Nothing was trained (the run had finished at {finished}), so this trainer holds the initial model, not "
            f"the trained one; copy the final model from {self.args.output_dir} or the weights of {finished} instead."
        )

    def _save_checkpoint(self, model, trial):
        # 1. mid-generation: each process saves its share of the buffered generation batch first, so that a folder
        #    with a trainer_state.json never lacks it; 2. the checkpoint itself (TRL: model card, model, optimizer,
        #    RNG states, trainer state) with rotation held back, then `_save_extra_state`; 3. once every process is
        #    done, every file fsynced and then the completion marker with their sizes, and only then the rotation, so
        #    that the newest complete checkpoint is never the one deleted.
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save:  # leftovers of an earlier, interrupted save of this step
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, COMPLETE_MARKER))
            shutil.rmtree(os.path.join(folder, ROLLOUT_DIR), ignore_errors=True)
        self.accelerator.wait_for_everyone()
        mid_generation = self._mid_generation
        if mid_generation:
            size = save_rollout(
                folder, self.accelerator.process_index, self.accelerator.num_processes, self._step,
                self.state.global_step, self._buffered_inputs,
            )  # fmt: skip
            logger.debug("Saved %d bytes of buffered rollout to %s", size, folder)
        limit = self.args.save_total_limit
        self.args.save_total_limit = None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        self._save_extra_state(folder)
        if self.args.dynamic_sampling and self.args.should_save:  # the same on every process: one file
            self._dynamic_sampling.save(folder)
        sync_own_files(folder)  # each process (each machine) flushes what it wrote before anyone vouches for it
        self.accelerator.wait_for_everyone()
        if self.args.should_save:  # every process has closed its files: sync them, then the marker with their sizes
            W = self.accelerator.num_processes
            missing = missing_rank_files(folder, W)
            if missing:  # the other machines wrote theirs elsewhere: no complete checkpoint can exist here
                raise RuntimeError(
                    f"{folder} lacks {', '.join(missing)}, written by the other processes: output_dir is not shared "
                    "between the machines. Put output_dir on a filesystem every machine mounts at the same path "
                    "(docs/recipes.md, 'Multi-node and failures')."
                )
            write_complete_marker(
                folder, files=sync_checkpoint_files(folder), global_step=self.state.global_step, world_size=W,
                rollout=mid_generation, run=run_identity(self._model_id, W, self.args),
            )  # fmt: skip
            rotate_after_marker(
                run_dir, self.args.save_total_limit, self.state.best_model_checkpoint,
                getattr(self, "_rotate_checkpoints", None),
            )  # fmt: skip
        self.accelerator.wait_for_everyone()  # no process trains on before the checkpoint is complete

    def _issue_warnings_after_load(self, load_result):
        # a tied `lm_head.weight` that the checkpoint stores once is not missing: tie it, no warning (`_compat`)
        missing = getattr(load_result, "missing_keys", None)
        if hasattr(load_result, "_replace") and only_tied_keys_missing(self.model, missing):
            self.model.tie_weights()
            load_result = load_result._replace(missing_keys=[])
        super()._issue_warnings_after_load(load_result)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        self._load_extra_state(checkpoint)
        if self.args.dynamic_sampling:
            self._dynamic_sampling.load(checkpoint)
        rollout = load_rollout(
            checkpoint, self.accelerator.process_index, self.accelerator.num_processes, self.accelerator.device
        )
        if rollout is not None:  # continue the saved generation batch instead of generating a new one
            self._buffered_inputs, self._step = rollout["buffered_inputs"], rollout["step"]
            if self.accelerator.is_main_process:
                left = self._generate_every - self._step % self._generate_every
                logger.info("Resuming inside a generation batch: %d micro-batch(es) of it left.", left)

    # TRL's rollout buffer (`GRPOTrainer._prepare_inputs`): its arithmetic, in one place -------------------------------
    @property
    def _generate_every(self) -> int:
        """Micro-batches between two generations (GRPOTrainer's `steps_per_generation * num_iterations`)."""
        return self.args.steps_per_generation * self.num_iterations

    @property
    def _mid_generation(self) -> bool:
        """Part of the buffered generation batch is still to be trained on."""
        return self._buffered_inputs is not None and self._step % self._generate_every != 0

    def _optimizer_step_batches(self) -> tuple[list[dict], int]:
        """The buffered micro-batches of the optimizer step that micro-batch `_step` belongs to, and `_step`'s position
        among them (0: the step's first). GRPOTrainer trains on `_buffered_inputs[_step % steps_per_generation]`."""
        GA, S, step = self.current_gradient_accumulation_steps, self.args.steps_per_generation, self._step
        first = (step - step % GA) % S  # this optimizer step's first micro-batch in the buffer
        return self._buffered_inputs[first : first + GA], step % GA

    def _balance_unit(self) -> int | None:
        """With `padding_free`: the rows that stay together when each optimizer step's rows are regrouped over its
        micro-batches so that their real tokens are even (`pacs.grpo.balance`; 1: any row anywhere); `None`: today's
        grouping. Regrouping keeps the step's gradient only where the loss does not depend on which rows share a
        micro-batch, so these keep it: `loss_type="bnpo"` (normalised by each micro-batch's tokens),
        `top_entropy_quantile` < 1 (a quantile over each micro-batch), an entropy bonus (a mean over each
        micro-batch's tokens) and the auxiliary loss of a mixture-of-experts model (per micro-batch). A subclass whose
        loss needs whole groups in a micro-batch returns their size (PACS)."""
        args = self.args
        if not getattr(args, "padding_free", False):
            return None
        partition_dependent = (
            args.loss_type == "bnpo"
            or self.top_entropy_quantile < 1.0
            or args.entropy_coef != 0.0
            or args.use_adaptive_entropy
            or self.aux_loss_enabled
        )
        return None if partition_dependent else 1

    def _balanced_step(self, inputs: dict) -> dict:
        """At an optimizer step's first micro-batch on its first pass: the step's buffered micro-batches regrouped by
        tokens (`_balance_unit`), written back to the buffer; returns the micro-batch to train on now. Deterministic
        in the buffer, so a resumed run regroups as the interrupted one did."""
        unit = self._balance_unit()
        GA, S = self.current_gradient_accumulation_steps, self.args.steps_per_generation
        # a step that spans two generation batches (S not a multiple of GA), or a later pass over the buffer
        # (num_iterations > 1: already regrouped), keeps its micro-batches
        if unit is None or GA < 2 or S % GA != 0 or self._step % self._generate_every >= S:
            return inputs
        batches, position = self._optimizer_step_batches()
        if position != 0 or batches[0] is not inputs:
            return inputs
        first = self._step % S
        self._buffered_inputs[first : first + GA] = balanced = balance_micro_batches(batches, unit)
        return balanced[0]

    def _fresh_step(self) -> bool:
        """Whether micro-batch `_step` belongs to the first optimizer step after a generation (see
        [`first_step_of_generation`])."""
        GA, S = self.current_gradient_accumulation_steps, self.args.steps_per_generation
        return first_step_of_generation(self._step, GA, S, self.num_iterations)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # with `padding_free`, each optimizer step's rows balanced by tokens over its micro-batches, once per step
        if self.model.training:
            inputs = self._balanced_step(inputs)
        return super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )

    # a batch's log-probs, as GRPOTrainer computes them, padded or packed (`padding_free`) ----------------------------
    def _logps_without_grad(self, model, batch: dict, batch_size: int | None = None) -> torch.Tensor:
        """Per-token log-probs `(B, T)` of `batch`'s completion tokens under `model`, as GRPOTrainer computes its old
        and reference log-probs: without grad and without activation checkpointing (which a forward without grad does
        not need, and which warns with use_reentrant=True)."""
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            return self._per_token_logps(model, batch, batch_size=batch_size)[0]

    def _per_token_logps(self, model, inputs, **kwargs):
        """`(logps, entropies, aux_loss)` of `inputs`' completion tokens under `model`, as GRPOTrainer computes them."""
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        return self._get_per_token_logps_and_entropies(
            model,
            torch.cat([prompt_ids, completion_ids], dim=1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
            completion_ids.size(1),  # logits_to_keep: only the completion tokens
            **kwargs,
            **forward_inputs(inputs),
        )

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal,
    ):
        """GRPOTrainer's, or with `padding_free` the same outputs from packed forwards
        (`pacs.grpo.padding_free.packed_logps_and_entropies`), checked on first use. Every forward of the layer and of
        PACS (training, old and reference log-probs, pi_ref, the split path) comes here. The loss's forward
        (`compute_entropy`) logs `pacs/real_token_frac`: real tokens / positions the backbone computed, on or off."""
        args = self.args
        if not args.padding_free:
            outputs = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **multimodal,
            )  # fmt: skip
            positions = input_ids.numel()
        else:
            if any(value is not None for value in multimodal.values()):
                raise ValueError("padding_free does not support vision-language inputs; set padding_free: false.")
            attn = getattr(self.accelerator.unwrap_model(model).config, "_attn_implementation", None) or "sdpa"
            packing = {
                "max_tokens_per_row": args.padding_free_max_tokens_per_row,
                "varlen": attn in VARLEN_ATTENTION,
                "autocast": self.accelerator.autocast,
            }
            if not self._packing_checked:  # the same forwards on every process (ZeRO-3)
                half = args.bf16 or args.fp16 or next(model.parameters()).dtype in (torch.bfloat16, torch.float16)
                check_packing(  # in eval mode: no dropout, no activation checkpointing
                    model, input_ids, attention_mask, attn_implementation=attn, tolerance=5e-2 if half else 1e-3,
                    **packing,
                )  # fmt: skip
                self._packing_checked = True
            *outputs, positions = packed_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **packing,
            )  # fmt: skip
        if compute_entropy:  # the loss's forward, once per micro-batch on every process
            counts = torch.tensor(
                [attention_mask.sum().item(), positions], device=input_ids.device, dtype=torch.float64
            )
            real, computed = self.accelerator.gather(counts).view(-1, 2).sum(0).tolist()
            self._metrics[self._mode]["pacs/real_token_frac"].append(real / max(computed, 1.0))
        return tuple(outputs)
