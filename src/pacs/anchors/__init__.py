"""The reward proxy's anchors (`PACSConfig.pacs_anchor`): one interface, one registry.

The reward proxy compares the policy with an anchor, $r_i = \\beta \\sum_t (\\log \\pi_\\theta - \\log \\pi_{anchor})$.
Every anchor is a class with the interface [`Anchor`] (the loss, the split path and `PACSTrainer` read nothing else),
and [`ANCHORS`] maps each `pacs_anchor` name to its [`AnchorInfo`]: where the class lives (imported only when a trainer
builds it), a one-line description, and what the planner needs to know (a frozen copy of the model beside the policy;
the setting that makes that copy change during a run). `PACSConfig` (choices, validation), `pacs demo` (choices) and
`pacs plan` (memory and checkpoint sizes) read the registry, so a new anchor is one module in this package and one
line here (or one `register_anchor` call elsewhere); its class is checked against [`Anchor`] when it registers and
when a trainer builds it.

Importing this package imports neither torch nor TRL (`pacs plan` reads it).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol


if TYPE_CHECKING:
    import torch


__all__ = [
    "ANCHORS", "ANCHOR_CHOICES", "ANCHOR_METHODS", "Anchor", "AnchorInfo", "anchor_class", "anchor_description",
    "anchor_names", "check_anchor", "make_anchor", "register_anchor",
]  # fmt: skip


@dataclass(frozen=True)
class AnchorInfo:
    """What the registry knows of an anchor without importing it.

    Args:
        target (`str`):
            `"module:Class"` of the anchor's class, imported when a trainer builds it.
        description (`str`):
            What the proxy is anchored to, for the config's help and its error message.
        model_copy (`bool`):
            The anchor holds a frozen copy of the model beside the policy (full fine-tuning; with LoRA it is an
            adapter snapshot, no copy). `pacs plan` counts its memory.
        reset_setting (`str` or `None`):
            The `PACSConfig` field that, when non-zero, makes the copy change during the run, so that checkpoints carry
            its weights (`pacs plan` counts them); `None`: it never changes.
    """

    target: str
    description: str
    model_copy: bool = False
    reset_setting: str | None = None


ANCHORS: dict[str, AnchorInfo] = {
    "rollout": AnchorInfo("pacs.anchors.rollout:RolloutAnchor", "pi_old of each generation, the authors' code"),
    "reference": AnchorInfo(
        "pacs.anchors.reference:ReferenceAnchor",
        "a fixed reference policy, the paper's revised version",
        model_copy=True,
        reset_setting="pacs_reference_reset_generations",
    ),
}
"""`pacs_anchor` name -> [`AnchorInfo`], in the order the choices are listed."""


def anchor_names() -> tuple[str, ...]:
    """The valid `pacs_anchor` values.

    >>> anchor_names()
    ('rollout', 'reference')
    """
    return tuple(ANCHORS)


class _Names(Sequence):
    """The registry's names, read when used (an `argparse` `choices` that sees an anchor registered after import)."""

    def __getitem__(self, index):
        return anchor_names()[index]

    def __len__(self) -> int:
        return len(ANCHORS)

    def __repr__(self) -> str:
        return repr(list(ANCHORS))


ANCHOR_CHOICES: Sequence[str] = _Names()
"""The `pacs_anchor` choices for a parser (`PACSConfig`'s field metadata, `pacs demo`), always the registry's."""


def anchor_description() -> str:
    """The choices in words, for help texts and errors.

    >>> anchor_description().split(" (")[0]
    "'rollout'"
    """
    named = [f"{name!r} ({info.description})" for name, info in ANCHORS.items()]
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + " or " + named[-1]


def anchor_class(name: str) -> type:
    """The class of anchor `name`, imported now and checked against [`Anchor`]."""
    return check_anchor(_import(ANCHORS[name].target), name)


def _import(target: str) -> type:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def register_anchor(name: str, info: AnchorInfo) -> None:
    """Add the anchor `name` to [`ANCHORS`] (which `PACSConfig`, `pacs demo` and `pacs plan` read), after importing
    its class and checking it against [`Anchor`]: a class that lacks a member fails here, not at a run's first step.

    Raises:
        `ValueError`: `name` is registered already. `TypeError`: the class lacks members of [`Anchor`] (named).
    """
    if name in ANCHORS:
        raise ValueError(
            f"An anchor named {name!r} is registered already ({ANCHORS[name].target}); pick another name."
        )
    check_anchor(_import(info.target), name)
    ANCHORS[name] = info


def check_anchor(cls: type, name: str = "") -> type:
    """`cls`, if it has every method of the [`Anchor`] protocol (its `at_policy` attribute may be set in `__init__`:
    `make_anchor` checks it on the instance); else a `TypeError` naming what it lacks."""
    missing = [member for member in ANCHOR_METHODS if not callable(getattr(cls, member, None))]
    if missing:
        raise TypeError(
            f"The anchor {name or cls.__name__!r} ({cls.__module__}.{cls.__qualname__}) lacks {missing} of the "
            "`pacs.anchors.Anchor` protocol: define them (see its docstrings), e.g. by subclassing RolloutAnchor."
        )
    return cls


class Anchor(Protocol):
    """The interface of every anchor. Built once, after `GRPOTrainer.__init__`, as
    `cls(args, model, accelerator, logps, kl_ref_model)`: the config, the policy, accelerate's `Accelerator`, a callable
    `logps(model, batch, batch_size) -> (B, T)` (per-token log-probs without grad) and TRL's KL reference model (or
    `None`). Each method receives what it acts on; no anchor holds the trainer."""

    at_policy: bool
    """The anchor equals the policy at the current generation's start (psi == 0 on its first step)."""

    def logps(self, inputs: dict) -> torch.Tensor | None:
        """The log-probs `(B, T)` the reward proxy compares the policy with; `None`: on-policy, r detaches (r = 0)."""

    def proxy_is_zero(self, inputs: dict, on_policy: bool) -> bool:
        """r is exactly 0 on this split-path step, so its coefficients need no forward."""

    def before_generation(self, model, optimizer, lr_scheduler) -> None:
        """Before each training generation, with the policy and its optimizer and scheduler (a reset, say)."""

    def after_generation(self, output: dict, model) -> dict:
        """Adds what the anchor needs to the training generation batch `output` (this process's rows), returns it."""

    def metrics(self, per_token_logps: torch.Tensor, inputs: dict, mask: torch.Tensor) -> dict[str, float]:
        """The anchor's metrics of a training micro-batch (collectives: every process calls it)."""

    def callbacks(self) -> list[Any]:
        """`TrainerCallback`s the trainer adds."""

    def save(self, folder: str, model) -> None:
        """Its state, into checkpoint `folder` (every process calls it)."""

    def load(self, checkpoint: str, model) -> None:
        """Restores what `save` wrote."""


ANCHOR_METHODS = tuple(name for name, value in vars(Anchor).items() if callable(value) and not name.startswith("_"))
"""The methods of the [`Anchor`] protocol, which every registered anchor's class has."""


def make_anchor(name: str, args, model, accelerator, logps, kl_ref_model=None) -> Anchor:
    """The anchor `name` for a `PACSTrainer` (after `GRPOTrainer.__init__`: the reference anchor builds pi_ref beside
    the model)."""
    anchor = anchor_class(name)(args, model, accelerator, logps, kl_ref_model)
    for attribute in Anchor.__annotations__:  # `at_policy`: set by the class or its `__init__`
        if not hasattr(anchor, attribute):
            raise TypeError(f"The anchor {name!r} sets no `{attribute}` (the `pacs.anchors.Anchor` protocol).")
    return anchor
