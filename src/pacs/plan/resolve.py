"""The run, resolved once: `resolve_run` reads the recipe's parsed arguments (`script_args`, the `PACSConfig` /
`GRPOConfig`, TRL's `ModelConfig`) into one frozen `Run`, and every section and check of the plan reads its fields."""

from __future__ import annotations

from dataclasses import dataclass

from ..anchors import ANCHORS
from .launch import Launch, VllmServe
from .shape import ModelShape


ASSUMED_PROMPT_TOKENS = 512  # the longest prompt when neither max_prompt_tokens nor vllm_max_model_length bounds it


@dataclass(frozen=True)
class Run:
    """One run as the plan sees it: its launch, its model's shape and every setting the plan reads, resolved once
    (`resolve_run`). The fields keep TRL's names where they mean the same thing."""

    launch: Launch
    shape: ModelShape | None  # None: unknown, and the parts that need it are skipped
    vllm_serve: VllmServe | None  # the `trl vllm-serve` command of a server-mode run, when given
    # The model, and how it trains
    algorithm: str
    model_name_or_path: str | None
    use_peft: bool
    lora_r: int
    dtype: str  # of the weights: the recipe's `dtype`, or TRL's default float32
    trainable: int | None  # parameters that train: the LoRA adapters', or all of them; None without the shape
    learning_rate: float
    gradient_checkpointing: bool
    reference_copy: bool  # a frozen copy of the model (TRL's KL reference, beta != 0, or PACS's pi_ref); not with LoRA
    reference_resets: bool  # pi_ref is reset during the run (pacs_reference_reset_generations), so checkpoints hold it
    # The batch (TRL's arithmetic)
    per_device_train_batch_size: int
    num_generations: int
    gradient_accumulation_steps: int
    steps_per_generation: int  # micro-batches per generation (TRL's steps_per_generation)
    num_iterations: int
    optimizer_steps_per_generation: float
    completions_per_generation: int
    expected_world_size: int | None
    max_steps: int
    dynamic_sampling_max_rounds: int | None  # dynamic sampling's round limit; None: off
    # The sequences
    prompt_tokens: int  # the longest prompt
    prompt_source: str  # where that figure comes from
    max_completion_length: int
    # vLLM
    use_vllm: bool
    vllm_mode: str
    tensor_parallel_size: int  # of a colocated vLLM engine (vllm_tensor_parallel_size); 1 otherwise
    vllm_max_model_length: int | None
    vllm_gpu_memory_utilization: float
    vllm_enable_sleep_mode: bool
    # Checkpoints
    saves: bool  # save_strategy is not "no"
    save_steps: float
    save_total_limit: int | None
    save_only_model: bool
    # In-training evaluation
    evaluates: bool  # eval_strategy is not "no"
    eval_benchmark: str | None
    eval_limit: int | None
    eval_steps: float | None
    num_generations_eval: int  # completions per problem (num_generations_eval, else num_generations)
    per_device_eval_batch_size: int

    padding_free: bool = False  # every forward packed, real tokens only (`HardenedGRPOConfig.padding_free`)
    padding_free_max_tokens_per_row: int | None = None  # the packed row's token budget; None: a micro-batch per row
    attn_implementation: str | None = None  # the model's (TRL's ModelConfig); None: transformers' choice, sdpa

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    @property
    def seq_tokens(self) -> int:
        """The longest sequence: the longest prompt + max_completion_length."""
        return self.prompt_tokens + self.max_completion_length

    @property
    def colocated(self) -> bool:
        """vLLM generates in the training processes (vllm_mode colocate)."""
        return self.use_vllm and self.vllm_mode == "colocate"

    @property
    def runs_steps(self) -> bool:
        """The run is bounded by max_steps (not by epochs)."""
        return bool(self.max_steps and self.max_steps > 0)


def resolve_run(
    script_args,
    args,
    model_args,
    launch: Launch,
    shape: ModelShape | None,
    vllm_serve: VllmServe | None = None,
) -> Run:
    """`script_args`, `args` (`PACSConfig` / `GRPOConfig`) and `model_args` (TRL's `ModelConfig`) as `pacs train`
    parses them, launched as `launch`, for a model of shape `shape`: the one `Run` the plan reads."""
    use_peft = bool(_get(model_args, "use_peft", False))
    anchor = ANCHORS.get(_get(args, "pacs_anchor"))  # `pacs.anchors`: does it hold a copy, does the copy change
    anchor_copy = anchor is not None and anchor.model_copy
    anchor_resets = anchor_copy and anchor.reset_setting is not None and bool(_get(args, anchor.reset_setting))
    C = args.max_completion_length or 0
    prompt_tokens, prompt_source = _prompt_tokens(script_args, args, C)
    use_vllm = bool(args.use_vllm)
    batch = batch_arithmetic(args, launch.world_size)
    return Run(
        launch=launch,
        shape=shape,
        vllm_serve=vllm_serve,
        algorithm=str(_get(script_args, "algorithm", "pacs")),
        model_name_or_path=_get(model_args, "model_name_or_path"),
        use_peft=use_peft,
        lora_r=_get(model_args, "lora_r"),
        dtype=str(_get(model_args, "dtype", None) or "float32"),
        trainable=_trainable(shape, model_args, use_peft),
        learning_rate=args.learning_rate,
        gradient_checkpointing=bool(args.gradient_checkpointing),
        reference_copy=not use_peft and (args.beta != 0.0 or anchor_copy),
        reference_resets=not use_peft and anchor_resets,
        per_device_train_batch_size=args.per_device_train_batch_size,
        num_generations=args.num_generations,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        steps_per_generation=args.steps_per_generation,
        num_iterations=args.num_iterations,
        optimizer_steps_per_generation=batch["optimizer_steps_per_generation"],
        completions_per_generation=batch["completions_per_generation"],
        expected_world_size=_get(script_args, "expected_world_size"),
        max_steps=args.max_steps,
        dynamic_sampling_max_rounds=args.dynamic_sampling_max_rounds if _get(args, "dynamic_sampling") else None,
        prompt_tokens=prompt_tokens,
        prompt_source=prompt_source,
        max_completion_length=C,
        use_vllm=use_vllm,
        vllm_mode=args.vllm_mode,
        tensor_parallel_size=args.vllm_tensor_parallel_size if use_vllm and args.vllm_mode == "colocate" else 1,
        vllm_max_model_length=args.vllm_max_model_length,
        vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        vllm_enable_sleep_mode=bool(args.vllm_enable_sleep_mode),
        saves=not (args.save_strategy in ("no", None) or str(args.save_strategy).endswith("NO")),
        save_steps=args.save_steps,
        save_total_limit=args.save_total_limit,
        save_only_model=bool(args.save_only_model),
        **_evaluation(script_args, args),
        **_padding(args, model_args),
    )


def _evaluation(script_args, args) -> dict:
    """What the plan's evaluation rows read: whether and what the run evaluates, and its batch."""
    return {
        "evaluates": not str(args.eval_strategy).lower().endswith("no"),
        "eval_benchmark": _get(script_args, "eval_benchmark"),
        "eval_limit": _get(script_args, "eval_limit"),
        "eval_steps": args.eval_steps,
        "num_generations_eval": args.num_generations_eval or args.num_generations,
        "per_device_eval_batch_size": args.per_device_eval_batch_size,
    }


def _padding(args, model_args) -> dict:
    """What the plan's padding section reads: `padding_free`, its row budget, the attention implementation."""
    return {
        "padding_free": bool(_get(args, "padding_free", False)),
        "padding_free_max_tokens_per_row": _get(args, "padding_free_max_tokens_per_row"),
        "attn_implementation": _get(model_args, "attn_implementation"),
    }


def batch_arithmetic(args, world_size: int | None = None) -> dict[str, float]:
    """TRL's batch arithmetic for `world_size` processes (defaults to the run's own, `args.world_size`); `args` is a
    `GRPOConfig` or a `Run`.

    A generation holds `per_device_train_batch_size * world_size * steps_per_generation` completions; an optimizer
    step consumes `per_device_train_batch_size * world_size * gradient_accumulation_steps` of them; so each generation
    feeds `steps_per_generation / gradient_accumulation_steps * num_iterations` optimizer steps.
    """
    world_size = world_size or args.world_size
    completions_per_micro_step = args.per_device_train_batch_size * world_size
    completions_per_generation = completions_per_micro_step * args.steps_per_generation
    return {
        "world_size": world_size,
        "completions_per_generation": completions_per_generation,
        "prompts_per_generation": completions_per_generation // args.num_generations,
        "completions_per_optimizer_step": completions_per_micro_step * args.gradient_accumulation_steps,
        "optimizer_steps_per_generation": args.steps_per_generation
        * args.num_iterations
        / args.gradient_accumulation_steps,
    }


def _prompt_tokens(script_args, args, C: int) -> tuple[int, str]:
    """The longest prompt in tokens, and where that figure comes from."""
    prompt_tokens = _get(script_args, "max_prompt_tokens")
    max_model_len = args.vllm_max_model_length
    prompt_source = "max_prompt_tokens"
    if prompt_tokens is None:
        prompt_tokens = (max_model_len - C) if max_model_len else ASSUMED_PROMPT_TOKENS
        prompt_source = "vllm_max_model_length - max_completion_length" if max_model_len else "assumed"
    return prompt_tokens, prompt_source


def _trainable(shape: ModelShape | None, model_args, use_peft: bool) -> int | None:
    """The parameters that train: a LoRA adapter's, or all of the model's."""
    if shape is None:
        return None
    return shape.lora_params(model_args.lora_r, model_args.lora_target_modules) if use_peft else shape.num_params


def _get(obj, name, default=None):
    """`obj.name`, or `default` where `obj` is None or lacks it (a `GRPOConfig` has no PACS fields)."""
    return getattr(obj, name, default) if obj is not None else default
