"""Every fact about the installed TRL 1.16 and transformers that the hardened GRPO layer relies on, and the workarounds
for what they lack.

The layer's floor: each module of `pacs.grpo` imports TRL's and transformers' private API through the names here, and
[`check_trl`] (run by `pacs.grpo.trainer` at import) fails with a fix when the installed versions lack one. Each piece
says when it can go. Importing this module imports neither torch nor TRL (`pacs plan` reads `pacs._compat`, which
extends this one); each function imports what it uses. What only `PACSTrainer` needs is in `pacs._compat`.

- The private names, checked at import (tests/test_grpo_trainer.py renames each one away and expects the check to
  fail, and compares the lists with the layer's code):
  - `OVERRIDDEN`: the private methods of `GRPOTrainer` and transformers' `Trainer` that `HardenedGRPOTrainer`
    overrides: generation (`_generate_single_turn`, `_generate_and_score_completions`), rewards
    (`_calculate_rewards`), checkpoints (`_save_checkpoint`, `_load_optimizer_and_scheduler`) and the load warning
    (`_issue_warnings_after_load`, see `only_tied_keys_missing`). Each can go when TRL / transformers offer the hook.
  - `USED`: the private methods it calls: a batch's log-probs (`_get_per_token_logps_and_entropies`), a checkpoint's
    folder (`_get_output_dir`), a finished run's final weights (`_load_from_checkpoint`).
  - `STATE`: the private state it reads or writes, found where the source of `GRPOTrainer` or one of its bases assigns
    it (`self.<name> =`): the micro-batch counter and the buffered generation batch (exact resume mid-generation,
    `_step`, `_buffered_inputs`), the metric buffer (`_metrics`), the tokenizer (`_tokenizer`: dynamic sampling pads
    assembled batches with it) and transformers' `current_gradient_accumulation_steps` (the optimizer step's
    micro-batches); `CLASS_STATE`: TRL's `_name` (the trainer's name in `check_trainer_args`' messages). Each can go
    when TRL exposes it: a rollout-buffer state for checkpoints, a metric-logging method, a public tokenizer.
  - `ROTATION`: transformers' checkpoint rotation, which the layer runs after the completion marker: the method
    `Trainer._rotate_checkpoints` before transformers 5.25, the function
    `transformers.trainer_utils.rotate_checkpoints` from 5.25 on (the method is gone). One of the two must be there;
    the method is used where it is. Remove the method's case when the layer requires transformers 5.25.
  - `VLLM_USED`, `VLLM_STATE`, `VLLM_PARAM_ITERATOR`: the `VLLMGeneration` method the LoRA push replaces
    (`_iter_named_params`) and what the replacement uses as TRL's does (`_fix_param_name_to_vllm`, `_dist`).
- `TRL_REWARD_KWARGS`, `MULTIMODAL_KEYS`: what `GRPOTrainer` passes to reward functions and to the model in
  `_compute_loss` (tests compare both with the installed TRL: tests/test_checks.py, test_grpo_trainer.py).
- Three instance patches, each on one object the trainer owns (its class and every other instance keep theirs):
  1. `replace_method` / `VLLM_PARAM_ITERATOR`: `VLLMGeneration._iter_named_params` on a trainer's own
     `vllm_generation` (the LoRA push without drift, `pacs.grpo.vllm_sync`). Its replacement names and gathers the
     parameters as TRL's method does (`_fix_param_name_to_vllm`, `_dist`, the `base_model.model.` / `.base_layer` /
     `modules_to_save.default.` renames): update it with that method. Remove when TRL pushes LoRA weights without
     merging them in place (TRL #6688).
  2. `optimizer.step` of the optimizer `HardenedGRPOTrainer.create_optimizer` creates, wrapped by
     `pacs.grpo.guards.NonFiniteGradientGuard.install` so that a step whose gradient norm is not finite is skipped.
     Remove when transformers' `Trainer` skips (or lets a callback skip) such a step itself.
  3. `session.request` of the `requests.Session` of a trainer's own `VLLMClient` (`vllm_mode="server"`), wrapped by
     `pacs.grpo.vllm_sync.add_read_timeout` so that a call gets `vllm_server_read_timeout` as its read timeout and a
     server that never replies ends the run with its address, not a hang. Remove when TRL's `VLLMClient` takes a
     read timeout itself.
- `prefer_activation_checkpointing`: transformers 5 renamed `gradient_checkpointing(_kwargs)` to
  `activation_checkpointing(_kwargs)` and warns (FutureWarning) whenever only the old name carries a value, which
  `GRPOConfig`'s default `gradient_checkpointing=True` always does. Remove when TRL's `GRPOConfig` sets the new name
  itself (or the layer requires a transformers with it and the recipes use it).
- `no_router_logits`: mixture-of-experts generation with `output_router_logits=True` fails in transformers'
  `load_balancing_loss_func` on cached decoding steps. Remove when generation no longer computes the load-balancing
  loss (transformers skips it under `use_cache`/`generate`, or TRL turns it off while generating).
- `only_tied_keys_missing`: transformers' `Trainer._issue_warnings_after_load` warns of "missing keys
  ['lm_head.weight']" whenever a model with tied embeddings loads a checkpoint (its tied copy is not saved), e.g. the
  final weights of a finished run; the trainer that loads them asks this first and ties the weights instead. Remove
  when transformers checks the model's tied keys there itself.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Sequence

from packaging.version import Version


__all__ = [
    "CLASS_STATE",
    "EPOCH_START",
    "FUSED_HEAD_KWARGS",
    "MULTIMODAL_KEYS",
    "OVERRIDDEN",
    "ROTATION",
    "STATE",
    "TRL_RANGE",
    "TRL_REWARD_KWARGS",
    "USED",
    "VLLM_PARAM_ITERATOR",
    "VLLM_STATE",
    "VLLM_USED",
    "activation_checkpointing_field",
    "check_trl",
    "missing_names",
    "no_router_logits",
    "only_tied_keys_missing",
    "prefer_activation_checkpointing",
    "replace_method",
    "require_trl",
    "unset_state",
]

TRL_RANGE = (Version("1.15"), Version("2"))
"""The TRL versions the layer supports (from, to exclusive): pyproject.toml's `trl>=1.15,<2`."""

TRL_REWARD_KWARGS = frozenset(
    {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)
"""Keywords TRL 1.16's `GRPOTrainer._calculate_rewards` passes to every reward function, besides the dataset columns
(`environments` only with an `environment_factory`)."""

MULTIMODAL_KEYS = (
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
"""TRL 1.16's optional forward inputs (vision-language models) that `GRPOTrainer._compute_loss` passes to the model;
update with TRL."""

OVERRIDDEN = (  # HardenedGRPOTrainer's, each in one class (tests/test_grpo_trainer.py)
    "_get_train_sampler",
    "_calculate_rewards",
    "_generate_and_score_completions",
    "_generate_single_turn",
    "_save_checkpoint",
    "_load_optimizer_and_scheduler",
    "_issue_warnings_after_load",
    "_get_per_token_logps_and_entropies",  # padded (GRPOTrainer's) or packed (`padding_free`)
)
USED = (
    "_get_output_dir",
    "_load_from_checkpoint",
    "_remove_unused_columns",  # transformers' `Trainer`: the columns dynamic sampling's top-up rows keep
)
STATE = ("_step", "_buffered_inputs", "_metrics", "_logs", "_tokenizer", "current_gradient_accumulation_steps")
CLASS_STATE = ("_name",)
EPOCH_START = "_init_training_state"
"""transformers' `Trainer` method that restores the trainer state and counts the epochs a resumed checkpoint trained
(transformers 5); the layer overrides it to place its sampler at that epoch (`pacs.grpo.sampler`). Where the installed
transformers lacks it, the override never runs and only transformers' `set_epoch` places the sampler (which misses it
under a mid-epoch resume on several processes); checked only where `Trainer` has it, like `ROTATION`."""
ROTATION = ("_rotate_checkpoints", "transformers.trainer_utils.rotate_checkpoints")
"""transformers' checkpoint rotation: `Trainer`'s method where the installed version has it (before 5.25), else
`trainer_utils`' function (`pacs.grpo.checkpoints.rotate_after_marker`)."""
FUSED_HEAD_KWARGS = ("fused_lm_head", "shift_labels")
"""What padding-free forwards (`pacs.grpo.padding_free`) pass to a model patched by TRL 1.16's `add_fused_lm_head`
(trl/trainer/utils.py): pre-shifted labels, scored without shifting, so that none crosses a packed sequence's
boundary. Checked at import in that function's source; update with TRL."""
VLLM_PARAM_ITERATOR = "_iter_named_params"
"""The `VLLMGeneration` method the LoRA push without drift replaces (`pacs.grpo.vllm_sync.iter_merged_params`)."""
VLLM_USED = (VLLM_PARAM_ITERATOR, "_fix_param_name_to_vllm")  # the LoRA push names parameters as TRL does
VLLM_STATE = ("_dist",)  # the LoRA push gathers under ZeRO-3 as TRL does


def _source(cls) -> str:
    """The text of the source file of `cls` (read as text: `inspect.getsource` of a class parses the whole module,
    0.25 s at import)."""
    import inspect
    from pathlib import Path

    return Path(inspect.getsourcefile(cls)).read_text(encoding="utf-8")


def unset_state(classes: Sequence[type], names: Sequence[str]) -> list[str]:
    """The attributes of `names` that the source files of `classes` never assign (`self.<name> =`): private state
    TRL or transformers dropped or renamed."""
    sources = "\n".join(_source(cls) for cls in dict.fromkeys(classes))
    return [name for name in names if f"self.{name} =" not in sources and f"self.{name}:" not in sources]


def missing_names() -> list[str]:
    """The private names of the installed TRL and transformers that the layer needs and does not find (`[]`: all
    there), each as `Class.name` (or the module's dotted name)."""
    import inspect

    import transformers.trainer_utils
    from trl import GRPOTrainer
    from trl.generation.vllm_generation import VLLMGeneration

    def methods(cls, names):
        return [f"{cls.__name__}.{n}" for n in names if not callable(getattr(cls, n, None))]

    missing = methods(GRPOTrainer, OVERRIDDEN + USED)
    bases = [cls for cls in GRPOTrainer.__mro__ if cls is not object]
    missing += [f"GRPOTrainer.{n}" for n in unset_state(bases, STATE)]
    missing += [f"GRPOTrainer.{n}" for n in CLASS_STATE if not isinstance(getattr(GRPOTrainer, n, None), str)]
    method, function = ROTATION
    if not callable(getattr(GRPOTrainer, method, None)):  # transformers >= 5.25: the function instead
        if not callable(getattr(transformers.trainer_utils, function.rsplit(".", 1)[1], None)):
            missing.append(f"{function} (or Trainer.{method})")
    from trl.trainer import utils as trl_utils

    fused_head = inspect.getsource(trl_utils.add_fused_lm_head)
    missing += [f"add_fused_lm_head's {name}" for name in FUSED_HEAD_KWARGS if f"{name}=" not in fused_head]
    missing += methods(VLLMGeneration, VLLM_USED)
    missing += [f"VLLMGeneration.{n}" for n in unset_state([VLLMGeneration], VLLM_STATE)]
    return missing


def check_trl() -> None:
    """Fail at import, with a fix, if the installed TRL (or transformers) lacks a private name the layer overrides,
    calls or reads, or TRL is outside `TRL_RANGE`."""
    import transformers

    require_trl(
        "pacs.grpo", missing_names(), found=f" with transformers {transformers.__version__}",
        install=" (and the transformers it requires)",
    )  # fmt: skip


def require_trl(who: str, missing: list[str], needs: str = "", found: str = "", install: str = "") -> None:
    """Raise `ImportError` naming `who`, the supported TRL range, what the installed TRL (`found` adds to it) lacks
    and the install command (`install` adds to it), when `missing` is not empty or TRL is outside `TRL_RANGE`; the
    one refusal of both checks (the layer's and `pacs._compat`'s)."""
    import trl

    low, high = TRL_RANGE
    if missing or not (low <= Version(trl.__version__) < high):
        raise ImportError(
            f"{who} needs trl>={low},<{high}{needs}; found trl {trl.__version__}{found}"
            + (f" without {', '.join(missing)}" if missing else "")
            + f'. Install a supported version: pip install "trl>={low},<{high}"{install}.'
        )


def replace_method(instance, name: str, function) -> None:
    """Bind `function` as `instance.name`, on this one instance (its class and every other instance keep theirs).
    Used for `VLLMGeneration._iter_named_params` (one of the three instance patches in the module docstring)."""
    if not callable(getattr(type(instance), name, None)):
        raise AttributeError(f"{type(instance).__name__} has no method {name!r} to replace; see pacs.grpo._compat.")
    setattr(instance, name, types.MethodType(function, instance))


def activation_checkpointing_field() -> str:
    """The `TrainingArguments` field that turns activation checkpointing on or off without a FutureWarning:
    `"activation_checkpointing"` where the installed transformers has it, `"gradient_checkpointing"` before."""
    from transformers import TrainingArguments

    return (
        "activation_checkpointing"
        if hasattr(TrainingArguments, "activation_checkpointing")
        else ("gradient_checkpointing")
    )


def prefer_activation_checkpointing(args) -> None:
    """Move `gradient_checkpointing(_kwargs)` to `activation_checkpointing(_kwargs)` where the installed transformers
    has the new names, before `TrainingArguments.__post_init__` (which then mirrors the value back to the old name, so
    code reading either sees it). Called by `HardenedGRPOConfig.__post_init__`; a no-op on older transformers."""
    for old, new in (
        ("gradient_checkpointing", "activation_checkpointing"),
        ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
    ):
        if hasattr(args, new) and getattr(args, new) is None and getattr(args, old) is not None:
            setattr(args, new, getattr(args, old))
            setattr(args, old, None)


@contextlib.contextmanager
def no_router_logits(model):
    """Turn `output_router_logits` off while generating (model config and text sub-config), then restore it.

    Mixture-of-experts checkpoints whose config says `output_router_logits=True` (as TRL's SFTTrainer saves them)
    compute the load-balancing loss in every forward, `generate`'s included. There, each cached decoding step has
    router logits for one new token per row but the attention mask of the whole sequence, and transformers'
    `load_balancing_loss_func` fails on their shapes as soon as the mask is kept, i.e. the prompts of the batch differ
    in length (several groups: 4 optimizer steps per generation). Generation needs no router logits; the update still
    gets its auxiliary loss (`_compute_loss` asks for it explicitly).
    """
    configs = {id(c): c for c in (model.config, model.config.get_text_config())}.values()
    turned_off = [c for c in configs if getattr(c, "output_router_logits", False)]
    for config in turned_off:
        config.output_router_logits = False
    try:
        yield
    finally:
        for config in turned_off:
            config.output_router_logits = True


def only_tied_keys_missing(model, missing_keys: Sequence[str]) -> bool:
    """Whether every key a checkpoint load reports missing is a weight tied to another one (`lm_head.weight` of a
    model with `tie_word_embeddings`, which safetensors saves once): `tie_weights()` restores them, so the load lost
    nothing. transformers' `Trainer._issue_warnings_after_load` warns "There were missing keys in the checkpoint model
    loaded: ['lm_head.weight']" for them unless `_keys_to_ignore_on_save` lists them, which transformers 5's Qwen3
    does not. Remove when that method checks the model's tied keys itself."""
    if not missing_keys or not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        return False
    tied = getattr(model, "all_tied_weights_keys", None) or getattr(model, "_tied_weights_keys", None) or {}
    return set(missing_keys) <= set(tied)
