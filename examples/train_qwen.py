"""Train a Qwen model with PACS (arXiv:2509.02522), or the GRPO baseline, on TRL: one script, YAML recipes.

Every run is `--config <recipe.yaml>` plus command-line overrides (`--learning_rate 2e-6`, `--max_steps 10`, ...);
the arguments are this script's `ScriptArguments`, `pacs.PACSConfig` (TRL's `GRPOConfig` for the GRPO baseline) and
TRL's `ModelConfig`.

Check a launch before spending a GPU (the same checks run here at start, before any model loads; docs/recipes.md):

    pacs plan --config examples/recipes/qwen3_4b_pacs.yaml --accelerate-config examples/accelerate_configs/zero3.yaml

CPU smoke run, offline, in seconds, against a local model directory (the tiny model the tests build):

    python -c "from pacs.testing import build_tiny_model; build_tiny_model('/tmp/tiny-qwen3')"
    HF_HUB_OFFLINE=1 python examples/train_qwen.py --config examples/recipes/tiny_cpu.yaml \
        --model_name_or_path /tmp/tiny-qwen3

One node, 8 GPUs, DeepSpeed ZeRO-3, vLLM colocated (the paper's setting; see the recipe for the batch arithmetic):

    accelerate launch --config_file examples/accelerate_configs/zero3.yaml \
        examples/train_qwen.py --config examples/recipes/qwen3_4b_pacs.yaml

The GRPO baseline on the same data and batch arithmetic:

    accelerate launch --config_file examples/accelerate_configs/zero3.yaml \
        examples/train_qwen.py --config examples/recipes/qwen3_4b_grpo.yaml

Two nodes x 8 GPUs (run the same command on every node, with that node's rank; the 8B recipe assumes 16 processes):

    accelerate launch --config_file examples/accelerate_configs/zero3.yaml \
        --num_machines 2 --num_processes 16 --machine_rank $NODE_RANK \
        --main_process_ip $MASTER_ADDR --main_process_port 29500 \
        examples/train_qwen.py --config examples/recipes/qwen3_8b_pacs.yaml

LoRA (the base model stays frozen in bf16, so ZeRO-2 is enough):

    accelerate launch --config_file examples/accelerate_configs/zero2.yaml \
        examples/train_qwen.py --config examples/recipes/qwen3_8b_pacs_lora.yaml

vLLM in server mode on its own GPUs (here GPUs 4-7 generate, GPUs 0-3 train; rescale the batch as the recipe says;
tensor parallelism, since TRL's vllm-serve keeps data_parallel_size at 1 for dense models):

    CUDA_VISIBLE_DEVICES=4,5,6,7 trl vllm-serve --model Qwen/Qwen3-4B --tensor_parallel_size 4 --max_model_len 9216 &
    CUDA_VISIBLE_DEVICES=0,1,2,3 accelerate launch --config_file examples/accelerate_configs/zero3.yaml \
        --num_processes 4 examples/train_qwen.py --config examples/recipes/qwen3_4b_pacs.yaml \
        --vllm_mode server --gradient_accumulation_steps 64 --steps_per_generation 256 --expected_world_size 4

Resume from the newest complete checkpoint in `output_dir` with `--resume_from_checkpoint true` (a checkpoint whose save
was cut short by a crash is skipped, with a warning naming it), or give a checkpoint folder. PACS resumes exactly, in
the middle of a generation batch too (docs/recipes.md, "Resuming after a crash").
Models load by hub id or local path, without running code from the hub unless `--trust_remote_code true`.
"""

import logging
import os
import sys
from dataclasses import dataclass, field

from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser, get_peft_config

from pacs import PACSConfig, PACSTrainer
from pacs.checkpoints import resolve_resume_checkpoint
from pacs.checks import check_model_path, check_train_dataset
from pacs.data import PROMPT_SUFFIX, SYSTEM_PROMPT, load_benchmark, load_train_dataset
from pacs.plan import check_training_plan
from pacs.rewards import get_reward_funcs


logger = logging.getLogger(__name__)


@dataclass
class ScriptArguments:
    """
    Arguments of this script that are neither training arguments ([`pacs.PACSConfig`]) nor model arguments
    ([`trl.ModelConfig`]).

    Args:
        algorithm (`str`, *optional*, defaults to `"pacs"`):
            `"pacs"` trains with [`pacs.PACSTrainer`] and parses the training arguments as [`pacs.PACSConfig`];
            `"grpo"` trains with TRL's `GRPOTrainer` and parses them as TRL's `GRPOConfig` (no `pacs_*` fields),
            for side-by-side baselines.
        dataset_name (`str`, *optional*, defaults to `"math_train"`):
            Training set: `"math_train"` (bundled, offline), `"deepscaler"` (hub), or a local `.jsonl`, `.json` or
            `.parquet` file. Loaded with `pacs.data.load_train_dataset`.
        dataset_limit (`int`, *optional*):
            Keep only the first `dataset_limit` problems of the training set (a log line says how many were kept of
            how many); `0` keeps them all.
        problem_column (`str`, *optional*, defaults to `"problem"`):
            Column holding the problem, for local files: a plain-text statement, or a conversation (a list of
            `{"role", "content"}` messages, passed through unchanged).
        prompt_suffix (`str`, *optional*, defaults to the paper's instruction `pacs.data.PROMPT_SUFFIX`):
            Appended to every plain-text problem; `""` appends nothing, any other string replaces it. Conversational
            problems are never changed.
        system_prompt (`str`, *optional*, defaults to the paper's `"You are a helpful assistant."`):
            System turn put before every plain-text problem (training set and `eval_benchmark`); `""` sends the user
            turn alone, for models whose chat template has no system role. Conversational problems are never changed.
        max_prompt_tokens (`int`, *optional*):
            Drop the training prompts longer than this many tokens, counted as the trainer will feed them (the
            tokenizer's chat template with the generation prompt), before training; a log line gives the count. The
            paper filters prompts over 1,024 tokens; TRL 1.16 has no prompt-length limit of its own. Unset keeps all.
        answer_column (`str`, *optional*, defaults to `"answer"`):
            Column holding the gold final answer, for local files.
        reward_funcs (`list[str]`, *optional*, defaults to `["math"]`):
            Reward functions, by name (`"math"`, `"format"`) or dotted import path. Loaded with
            `pacs.rewards.get_reward_funcs`.
        eval_benchmark (`str`, *optional*):
            Bundled benchmark (`"math500"`, `"aime24"`, `"aime25"`, `"amc23"`) evaluated every `eval_steps` when
            `eval_strategy` is `"steps"`. TRL then logs the mean reward over `num_generations_eval` samples per
            problem (`eval_reward`), i.e. a pass@1 estimate at the training temperature.
        eval_limit (`int`, *optional*):
            Keep only the first `eval_limit` problems of the benchmark.
        expected_world_size (`int`, *optional*):
            Number of processes the recipe's batch arithmetic assumes. When the run has a different number, the script
            warns and says how to rescale `gradient_accumulation_steps` and `steps_per_generation`.
        expected_gpu_memory_gb (`float`, *optional*):
            Memory of one GPU the recipe assumes, in GiB as the GPU reports it (an "80 GB" H100 reports about 79.2).
            `pacs plan --config <recipe>` checks the recipe against it; a run on GPUs with less memory logs a warning.
        check_plan (`bool`, *optional*, defaults to `True`):
            Run `pacs plan`'s checks (`pacs.plan.check_training_plan`) at start, before any model loads, and stop on
            a failure (a vLLM engine that cannot start, bf16 weights that cannot learn, a vLLM share below the
            weights, memory over the GPU's). `false` only logs them, for when an estimate is wrong for your hardware.
    """

    algorithm: str = field(
        default="pacs",
        metadata={
            "help": "`pacs` (PACSTrainer) or `grpo` (TRL's GRPOTrainer, for baselines).",
            "choices": ["pacs", "grpo"],
        },
    )
    dataset_name: str = field(
        default="math_train",
        metadata={
            "help": "Training set: `math_train` (bundled), `deepscaler` (hub), or a local .jsonl/.json/.parquet."
        },
    )
    dataset_limit: int | None = field(
        default=None,
        metadata={"help": "Keep only the first `dataset_limit` problems of the training set; `0` keeps them all."},
    )
    problem_column: str = field(
        default="problem",
        metadata={"help": "Column holding the problem (text, or a list of role/content messages), for local files."},
    )
    prompt_suffix: str = field(
        default=PROMPT_SUFFIX,
        metadata={"help": "Appended to every plain-text problem (the paper's instruction); `''` for none."},
    )
    system_prompt: str = field(
        default=SYSTEM_PROMPT,
        metadata={
            "help": "System turn before every plain-text problem (the paper's); `''` sends the user turn alone."
        },
    )
    max_prompt_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Drop training prompts longer than this many tokens (chat template applied), logging the count; "
            "the paper's 1024."
        },
    )
    answer_column: str = field(
        default="answer", metadata={"help": "Column holding the gold final answer, for local files."}
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["math"],
        metadata={"help": "Reward functions, by name (`math`, `format`) or dotted import path."},
    )
    eval_benchmark: str | None = field(
        default=None,
        metadata={"help": "Bundled benchmark (`math500`, `aime24`, `aime25`, `amc23`) evaluated every `eval_steps`."},
    )
    eval_limit: int | None = field(
        default=None, metadata={"help": "Keep only the first `eval_limit` problems of the benchmark."}
    )
    expected_world_size: int | None = field(
        default=None,
        metadata={
            "help": "Number of processes the recipe's batch arithmetic assumes; the script warns on a mismatch."
        },
    )
    expected_gpu_memory_gb: float | None = field(
        default=None,
        metadata={"help": "Memory of one GPU the recipe assumes (GiB); `pacs plan` checks the recipe against it."},
    )
    check_plan: bool = field(
        default=True,
        metadata={"help": "Stop at start on a failure of `pacs plan`'s checks; `false` only logs them."},
    )


def batch_arithmetic(args: GRPOConfig, world_size: int | None = None) -> dict[str, float]:
    """TRL's batch arithmetic for `world_size` processes (defaults to the current run's).

    A generation holds `per_device_train_batch_size * world_size * steps_per_generation` completions; an optimizer
    step consumes `per_device_train_batch_size * world_size * gradient_accumulation_steps` of them; so each generation
    feeds `steps_per_generation / gradient_accumulation_steps * num_iterations` optimizer steps.
    """
    world_size = world_size or args.world_size
    completions_per_micro_step = args.per_device_train_batch_size * world_size
    completions_per_generation = completions_per_micro_step * args.steps_per_generation
    optimizer_steps_per_generation = args.steps_per_generation * args.num_iterations / args.gradient_accumulation_steps
    return {
        "world_size": world_size,
        "completions_per_generation": completions_per_generation,
        "prompts_per_generation": completions_per_generation // args.num_generations,
        "completions_per_optimizer_step": completions_per_micro_step * args.gradient_accumulation_steps,
        "optimizer_steps_per_generation": optimizer_steps_per_generation,
    }


def check_world_size(script_args: ScriptArguments, training_args: GRPOConfig) -> None:
    """Warn when the run's world size differs from the one the recipe was written for, and say how to rescale."""
    expected, actual = script_args.expected_world_size, training_args.world_size
    if expected is None or expected == actual or training_args.process_index != 0:
        return
    intended = batch_arithmetic(training_args, expected)
    # keep the completions per optimizer step and per generation: both scale as 1 / world_size
    ga = intended["completions_per_optimizer_step"] / (training_args.per_device_train_batch_size * actual)
    spg = intended["completions_per_generation"] / (training_args.per_device_train_batch_size * actual)
    logger.warning(
        "The recipe assumes %d processes but this run has %d, so a generation holds %d completions instead of %d. "
        "To keep the recipe's batch, pass --gradient_accumulation_steps %s --steps_per_generation %s "
        "--expected_world_size %d.",
        expected,
        actual,
        training_args.generation_batch_size,
        intended["completions_per_generation"],
        int(ga) if ga.is_integer() else f"{ga:.2f} (not an integer: change per_device_train_batch_size too)",
        int(spg) if spg.is_integer() else f"{spg:.2f} (not an integer: change per_device_train_batch_size too)",
        actual,
    )


def load_datasets(script_args: ScriptArguments, training_args: GRPOConfig):
    """The training set (`--dataset_name`) and the evaluation set (`--eval_benchmark`, when `eval_strategy` is on)."""
    train_dataset = load_train_dataset(
        script_args.dataset_name,
        problem_column=script_args.problem_column,
        answer_column=script_args.answer_column,
        limit=script_args.dataset_limit or None,
        prompt_suffix=script_args.prompt_suffix,
        system_prompt=script_args.system_prompt or None,
    )
    eval_dataset = None
    if training_args.eval_strategy != "no":
        if script_args.eval_benchmark is None:
            raise ValueError(
                f"eval_strategy is {training_args.eval_strategy!r} but there is nothing to evaluate on: pass "
                "--eval_benchmark math500 (or aime24, aime25, amc23), or --eval_strategy no."
            )
        eval_dataset = load_benchmark(
            script_args.eval_benchmark, limit=script_args.eval_limit, system_prompt=script_args.system_prompt or None
        )
    return train_dataset, eval_dataset


def drop_long_prompts(dataset, tokenizer, max_prompt_tokens: int, chat_template_kwargs: dict | None = None):
    """`dataset` without the rows whose prompt is longer than `max_prompt_tokens` tokens, counted as GRPOTrainer
    tokenizes it (conversations: the chat template with the generation prompt, as in its `_tokenize_prompts`)."""
    if max_prompt_tokens < 1:
        raise ValueError(
            f"max_prompt_tokens must be at least 1 (or unset to keep every prompt), got {max_prompt_tokens}."
        )
    lengths = []
    for start in range(0, len(dataset), 1024):
        prompts = dataset[start : start + 1024]["prompt"]
        if isinstance(prompts[0], str):
            ids = tokenizer(text=prompts)["input_ids"]
        else:
            ids = tokenizer.apply_chat_template(
                conversation=prompts, add_generation_prompt=True, tokenize=True, return_dict=True,
                **(chat_template_kwargs or {}),
            )["input_ids"]  # fmt: skip
        lengths += [len(x) for x in ids]
    keep = [i for i, n in enumerate(lengths) if n <= max_prompt_tokens]
    logger.info(
        "max_prompt_tokens=%d: dropped %d of %d training prompts (longest: %d tokens, chat template applied)",
        max_prompt_tokens, len(dataset) - len(keep), len(dataset), max(lengths, default=0),
    )  # fmt: skip
    if not keep:
        raise ValueError(
            f"Every training prompt is longer than max_prompt_tokens={max_prompt_tokens} tokens (the shortest has "
            f"{min(lengths, default=0)}); raise --max_prompt_tokens or leave it unset."
        )
    return dataset if len(keep) == len(dataset) else dataset.select(keep)


def main(script_args: ScriptArguments, training_args: GRPOConfig, model_args: ModelConfig) -> None:
    if model_args.model_name_or_path is None:
        raise ValueError("No model given: pass --model_name_or_path <hub id or local directory>.")
    check_model_path(model_args.model_name_or_path)
    # before any model loads: what `pacs plan` checks (vLLM's limits, precision, memory), on this run's own hardware
    try:
        check_training_plan(script_args, training_args, model_args)
    except ValueError:
        if script_args.check_plan:
            raise
        logger.exception("check_plan is false: training despite the plan's failures")

    # 1. The model is loaded by the trainer from its id or path, so that ZeRO-3 can shard it while it loads.
    model_init_kwargs = {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs

    # 2. Data and rewards: the prompts are conversational and the gold answers sit in the `solution` column,
    # which TRL hands to every reward function as a keyword argument.
    train_dataset, eval_dataset = load_datasets(script_args, training_args)
    reward_funcs = get_reward_funcs(script_args.reward_funcs)
    # before the model loads: a missing column or an empty set is an error that names the fix (PACSTrainer runs this
    # check itself, before it loads the model; the GRPO baseline's trainer does not)
    for name, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
        if script_args.algorithm != "pacs":
            check_train_dataset(
                dataset, reward_funcs, name=name, remove_unused_columns=training_args.remove_unused_columns
            )
    if script_args.max_prompt_tokens is not None:  # the paper filters overlong prompts before training
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            model_args.model_name_or_path,
            revision=model_args.model_revision,
            trust_remote_code=training_args.trust_remote_code,
        )
        train_dataset = drop_long_prompts(
            train_dataset, tokenizer, script_args.max_prompt_tokens, training_args.chat_template_kwargs
        )

    # 3. The trainer: PACS, or the GRPO baseline on identical arguments.
    check_world_size(script_args, training_args)
    trainer_cls = PACSTrainer if script_args.algorithm == "pacs" else GRPOTrainer
    trainer = trainer_cls(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=get_peft_config(model_args),
    )
    if trainer.accelerator.is_main_process:
        backend = trainer.accelerator.distributed_type.value
        if trainer.is_deepspeed_enabled:
            backend += f" zero_stage={trainer.accelerator.state.deepspeed_plugin.zero_stage}"
        arithmetic = batch_arithmetic(training_args)
        print(f"{script_args.algorithm} on {len(train_dataset)} problems, {backend}: {arithmetic}")

    # 4. Train, resuming if asked (`--resume_from_checkpoint true`: the newest complete checkpoint in output_dir).
    resume = training_args.resume_from_checkpoint  # PACSTrainer.train resolves it (pacs.checkpoints); GRPOTrainer not
    if script_args.algorithm != "pacs":
        resume = resolve_resume_checkpoint(resume, training_args.output_dir, trainer.accelerator.is_main_process)
    trainer.train(resume_from_checkpoint=resume)

    # 5. Save (LoRA: the adapter; ZeRO-3: the gathered 16-bit weights) and push like any TRL script.
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        print(f"Model saved to {os.path.abspath(training_args.output_dir)}")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    if hasattr(trainer, "end"):  # transformers >= 5.18: finish the trackers and destroy the process group
        trainer.end()


def make_parser(algorithm: str = "pacs") -> TrlParser:
    return TrlParser((ScriptArguments, PACSConfig if algorithm == "pacs" else GRPOConfig, ModelConfig))


def parse_args(args: list[str] | None = None) -> tuple[ScriptArguments, GRPOConfig, ModelConfig]:
    """Parse `--config recipe.yaml` plus overrides; `algorithm` (from either) picks `PACSConfig` or `GRPOConfig`."""
    args = sys.argv[1:] if args is None else list(args)
    algorithm = "pacs"
    if not {"-h", "--help"} & set(args):
        script_args, _ = TrlParser(ScriptArguments).parse_args_and_config(args, return_remaining_strings=True)
        algorithm = script_args.algorithm
    if algorithm == "pacs":
        return make_parser("pacs").parse_args_and_config(args)
    # GRPOConfig has no pacs_* fields: a PACS recipe run as the GRPO baseline drops them, anything else is an error
    *parsed, remaining = make_parser(algorithm).parse_args_and_config(args, return_remaining_strings=True)
    unknown = [arg for arg in remaining if arg.startswith("-") and not arg.startswith("--pacs_")]
    if unknown:
        raise ValueError(f"Unknown arguments {unknown}; see `python examples/train_qwen.py --help`.")
    if remaining:
        logger.warning("algorithm=%s ignores the PACS settings %s", algorithm, " ".join(remaining))
    return tuple(parsed)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main(*parse_args())
