"""The hardened GRPO layer: TRL's `GRPOTrainer` with checks before work, guards while it runs, crash-safe exact
checkpoints and a drift-free vLLM LoRA push; nothing of PACS (`PACSTrainer` is built on it).

>>> from pacs.grpo import HardenedGRPOConfig, HardenedGRPOTrainer

Rooms: `checks` (before work), `guards` (while it runs), `checkpoints` (files), `resume` (how a run resumes, decided
once), `sampler` (TRL's prompt order in every epoch, also after a resume), `dynamic_sampling` (generation batches of groups whose rewards differ), `rows` (moving rows between
processes), `metrics` (the batch's reward
sparsity), `vllm_sync` (vLLM: the LoRA push, the stale-weights monitor, the importance-sampling metrics), `terms`
(pieces of GRPO's `_compute_loss` the layer needs), `packing` (sequence packing, pure torch), `padding_free`
(packed forwards through TRL's fused LM head) and `balance` (an optimizer step's rows regrouped by tokens), `model_checks` (the model argument, before anything loads), `config` and `trainer` (the
one class that overrides TRL's methods), and its floor, `_compat` (every private name of TRL and transformers it
touches, checked at import). The layer imports nothing of `pacs` above it; what `pacs train` adds around a run (one
run per output folder, the overwrite policy) is `pacs.run_lock`. `HardenedGRPOConfig` and `HardenedGRPOTrainer`
import TRL on first use, so that `pacs.grpo.checks` stays quick to import.

The name `pacs` in the layer is the package's namespace, never the PACS algorithm: the metrics it logs
(`pacs/skipped_steps`, `pacs/frac_all_wrong_groups`, `pacs/frac_all_right_groups`, `pacs/ds/*`, `pacs/is_*`) sit
apart from TRL's unprefixed ones in a logger, the file names it writes (`pacs_checkpoint_complete.json`,
`pacs_rollout/`, `pacs_dynamic_sampling.json`) apart from transformers', and its one config field,
`pacs_max_skipped_steps`, apart from any field a later `GRPOConfig` adds. They keep that name: every saved checkpoint
carries the file names (a renamed marker would make each older checkpoint incomplete), every logged run and study
(benchmarks/, docs/) reads the metric keys, and recipes set the field; a rename would buy a shorter `grep` with
aliases for all three.
"""

from typing import TYPE_CHECKING


__all__ = ["HardenedGRPOConfig", "HardenedGRPOTrainer"]

if TYPE_CHECKING:
    from .config import HardenedGRPOConfig
    from .trainer import HardenedGRPOTrainer


def __getattr__(name: str):
    if name == "HardenedGRPOConfig":
        from .config import HardenedGRPOConfig

        return HardenedGRPOConfig
    if name == "HardenedGRPOTrainer":
        from .trainer import HardenedGRPOTrainer

        return HardenedGRPOTrainer
    raise AttributeError(f"module 'pacs.grpo' has no attribute {name!r}")
