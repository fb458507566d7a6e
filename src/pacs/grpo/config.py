"""`HardenedGRPOConfig`: TRL's `GRPOConfig` plus the settings of the hardened layer (`pacs.grpo`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from ._compat import prefer_activation_checkpointing


__all__ = ["HardenedGRPOConfig"]


@dataclass
class HardenedGRPOConfig(GRPOConfig):
    r"""
    Configuration class for [`HardenedGRPOTrainer`]: every field of [`~trl.GRPOConfig`], unchanged, plus the layer's.

    The differences from `GRPOConfig`:

    - `gradient_checkpointing` (GRPOConfig's default, and the recipes' key) is carried over to transformers 5's
      `activation_checkpointing` before transformers warns about the old name (`_compat`).
    - `vllm_server_read_timeout`: a read timeout for TRL's vLLM client in server mode.
    - `pacs_max_skipped_steps` (the `pacs_` prefix is this package's namespace, as `PACSConfig`'s fields use it): the
      non-finite gradient guard's patience.
    - `dynamic_sampling`, `dynamic_sampling_max_rounds`, `dynamic_sampling_metric`: DAPO's dynamic sampling (generation
      batches of groups whose rewards differ, `pacs.grpo.dynamic_sampling`), off by default. In verl:
      `algorithm.filter_groups.enable` / `.max_num_gen_batches` / `.metric`; OpenRLHF: `--dynamic_filtering`; ms-swift:
      `--dynamic_sample` / `--max_resample_times`; NeMo RL: `use_dynamic_sampling`.
    - `padding_free`, `padding_free_max_tokens_per_row`: every forward (training, old and reference log-probs, PACS's
      pi_ref anchor and split path) computes real tokens only, packed (`pacs.grpo.padding_free`), off by default. In
      verl: `actor_rollout_ref.model.use_remove_padding`; OpenRLHF: `--packing_samples`; ms-swift: `padding_free`; TRL:
      `SFTConfig.padding_free` (and trl#7087 for `GRPOConfig`).

    Parameters:
        dynamic_sampling (`bool`, *optional*, defaults to `False`):
            Train only on groups whose completions' rewards differ: the uniform groups of each training generation
            batch are dropped and rounds of fresh prompts are generated until the batch is full again (at most
            `dynamic_sampling_max_rounds` rounds; then uniform groups fill it, counted in `pacs/ds/fallback_groups`).
            Evaluation is never filtered. Needs a map-style training set, `scale_rewards` "group" or "none" and
            `multi_objective_aggregation="sum_then_normalize"` (advantages within each group).
        dynamic_sampling_max_rounds (`int`, *optional*, defaults to `10`):
            With `dynamic_sampling`: the most generation rounds per generation batch, the first included (verl's
            `max_num_gen_batches`, whose default 0 means no limit; 10 is its DAPO scripts' setting; NeMo RL's
            `dynamic_sampling_max_gen_batches` is 10 and raises when reached, where this fills the batch with uniform
            groups); each round generates a whole generation batch, so this bounds the generation per optimizer step.
            `1` generates no top-ups.
        dynamic_sampling_metric (`str`, *optional*, defaults to `"reward"`):
            With `dynamic_sampling`: what must differ within a group. `"reward"`: each completion's
            `reward_weights`-weighted sum of the reward functions (for PACS: its label), compared over the group's
            completions that count (GRPO: the scored ones, as TRL's advantages; PACS: those its loss counts, so not a
            completion masked out by `mask_truncated_completions`; fewer than two: uniform); or the name of one reward
            function (e.g. an accuracy reward beside a format reward, as verl's `metric: acc`).
        padding_free (`bool`, *optional*, defaults to `False`):
            Pack each micro-batch's sequences (prompt + completion, pads removed) into one or a few rows with positions
            restarting at 0 per sequence, no attention mask and no cache, and scatter the per-token log-probs and
            entropies back to TRL's padded layout, so that every loss is unchanged but the backbone computes real
            tokens only. Checked on first use against the same rows forwarded one by one. Needs `sdpa`, `eager` or
            flash-attention (`flash_attention_2` / `_3`, given `cu_seq_lens`); refused with vision-language models and
            `use_liger_kernel`. Off: the layer is `GRPOTrainer`'s forward, unchanged.
        padding_free_max_tokens_per_row (`int` or `None`, *optional*, defaults to `None`):
            With `padding_free`: the most real tokens per packed row (sequences go to rows first fit decreasing, a
            longer one to a row of its own). `None` chooses: on flash-attention one packed row per micro-batch (varlen
            attention stays within each sequence); on `sdpa` / `eager`, which attend over each packed row whole
            through a dense mask of its length squared, rows no longer than the micro-batch's longest sequence, so
            that packing drops the pad positions without adding attention (`pacs.grpo.padding_free.row_budget`). Not
            with the MoE load-balancing loss, which would count the rows' filler (it packs one row per micro-batch).
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

    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "Train only on groups whose rewards differ: drop the uniform groups of each training generation "
            "batch and generate rounds of fresh prompts until it is full (verl filter_groups, OpenRLHF "
            "--dynamic_filtering). Evaluation is never filtered."
        },
    )
    dynamic_sampling_max_rounds: int = field(
        default=10,
        metadata={
            "help": "With dynamic_sampling: the most generation rounds per generation batch, the first included "
            "(verl max_num_gen_batches, whose default 0 is no limit; its DAPO scripts use 10); then uniform groups "
            "fill the batch. 1 generates no top-ups."
        },
    )
    dynamic_sampling_metric: str = field(
        default="reward",
        metadata={
            "help": "With dynamic_sampling: what must differ within a group: 'reward' (the weighted reward sum; for "
            "PACS the label) or the name of one reward function (verl's metric: acc)."
        },
    )

    padding_free: bool = field(
        default=False,
        metadata={
            "help": "Pack each micro-batch's sequences (pads removed, positions restarting per sequence) in every "
            "forward, so the backbone computes real tokens only; log-probs go back to the padded layout, losses "
            "unchanged (verl use_remove_padding, OpenRLHF --packing_samples, ms-swift / TRL SFTConfig padding_free). "
            "Needs sdpa, eager or flash-attention."
        },
    )
    padding_free_max_tokens_per_row: int | None = field(
        default=None,
        metadata={
            "help": "With padding_free: the most real tokens per packed row. None: one row per micro-batch on "
            "flash-attention; on sdpa / eager (a dense mask of each packed row's length squared) rows no longer than "
            "the micro-batch's longest sequence."
        },
    )

    def __post_init__(self):
        rounds = self.dynamic_sampling_max_rounds
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(
                f"dynamic_sampling_max_rounds must be an integer >= 1 (the first round included), got {rounds!r}; "
                "the default is 10."
            )
        prefer_activation_checkpointing(self)  # GRPOConfig's default would warn in transformers 5 (_compat)
        super().__post_init__()
        if self.dynamic_sampling:
            if self.scale_rewards == "batch":
                raise ValueError(
                    'dynamic_sampling needs advantages computed within each group, but scale_rewards="batch" '
                    'normalises them over the whole batch, dropped rows included; use scale_rewards="group" (the '
                    'default) or "none", or turn dynamic_sampling off.'
                )
            if self.multi_objective_aggregation != "sum_then_normalize":
                raise ValueError(
                    f"dynamic_sampling needs advantages computed within each group, but multi_objective_aggregation="
                    f'"{self.multi_objective_aggregation}" normalises over the whole batch, dropped rows included; use '
                    'multi_objective_aggregation="sum_then_normalize" (the default) or turn dynamic_sampling off.'
                )
        budget = self.padding_free_max_tokens_per_row
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(
                f"padding_free_max_tokens_per_row must be an integer >= 1 or None (chosen by attention implementation), "
                f"got {budget!r}."
            )
        if not isinstance(self.pacs_max_skipped_steps, int) or self.pacs_max_skipped_steps < 0:
            raise ValueError(
                f"pacs_max_skipped_steps must be an integer >= 0 (0: never stop), got {self.pacs_max_skipped_steps!r}; "
                "the default is 5."
            )
