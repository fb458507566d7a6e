"""PACS: implicit actor-critic coupling via a supervised learning framework for RLVR (arXiv:2509.02522), on TRL.

>>> from pacs import PACSConfig, PACSTrainer, pacs_loss

`pacs_loss` is pure torch; `PACSConfig` and `PACSTrainer` import TRL on first use, so that `pacs.loss`,
`pacs.rewards` and the `pacs` command line stay quick to import.
"""

import importlib.abc
import sys
from typing import TYPE_CHECKING

from .loss import pacs_loss


__version__ = "0.1.0"

__all__ = ["PACSConfig", "PACSTrainer", "pacs_loss", "__version__"]

if TYPE_CHECKING:
    from .config import PACSConfig
    from .trainer import PACSTrainer


MOVED_MODULES = {
    "pacs.checks": "pacs.grpo.checks",
    "pacs.checkpoints": "pacs.grpo.checkpoints",
    "pacs.guards": "pacs.grpo.guards",
    "pacs.vllm_sync": "pacs.grpo.vllm_sync",
    "pacs._grpo_terms": "pacs.grpo.terms",
    "pacs.reference": "pacs.anchors.reference",
}
"""Modules that moved (into the hardened GRPO layer `pacs.grpo`, or the anchors' package `pacs.anchors`): importing the
old name says where they are now."""


class _MovedModules(importlib.abc.MetaPathFinder):
    """Last on `sys.meta_path`: only a name nothing else finds reaches it."""

    def find_spec(self, name, path=None, target=None):
        if name in MOVED_MODULES:
            raise ModuleNotFoundError(
                f"No module named {name!r}: it moved to {MOVED_MODULES[name]!r}; import it from there.",
                name=name,
            )
        return None


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def __getattr__(name: str):
    if name == "PACSConfig":
        from .config import PACSConfig

        return PACSConfig
    if name == "PACSTrainer":
        from .trainer import PACSTrainer

        return PACSTrainer
    raise AttributeError(f"module 'pacs' has no attribute {name!r}")
