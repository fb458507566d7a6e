"""`PACSTrainer`: TRL's `GRPOTrainer` with the PACS loss.

PACS (https://arxiv.org/abs/2509.02522) treats RLVR as supervised learning: the verifiable reward of each completion
is a label, and the policy's own group-relative log-ratio score $\\psi$ is the logit that predicts it, so the policy
is actor and critic at once (see `pacs.loss`).

The only change w.r.t. `GRPOTrainer` is the loss; generation (transformers, vLLM colocate or server), reward
functions, reference model / KL, PEFT, DeepSpeed and logging are inherited unchanged. Three narrow overrides carry what
the loss needs:

1. `_calculate_rewards` keeps each completion's label (the `reward_weights`-weighted sum of the reward functions,
   each mapped by `pacs_label_transform`), checked to lie in [0, 1]; `_generate_and_score_completions` attaches this
   process's slice of the labels.
2. `_prepare_inputs` shuffles the generation batch by whole groups instead of by rows, so that a micro-batch (or,
   when `per_device_train_batch_size` is not a multiple of `num_generations`, an optimizer step) holds whole groups.
3. `_compute_loss` evaluates `pacs_loss` (plus TRL's KL term when `beta > 0` and its entropy bonus) and logs the
   implicit critic. When groups are split over micro-batches and processes, it backpropagates
   sum_i c_i r_i with the closed-form whole-group coefficients c = dL/dr of the optimizer step
   (`pacs.loss.pacs_coefficients`): the exact whole-group gradient.

The user's data, reward functions and model path are checked before anything loads or generates (`pacs.checks`).
Checkpoints are marked complete once every process has saved, and a checkpoint in the middle of a generation batch
carries that batch, so `resume_from_checkpoint=True` takes the newest complete one and continues exactly
(`pacs.checkpoints`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import shutil
from collections.abc import Sequence

import torch
import torch.nn.functional as F
import trl
from packaging.version import Version
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOConfig, GRPOTrainer
from trl.trainer import grpo_trainer as _grpo_module
from trl.trainer.utils import get_config_model_id

from .checkpoints import (
    COMPLETE_MARKER,
    ROLLOUT_DIR,
    load_rollout,
    resolve_resume_checkpoint,
    save_rollout,
    write_complete_marker,
)
from .checks import UnlabeledBatchTracker, check_model_path, check_train_dataset, validated_reward_func
from .config import PACSConfig
from .labels import reward_to_label
from .loss import compute_reward_proxy, pacs_coefficients, pacs_loss


logger = logging.getLogger(__name__)

_TRL_RANGE = (Version("1.15"), Version("2"))
_OVERRIDDEN = (
    "_calculate_rewards",
    "_generate_and_score_completions",
    "_generate_single_turn",
    "_prepare_inputs",
    "_compute_loss",
    "_save_checkpoint",
    "_load_optimizer_and_scheduler",
)
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


def split_layout(
    per_device_batch: int, grad_accum: int, steps_per_generation: int, world_size: int, num_generations: int
) -> str:
    """How the split path keeps every optimizer step made of whole groups, or a `ValueError` naming a valid setting.

    Used when `per_device_batch` is not a multiple of `num_generations` (a micro-batch holds part of a group). Each
    process generates a contiguous slice of the generation batch (TRL's layout, which vLLM server mode relies on).
    Returns:

    - `"local"`: the step spans the whole generation batch (`steps_per_generation == gradient_accumulation_steps`;
      groups may span processes), or each process's share of it (`per_device_batch * grad_accum` rows) is a whole
      number of groups: the rows stay where they were generated.
    - `"exchange"`: only the step over all processes holds whole groups (`world_size * per_device_batch * grad_accum`
      rows, e.g. 8 GPUs with one row each and groups of 8, several optimizer steps per generation): after each
      generation the rows are redistributed once (one all-gather of the generation batch) so that every process holds
      its share of every step's groups.

    >>> split_layout(1, 8, 32, 1, 8)  # one GPU, 8 micro-batches of 1 per optimizer step, 4 steps per generation
    'local'
    >>> split_layout(1, 1, 4, 8, 8)  # 8 GPUs x 1 row: a group per optimizer step, spread over the 8 processes
    'exchange'
    """
    P, GA, S, W, G = per_device_batch, grad_accum, steps_per_generation, world_size, num_generations
    if S % GA != 0:
        raise ValueError(
            f"per_device_train_batch_size ({P}) is not a multiple of num_generations ({G}), so groups are split over "
            f"micro-batches; then every optimizer step must lie within one generation batch: steps_per_generation "
            f"({S}) must be a multiple of gradient_accumulation_steps ({GA}), e.g. steps_per_generation={4 * GA}."
        )
    if S == GA or (P * GA) % G == 0:
        return "local"
    if (W * P * GA) % G == 0:
        return "exchange"
    ga = G // math.gcd(W * P, G)  # smallest accumulation that makes W * P * GA a multiple of G
    raise ValueError(
        f"{W} process(es) x per_device_train_batch_size={P} x gradient_accumulation_steps={GA} = {W * P * GA} rows per "
        f"optimizer step do not hold whole groups of num_generations={G}. Use gradient_accumulation_steps={ga} (with "
        f"steps_per_generation={4 * ga} for 4 optimizer steps per generation), or steps_per_generation={GA} (one "
        "optimizer step per generation; num_iterations > 1 for off-policy steps)."
    )


def exchange_order(rows_per_process: int, world_size: int, rows_per_step: int, num_generations: int) -> torch.Tensor:
    """For `"exchange"` layouts: which rows of the gathered generation batch each process trains on, in order.

    Optimizer step j takes the groups j*q .. (j+1)*q - 1 of the generation batch (q groups per step; the prompts are
    already in random order, TRL's sampler shuffles them), and process p takes rows p*M .. (p+1)*M - 1 of them
    (M = `rows_per_step` per process). Row `g*G + i` is completion i of group g, as TRL gathers them.

    Returns:
        `torch.Tensor` of shape `(world_size, rows_per_process)`: row `p` lists, step by step, process p's rows.

    >>> exchange_order(4, 2, 2, 4).tolist()  # 2 processes, 2 groups of 4, 2 optimizer steps of 1 group each
    [[0, 1, 4, 5], [2, 3, 6, 7]]
    """
    n, W, M = rows_per_process, world_size, rows_per_step
    steps = n // M
    return torch.arange(W * n).view(steps, W, M).transpose(0, 1).reshape(W, n)


@contextlib.contextmanager
def _group_shuffle(group_size: int):
    # GRPOTrainer._prepare_inputs shuffles the generation batch row by row through this module-level name; swapping
    # it for the group-preserving twin while the parent method runs keeps groups whole without copying the method.
    # group_size None: no shuffle at all
    original = _grpo_module.shuffle_sequence_dict
    keep = lambda seq_dict: seq_dict  # noqa: E731
    _grpo_module.shuffle_sequence_dict = (
        keep if group_size is None else functools.partial(shuffle_groups, group_size=group_size)
    )
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
        if isinstance(model, str):
            check_model_path(model)  # "no such model directory", not transformers' "Repo id must be in the form"
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
        # Split path: a micro-batch holds part of a group (see `_split_step_coefficients`)
        self._pacs_layout = None
        if args.per_device_train_batch_size % args.num_generations != 0:
            self._pacs_layout = split_layout(
                args.per_device_train_batch_size, args.gradient_accumulation_steps, args.steps_per_generation,
                args.world_size, args.num_generations,
            )  # fmt: skip
        self._pacs_split_coef: torch.Tensor | None = None  # (generation_batch_size,) c of the current optimizer step
        self._pacs_split_loss: torch.Tensor | None = None
        # The user's data against the reward functions, before the model loads or anything is generated
        for name in ("train_dataset", "eval_dataset"):
            data = kwargs.get(name)
            for key, dataset in data.items() if isinstance(data, dict) else [(None, data)]:
                check_train_dataset(
                    dataset, reward_funcs, name=name if key is None else f"{name}[{key!r}]",
                    remove_unused_columns=args.remove_unused_columns, rollout_func=kwargs.get("rollout_func"),
                    environment_factory=kwargs.get("environment_factory"),
                )  # fmt: skip
        super().__init__(model, reward_funcs, args=args, **kwargs)
        # NaN, strings or a bare scalar from a reward function: an error naming it, not a silent "skip"
        self.reward_funcs = [validated_reward_func(f) for f in self.reward_funcs]
        self._unlabeled_batches = UnlabeledBatchTracker()

    @property
    def _pacs_split(self) -> bool:
        """A micro-batch holds part of a group (see `_split_step_coefficients`)."""
        return self._pacs_layout is not None

    def evaluate(self, *args, **kwargs):
        self._check_eval_batch()
        return super().evaluate(*args, **kwargs)

    def _check_eval_batch(self) -> None:
        # GRPOTrainer computes its group advantages in evaluation too: the eval batch over all processes must hold
        # whole groups of num_generations_eval (the PACS loss itself needs none, see `_compute_loss`).
        G, W = self.num_generations_eval, self.accelerator.num_processes
        batch = self.args.per_device_eval_batch_size
        if (W * batch) % G != 0:
            valid = [b for b in range(1, 4 * G + 1) if (W * b) % G == 0][:3]
            raise ValueError(
                f"per_device_eval_batch_size ({batch}) x {W} process(es) must be a multiple of num_generations_eval "
                f"({G}) so that TRL's evaluation sees whole groups; use per_device_eval_batch_size in {valid} or "
                "set num_generations_eval."
            )

    def _generate_single_turn(self, *args, **kwargs):
        # Mixture-of-experts checkpoints whose config says `output_router_logits=True` (as TRL's SFTTrainer saves them)
        # compute the load-balancing loss in every forward, `generate`'s included. There, each cached decoding step
        # has router logits for one new token per row but the attention mask of the whole sequence, and transformers'
        # `load_balancing_loss_func` fails on their shapes as soon as the mask is kept, i.e. the prompts of the batch
        # differ in length (several groups: PACS's 4 optimizer steps per generation). Generation needs no router
        # logits; the update still gets its auxiliary loss (`_compute_loss` asks for it explicitly).
        with _no_router_logits(self.model):
            return super()._generate_single_turn(*args, **kwargs)

    # checkpoints: crash-safe, and exact to resume in the middle of a generation batch (`pacs.checkpoints`) -------
    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """`Trainer.train`, resuming from the newest *complete* checkpoint for `resume_from_checkpoint=True`.

        A checkpoint whose save was interrupted (no `pacs_checkpoint_complete.json`) is skipped with a warning that
        says why; a named incomplete one is an error (see `pacs.checkpoints`).
        """
        resume = resolve_resume_checkpoint(
            resume_from_checkpoint, self.args.output_dir, verbose=self.accelerator.is_main_process
        )
        return super().train(
            resume_from_checkpoint=resume, trial=trial, ignore_keys_for_eval=ignore_keys_for_eval, **kwargs
        )

    def _save_checkpoint(self, model, trial):
        # 1. mid-generation: each process saves its share of the buffered generation batch first, so that a folder
        #    with a trainer_state.json never lacks it; 2. the checkpoint itself (TRL: model card, model, optimizer,
        #    RNG states, trainer state) with rotation held back; 3. once every process is done, the completion marker,
        #    and only then the rotation, so that the newest complete checkpoint is never the one deleted.
        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save:  # leftovers of an earlier, interrupted save of this step
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, COMPLETE_MARKER))
            shutil.rmtree(os.path.join(folder, ROLLOUT_DIR), ignore_errors=True)
        self.accelerator.wait_for_everyone()
        mid_generation = self._buffered_inputs is not None and self._step % self._generate_every != 0
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
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            write_complete_marker(
                folder, global_step=self.state.global_step, world_size=self.accelerator.num_processes,
                rollout=mid_generation,
            )  # fmt: skip
            _rotate_checkpoints(self, run_dir)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        rollout = load_rollout(
            checkpoint, self.accelerator.process_index, self.accelerator.num_processes, self.accelerator.device
        )
        if rollout is not None:  # continue the saved generation batch instead of generating a new one
            self._buffered_inputs, self._step = rollout["buffered_inputs"], rollout["step"]
            if self.accelerator.is_main_process:
                left = self._generate_every - self._step % self._generate_every
                logger.info("Resuming inside a generation batch: %d micro-batch(es) of it left.", left)

    @property
    def _generate_every(self) -> int:
        """Micro-batches between two generations (GRPOTrainer's `steps_per_generation * num_iterations`)."""
        return self.args.steps_per_generation * self.num_iterations

    # 1. labels -------------------------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # (B_glob, F)
        args = self.args
        labels_per_func = reward_to_label(
            rewards_per_func, args.pacs_label_transform, args.pacs_label_temperature, args.pacs_label_offset
        )  # (B_glob, F), each function's score mapped to [0, 1] (identity for "none")
        weights = self.reward_weights.to(rewards_per_func.device)
        scorable = ~torch.isnan(rewards_per_func).all(dim=1)  # (B_glob,)
        # gathered counts, so every process warns or stops together
        self._unlabeled_batches.update(
            int(scorable.sum()), scorable.numel(), "train" if self.model.training else "eval"
        )
        labels = (labels_per_func * weights.unsqueeze(0)).nansum(dim=1)  # (B_glob,)
        bad = scorable & ((labels < 0) | (labels > 1) | ~torch.isfinite(labels))
        if bad.any():
            raise self._label_range_error(int(bad.nonzero()[0]), rewards_per_func, labels_per_func, labels, weights)
        self._pacs_labels, self._pacs_scorable = labels, scorable
        self._log_rollout_labels(labels, scorable)
        # TRL logs `reward` and `rewards/<function>/mean` from what this returns: the raw scores, not the labels
        return rewards_per_func

    def _label_range_error(self, row, rewards_per_func, labels_per_func, labels, weights) -> ValueError:
        transform = self.args.pacs_label_transform
        parts = ", ".join(
            f"{name}={rewards_per_func[row, i].item():g}"
            + (f" -> label {labels_per_func[row, i].item():g}" if transform != "none" else "")
            + f" (weight {weights[i].item():g})"
            for i, name in enumerate(self.reward_func_names)
        )
        return ValueError(
            f"PACS uses the reward as a label and needs it in [0, 1], but completion {row} of this batch got "
            f"{labels[row].item():g} from the reward functions {parts} with pacs_label_transform={transform!r}. For a "
            "learned reward model or any unbounded score, set pacs_label_transform='sigmoid' (label "
            "sigmoid((score - pacs_label_offset) / pacs_label_temperature)) or 'clip'; otherwise make the reward "
            "functions return values in [0, 1] (e.g. 1.0 correct / 0.0 wrong). The reward_weights must be >= 0 and "
            f"sum to at most 1, e.g. reward_weights={[round(1 / len(weights), 4)] * len(weights)}."
        )

    def _log_rollout_labels(self, labels: torch.Tensor, scorable: torch.Tensor) -> None:
        # labels are already gathered over processes (TRL gathers the rewards), so this needs no collective
        mode = "train" if self.model.training else "eval"
        count = scorable.sum().clamp(min=1)
        mean = (labels * scorable).sum() / count
        self._metrics[mode]["pacs/rollout_label_mean"].append(mean.item())
        std = (((labels - mean) ** 2 * scorable).sum() / count).sqrt()
        self._metrics[mode]["pacs/rollout_label_std"].append(std.item())

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        n = output["prompt_ids"].size(0)  # this process's rows, in the order of the gathered rewards
        start = self.accelerator.process_index * n
        local = slice(start, start + n)
        output["pacs_labels"] = self._pacs_labels[local]  # (B,)
        output["pacs_scorable"] = self._pacs_scorable[local].float()  # (B,)
        # Row number in the gathered generation batch, where rows g*G .. g*G+G-1 are one prompt's group: it lets the
        # split path reassemble groups whatever the shuffle and the micro-batch and process boundaries.
        output["pacs_index"] = torch.arange(start, start + n, device=output["prompt_ids"].device)  # (B,)
        if self._pacs_layout == "exchange" and self.model.training:
            output = self._exchange_rows(output)
        is_ratio = output.get("importance_sampling_ratio")
        if is_ratio is not None:  # vLLM correction: how much of the batch it drops (mask modes) and its mean ratio
            mode = "train" if self.model.training else "eval"
            ratio = self.accelerator.gather(is_ratio.reshape(n, -1)[:, 0])  # (B_world,) sequence-level ratio
            kept = ratio > 0
            self._metrics[mode]["pacs/is_masked_frac"].append((~kept).float().mean().item())
            self._metrics[mode]["pacs/is_ratio_mean"].append(ratio[kept].mean().item() if kept.any() else 0.0)
        return output

    def _exchange_rows(self, output: dict) -> dict:
        """Redistribute the generation batch over processes so that each optimizer step holds whole groups.

        One all-gather of the batch (its token ids, masks and per-token log-probabilities), then each process keeps
        its rows of `exchange_order`; tensors are padded to the widest process first (prompts on the left).
        """
        unsupported = [key for key in _MULTIMODAL_KEYS if output.get(key) is not None]
        if unsupported:
            raise ValueError(
                f"Groups split over processes with rows exchanged between them do not support {unsupported}; use a "
                "gradient_accumulation_steps that makes per_device_train_batch_size x gradient_accumulation_steps a "
                "multiple of num_generations."
            )
        n = output["prompt_ids"].size(0)
        pad_id = self._tokenizer.pad_token_id
        M = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps
        order = exchange_order(n, self.accelerator.num_processes, M, self.num_generations)
        mine = order[self.accelerator.process_index].to(output["prompt_ids"].device)  # (n,)
        exchanged = {}
        for key, value in output.items():
            if not (isinstance(value, torch.Tensor) and value.dim() >= 1 and value.size(0) == n):
                exchanged[key] = value  # scalars (num_items_in_batch) and the like
                continue
            if value.dim() >= 2:
                pad = pad_id if key.endswith("_ids") else (1 if key == "tool_mask" else 0)
                value = self.accelerator.pad_across_processes(
                    value, dim=1, pad_index=pad, pad_first=key.startswith("prompt")
                )
            exchanged[key] = self.accelerator.gather(value)[mine]
        return exchanged

    # 2. whole groups -------------------------------------------------------------------------------------------
    def _prepare_inputs(self, generation_batch):
        if self._pacs_layout == "exchange":
            # rows already in optimizer-step order (`_exchange_rows`): keep it
            with _group_shuffle(None):
                return super()._prepare_inputs(generation_batch)
        if self._pacs_split and self.args.steps_per_generation == self.args.gradient_accumulation_steps:
            # one optimizer step per pass over the generation batch: it holds whole groups whatever the row order,
            # so TRL's row shuffle stays (groups may then also span processes, which `pacs_index` handles)
            return super()._prepare_inputs(generation_batch)
        with _group_shuffle(self.num_generations):
            inputs = super()._prepare_inputs(generation_batch)
        return inputs

    # 3. the loss -----------------------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        mask = self._loss_mask(inputs)  # (B, T)
        split = mode == "train" and self._pacs_split
        if split:  # before this micro-batch's graph exists: the step's extra forward then adds no peak memory
            coef, step_loss = self._split_step_coefficients(inputs)  # (B,), ()
        per_token_logps, entropies, aux_loss = self._per_token_logps(
            model, inputs, compute_entropy=True, compute_aux_loss=self.aux_loss_enabled
        )  # (B, T), (B, T)
        if not self._entropy_bonus_enabled:
            entropies = entropies.detach()  # only logged: keep no graph for it
        old_per_token_logps = inputs.get("old_per_token_logps")  # None when on-policy: the proxy detaches
        sample_weight = self._sample_weight(inputs, mask, per_token_logps.dtype)  # (B,)

        if mode == "eval":
            # No update between sampling and scoring, so psi == 0 and every BCE term is log 2 by construction; the
            # loss needs no groups (any per_device_eval_batch_size, num_generations_eval=1 included).
            labels = inputs["pacs_labels"].to(per_token_logps.dtype)
            loss = F.binary_cross_entropy_with_logits(torch.zeros_like(labels), labels)
            pacs_value = loss.detach()
        elif split:
            # Groups cut by this micro-batch: backpropagate sum_i c_i r_i with the whole-group coefficients c of this
            # optimizer step (see `_split_step_coefficients`). The factors undo the averaging over processes and the
            # division by gradient_accumulation_steps below, which c already contains.
            rewards = compute_reward_proxy(
                per_token_logps, old_per_token_logps, mask, self.args.pacs_beta, self.args.pacs_reward_proxy
            )  # (B,) with grad
            scale = self.accelerator.num_processes * self.current_gradient_accumulation_steps
            surrogate = scale * (coef.to(rewards.dtype) * rewards).sum()
            # value: this micro-batch's share of the step's PACS loss; gradient: the exact whole-group gradient
            loss = surrogate - surrogate.detach() + step_loss
            pacs_value = step_loss
        else:
            loss, stats = pacs_loss(
                per_token_logps,
                old_per_token_logps,
                mask,
                inputs["pacs_labels"],
                self.num_generations,
                beta=self.args.pacs_beta,
                reward_proxy=self.args.pacs_reward_proxy,
                score=self.args.pacs_score,
                class_weight=self.args.pacs_class_weight,
                sample_weight=sample_weight,
            )
            pacs_value = loss.detach()
            gather = self.accelerator.gather
            self._log_pacs_metrics(
                mode, gather(pacs_value).mean(), gather(stats["psi"]), gather(inputs["pacs_labels"]),
                gather(stats["weights"]), self.num_generations,
            )  # fmt: skip

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
        if self._entropy_bonus_enabled:
            loss = loss - self._entropy_bonus(mode, entropies, mask)
            self._metrics[mode]["policy_loss"].append(self.accelerator.gather(pacs_value).mean().item())
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / normalizer
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather(aux_loss.detach()).mean().item())

        if mode == "eval":  # the critic metrics carry no information here (psi == 0); the labels do
            labels, valid = self.accelerator.gather(inputs["pacs_labels"]), self.accelerator.gather(sample_weight > 0)
            self._metrics[mode]["pacs/label_mean"].append(labels[valid].mean().item() if valid.any() else 0.0)
        self._log_token_metric(mode, "entropy", entropies, mask)
        if self.beta != 0.0:
            self._log_token_metric(mode, "kl", per_token_kl, mask)
        return loss

    def _per_token_logps(self, model, inputs, **kwargs):
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        return self._get_per_token_logps_and_entropies(
            model,
            torch.cat([prompt_ids, completion_ids], dim=1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
            completion_ids.size(1),  # logits_to_keep: only the completion tokens
            **kwargs,
            **{key: inputs.get(key) for key in _MULTIMODAL_KEYS},
        )

    @staticmethod
    def _loss_mask(inputs) -> torch.Tensor:
        # completion tokens that count: tool output (multi-turn) is not the policy's
        mask = inputs["completion_mask"]
        return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask  # (B, T)

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

    def _split_step_coefficients(self, inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Coefficients c_i = dL/dr_i of this optimizer step's whole groups for the rows of `inputs`, and the loss
        share of one micro-batch.

        At the first micro-batch of an optimizer step: (1) take r of every row of the step on this process: r = 0 on
        the first optimizer step after a generation (the policy is still the sampling policy, so the log-ratio is 0
        and no forward is needed), else (and always with `pacs_reward_proxy="mean_logp"`) one forward without grad
        over the step's micro-batches; (2) gather r, labels
        and weights of all processes and reorder them by `pacs_index` into whole groups; (3) compute c in closed form
        (`pacs_coefficients`) over all rows of the step, normalised by their number as the whole-group path is;
        (4) log the critic metrics over those whole groups. Later micro-batches of the step look their c up.
        """
        GA = self.current_gradient_accumulation_steps
        if self._step % GA == 0 or self._pacs_split_coef is None:
            S, G = self.args.steps_per_generation, self.num_generations
            first = self._step % S
            batches = self._buffered_inputs[first : first + GA]
            on_policy = self._step % (S * self.num_iterations) < GA
            index, rewards, labels, weight, valid = [], [], [], [], []
            for batch in batches:
                mask = self._loss_mask(batch)
                old = batch.get("old_per_token_logps")
                if self.args.pacs_reward_proxy == "log_ratio" and (on_policy or old is None):  # r = 0 exactly
                    r = torch.zeros(mask.size(0), device=mask.device)
                else:
                    with torch.no_grad(), _no_checkpointing(self):
                        logps, _, _ = self._per_token_logps(self.model, batch)
                    r = compute_reward_proxy(logps, old, mask, self.args.pacs_beta, self.args.pacs_reward_proxy)
                index.append(batch["pacs_index"])
                rewards.append(r.float())
                labels.append(batch["pacs_labels"].float())
                weight.append(self._sample_weight(batch, mask, torch.float32))
                valid.append(mask.sum(-1) > 0)
            gather = self.accelerator.gather
            index = gather(torch.cat(index))
            order = torch.argsort(index)
            index = index[order]
            rows = [gather(torch.cat(x))[order] for x in (rewards, labels, weight, valid)]
            rewards, labels, weight, valid = rows
            groups = index.view(-1, G) // G
            if index.numel() % G or not (groups == groups[:, :1]).all():
                raise RuntimeError(
                    "PACS split path: this optimizer step does not hold whole groups of num_generations="
                    f"{G} completions (rows {index.tolist()}); please report this with your batch settings."
                )
            coef, loss, stats = pacs_coefficients(
                rewards, labels, G, self.args.pacs_score, self.args.pacs_class_weight, weight,
                None if valid.all() else valid,
            )  # fmt: skip
            by_index = torch.zeros(self.args.generation_batch_size, device=coef.device, dtype=coef.dtype)
            by_index[index] = coef
            self._pacs_split_coef, self._pacs_split_loss = by_index, loss / GA
            self._log_pacs_metrics("train", loss, stats["psi"], labels, stats["weights"], G)
        return self._pacs_split_coef[inputs["pacs_index"]], self._pacs_split_loss

    def _entropy_bonus(self, mode: str, entropies: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """TRL's entropy regularisation (static `entropy_coef` or adaptive), scaled and logged as GRPOTrainer does."""
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        entropy_loss = (entropies * mask).sum() / mask.sum().clamp(min=1.0) / accumulation
        # the coefficient and gate of the previous optimizer step, so every micro-batch of this one uses the same
        adaptive = self.use_adaptive_entropy
        coef = self.entropy_coef if not adaptive or self._last_world_entropy <= self.args.entropy_target else 0.0
        if adaptive and mode == "train":
            stats = torch.stack([(entropies * mask).sum(), mask.sum()]).detach()
            window = self._entropy_window_stats
            self._entropy_window_stats = stats if window is None else window + stats
            if self.accelerator.sync_gradients:  # optimizer-step boundary: update the coefficient for the next one
                totals = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                world_entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
                step = self.args.entropy_coef_delta
                if world_entropy <= self.args.entropy_target:
                    self.entropy_coef = min(self.entropy_coef + step, self.args.entropy_coef_max)
                else:
                    self.entropy_coef = max(self.entropy_coef - step, self.args.entropy_coef_min)
                self._last_world_entropy = world_entropy
                self._entropy_window_stats = None
        if mode == "train" and self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        return coef * entropy_loss

    def _log_token_metric(self, mode: str, name: str, values: torch.Tensor, mask: torch.Tensor) -> None:
        totals = self.accelerator.reduce(torch.stack([(values.detach() * mask).sum(), mask.sum().float()]), "sum")
        self._metrics[mode][name].append((totals[0] / totals[1].clamp(min=1.0)).item())

    def _log_pacs_metrics(self, mode, loss, psi, labels, weights, num_generations) -> None:
        """The implicit critic over whole groups; every argument is already gathered over processes."""
        valid = (weights > 0).to(psi.dtype)  # (B_world,)
        labels = labels.to(psi.dtype)
        probs = torch.sigmoid(psi)
        count = valid.sum().clamp(min=1.0)

        def valid_mean(x: torch.Tensor) -> float:
            return ((x * valid).sum() / count).item()

        psi_mean = valid_mean(psi)
        groups_valid = valid.view(-1, num_generations).sum(-1)  # (groups,)
        groups_pos = (labels * valid).view(-1, num_generations).sum(-1)  # (groups,)
        mixed = ((groups_pos > 0) & (groups_pos < groups_valid)).float()
        metrics = self._metrics[mode]
        metrics["pacs/loss"].append(float(loss))
        metrics["pacs/psi_mean"].append(psi_mean)
        metrics["pacs/psi_std"].append(valid_mean((psi - psi_mean) ** 2) ** 0.5)
        metrics["pacs/critic_accuracy"].append(valid_mean(((probs > 0.5) == (labels > 0.5)).to(psi.dtype)))
        metrics["pacs/critic_brier"].append(valid_mean((probs - labels) ** 2))
        metrics["pacs/label_mean"].append(valid_mean(labels))
        metrics["pacs/frac_mixed_groups"].append(mixed.mean().item())


def _rotate_checkpoints(trainer, run_dir: str) -> None:
    # transformers' rotation, run by PACSTrainer after the completion marker (see `_save_checkpoint`)
    if hasattr(trainer, "_rotate_checkpoints"):  # transformers < 5
        trainer._rotate_checkpoints(use_mtime=True, output_dir=run_dir)
        return
    from transformers.trainer_utils import rotate_checkpoints

    rotate_checkpoints(
        output_dir=run_dir, save_total_limit=trainer.args.save_total_limit,
        best_model_checkpoint=trainer.state.best_model_checkpoint, use_mtime=True,
    )  # fmt: skip


@contextlib.contextmanager
def _no_checkpointing(trainer):
    # A forward without grad needs no activation checkpointing (and with use_reentrant=True it warns); TRL's helper.
    with _grpo_module.disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        yield


@contextlib.contextmanager
def _no_router_logits(model):
    # Turns the config flag off (model config and text sub-config, e.g. of a vision-language MoE) and restores it.
    configs = {id(c): c for c in (model.config, model.config.get_text_config())}.values()
    turned_off = [c for c in configs if getattr(c, "output_router_logits", False)]
    for config in turned_off:
        config.output_router_logits = False
    try:
        yield
    finally:
        for config in turned_off:
            config.output_router_logits = True


__all__ = ["PACSTrainer", "exchange_order", "shuffle_groups", "split_layout"]
