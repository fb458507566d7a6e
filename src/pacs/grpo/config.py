"""`HardenedGRPOConfig`: TRL's `GRPOConfig` plus the settings of the hardened layer (`pacs.grpo`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from .._compat import prefer_activation_checkpointing


__all__ = ["HardenedGRPOConfig"]


@dataclass
class HardenedGRPOConfig(GRPOConfig):
    r"""
    Configuration class for [`HardenedGRPOTrainer`]: every field of [`~trl.GRPOConfig`], unchanged, plus two.

    Three differences from `GRPOConfig`:

    - `gradient_checkpointing` (GRPOConfig's default, and the recipes' key) is carried over to transformers 5's
      `activation_checkpointing` before transformers warns about the old name (`pacs._compat`).
    - `vllm_server_read_timeout`: a read timeout for TRL's vLLM client in server mode.
    - `pacs_max_skipped_steps` (the `pacs_` prefix is this package's namespace, as `PACSConfig`'s fields use it): the
      non-finite gradient guard's patience.

    Parameters:
        pacs_max_skipped_steps (`int`, *optional*, defaults to `5`):
            An optimizer step whose gradient norm is not finite is skipped (weights and optimizer states untouched,
            counted in `pacs/skipped_steps`, see `pacs.grpo.guards`); this many skipped in a row stop training with an
            error saying what to check. `0` never stops.
        vllm_server_read_timeout (`float`, *optional*, defaults to `1800`):
            With `vllm_mode="server"`: seconds TRL's vLLM client waits for a reply to a request before the run stops
            with an error naming the server (TRL sets no read timeout, so a hung server hangs the trainer). It must
            exceed the longest generation request. `None` waits for ever.
    """

    pacs_max_skipped_steps: int = field(
        default=5,
        metadata={
            "help": "Optimizer steps whose gradient norm is not finite are skipped (weights and optimizer states "
            "untouched, counted in pacs/skipped_steps); this many in a row stop training with an error. 0 never stops."
        },
    )

    vllm_server_read_timeout: float | None = field(
        default=1800.0,
        metadata={
            "help": "vllm_mode server: seconds the vLLM client waits for a reply before the run stops with an error "
            "naming the server; must exceed the longest generation request. None waits for ever."
        },
    )

    def __post_init__(self):
        if not isinstance(self.pacs_max_skipped_steps, int) or self.pacs_max_skipped_steps < 0:
            raise ValueError(
                f"pacs_max_skipped_steps must be an integer >= 0 (0: never stop), got {self.pacs_max_skipped_steps!r}; "
                "the default is 5."
            )
        prefer_activation_checkpointing(self)  # GRPOConfig's default would warn in transformers 5 (_compat)
        super().__post_init__()
