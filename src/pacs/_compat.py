"""Every fact about the installed TRL 1.16 and transformers that pacs relies on above the GRPO layer, and the
workarounds for what they lack.

The hardened GRPO layer has its own floor, `pacs.grpo._compat` (its private names of TRL and transformers, checked at
import; the LoRA push, the gradient guard's and the vLLM client's instance patches; activation checkpointing, MoE
generation, tied weights on load): this module extends it with what only the PACS level needs, and re-exports the
pieces the PACS level shares (`MULTIMODAL_KEYS`, `activation_checkpointing_field`). One place per level, so that a TRL
upgrade touches two files; each piece says when it can go. Importing it imports neither torch nor TRL (`pacs plan`
reads its constants), each function imports what it uses.

- `check_trl` (by `pacs.trainer`): the import-time check that TRL has what only `PACSTrainer` and its loss terms need
  (`_PACS_OVERRIDDEN`, `_PACS_STATE`, the module global `shuffle_sequence_dict`); the layer's own check
  (`pacs.grpo._compat.check_trl`) runs when `pacs.grpo.trainer` is imported, before. Keep it as long as PACS touches
  private names; update the lists with every new one (tests/test_grpo_trainer.py compares `_PACS_OVERRIDDEN` with the
  code). Also private, outside this file: `pacs.loss_terms` (GRPOTrainer's inline loss pieces, re-done; its
  docstring says when it can go) and `pacs.anchors.reference.ReferenceAnchor._build_ref_model` (GRPOTrainer's way of
  building and sharding its reference model, followed for pi_ref: update with TRL's `__init__`).
- `GRPO_ONLY_LOSS_SETTINGS`: which `GRPOConfig` settings only shape GRPO's loss; `TRL_MAX_NUM_BATCHED_TOKENS`,
  `TRL_LM_HEAD_TILE`: what TRL hard-codes for a colocated vLLM engine and its fused LM head (`pacs plan` reads them).
  Update with TRL (tests compare the first with the installed TRL: tests/test_grpo_trainer.py).
- One module-global swap, below:
- `group_shuffle` / `shuffle_groups`: `GRPOTrainer._prepare_inputs` shuffles the generation batch row by row through
  the module global `shuffle_sequence_dict`; PACS swaps in a group-preserving twin while the parent method runs.
  Remove when TRL shuffles by whole groups itself (or exposes the shuffle as a method to override).
- `elastic_restart_env`: what torchrun's elastic agent needs for a worker group to restart (`--max_restarts`), set
  by `pacs train` (`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` on the torch versions in `TORCH_SHARED_RDZV_STORE`, the
  c10d rendezvous endpoint). Remove the variable when pytorch#135712 is fixed in the oldest torch pacs supports.
- `without_zero3_init`: in a ZeRO-3 process (a live `HfDeepSpeedConfig`, which `pacs train`'s training arguments
  create before the planner runs), transformers' `from_config` wraps the build in `deepspeed.zero.Init`, which cannot
  partition the meta device's tensors ("Cannot copy out of meta tensor; no data!"): the planner's parameter count
  fell back to the formula on every ZeRO-3 launch. transformers' `set_zero3_state` marks zero.Init as already
  entered, so the build skips it. Remove when transformers skips zero.Init under `init_empty_weights` itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from packaging.version import Version

from .grpo._compat import MULTIMODAL_KEYS, activation_checkpointing_field, require_trl, unset_state


__all__ = [
    "GRPO_ONLY_LOSS_SETTINGS",
    "MULTIMODAL_KEYS",
    "TRL_LM_HEAD_TILE",
    "TRL_MAX_NUM_BATCHED_TOKENS",
    "activation_checkpointing_field",
    "check_trl",
    "elastic_restart_env",
    "group_shuffle",
    "shuffle_groups",
    "without_zero3_init",
]

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

_PACS_OVERRIDDEN = ("_prepare_inputs", "_compute_loss")  # PACSTrainer's: the batch shuffle and the loss
_PACS_STATE = ("_entropy_bonus_enabled", "_entropy_window_stats", "_last_world_entropy")
"""GRPOTrainer's private state only PACS reads or writes: the adaptive entropy controller
(`pacs.loss_terms.GRPOLossTerms`, a copy of TRL's inline one). It can go when TRL exposes a loss-terms helper. (The
tokenizer, `_tokenizer`, which the split path's row exchange pads with, is the layer's: `pacs.grpo._compat.STATE`.)"""


def check_trl() -> None:
    """Fail at import, with a fix, if the installed TRL lacks what only `PACSTrainer` overrides or reads (the layer's
    own names are `pacs.grpo._compat.check_trl`'s)."""
    from trl import GRPOTrainer
    from trl.trainer import grpo_trainer as _grpo_module

    missing = [name for name in _PACS_OVERRIDDEN if not callable(getattr(GRPOTrainer, name, None))]
    missing += unset_state([GRPOTrainer], _PACS_STATE)
    if not hasattr(_grpo_module, "shuffle_sequence_dict"):
        missing.append("trl.trainer.grpo_trainer.shuffle_sequence_dict")
    require_trl("pacs", missing, needs=f" (GRPOTrainer with {', '.join(_PACS_OVERRIDDEN)})")


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
def without_zero3_init():
    """Build models without DeepSpeed's `zero.Init` inside, even in a ZeRO-3 process (for the meta device)."""
    try:
        from transformers.modeling_utils import set_zero3_state
    except ImportError:  # a transformers without the switch: zero.Init as it decides
        yield
        return
    with set_zero3_state():
        yield
