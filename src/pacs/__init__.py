"""PACS: implicit actor-critic coupling via a supervised learning framework for RLVR (arXiv:2509.02522), on TRL.

>>> from pacs import PACSConfig, PACSTrainer, pacs_loss

`pacs_loss` is pure torch; `PACSConfig` and `PACSTrainer` import TRL on first use, so that `pacs.loss`,
`pacs.rewards` and the `pacs` command line stay quick to import.
"""

from typing import TYPE_CHECKING

from .loss import pacs_loss


__version__ = "0.1.0"

__all__ = ["PACSConfig", "PACSTrainer", "pacs_loss", "__version__"]

if TYPE_CHECKING:
    from .config import PACSConfig
    from .trainer import PACSTrainer


def __getattr__(name: str):
    if name == "PACSConfig":
        from .config import PACSConfig

        return PACSConfig
    if name == "PACSTrainer":
        from .trainer import PACSTrainer

        return PACSTrainer
    raise AttributeError(f"module 'pacs' has no attribute {name!r}")
