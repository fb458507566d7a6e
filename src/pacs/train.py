"""`pacs train`: train with PACS (arXiv:2509.02522), or hardened GRPO, from a YAML recipe, as `trl grpo` does.

Every run is `--config RECIPE` plus command-line overrides (`--learning_rate 2e-6`, `--max_steps 10`, ...). A recipe
is a shipped one by name (`pacs recipes` lists them) or a YAML file by path (a path that exists wins). Its keys are
the fields of [`ScriptArguments`] below, of `pacs.PACSConfig` (`pacs.grpo.HardenedGRPOConfig` for `algorithm: grpo`)
and of TRL's `ModelConfig`, parsed by `TrlParser`, so `--config`, the help texts and the recipes come from one
definition; plus the launch keys: `accelerate_config` and the options of `accelerate launch` (`--num_processes 4`,
...). Any other key is an error that names the closest valid ones.

How it launches (TRL's convention, `trl grpo`): when the recipe or the command line names an `accelerate_config`
(a shipped one by name: `zero3`, `zero2`, `ddp`, `zero3_multinode`, `zero3_hostfile`; or a path), `pacs train` runs
`accelerate launch --config_file <it> [launch options] -m pacs.train <the rest>`; without one (and without launch
options), it trains in this process. `python -m pacs.train ...` always trains in its own process, which is what
`accelerate launch -m pacs.train` (or `examples/train_qwen.py`) runs on every rank; there the launch keys are ignored.
Before any model loads, the run checks itself as `pacs plan` does (`pacs.plan.check_training_plan`).

Check a launch before spending a GPU (the same checks; docs/recipes.md):

    pacs plan --config qwen3_4b_pacs

CPU smoke run, offline, in seconds, against a local model directory (the tiny model the tests build):

    python -c "from pacs.testing import build_tiny_model; build_tiny_model('/tmp/tiny-qwen3')"
    HF_HUB_OFFLINE=1 pacs train --config tiny_cpu --model_name_or_path /tmp/tiny-qwen3

One node, 8 GPUs, DeepSpeed ZeRO-3 (the recipe's `accelerate_config: zero3`), vLLM colocated (the paper's setting):

    pacs train --config qwen3_4b_pacs

Two nodes x 8 GPUs (the same command on every node, with that node's rank; the 8B recipe assumes 16 processes):

    pacs train --config qwen3_8b_pacs --num_machines 2 --num_processes 16 --machine_rank $NODE_RANK \
        --main_process_ip $MASTER_ADDR --main_process_port 29500

Resume from the newest complete checkpoint in `output_dir` with `--resume_from_checkpoint true`, or give a checkpoint
folder (docs/recipes.md, "Resuming after a crash"). Models load by hub id or local path, without running code from the
hub unless `--trust_remote_code true`.
"""

import difflib
import logging
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

from trl import GRPOConfig, ModelConfig, TrlParser, get_peft_config

from pacs import PACSConfig, PACSTrainer
from pacs.data import PROMPT_SUFFIX, SYSTEM_PROMPT, drop_long_prompts, load_benchmark, load_train_dataset
from pacs.grpo import HardenedGRPOConfig, HardenedGRPOTrainer
from pacs.grpo.checkpoints import train_unless_finished
from pacs.grpo.checks import check_model_path
from pacs.plan import batch_arithmetic, check_training_plan
from pacs.recipes import resolve_accelerate_config, resolve_recipe
from pacs.rewards import get_reward_funcs


logger = logging.getLogger(__name__)

ALGORITHMS = {"pacs": (PACSTrainer, PACSConfig), "grpo": (HardenedGRPOTrainer, HardenedGRPOConfig)}
"""`algorithm` -> (trainer, its config): PACS, or the same hardened layer with GRPO's own loss (the baseline)."""


@dataclass
class ScriptArguments:
    """
    Arguments of `pacs train` that are neither training arguments ([`pacs.PACSConfig`]) nor model arguments
    ([`trl.ModelConfig`]).

    Args:
        algorithm (`str`, *optional*, defaults to `"pacs"`):
            `"pacs"` trains with [`pacs.PACSTrainer`] and parses the training arguments as [`pacs.PACSConfig`];
            `"grpo"` trains with [`pacs.grpo.HardenedGRPOTrainer`] (TRL's `GRPOTrainer` and its loss, with the same
            checks, guards and checkpoints as PACS) and parses them as [`pacs.grpo.HardenedGRPOConfig`] (TRL's
            `GRPOConfig` plus `pacs_max_skipped_steps`), for side-by-side baselines.
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
            Number of processes the recipe's batch arithmetic assumes. A launch with a different number changes the
            batch, so `pacs plan` and the run's start-up check refuse it, naming how to rescale
            `gradient_accumulation_steps` and `steps_per_generation` (or pass the new number to accept the new batch).
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
            "help": "`pacs` (PACSTrainer) or `grpo` (HardenedGRPOTrainer: GRPO's loss, for baselines).",
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
            "help": "Number of processes the recipe's batch arithmetic assumes; another number is refused, naming the "
            "rescaling."
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


def main(script_args: ScriptArguments, training_args: GRPOConfig, model_args: ModelConfig) -> None:
    """Train in this process: the checks, the data and rewards, the trainer, `train()`, the saved model."""
    if model_args.model_name_or_path is None:
        raise ValueError("No model given: pass --model_name_or_path <hub id or local directory>.")
    check_model_path(model_args.model_name_or_path)
    # before any model loads: what `pacs plan` checks (batch, vLLM's limits, precision, memory) on this run's hardware
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
    # which TRL hands to every reward function as a keyword argument. The trainer checks them against each other
    # before the model loads (`pacs.grpo.checks`).
    train_dataset, eval_dataset = load_datasets(script_args, training_args)
    reward_funcs = get_reward_funcs(script_args.reward_funcs)
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

    # 3. The trainer: PACS, or the GRPO baseline on identical arguments and the same hardened layer.
    trainer_cls, _ = ALGORITHMS[script_args.algorithm]
    trainer = trainer_cls(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=get_peft_config(model_args),
    )
    _log_run(trainer, script_args.algorithm, len(train_dataset))
    _train_and_save(trainer, script_args, training_args)


def _train_and_save(trainer, script_args: ScriptArguments, training_args: GRPOConfig) -> None:
    # 4. Train, resuming if asked (`--resume_from_checkpoint true`: the newest complete checkpoint in output_dir); a
    #    run whose checkpoint is already at max_steps trains nothing and keeps its final model (pacs.grpo.checkpoints).
    trained = train_unless_finished(trainer, training_args.resume_from_checkpoint)

    # 5. Save (LoRA: the adapter; ZeRO-3: the gathered 16-bit weights) and push like any TRL script.
    if trained:
        trainer.save_model(training_args.output_dir)
        if trainer.accelerator.is_main_process:
            logger.info("Model saved to %s", os.path.abspath(training_args.output_dir))
        if training_args.push_to_hub:
            trainer.push_to_hub(dataset_name=script_args.dataset_name)
    if hasattr(trainer, "end"):  # transformers >= 5.18: finish the trackers and destroy the process group
        trainer.end()


def _log_run(trainer, algorithm: str, problems: int) -> None:
    """One line on what trains where: the backend (DeepSpeed stage, processes) and TRL's batch arithmetic."""
    if not trainer.accelerator.is_main_process:
        return
    state = trainer.accelerator.state
    stage = state.deepspeed_plugin.zero_stage if trainer.is_deepspeed_enabled else None
    backend = f"DeepSpeed ZeRO-{stage}" if stage is not None else "no DeepSpeed"
    batch = batch_arithmetic(trainer.args)
    logger.info(
        "%s on %d training problems, %d process(es), %s: %d completions per generation, %d per optimizer step, "
        "%g optimizer steps per generation",
        algorithm, problems, state.num_processes, backend, batch["completions_per_generation"],
        batch["completions_per_optimizer_step"], batch["optimizer_steps_per_generation"],
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# The recipe reader: TrlParser over the three dataclasses, plus the launch keys
# ---------------------------------------------------------------------------------------------------------------------

LAUNCH_KEY = "--accelerate_config"  # TRL's key (trl/cli/accelerate_config.py): a shipped config's name or a path
# accelerate launch's own options that `pacs train` cannot pass on: it runs the module itself
NOT_LAUNCH_OPTIONS = {"--module", "--no_python", "--no-python", "--help", "--config_file", "--config-file"}


def make_parser(algorithm: str = "pacs", prog: str = "pacs train") -> TrlParser:
    return TrlParser(
        (ScriptArguments, ALGORITHMS[algorithm][1], ModelConfig),
        prog=prog,
        allow_abbrev=False,  # `--num_generation` is a typo to name, not an abbreviation of `--num_generations`
        epilog="Launch keys (recipe or command line): --accelerate_config NAME_OR_PATH (shipped: zero3, zero2, ddp, "
        "zero3_multinode, zero3_hostfile) and the options of `accelerate launch` (--num_processes, --num_machines, "
        "--machine_rank, --main_process_ip, ...); see pacs.train's docstring.",
    )


def launch_options() -> set[str]:
    """The option strings `pacs train` passes on to `accelerate launch`."""
    from accelerate.commands.launch import launch_command_parser

    options = {s for s in launch_command_parser()._option_string_actions if s.startswith("--")}
    return (options - NOT_LAUNCH_OPTIONS) | {LAUNCH_KEY}


@dataclass
class Recipe:
    """A parsed `pacs train` command line: the three argument dataclasses, and how to launch them."""

    script_args: ScriptArguments
    training_args: GRPOConfig
    model_args: ModelConfig
    accelerate_config: Path | None = None  # resolved: the command line's, else the recipe's
    launch_args: list[str] = field(default_factory=list)  # other `accelerate launch` options, as given
    train_argv: list[str] = field(default_factory=list)  # the command line without the launch options


def _resolve_config_argument(argv: list[str]) -> list[str]:
    """`--config NAME` -> `--config <the shipped recipe's path>` (a path that exists stays as it is)."""
    argv = list(argv)
    for i, arg in enumerate(argv[:-1]):
        if arg == "--config":
            argv[i + 1] = str(resolve_recipe(argv[i + 1]))
    return argv


def _groups(strings: list[str]) -> list[tuple[str, list[str]]]:
    """`["--a", "1", "--b=2", "--c"]` -> `[("--a", ["--a", "1"]), ("--b", ["--b=2"]), ("--c", ["--c"])]`."""
    groups: list[tuple[str, list[str]]] = []
    for s in strings:
        if s.startswith("-") or not groups:
            groups.append((s.split("=", 1)[0], [s]))
        else:
            groups[-1][1].append(s)
    return groups


def _unknown_keys_error(unknown: list[tuple[str, str]], parser: TrlParser, launch: set[str]) -> ValueError:
    options = {s[2:] for s in parser._option_string_actions if s.startswith("--")} | {s[2:] for s in launch}
    known = sorted(key for key in options if "-" not in key)  # the underscore spelling, as in the recipes
    lines = []
    for key, where in unknown:
        close = difflib.get_close_matches(key.lstrip("-"), known, n=3, cutoff=0.6)
        hint = f": did you mean {' or '.join(close)}?" if close else ": no similar key."
        lines.append(f"  {key.lstrip('-')} ({where}){hint}")
    return ValueError(
        "Unknown key(s), neither a training argument (`pacs train --help`: ScriptArguments, PACSConfig or GRPOConfig, "
        "ModelConfig) nor a launch key (accelerate_config, or an option of `accelerate launch` such as "
        "num_processes):\n" + "\n".join(lines)
    )


def read_recipe(argv: list[str] | None = None, prog: str = "pacs train") -> Recipe:
    """Parse `--config RECIPE` plus overrides; `algorithm` (from either) picks the config class (`ALGORITHMS`).

    Keys that are neither training arguments nor launch keys are an error naming the closest valid keys; a PACS
    recipe run as the GRPO baseline (`--algorithm grpo`) drops the PACS settings its config lacks with a warning.
    """
    argv = _resolve_config_argument(sys.argv[1:] if argv is None else argv)
    algorithm = "pacs"
    if not {"-h", "--help"} & set(argv):
        first = TrlParser(ScriptArguments, allow_abbrev=False)  # only `algorithm`; the rest is read below
        script_args, _ = first.parse_args_and_config(argv, return_remaining_strings=True)
        algorithm = script_args.algorithm
    parser = make_parser(algorithm, prog)
    not_here = {f"--{f.name}" for f in fields(PACSConfig)} - {f"--{f.name}" for f in fields(ALGORITHMS[algorithm][1])}
    *parsed, from_recipe, from_cli = parser.parse_args_and_config(
        argv, return_remaining_strings=True, separate_remaining_strings=True
    )
    recipe, launch = Recipe(*parsed), launch_options()
    accelerate_config, cli_launch, unknown, dropped = None, [], [], []
    for where, strings in (("in the recipe", from_recipe), ("on the command line", from_cli)):
        for key, tokens in _groups(strings):
            if key == LAUNCH_KEY or key in launch:
                if key == LAUNCH_KEY:
                    accelerate_config = tokens[-1].split("=", 1)[-1]
                else:
                    recipe.launch_args += tokens
                cli_launch += tokens if where == "on the command line" else []
            elif key in not_here:  # a PACS setting, in a recipe run as the GRPO baseline
                dropped += tokens
            else:
                unknown.append((key, where))
    if unknown:
        raise _unknown_keys_error(unknown, parser, launch)
    if dropped:
        logger.warning("algorithm=%s ignores the PACS settings %s", algorithm, " ".join(dropped))
    if accelerate_config is not None:
        recipe.accelerate_config = resolve_accelerate_config(accelerate_config)
    recipe.train_argv = _subtract_subsequence(argv, cli_launch)
    return recipe


def _subtract_subsequence(items: list[str], subsequence: list[str]) -> list[str]:
    """`items` without the ordered `subsequence` (TRL's `trl/cli/commands/training.py` does the same)."""
    rest, it = [], iter(subsequence)
    current = next(it, None)
    for item in items:
        if current is not None and item == current:
            current = next(it, None)
        else:
            rest.append(item)
    return rest


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, GRPOConfig, ModelConfig]:
    """The three argument dataclasses of a `pacs train` command line (the launch keys read and set aside)."""
    recipe = read_recipe(argv)
    return recipe.script_args, recipe.training_args, recipe.model_args


# ---------------------------------------------------------------------------------------------------------------------
# Entry points: `pacs train` (launches accelerate when asked) and `python -m pacs.train` (this process)
# ---------------------------------------------------------------------------------------------------------------------


def run_in_process(argv: list[str] | None = None) -> None:
    """`python -m pacs.train ...`: train in this process (what every rank of an accelerate launch runs)."""
    recipe = read_recipe(argv, prog="python -m pacs.train")
    if recipe.launch_args and "LOCAL_RANK" not in os.environ:
        logger.warning(
            "%s are options of `accelerate launch`: this process trains as launched and ignores them (use "
            "`pacs train`, which launches accelerate, or pass them to `accelerate launch`).",
            " ".join(recipe.launch_args),
        )
    main(recipe.script_args, recipe.training_args, recipe.model_args)


def launch(recipe: Recipe) -> None:
    """`accelerate launch --config_file <accelerate_config> [launch options] -m pacs.train <the rest>`, in this
    process, as TRL's `trl grpo` (trl/cli/accelerate_launcher.py)."""
    from accelerate.commands.launch import launch_command, launch_command_parser

    config = ["--config_file", str(recipe.accelerate_config)] if recipe.accelerate_config else []
    command = [*config, *recipe.launch_args, "--module", "pacs.train", *recipe.train_argv]
    logger.info("accelerate launch %s", " ".join(command))
    launch_command(launch_command_parser().parse_args(command))


def run(args) -> int:
    """`pacs train ...` (registered in `pacs.cli`): `args.overrides` is the whole command line after `train`."""
    argv = list(getattr(args, "overrides", []))
    try:
        recipe = read_recipe(argv)
    except (ValueError, FileNotFoundError) as error:  # a recipe or a key that does not exist: the message is the fix
        print(f"pacs train: error: {error}", file=sys.stderr)
        return 2
    # inside a launched process (`accelerate launch ... pacs train`), or nothing to launch: train here
    if "LOCAL_RANK" in os.environ or (recipe.accelerate_config is None and not recipe.launch_args):
        main(recipe.script_args, recipe.training_args, recipe.model_args)
    else:
        launch(recipe)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pacs.train import run_in_process as _run  # the package's module, not a second copy as __main__

    _run()
