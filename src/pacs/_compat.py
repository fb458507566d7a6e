"""Every fact about the installed TRL 1.16 and transformers that pacs relies on, and the workarounds for what they lack.

One place, so that a TRL upgrade touches one file; each piece says when it can go. Importing it imports neither torch nor
TRL (`pacs plan` reads its constants), each function imports what it uses.

- `check_trl`: the import-time check that TRL has every `GRPOTrainer` method a layer overrides or calls, and the
  private state it reads or writes. `check_trl()` (by `pacs.grpo.trainer`): what `HardenedGRPOTrainer` needs
  (`_OVERRIDDEN`, `_USED`, `_STATE`) and the `VLLMGeneration` method the LoRA push replaces and what it uses
  (`_VLLM_USED`, `_VLLM_STATE`); `check_trl("pacs")` (by `pacs.trainer`): what only `PACSTrainer` and its loss terms
  need (`_PACS_OVERRIDDEN`, `_PACS_STATE`, the module global `shuffle_sequence_dict`). Keep it as long as pacs touches
  private names; update the lists with every new one (tests/test_grpo_trainer.py compares `_OVERRIDDEN` and
  `_PACS_OVERRIDDEN` with the code). Also private, outside this file: `pacs.grpo.terms` and `pacs.loss_terms`
  (GRPOTrainer's inline loss pieces, re-done; their docstrings say when they can go) and `pacs.anchors.reference.ReferenceAnchor._build_ref_model` (GRPOTrainer's way of building and
  sharding its reference model, followed for pi_ref: update with TRL's `__init__`).
- `TRL_REWARD_KWARGS`, `MULTIMODAL_KEYS`, `GRPO_ONLY_LOSS_SETTINGS`: what `GRPOTrainer` passes to reward functions, to
  the model in `_compute_loss`, and which `GRPOConfig` settings only shape GRPO's loss; `TRL_MAX_NUM_BATCHED_TOKENS`,
  `TRL_LM_HEAD_TILE`: what TRL hard-codes for a colocated vLLM engine and its fused LM head (`pacs plan` reads them).
  Update with TRL (tests compare the first three with the installed TRL: tests/test_checks.py, test_grpo_trainer.py).
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
- One module-global swap, below:
- `group_shuffle` / `shuffle_groups`: `GRPOTrainer._prepare_inputs` shuffles the generation batch row by row through
  the module global `shuffle_sequence_dict`; PACS swaps in a group-preserving twin while the parent method runs.
  Remove when TRL shuffles by whole groups itself (or exposes the shuffle as a method to override).
- `prefer_activation_checkpointing`: transformers 5 renamed `gradient_checkpointing(_kwargs)` to
  `activation_checkpointing(_kwargs)` and warns (FutureWarning) whenever only the old name carries a value, which
  `GRPOConfig`'s default `gradient_checkpointing=True` always does. Remove when TRL's `GRPOConfig` sets the new name
  itself (or pacs requires a transformers with it and the recipes use it).
- `no_router_logits`: mixture-of-experts generation with `output_router_logits=True` fails in transformers'
  `load_balancing_loss_func` on cached decoding steps. Remove when generation no longer computes the load-balancing
  loss (transformers skips it under `use_cache`/`generate`, or TRL turns it off while generating).
- `elastic_restart_env`: what torchrun's elastic agent needs for a worker group to restart (`--max_restarts`), set
  by `pacs train` (`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` on the torch versions in `TORCH_SHARED_RDZV_STORE`, the
  c10d rendezvous endpoint). Remove the variable when pytorch#135712 is fixed in the oldest torch pacs supports.
- `without_zero3_init`: in a ZeRO-3 process (a live `HfDeepSpeedConfig`, which `pacs train`'s training arguments
  create before the planner runs), transformers' `from_config` wraps the build in `deepspeed.zero.Init`, which cannot
  partition the meta device's tensors ("Cannot copy out of meta tensor; no data!"): the planner's parameter count
  fell back to the formula on every ZeRO-3 launch. transformers' `set_zero3_state` marks zero.Init as already
  entered, so the build skips it. Remove when transformers skips zero.Init under `init_empty_weights` itself.
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
    "GRPO_ONLY_LOSS_SETTINGS",
    "MULTIMODAL_KEYS",
    "TRL_LM_HEAD_TILE",
    "TRL_MAX_NUM_BATCHED_TOKENS",
    "VLLM_PARAM_ITERATOR",
    "TRL_REWARD_KWARGS",
    "activation_checkpointing_field",
    "check_trl",
    "elastic_restart_env",
    "group_shuffle",
    "no_router_logits",
    "only_tied_keys_missing",
    "prefer_activation_checkpointing",
    "replace_method",
    "shuffle_groups",
]

TRL_REWARD_KWARGS = frozenset(
    {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)
"""Keywords TRL 1.16's `GRPOTrainer._calculate_rewards` passes to every reward function, besides the dataset columns
(`environments` only with an `environment_factory`)."""

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
    "sapo_temperature_neg",
    "sapo_temperature_pos",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
)
"""TRL 1.16's `GRPOConfig` settings that only shape GRPO's clipped surrogate loss or the advantages it is fed.
`PACSTrainer` replaces that loss and uses the rewards as labels, so these have no effect there; a user who changed one
is warned rather than silently ignored. (The entropy bonus, `entropy_coef` and `use_adaptive_entropy`, is added to the
PACS loss as in GRPO.) Update with every TRL release that adds a GRPO loss setting."""

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

TRL_MAX_NUM_BATCHED_TOKENS = 4096
"""What TRL 1.16 asks of a colocated vLLM engine (trl/generation/vllm_generation.py, `LLM(...)`): a hard-coded token
budget per scheduler step; with it, `max_num_seqs` = per-device batch x vLLM tensor-parallel size x
`steps_per_generation` (trl/trainer/grpo_trainer.py), which vLLM refuses above `max_num_batched_tokens`
(vllm/config/scheduler.py). `pacs plan` checks a recipe against it; update with TRL."""

TRL_LM_HEAD_TILE = (4096, 32768)
"""The tiles (tokens x vocabulary) of TRL 1.16's fused LM head in the training forward, which `pacs plan` counts in
its memory estimate; update with TRL."""

TORCH_SHARED_RDZV_STORE = (Version("2.4"), None)
"""The torch versions (from, to exclusive; `None`: not fixed yet) whose elastic agent hands its rendezvous TCP store
to the workers (`dynamic_rendezvous.py`, `use_agent_store`) and whose restarted workers then read the previous
attempt's addresses from it: gloo fails with "connectFullMesh failed ... Connection refused", or the group hangs
(pytorch#135712; seen on torch 2.13 on CPU, tests/test_resume.py). `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` gives
each attempt a store of its own. Set the upper bound when a torch release fixes it."""

_TRL_RANGE = (Version("1.15"), Version("2"))
_OVERRIDDEN = (  # HardenedGRPOTrainer's: each in one class (tests/test_grpo_trainer.py)
    "_calculate_rewards",
    "_generate_and_score_completions",
    "_generate_single_turn",
    "_save_checkpoint",
    "_load_optimizer_and_scheduler",
)
_USED = (  # a batch's log-probs; a checkpoint's folder; a finished run's final weights; the dataloader's columns
    "_get_per_token_logps_and_entropies",  # dynamic sampling also skips it inside a round (`_round_without_logps`)
    "_get_output_dir",
    "_load_from_checkpoint",
    "_remove_unused_columns",  # transformers' `Trainer`: the columns top-up rows keep, as the dataloader's
)
_STATE = ("_step", "_buffered_inputs", "_metrics", "_logs")
"""GRPOTrainer's private state the hardened layer reads or writes: the micro-batch counter and the buffered generation
batch (exact resume mid-generation), the metric buffer (every metric it logs) and the completions table (dynamic
sampling puts the trained rows there). Checked at import in GRPOTrainer's source, where `__init__` sets them. Each can
go when TRL exposes it: a rollout-buffer state for checkpoints, a metric-logging method, a completions-logging one."""
_PACS_OVERRIDDEN = ("_prepare_inputs", "_compute_loss")  # PACSTrainer's: the batch shuffle and the loss
_PACS_STATE = ("_tokenizer", "_entropy_bonus_enabled", "_entropy_window_stats", "_last_world_entropy")
"""GRPOTrainer's private state only PACS reads or writes: the tokenizer (the split path's row exchange pads with it)
and the adaptive entropy controller (`pacs.loss_terms.GRPOLossTerms`, a copy of TRL's inline one). It can go when TRL
exposes a loss-terms helper."""
_VLLM_USED = ("_fix_param_name_to_vllm",)  # the LoRA push names parameters as TRL does
_VLLM_STATE = ("_dist",)  # the LoRA push gathers under ZeRO-3 as TRL does
VLLM_PARAM_ITERATOR = "_iter_named_params"
"""The `VLLMGeneration` method the LoRA push without drift replaces (`pacs.grpo.vllm_sync.iter_merged_params`)."""
_VLLM_REPLACED = (VLLM_PARAM_ITERATOR,)


def replace_method(instance, name: str, function) -> None:
    """Bind `function` as `instance.name`, on this one instance (its class and every other instance keep theirs).
    Used for `VLLMGeneration._iter_named_params` (one of the two instance patches in the module docstring)."""
    if not callable(getattr(type(instance), name, None)):
        raise AttributeError(f"{type(instance).__name__} has no method {name!r} to replace; see pacs._compat.")
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


def elastic_restart_env(torch_version: str, endpoint: str) -> dict[str, str]:
    """The environment `pacs train` adds to `accelerate launch` when `max_restarts` > 0 (the c10d rendezvous).

    `PET_RDZV_ENDPOINT` is torchrun's `--rdzv_endpoint`, which accelerate fills only for several machines on
    different networks; without it c10d rendezvous on a fixed `localhost:29400` (a second run on the host collides,
    and other machines never find it). `TORCH_DISABLE_SHARE_RDZV_TCP_STORE` as `TORCH_SHARED_RDZV_STORE` says.

    >>> elastic_restart_env("2.13.0+cpu", "10.0.0.1:29500")["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"]
    '1'
    """
    env = {"PET_RDZV_ENDPOINT": endpoint}
    low, high = TORCH_SHARED_RDZV_STORE
    version = Version(Version(torch_version).base_version)
    if version >= low and (high is None or version < high):
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def check_trl(layer: str = "grpo") -> None:
    """Fail at import, with a fix, if the installed TRL lacks what a layer overrides or calls: `"grpo"`,
    `HardenedGRPOTrainer`'s (and the LoRA push's) private names; `"pacs"`, those only `PACSTrainer` adds."""
    import trl
    from trl import GRPOTrainer
    from trl.trainer import grpo_trainer as _grpo_module

    version = Version(trl.__version__)
    if layer == "pacs":
        needed = _PACS_OVERRIDDEN
        missing = [name for name in needed if not callable(getattr(GRPOTrainer, name, None))]
        missing += _unset(GRPOTrainer, _PACS_STATE)
        if not hasattr(_grpo_module, "shuffle_sequence_dict"):
            missing.append("trl.trainer.grpo_trainer.shuffle_sequence_dict")
    else:
        from trl.generation.vllm_generation import VLLMGeneration

        needed = _OVERRIDDEN + _USED
        missing = [name for name in needed if not callable(getattr(GRPOTrainer, name, None))]
        missing += [
            f"VLLMGeneration.{n}"
            for n in _VLLM_REPLACED + _VLLM_USED
            if not callable(getattr(VLLMGeneration, n, None))
        ]
        missing += _unset(GRPOTrainer, _STATE) + [f"VLLMGeneration.{n}" for n in _unset(VLLMGeneration, _VLLM_STATE)]
    if missing or not (_TRL_RANGE[0] <= version < _TRL_RANGE[1]):
        raise ImportError(
            f"pacs needs trl>={_TRL_RANGE[0]},<{_TRL_RANGE[1]} (GRPOTrainer with {', '.join(needed)}); "
            f"found trl {trl.__version__}"
            + (f" without {', '.join(missing)}" if missing else "")
            + '. Install a supported version: pip install "trl>=1.15,<2".'
        )


def _unset(cls, names: Sequence[str]) -> list[str]:
    """The attributes of `names` that the source file of `cls` never assigns (`self.<name> =`): private state TRL
    dropped. The file is read as text (`inspect.getsource` of a class parses the whole module: 0.25 s at import)."""
    import inspect
    from pathlib import Path

    source = Path(inspect.getsourcefile(cls)).read_text(encoding="utf-8")
    return [name for name in names if f"self.{name} =" not in source and f"self.{name}:" not in source]


def shuffle_groups(seq_dict: dict[str, Sequence | None], group_size: int) -> dict[str, Sequence | None]:
    """Shuffle all sequence values of `seq_dict` along the first dimension by whole groups of `group_size` rows.

    The group-preserving twin of TRL's `shuffle_sequence_dict`: rows `g*G .. g*G+G-1` stay together and in order.

    >>> import torch
    >>> shuffle_groups({"x": torch.arange(4), "y": ["a", "b", "c", "d"], "n": torch.tensor(7)}, 2)["n"]
    tensor(7)
    """
    import torch

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
def group_shuffle(group_size: int | None):
    """While the parent `_prepare_inputs` runs: shuffle by whole groups of `group_size` (`None`: keep the order)."""
    from trl.trainer import grpo_trainer as _grpo_module

    original = _grpo_module.shuffle_sequence_dict
    keep = lambda seq_dict: seq_dict  # noqa: E731
    # looked up at call time, so a test may replace `shuffle_groups`
    _grpo_module.shuffle_sequence_dict = (
        keep if group_size is None else lambda seq_dict: shuffle_groups(seq_dict, group_size=group_size)
    )
    try:
        yield
    finally:
        _grpo_module.shuffle_sequence_dict = original


@contextlib.contextmanager
def no_router_logits(model):
    """Turn `output_router_logits` off while generating (model config and text sub-config), then restore it.

    Mixture-of-experts checkpoints whose config says `output_router_logits=True` (as TRL's SFTTrainer saves them)
    compute the load-balancing loss in every forward, `generate`'s included. There, each cached decoding step has
    router logits for one new token per row but the attention mask of the whole sequence, and transformers'
    `load_balancing_loss_func` fails on their shapes as soon as the mask is kept, i.e. the prompts of the batch differ
    in length (several groups: PACS's 4 optimizer steps per generation). Generation needs no router logits; the update
    still gets its auxiliary loss (`_compute_loss` asks for it explicitly).
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


@contextlib.contextmanager
def without_zero3_init():
    """Build models without DeepSpeed's `zero.Init` inside, even in a ZeRO-3 process (for the meta device)."""
    try:
        from transformers.modeling_utils import set_zero3_state
    except ImportError:  # a transformers without the switch: zero.Init as it decides
        yield
        return
    with set_zero3_state():
        yield
