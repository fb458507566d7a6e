"""The reference anchor of the reward proxy (`pacs_anchor="reference"`): a fixed $\\pi_{ref}$, hard-reset periodically.

The revised PACS paper (arXiv 2509.02522v2, Eq. 7) scores a completion against a fixed reference policy,

    r_i = beta * sum_t (log pi_theta(o_i,t) - log pi_ref(o_i,t)),

and, since r "may grow progressively larger over time due to the fixed reference policy", follows ProRL
(arXiv 2505.24864): it periodically hard-resets pi_ref to a snapshot of the online policy and re-initialises the
optimizer states. The authors' first code (and `pacs_anchor="rollout"`) anchors to pi_old of each generation instead,
which makes r = 0 on the first optimizer step after every generation.

`ReferenceAnchor` holds pi_ref and its schedule for a `PACSTrainer` (the interface: `pacs.anchors.Anchor`):

1. pi_ref: for full fine-tuning a frozen copy of the initial model, built and sharded the way TRL builds its KL
   reference model (`prepare_deepspeed` under ZeRO-3); when TRL already holds that copy (`beta > 0`) and pi_ref is never
   reset, the one copy serves both. With LoRA, a frozen second adapter `pacs_ref` beside the trained one (no second
   copy of the base model): it starts as the initial adapter and a reset copies the trained adapter into it.
2. Resets happen only at generation boundaries, before generations N+1, 2N+1, ... (N =
   `pacs_reference_reset_generations`, 0 = never), so every completion of a generation is scored against one pi_ref.
   A reset copies the policy's weights into pi_ref (under ZeRO-3 gathered as TRL's `SyncRefModelCallback` does) and,
   with `pacs_reset_optimizer`, zeroes the optimizer's states in place (Adam's moments and step count: the next step
   is a first step again); the learning-rate schedule goes on.
3. pi_ref's per-token log-probabilities are computed once per generation, right after it is scored, and ride with
   the generation batch as `pacs_ref_per_token_logps` (like TRL's `ref_per_token_logps`), so a checkpoint in the
   middle of a generation batch carries them.
4. Checkpoints carry the schedule (`pacs_reference.json`: generations done, resets done) and, once pi_ref differs from
   what `__init__` rebuilds (after the first reset; always for LoRA, whose snapshot is small), pi_ref's weights.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os

import torch
from accelerate.utils import is_peft_model
from transformers import TrainerCallback

from ..loss_terms import per_token_kl, token_mean


logger = logging.getLogger(__name__)

REF_ADAPTER = "pacs_ref"
STATE_FILE = "pacs_reference.json"
WEIGHTS_FILE = "pacs_reference.safetensors"
LOGPS_KEY = "pacs_ref_per_token_logps"


def reset_optimizer_states(optimizer) -> int:
    """Re-initialise an optimizer's per-parameter states in place: every tensor state zeroed, step counts to 0.

    Works through accelerate's and DeepSpeed's wrappers (the innermost `.optimizer` holds the states). For Adam(W), a
    zeroed state with step 0 is exactly a fresh state: the next step's bias correction is that of a first step.
    Returns the number of parameters whose state was reset.

    >>> p = torch.nn.Parameter(torch.ones(2)); opt = torch.optim.AdamW([p]); p.grad = torch.ones(2); opt.step()
    >>> reset_optimizer_states(opt), float(opt.state[p]["step"]), float(opt.state[p]["exp_avg"].abs().sum())
    (1, 0.0, 0.0)
    """
    inner = _innermost(optimizer)
    count = 0
    for state in inner.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                value.zero_()
            elif key == "step" and isinstance(value, (int, float)):
                state[key] = type(value)(0)
        count += 1
    return count


def _innermost(optimizer):
    # through accelerate's and DeepSpeed's wrappers: the innermost `.optimizer` holds the states
    while hasattr(optimizer, "optimizer") and optimizer.optimizer is not optimizer:
        optimizer = optimizer.optimizer
    return optimizer


def optimizer_step_count(optimizer) -> int | None:
    """The number of steps the optimizer's states have taken (Adam's `step`, the largest over parameters; `None` when
    it holds no step count yet). After `reset_optimizer_states`, the steps taken since the reset.

    >>> p = torch.nn.Parameter(torch.ones(2)); opt = torch.optim.AdamW([p]); optimizer_step_count(opt) is None
    True
    >>> p.grad = torch.ones(2); opt.step(); opt.step(); optimizer_step_count(opt)
    2
    """
    inner = _innermost(optimizer)
    counts = [state["step"] for state in inner.state.values() if "step" in state]
    counts += [group["step"] for group in inner.param_groups if "step" in group]  # optimizers that count per group
    return int(max(float(c) for c in counts)) if counts else None


def rewarmup_factor(steps_since_reset: int | None, warmup_steps: int) -> float:
    """The factor on the scheduled learning rate for the next optimizer step, `steps_since_reset` steps after a reset:
    (k+1)/(K+1) for the first K steps, then 1.

    >>> [rewarmup_factor(k, 3) for k in range(5)], rewarmup_factor(None, 3), rewarmup_factor(0, 0)
    ([0.25, 0.5, 0.75, 1.0, 1.0], 1.0, 1.0)
    """
    if steps_since_reset is None or steps_since_reset >= warmup_steps:
        return 1.0
    return (steps_since_reset + 1) / (warmup_steps + 1)


@contextlib.contextmanager
def _gathered(params: list[torch.nn.Parameter], modifier_rank: int | None = 0):
    """Full parameters under DeepSpeed ZeRO-3 (written back from `modifier_rank`), a no-op otherwise."""
    sharded = [p for p in params if hasattr(p, "ds_id")]
    if sharded:
        import deepspeed

        with deepspeed.zero.GatheredParameters(sharded, modifier_rank=modifier_rank):
            yield
    else:
        yield


def copy_parameters(pairs: list[tuple[torch.nn.Parameter, torch.Tensor]]) -> None:
    """`dst <- src` for each pair, one pair gathered at a time under ZeRO-3 (every process copies the same values,
    so the one whose copy is written back holds them too; no second full model is ever gathered)."""
    with torch.no_grad():
        for dst, src in pairs:
            with _gathered([dst, src] if isinstance(src, torch.nn.Parameter) else [dst]):
                dst.data.copy_(src.data.to(dst.device, dst.dtype))


class ReferenceAnchor:
    """pi_ref, its reset schedule and its log-probabilities for a `PACSTrainer` (see the module docstring)."""

    def __init__(self, args, model, accelerator, logps, kl_ref_model=None):
        self.args, self.accelerator, self._logps = args, accelerator, logps
        self.every = args.pacs_reference_reset_generations
        self.generations = 0  # training generations scored so far
        self.resets = 0
        self.at_policy = False  # pi_ref == the policy at the current generation's start: psi == 0 on its first step
        self.warmup = args.pacs_reset_warmup_steps
        self._lrs: tuple[list[float], list[float]] | None = None  # (scheduled, written) learning rates, re-warmup
        self.lr_factor: float | None = None  # the re-warmup factor of the current optimizer step (None: no reset yet)
        self.peft = is_peft_model(model)
        self.shared = False  # pi_ref is TRL's KL reference model
        self.ref_model = None
        if self.peft:
            self._add_ref_adapter(model)
        elif kl_ref_model is not None and self.every == 0:
            self.ref_model, self.shared = kl_ref_model, True
        else:
            self.ref_model = self._build_ref_model(model)

    # pi_ref ---------------------------------------------------------------------------------------------------
    def _add_ref_adapter(self, model) -> None:
        active = model.active_adapter
        if REF_ADAPTER in model.peft_config:
            raise ValueError(f"The PEFT model already has an adapter named {REF_ADAPTER!r}; rename or remove it.")
        model.add_adapter(REF_ADAPTER, model.peft_config[active])
        model.set_adapter(active)  # PEFT: only the active adapter trains
        self._copy_adapter(model, active, REF_ADAPTER)
        for name, param in model.named_parameters():
            if f".{REF_ADAPTER}." in name:
                param.requires_grad_(False)

    @staticmethod
    def _adapter_pairs(model, source: str, target: str) -> list[tuple[torch.nn.Parameter, torch.nn.Parameter]]:
        params = dict(model.named_parameters())
        pairs = []
        for name, param in params.items():
            if f".{source}." in name:
                pairs.append((params[name.replace(f".{source}.", f".{target}.")], param))
        if not pairs:
            raise RuntimeError(f"PACS reference anchor: the PEFT model has no parameters of adapter {source!r}.")
        return pairs

    def _copy_adapter(self, model, source: str, target: str) -> None:
        copy_parameters(self._adapter_pairs(model, source, target))

    def _build_ref_model(self, model):
        # As GRPOTrainer builds its KL reference model: the policy's checkpoint loaded again, frozen, in eval mode,
        # with TRL's fused LM head, and prepared like the policy (sharded under ZeRO-3).
        from trl.models.utils import prepare_deepspeed
        from trl.trainer.utils import (
            add_fused_lm_head,
            create_model_from_path,
            disable_dropout_in_model,
            get_config_model_id,
        )

        args, accelerator = self.args, self.accelerator
        kwargs = dict(args.model_init_kwargs or {})
        if args.distributed_state.distributed_type in ["MULTI_GPU", "DEEPSPEED"]:
            kwargs["device_map"] = None
        kwargs.setdefault("trust_remote_code", args.trust_remote_code)
        kwargs.setdefault("dtype", model.dtype)
        kwargs.setdefault("attn_implementation", model.config._attn_implementation)
        ref = create_model_from_path(get_config_model_id(model.config), **kwargs)
        ref.requires_grad_(False)
        if args.disable_dropout:
            disable_dropout_in_model(ref)
        add_fused_lm_head(ref, temperature=args.temperature, cast_lm_head_to_fp32=args.cast_lm_head_to_fp32)
        if getattr(accelerator.state, "deepspeed_plugin", None) is not None:  # as `Trainer.is_deepspeed_enabled`
            return prepare_deepspeed(ref, accelerator)
        return accelerator.prepare_model(ref, evaluation_mode=True)

    def _ref_params(self) -> list[torch.nn.Parameter]:
        return list(self.accelerator.unwrap_model(self.ref_model).parameters())

    # the schedule ---------------------------------------------------------------------------------------------
    def before_generation(self, model, optimizer, lr_scheduler) -> None:
        """Called before each training generation: resets pi_ref when the schedule says so."""
        reset = self.every > 0 and self.generations > 0 and self.generations % self.every == 0
        self.at_policy = reset or self.generations == 0
        if reset:
            self.reset(model, optimizer, lr_scheduler)

    def reset(self, model, optimizer, lr_scheduler) -> None:
        """pi_ref <- pi_theta (a hard copy), and the optimizer's states re-initialised when configured."""
        args = self.args
        model = self.accelerator.unwrap_model(model)
        if self.peft:
            self._copy_adapter(model, model.active_adapter, REF_ADAPTER)
        else:
            copy_parameters(list(zip(self._ref_params(), model.parameters(), strict=True)))
        if args.pacs_reset_optimizer and optimizer is not None:
            reset_optimizer_states(optimizer)
        self.resets += 1
        self.apply_rewarmup(optimizer, lr_scheduler)  # this step is Adam's first since the reset
        if self.accelerator.is_main_process:
            logger.info(
                "PACS: reference policy reset to the current policy before generation %d (reset %d)%s.",
                self.generations + 1, self.resets, ", optimizer states re-initialised" if args.pacs_reset_optimizer else "",
            )  # fmt: skip

    def apply_rewarmup(self, optimizer, scheduler) -> None:
        """Set the learning rate of the optimizer step about to be taken to the scheduled one times `rewarmup_factor`
        (`pacs_reset_warmup_steps`); called at each optimizer step's start and right after a reset.

        The scheduled rate is the scheduler's own (`get_last_lr()`: transformers' schedulers and DeepSpeed's compute
        it from their step count, so the factor never compounds); without a scheduler, a rate that still equals what
        this method wrote is replaced by the rate it came from. A resumed run restores the scheduler and Adam's step
        count from the checkpoint, so it re-warms exactly as the uninterrupted run.
        """
        if not self.warmup or self.resets == 0 or optimizer is None:
            return
        groups = optimizer.param_groups
        current = [group["lr"] for group in groups]
        if hasattr(scheduler, "get_last_lr") and len(scheduler.get_last_lr()) == len(groups):
            scheduled = [float(lr) for lr in scheduler.get_last_lr()]
        else:
            scheduled = self._lrs[0] if self._lrs is not None and self._lrs[1] == current else current
        factor = rewarmup_factor(optimizer_step_count(optimizer), self.warmup)
        written = [lr * factor for lr in scheduled]
        for group, lr in zip(groups, written, strict=True):
            group["lr"] = lr
        self._lrs = (scheduled, written)
        self.lr_factor = factor  # applied again in the same step (a reset): the later one holds

    def after_generation(self, output: dict, model) -> dict:
        """Adds pi_ref's per-token log-probabilities of the generation batch (`LOGPS_KEY`) to `output`."""
        self.generations += 1
        if self.shared and output.get("ref_per_token_logps") is not None:
            output[LOGPS_KEY] = output["ref_per_token_logps"]
            return output
        batch_size = self.args.per_device_train_batch_size
        if self.peft:
            from trl.trainer.utils import use_adapter

            with use_adapter(self.accelerator.unwrap_model(model), REF_ADAPTER):
                output[LOGPS_KEY] = self._logps(model, output, batch_size)
        else:
            output[LOGPS_KEY] = self._logps(self.ref_model, output, batch_size)
        return output

    # the interface of every anchor (see `RolloutAnchor`) ---------------------------------------------------------
    def logps(self, inputs: dict) -> torch.Tensor:
        """pi_ref's log-probs `(B, T)` of the batch's completion tokens (never `None`: r is never exactly 0)."""
        return inputs[LOGPS_KEY]

    def proxy_is_zero(self, inputs: dict, on_policy: bool) -> bool:
        return False

    def metrics(self, per_token_logps: torch.Tensor, inputs: dict, mask: torch.Tensor) -> dict[str, float]:
        """`pacs/reference_kl` (k3 estimate of KL(pi_theta || pi_ref) on the sampled tokens) and
        `pacs/reference_resets`, for each training micro-batch; `pacs/lr_factor` on each optimizer step's last."""
        kl = per_token_kl(per_token_logps.detach(), inputs[LOGPS_KEY], None, bias_correction=False)  # (B, T)
        accelerator = self.accelerator
        metrics = {"pacs/reference_kl": token_mean(accelerator, kl, mask), "pacs/reference_resets": float(self.resets)}
        if self.lr_factor is not None and accelerator.sync_gradients:  # once per optimizer step, the factor it used
            metrics["pacs/lr_factor"] = self.lr_factor
        return metrics

    def callbacks(self) -> list[TrainerCallback]:
        """The re-warmup at each optimizer step's start, with `pacs_reset_warmup_steps`."""
        return [_RewarmupCallback(self)] if self.warmup else []

    # checkpoints ----------------------------------------------------------------------------------------------
    def state(self) -> dict:
        return {"generations": self.generations, "resets": self.resets, "every": self.every}

    def save(self, folder: str, model) -> None:
        """The schedule and, where `__init__` cannot rebuild it, pi_ref's weights (collective under ZeRO-3)."""
        weights = self._ref_state_dict(model) if (self.peft or self.resets > 0) else None
        if self.args.should_save:
            os.makedirs(folder, exist_ok=True)
            if weights is not None:
                from safetensors.torch import save_file

                save_file({k: v.contiguous() for k, v in weights.items()}, os.path.join(folder, WEIGHTS_FILE))
            with open(os.path.join(folder, STATE_FILE), "w") as f:
                json.dump(self.state(), f)

    def _ref_state_dict(self, model) -> dict[str, torch.Tensor]:
        if self.peft:
            model = self.accelerator.unwrap_model(model)
            named = [(n, p) for n, p in model.named_parameters() if f".{REF_ADAPTER}." in n]
        else:
            named = list(self.accelerator.unwrap_model(self.ref_model).named_parameters())
        weights = {}
        for name, param in named:
            with _gathered([param], modifier_rank=None):
                weights[name] = param.detach().cpu().clone()
        return weights

    def load(self, folder: str, model) -> None:
        path = os.path.join(folder, STATE_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{folder} has no {STATE_FILE}: it was not saved with pacs_anchor='reference'. Resume it with the "
                "pacs_anchor it was trained with, or start a new run."
            )
        with open(path) as f:
            state = json.load(f)
        self.generations, self.resets = state["generations"], state["resets"]
        weights_path = os.path.join(folder, WEIGHTS_FILE)
        if not os.path.exists(weights_path):
            return
        from safetensors.torch import load_file

        weights = load_file(weights_path)
        source = model if self.peft else self.ref_model
        named = dict(self.accelerator.unwrap_model(source).named_parameters())
        missing = sorted(set(weights) - set(named))
        if missing:
            raise ValueError(
                f"{weights_path} does not fit this model (e.g. {missing[:3]}); resume with the same model."
            )
        copy_parameters([(named[key], value) for key, value in weights.items()])


class _RewarmupCallback(TrainerCallback):
    """`ReferenceAnchor.apply_rewarmup` at the start of every optimizer step (before its micro-batches, so that under
    DeepSpeed, whose engine steps inside the last micro-batch's backward, the step sees the rate too)."""

    def __init__(self, anchor: ReferenceAnchor):
        self.anchor = anchor

    def on_step_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        self.anchor.apply_rewarmup(optimizer, lr_scheduler)  # the trainer's own (transformers passes them)


__all__ = [
    "LOGPS_KEY", "ReferenceAnchor", "optimizer_step_count", "reset_optimizer_states", "rewarmup_factor",
]  # fmt: skip
