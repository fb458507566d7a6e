"""Guards a long run needs: an optimizer step whose gradient is not finite is skipped, not applied.

The paper's recipes train unclipped (`max_grad_norm: 0`, as the authors' PACS actor), and the authors' actor skips an
optimizer step whose gradient norm is not finite. Without that, one NaN gradient makes every weight NaN and the next
generation crashes ("probability tensor contains either inf, nan or element < 0"), hours later and far from the cause.

`NonFiniteGradientGuard`, installed by `PACSTrainer` on the optimizer it creates:

1. Without DeepSpeed it wraps the optimizer's `step`: when the total norm of the gradients is not finite (on any
   process: the verdict is all-reduced, so every process skips or steps together), the step is skipped and the
   gradients are dropped; the weights and the optimizer's states (Adam's moments and step count) stay untouched.
2. Under DeepSpeed, whose ZeRO optimizers (0.19: stages 1-2 with `bf16.check_grad_overflow`, on by default; stage 3
   always) already skip a step with a non-finite gradient norm, it reads DeepSpeed's verdict (`optimizer.overflow`).
3. Either way it counts the skipped steps (`pacs/skipped_steps`, cumulative), warns at each one, and after
   `pacs_max_skipped_steps` in a row stops training with an error that says what to check.

The learning-rate scheduler still advances on a step skipped here (transformers only holds it back for DeepSpeed's
and the fp16 loss scaler's skips); the recipes' schedule is constant.
"""

from __future__ import annotations

import functools
import logging
import math

import torch
from transformers import TrainerCallback


logger = logging.getLogger(__name__)

METRIC = "pacs/skipped_steps"


class NonFiniteGradientError(RuntimeError):
    """Training stopped after too many optimizer steps in a row had a non-finite gradient norm."""


def total_grad_norm(parameters) -> torch.Tensor | None:
    """The 2-norm of all gradients of `parameters`, in float32 (None when no parameter has a gradient)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return None
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=None).float()


def _all_finite(norm: torch.Tensor | None, device: torch.device | None) -> bool:
    """Whether the norm is finite on every process (a collective: every process must call it at every step)."""
    bad = torch.zeros((), dtype=torch.float32, device=device) if norm is None else (~torch.isfinite(norm)).float()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
    return not bool(bad.item())


class NonFiniteGradientGuard(TrainerCallback):
    """Skips optimizer steps with a non-finite gradient norm; stops after `max_skipped` of them in a row.

    Args:
        trainer: the `transformers.Trainer` whose optimizer is guarded; its `_metrics["train"]` (TRL's) receives
            `pacs/skipped_steps`.
        max_skipped (`int`): consecutive skipped steps that stop training; `0` never stops.
    """

    def __init__(self, trainer, max_skipped: int):
        self.trainer = trainer
        self.max_skipped = max_skipped
        self.skipped = 0  # in the whole run
        self.in_a_row = 0
        self.last_norm = float("nan")
        self._step_skipped: bool | None = None  # the verdict of the wrapped step, None under DeepSpeed

    @classmethod
    def install(cls, trainer, optimizer, max_skipped: int) -> NonFiniteGradientGuard:
        """Guard `optimizer` (the torch optimizer `trainer.create_optimizer` made) and register the callback; once per
        optimizer (transformers may ask `create_optimizer` for it more than once)."""
        guard = getattr(optimizer, "_pacs_nonfinite_guard", None)
        if guard is not None:
            return guard
        guard = cls(trainer, max_skipped)
        if not getattr(trainer, "is_deepspeed_enabled", False):
            guard.wrap(optimizer)
        optimizer._pacs_nonfinite_guard = guard
        trainer.add_callback(guard)
        return guard

    def wrap(self, optimizer: torch.optim.Optimizer) -> None:
        step = optimizer.step
        params = [p for group in optimizer.param_groups for p in group["params"]]
        device = params[0].device if params else None

        @functools.wraps(step)
        def guarded_step(*args, **kwargs):
            norm = total_grad_norm(params)
            if _all_finite(norm, norm.device if norm is not None else device):
                self._step_skipped = False
                return step(*args, **kwargs)
            self._step_skipped = True
            self.last_norm = float(norm.item()) if norm is not None else float("nan")
            optimizer.zero_grad(set_to_none=True)
            return None

        optimizer.step = guarded_step

    def _deepspeed_skipped(self) -> bool:
        engine = getattr(self.trainer, "deepspeed", None)
        optimizer = getattr(engine, "optimizer", None)
        if not getattr(optimizer, "overflow", False):
            return False
        if getattr(self.trainer.args, "fp16", False):
            return False  # fp16's dynamic loss scaling skips overflowing steps by design while it finds its scale
        self.last_norm = float("inf")
        return True

    def on_optimizer_step(self, args, state, control, **kwargs):
        skipped = self._step_skipped if self._step_skipped is not None else self._deepspeed_skipped()
        self._step_skipped = None
        step = state.global_step + 1  # the step being taken (global_step counts the finished ones)
        if skipped:
            self.skipped += 1
            self.in_a_row += 1
        accelerator = getattr(self.trainer, "accelerator", None)
        if skipped and (accelerator is None or accelerator.is_main_process):
            logger.warning(
                "Optimizer step %d skipped: the gradient norm is %s (weights and optimizer states unchanged; %d "
                "skipped so far, %d in a row).",
                step,
                "nan" if math.isnan(self.last_norm) else f"{self.last_norm:g}",
                self.skipped,
                self.in_a_row,
            )
        if not skipped:
            self.in_a_row = 0
        metrics = getattr(self.trainer, "_metrics", None)
        if metrics is not None:
            metrics["train"][METRIC] = [float(self.skipped)]  # one value: the log shows the running count
        if skipped and self.max_skipped and self.in_a_row >= self.max_skipped:
            raise NonFiniteGradientError(
                f"{self.in_a_row} optimizer steps in a row (up to step {step}) had a non-finite gradient norm; the "
                f"weights are those of step {step - self.in_a_row}. Check, in the logs before it: the loss and "
                "pacs/loss, pacs/psi_* (a reward proxy that overflows: lower pacs_beta), pacs/is_ratio_* and "
                "sampling/sampling_logp_difference (vLLM sampling from stale or broken weights), the learning rate "
                "(too high: lower learning_rate or clip with max_grad_norm 1.0), and the completions (empty or "
                "all-padding rows). Resume from the last checkpoint once fixed; pacs_max_skipped_steps sets how many "
                "skipped steps in a row stop the run (0: never)."
            )
        return control
