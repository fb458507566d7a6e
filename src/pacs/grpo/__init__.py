"""The hardened GRPO layer: TRL's `GRPOTrainer` with checks before work, guards while it runs, crash-safe exact
checkpoints and a drift-free vLLM LoRA push; nothing of PACS (`PACSTrainer` is built on it).

>>> from pacs.grpo import HardenedGRPOConfig, HardenedGRPOTrainer

Rooms: `checks` (before work), `guards` (while it runs), `checkpoints` (files), `resume` (how a run resumes, decided
once), `run_lock` (one run per output folder, no orphaned workers), `vllm_sync` (vLLM), `terms` (pieces of GRPO's
`_compute_loss` the layer needs), `dynamic_sampling` (DAPO's filter and top-ups), `rows` (moving rows between
processes), `config` and `trainer` (the one class that overrides TRL's methods). What
they need from TRL is in `pacs._compat`. `HardenedGRPOConfig` and `HardenedGRPOTrainer` import TRL on first use, so that
`pacs.grpo.checks` stays quick to import.
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
