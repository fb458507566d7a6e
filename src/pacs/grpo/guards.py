"""Guards a long run needs: an optimizer step whose gradient is not finite is skipped, not applied.

The paper's recipes train unclipped (`max_grad_norm: 0`, as the authors' PACS actor), and the authors' actor skips an
optimizer step whose gradient norm is not finite. Without that, one NaN gradient makes every weight NaN and the next
generation crashes ("probability tensor contains either inf, nan or element < 0"), hours later and far from the cause.

`NonFiniteGradientGuard`, installed by `HardenedGRPOTrainer` on the optimizer it creates:

1. Without DeepSpeed it wraps the optimizer's `step`: when the total norm of the gradients is not finite (on any
   process: the verdict is all-reduced, so every process skips or steps together), the step is skipped and the
   gradients are dropped; the weights and the optimizer's states (Adam's moments and step count) stay untouched.
2. Under DeepSpeed, whose ZeRO optimizers (0.19: stages 1-2 with `bf16.check_grad_overflow`, on by default; stage 3
   always) already skip a step with a non-finite gradient norm, it reads DeepSpeed's verdict (`optimizer.overflow`).
3. Either way it counts the skipped steps (`pacs/skipped_steps`, cumulative), warns at each one, and after
   `pacs_max_skipped_steps` in a row stops training with an error that says what to check.

The learning-rate scheduler still advances on a step skipped here (transformers only holds it back for DeepSpeed's
and the fp16 loss scaler's skips); the recipes' schedule is constant.

The reward functions' outputs are checked as TRL reads them ([`validated_reward_func`]: one finite number or `None` per
completion, not NaN, a string or a bare scalar), and [`UnlabeledBatchTracker`] warns on every generation batch in which
no completion got a reward and stops a run where that persists (`MAX_UNLABELED_BATCHES` in a row).

A process that stops answering (hung in a reward function, stopped, on a node that froze) leaves the others waiting
in a collective until the process-group timeout (`ddp_timeout`); [`stopped_rank_error`] turns the backend's timeout
error into one that says so and what to check.
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
from collections.abc import Callable
from typing import Any

import torch
from transformers import TrainerCallback

from .checks import _callable_name, _is_module


logger = logging.getLogger(__name__)

__all__ = [
    "MAX_UNLABELED_BATCHES",
    "NonFiniteGradientError",
    "NonFiniteGradientGuard",
    "UnlabeledBatchTracker",
    "total_grad_norm",
    "validate_reward_output",
    "stopped_rank_error",
    "validated_reward_func",
]

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
        hint (`str`): what of the algorithm's own logs to check first, named in the error (`"the loss"` by default;
            `PACSTrainer` names its reward proxy's metrics).
    """

    def __init__(self, trainer, max_skipped: int, hint: str = "the loss"):
        self.trainer = trainer
        self.max_skipped = max_skipped
        self.hint = hint  # the algorithm's own metrics to check first, for the error
        self.skipped = 0  # in the whole run
        self.in_a_row = 0
        self.last_norm = float("nan")
        self._step_skipped: bool | None = None  # the verdict of the wrapped step, None under DeepSpeed

    @classmethod
    def install(cls, trainer, optimizer, max_skipped: int, hint: str = "the loss") -> NonFiniteGradientGuard:
        """Guard `optimizer` (the torch optimizer `trainer.create_optimizer` made) and register the callback; once per
        optimizer (transformers may ask `create_optimizer` for it more than once)."""
        guard = getattr(optimizer, "_pacs_nonfinite_guard", None)
        if guard is not None:
            return guard
        guard = cls(trainer, max_skipped, hint)
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
                f"weights are those of step {step - self.in_a_row}. Check, in the logs before it: {self.hint}, "
                "pacs/is_ratio_* and sampling/sampling_logp_difference (vLLM sampling from stale or broken weights), the learning rate "
                "(too high: lower learning_rate or clip with max_grad_norm 1.0), and the completions (empty or "
                "all-padding rows). Resume from the last checkpoint once fixed; pacs_max_skipped_steps sets how many "
                "skipped steps in a row stop the run (0: never)."
            )
        return control


# ---------------------------------------------------------------------------------------------------------------------
# Reward functions' outputs, and batches without a single reward
# ---------------------------------------------------------------------------------------------------------------------

MAX_UNLABELED_BATCHES = 3
"""[`UnlabeledBatchTracker`] stops the run after this many consecutive generation batches without a single reward."""


def _is_number(value: Any) -> bool:
    if isinstance(value, (str, bytes)):
        return False
    if isinstance(value, numbers.Real):  # float, int, bool, numpy scalars
        return True
    return getattr(value, "ndim", None) == 0 and hasattr(value, "item")  # a 0-d torch tensor or numpy array


def validate_reward_output(func_name: str, output: Any, num_completions: int | None) -> None:
    """Check that a reward function returned one finite number or `None` for each of `num_completions` completions.

    A list, a tuple, or a 1-d numpy array / torch tensor is accepted; elements may be `float`, `int`, `bool`, numpy
    scalars, 0-d tensors, or `None` ("no reward for this completion": TRL skips it). NaN is refused rather than read as
    `None`, because it usually means a bug in the reward (0 / 0, a failed parse) that should not pass silently.

    >>> validate_reward_output("my_reward", [1.0, None, 0], 3)
    >>> validate_reward_output("my_reward", [1.0, float("nan")], 2)
    Traceback (most recent call last):
    ...
    ValueError: The reward function my_reward returned nan for completion 1 of 2; return None to skip a completion, or a finite number.

    Args:
        func_name (`str`):
            The reward function's name, for the message.
        output (`Any`):
            What it returned.
        num_completions (`int` or `None`):
            How many completions it was given; `None`: unknown, the count is not checked.

    Raises:
        `ValueError`: naming the function, the first offending index and its value.
    """
    here = "" if num_completions is None else f" ({num_completions} here)"
    of = "" if num_completions is None else f" of {num_completions}"
    if isinstance(output, (str, bytes)) or _is_number(output) or output is None:
        raise ValueError(
            f"The reward function {func_name} returned {output!r} instead of a list with one reward per completion"
            f"{here}; return e.g. [1.0, 0.0, None, ...] with None for a completion it cannot score."
        )
    if getattr(output, "ndim", 1) != 1 or not hasattr(output, "__len__"):
        shape = tuple(getattr(output, "shape", ())) or type(output).__name__
        raise ValueError(
            f"The reward function {func_name} returned {shape} instead of a list with one reward per completion{here}."
        )
    if num_completions is not None and len(output) != num_completions:
        raise ValueError(
            f"The reward function {func_name} returned {len(output)} rewards for {num_completions} completions; it must "
            "return exactly one per completion (None for one it cannot score), in the order of `completions`."
        )
    for i, value in enumerate(output):
        if value is None:
            continue
        if not _is_number(value):
            raise ValueError(
                f"The reward function {func_name} returned {value!r} ({type(value).__name__}) for completion {i}{of}; "
                "each reward must be a number (float, int or bool) or None to skip the completion"
                + (", e.g. float(value)." if isinstance(value, (str, bytes)) else ".")
            )
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(
                f"The reward function {func_name} returned {number} for completion {i}{of}; return "
                "None to skip a completion, or a finite number."
            )


_PER_COMPLETION_KEYWORDS = ("completions", "completion_ids", "prompts", "environments")
"""Keywords TRL passes with one entry per completion; `environments` alone reaches an environment's own reward."""


def _num_completions(args: tuple, kwargs: dict) -> int | None:
    """How many completions a reward function was called on, from whichever per-completion list it was given (TRL
    calls an environment's `get_reward` wrapper with `environments=` alone); `None` when it cannot tell."""
    if args:
        return len(args[0])
    for key in _PER_COMPLETION_KEYWORDS:
        if kwargs.get(key) is not None:
            return len(kwargs[key])
    return None


def validated_reward_func(func: Callable) -> Callable:
    """Wrap a reward function so that its output goes through [`validate_reward_output`] before TRL reads it.

    The wrapper keeps `__name__` (TRL names the logged reward metric after it), the signature (`functools.wraps`) and
    async-ness: TRL 1.16 runs async reward functions on its event loop, so an `async def` stays an `async def`.
    Reward models (`nn.Module`), strings and already wrapped functions are returned unchanged.

    Args:
        func (`Callable`):
            A reward function `f(completions, ..., **kwargs) -> list[float | None]`.

    Returns:
        `Callable`: the wrapped function.
    """
    if isinstance(func, str) or not callable(func) or _is_module(func) or getattr(func, "_pacs_validated", False):
        return func
    name = _callable_name(func)
    from trl.trainer.utils import is_async_callable

    if is_async_callable(func):

        @functools.wraps(func)
        async def wrapper(*args, **kwargs):
            output = await func(*args, **kwargs)
            validate_reward_output(name, output, _num_completions(args, kwargs))
            return output

    else:

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            output = func(*args, **kwargs)
            validate_reward_output(name, output, _num_completions(args, kwargs))
            return output

    wrapper.__name__ = name  # partials and callable instances have no __name__ for functools.wraps to copy
    wrapper._pacs_validated = True
    return wrapper


class UnlabeledBatchTracker:
    """Warns on every generation batch in which no completion got a reward, and stops a run where that persists.

    A completion whose reward functions all returned `None` carries no label and no gradient; a batch of only such
    completions trains nothing, and a run of them finishes "successfully" with loss 0. Call [`update`] once per
    generation batch with the global counts (the same on every rank, e.g. after TRL's gather, so that every rank
    raises together).

    >>> tracker = UnlabeledBatchTracker(patience=2)
    >>> tracker.update(num_scorable=3, num_completions=8)
    >>> tracker.consecutive
    0

    Args:
        patience (`int`, *optional*, defaults to `MAX_UNLABELED_BATCHES` (3)):
            Consecutive unlabeled batches (per mode) after which [`update`] raises.
    """

    def __init__(self, patience: int = MAX_UNLABELED_BATCHES):
        if patience < 1:
            raise ValueError(f"patience must be at least 1, got {patience}.")
        self.patience = patience
        self._consecutive: dict[str, int] = {}

    @property
    def consecutive(self) -> int:
        """Consecutive unlabeled training batches so far."""
        return self._consecutive.get("train", 0)

    def update(self, num_scorable: int, num_completions: int, mode: str = "train") -> None:
        """Record one generation batch: `num_scorable` of its `num_completions` completions got a reward.

        Raises:
            `RuntimeError`: after `patience` consecutive batches of `mode` with `num_scorable == 0`.
        """
        if num_scorable > 0 or num_completions == 0:
            self._consecutive[mode] = 0
            return
        count = self._consecutive.get(mode, 0) + 1
        self._consecutive[mode] = count
        logger.warning(
            "No completion of this %s generation batch got a reward: every reward function returned None for all %d "
            "completions (%d such batch(es) in a row; the run stops at %d). These completions carry no label.",
            mode,
            num_completions,
            count,
            self.patience,
        )
        if count >= self.patience:
            raise RuntimeError(
                f"{count} consecutive {mode} generation batches ({num_completions} completions each) got no reward at "
                "all: every reward function returned None for every completion, so nothing is being learned. Check "
                "that the reward functions return numbers for these completions: call one on a few completions and "
                "the dataset's columns, e.g. math_reward(['\\\\boxed{2}'], solution=['2']) -> [1.0]; a None for every "
                "completion usually means a gold answer that does not parse or a column holding the wrong field "
                "(a worked solution instead of the final answer)."
            )


_TIMEOUT_WORDS = ("timed out", "timeout", "watchdog caught collective operation")


def stopped_rank_error(error: BaseException, ddp_timeout: int, world_size: int) -> RuntimeError | None:
    """The error a run raises when a collective timed out on a multi-process run, or `None` for any other error.

    gloo says "Timed out waiting 60000ms for recv operation", NCCL's watchdog "Watchdog caught collective operation
    timeout"; either means another process stopped answering for `ddp_timeout` seconds.
    """
    text = str(error).lower()
    if world_size <= 1 or not any(word in text for word in _TIMEOUT_WORDS):
        return None
    return RuntimeError(
        f"A process stopped answering: a collective of this {world_size}-process run waited ddp_timeout ({ddp_timeout} "
        "s) for another process. Look for a process or node that hung or died (its log ends early); under "
        "max_restarts the group restarts and resumes. If it was only slow, raise ddp_timeout above the longest gap "
        f"between collectives (a whole generation plus an evaluation). Backend: {str(error).splitlines()[0][:200]}"
    )
