"""The reader of `pacs train`'s command line and recipes, shared by `pacs train` and `pacs plan`.

A recipe (`--config NAME_OR_PATH`, `pacs.recipes.resolve_recipe`) plus command-line overrides, parsed by TRL's
`TrlParser` into three dataclasses: [`ScriptArguments`] (below), the training arguments (`pacs.PACSConfig`, or
`pacs.grpo.HardenedGRPOConfig` for `algorithm: grpo`: [`ALGORITHMS`]) and TRL's `ModelConfig`; plus the launch keys
(`accelerate_config`, and the options of `accelerate launch`), set aside for `pacs train` to launch with. Any other
key is an error naming the closest valid ones. It imports no trainer, so that `pacs plan` reads a recipe exactly as
`pacs train` does without importing `pacs.train` (which imports the planner).
"""

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trl import GRPOConfig, ModelConfig, TrlParser

from ..config import PACSConfig
from ..data import PROMPT_SUFFIX, SYSTEM_PROMPT
from ..grpo.config import HardenedGRPOConfig
from ..options import CommandParser, did_you_mean, field_options, unknown_options_error
from ..rewards import REWARD_FACTORIES, REWARD_FUNCS
from . import resolve_accelerate_config, resolve_recipe


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Algorithm:
    """One `algorithm` of `pacs train`: the class its training arguments parse into, and its trainer (a class, or its
    dotted path, imported by `trainer_class` when `pacs train` builds it: the reader imports no trainer)."""

    config: type
    trainer: Callable | str

    def trainer_class(self) -> Callable:
        if not isinstance(self.trainer, str):
            return self.trainer
        import importlib

        module, _, name = self.trainer.rpartition(".")
        return getattr(importlib.import_module(module), name)


ALGORITHMS = {
    "pacs": Algorithm(PACSConfig, "pacs.PACSTrainer"),
    "grpo": Algorithm(HardenedGRPOConfig, "pacs.grpo.HardenedGRPOTrainer"),  # GRPO's loss on the same hardened layer
}
"""The one table of `pacs train`'s `algorithm` (read by `pacs train`, `pacs plan` and the `algorithm` option's
choices): PACS, or the GRPO baseline on identical arguments and the same checks, guards and checkpoints."""


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
            Training set: `"math_train"` (bundled, offline), `"deepscaler"` (hub), a hub id, or a local `.jsonl`,
            `.json` or `.parquet` file, in the math format (`problem_column`, `answer_column`: the paper's prompt is
            built) or in TRL's (a `prompt` column, plain or conversational, kept as it is, and the columns the reward
            functions take). The columns the rewards take are kept and checked before anything loads or launches.
            Loaded with `pacs.data.load_train_dataset`.
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
            Reward functions, by name (`"math"`, `"boxed_math"`, `"format"`: `pacs.rewards.REWARD_FUNCS`;
            `"soft_overlong_punishment"`, DAPO's overlong reward shaping over the last `soft_punish_cache` tokens before
            `max_completion_length`: `pacs.rewards.REWARD_FACTORIES`) or dotted import path (`mymodule.my_reward`;
            `pacs train` imports modules from the working directory, as `python -m` does). Loaded with
            `pacs.rewards.get_reward_funcs`.
        soft_punish_cache (`int`, *optional*):
            With the reward `soft_overlong_punishment`: the tokens before `max_completion_length` over which its
            punishment grows from 0 to -1 (DAPO's overlong buffer, 4,096 of 20,480; verl's
            `reward_model.overlong_buffer.len`). Unset: a fifth of `max_completion_length`, DAPO's share.
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
        overwrite_output_dir (`bool`, *optional*, defaults to `False`):
            A fresh start (no `resume_from_checkpoint`) in an `output_dir` that holds `checkpoint-N` folders is
            refused, so that another run's checkpoints are not written over; `true` deletes them and starts anew.
            Ignored when a resume is asked for (`auto`, `true`, a folder) and on an elastic restart.
        check_plan (`bool`, *optional*, defaults to `True`):
            Run `pacs plan`'s checks (`pacs.plan.check_training_plan`) at start, before any model loads, and stop on
            a failure (a vLLM engine that cannot start, bf16 weights that cannot learn, a vLLM share below the
            weights, memory over the GPU's). `false` only logs them, for when an estimate is wrong for your hardware.
    """

    algorithm: str = field(
        default="pacs",
        metadata={
            "help": "`pacs` (PACSTrainer) or `grpo` (HardenedGRPOTrainer: GRPO's loss, for baselines).",
            "choices": list(ALGORITHMS),
        },
    )
    dataset_name: str = field(
        default="math_train",
        metadata={
            "help": "Training set: `math_train` (bundled), `deepscaler` (hub), or a local .jsonl/.json/.parquet, in "
            "the math format (problem/answer) or TRL's (`prompt` and the columns the rewards take, kept)."
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
        metadata={
            "help": f"Reward functions, by name ({', '.join(f'`{n}`' for n in [*REWARD_FUNCS, *REWARD_FACTORIES])}) "
            "or dotted import path (`mymodule.my_reward`, importable from the working directory)."
        },
    )
    soft_punish_cache: int | None = field(
        default=None,
        metadata={
            "help": "With the reward `soft_overlong_punishment`: the tokens before max_completion_length over which "
            "its punishment grows to -1 (DAPO's overlong buffer); unset: a fifth of max_completion_length."
        },
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
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "A fresh start in an output_dir holding checkpoint-N folders is refused; `true` deletes them "
            "and starts anew."
        },
    )
    check_plan: bool = field(
        default=True,
        metadata={"help": "Stop at start on a failure of `pacs plan`'s checks; `false` only logs them."},
    )


# ---------------------------------------------------------------------------------------------------------------------
# The recipe reader: TrlParser over the three dataclasses, plus the launch keys
# ---------------------------------------------------------------------------------------------------------------------

LAUNCH_KEY = "--accelerate_config"  # TRL's key (trl/cli/accelerate_config.py): a shipped config's name or a path
# accelerate launch's own options that `pacs train` cannot pass on: it runs the module itself
NOT_LAUNCH_OPTIONS = {"--module", "--no_python", "--no-python", "--help", "--config_file", "--config-file"}


USAGE = "%(prog)s --config RECIPE [--KEY VALUE ...] [--accelerate_config NAME_OR_PATH] [accelerate launch options]"
DESCRIPTION = (
    "Train with PACS (or the GRPO baseline, --algorithm grpo) from a recipe: a shipped one by name (`pacs recipes` "
    "lists them: qwen3_4b_pacs, tiny_cpu, ...) or a YAML file by path, e.g. `pacs train --config qwen3_4b_pacs`. "
    "Every key below can be set in the recipe or on the command line, where it overrides the recipe's "
    "(`--learning_rate 2e-6`). Check a launch first with `pacs plan --config RECIPE`."
)


RESUME_HELP = (
    "Resume: `auto` (the newest complete checkpoint of output_dir, or a fresh start when there is none; the shipped "
    "GPU recipes' setting), `true` (the newest complete checkpoint, which must exist), or a checkpoint folder."
)


def make_parser(algorithm: str = "pacs", prog: str = "pacs train") -> TrlParser:
    return CommandParser(
        (ScriptArguments, ALGORITHMS[algorithm].config, ModelConfig),
        prog=prog,
        usage=USAGE,
        description=DESCRIPTION,
        epilog="Launch keys (recipe or command line): --accelerate_config NAME_OR_PATH (shipped: zero3, zero2, ddp, "
        "zero3_multinode, zero3_hostfile) and the options of `accelerate launch` (--num_processes, --num_machines, "
        "--machine_rank, --main_process_ip, ...); see pacs.train's docstring. --resume_from_checkpoint: "
        + RESUME_HELP,
    )


def launch_options() -> set[str]:
    """The option strings `pacs train` passes on to `accelerate launch` (read from accelerate's own parser: it has
    no public list of them)."""
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
    argv: list[str] = field(default_factory=list)  # the command line (`--config` resolved to a path)


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


def _split_config(argv: list[str]) -> tuple[dict, list[str]]:
    """The recipe's keys (a YAML mapping) and the command line without `--config PATH`."""
    import yaml

    if "--config" not in argv[:-1]:
        return {}, argv
    i = argv.index("--config")
    with open(argv[i + 1]) as f:
        config = yaml.safe_load(f)
    if not isinstance(config, dict):
        raise ValueError(f"The recipe {argv[i + 1]} must be a YAML mapping of keys to values.")
    return config, argv[:i] + argv[i + 2 :]


def _algorithm(config: dict, cli: list[str]) -> str:
    """The `algorithm` the command line (its last `--algorithm`) or else the recipe names: the one key read before the
    parse, since it picks the parser's training-argument class (`ALGORITHMS`)."""
    algorithm = config.get("algorithm", "pacs")
    for key, tokens in _groups(cli):
        if key == "--algorithm":
            algorithm = tokens[-1].split("=", 1)[-1] if len(tokens) <= 2 else tokens[1]
    if algorithm not in ALGORITHMS:
        close = did_you_mean(str(algorithm), ALGORITHMS)
        raise ValueError(
            f"algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}" + (f"; {close}" if close else ".")
        )
    return algorithm


def _sort_keys(config_rest: list[str], cli_rest: list[str], algorithm: str):
    """The keys that are not training arguments, sorted before any argument class is built (their `__post_init__`
    checks values, and a typo must be named before a value error it causes): launch keys, PACS settings a GRPO run
    drops, and unknown keys (an error naming the closest valid ones)."""
    launch = launch_options()
    not_here = {
        f"--{name}" for name in set(field_options([PACSConfig])) - set(field_options([ALGORITHMS[algorithm].config]))
    }
    accelerate_config, launch_args, unknown, dropped = None, [], [], []
    for where, strings in (("in the recipe", config_rest), ("on the command line", cli_rest)):
        for key, tokens in _groups(strings):
            if key == LAUNCH_KEY:
                accelerate_config = tokens[-1].split("=", 1)[-1]
            elif key in launch:
                launch_args += tokens
            elif key in not_here:  # a PACS setting, in a recipe run as the GRPO baseline
                dropped += tokens
            else:
                unknown.append((key, where))
    if unknown:
        known = [
            *field_options([ScriptArguments, ALGORITHMS[algorithm].config, ModelConfig]),
            *(s[2:] for s in launch),
        ]
        raise unknown_options_error(
            unknown,
            [key for key in known if "-" not in key],  # the underscore spelling, as in the recipes
            "a training argument (`pacs train --help`: ScriptArguments, PACSConfig or GRPOConfig, ModelConfig) nor a "
            "launch key (accelerate_config, or an option of `accelerate launch` such as num_processes)",
        )
    return accelerate_config, launch_args, dropped


def read_recipe(argv: list[str] | None = None, prog: str = "pacs train") -> Recipe:
    """Parse `--config RECIPE` plus overrides, once; `algorithm` (from either) picks the config class (`ALGORITHMS`).

    As TRL's `TrlParser.parse_args_and_config` does, in three steps, so that a key that is neither a training
    argument nor a launch key is named (with the closest valid keys) before any value is checked: (1) the recipe's
    keys become the parser's defaults, (2) the command line is parsed, (3) the keys left over are sorted (launch keys
    set aside; PACS settings a GRPO run lacks dropped with a warning; any other is an error), and only then are the
    argument classes built, which checks their values. Every error is a `ValueError` (or `FileNotFoundError`) of one
    message.
    """
    argv = _resolve_config_argument(sys.argv[1:] if argv is None else argv)
    config, cli = _split_config(argv)
    for key, value in (config.pop("env", None) or {}).items():  # TRL's recipe key `env`: environment variables
        os.environ[key] = str(value)
    algorithm = _algorithm(config, cli) if not {"-h", "--help"} & set(cli) else "pacs"
    parser = make_parser(algorithm, prog)
    config_rest = parser.set_defaults_with_config(**config)  # 1.
    namespace, cli_rest = parser.parse_known_args(cli)  # 2. (`--help` prints the help and exits here)
    accelerate_config, launch_args, dropped = _sort_keys(config_rest, cli_rest, algorithm)  # 3.
    try:
        arguments = [dtype(**{name: getattr(namespace, name) for name in field_options([dtype])})
                     for dtype in parser.dataclass_types]  # fmt: skip
    except ValueError as error:
        if _asks_for_a_missing_gpu(error):
            raise ValueError(_no_gpu_message(argv, prog)) from error
        raise
    recipe = Recipe(*arguments, launch_args=launch_args, argv=argv)
    if dropped:
        logger.warning("algorithm=%s ignores the PACS settings %s", algorithm, " ".join(dropped))
    if accelerate_config is not None:
        recipe.accelerate_config = resolve_accelerate_config(accelerate_config)
    return recipe


def _asks_for_a_missing_gpu(error: ValueError) -> bool:
    """Whether `error` is transformers' refusal of bf16/fp16 (`TrainingArguments.__post_init__`) on a machine
    without a GPU."""
    import torch

    text = str(error)
    return not torch.cuda.is_available() and ("bf16/gpu" in text or ("fp16" in text and "GPU" in text))


def _no_gpu_message(argv: list[str], prog: str) -> str:
    """A GPU recipe on a machine without one: what to run instead (not transformers' advice to set `use_cpu`)."""
    config = argv[argv.index("--config") + 1] if "--config" in argv[:-1] else None
    name = Path(config).stem if config else "this recipe"
    return (
        f"{name} is written for GPUs (bf16 or fp16) and this machine has none. Check what it asks of them with "
        f"`pacs plan --config {name}`, or train on this CPU with the CPU recipe: `{prog} --config tiny_cpu "
        "--model_name_or_path <a small local model>` (docs/quickstart.md)."
    )


def launch_setting(recipe: Recipe, name: str, default=None, config_file: bool = True):
    """The launch option `name` (`"num_processes"`) as `accelerate launch` will see it: the last value given in the
    recipe or on the command line (either spelling), else the `accelerate_config` file's (unless `config_file` is
    false), else `default`."""
    spellings = {f"--{name}", f"--{name.replace('_', '-')}"}
    value = None
    for key, tokens in _groups(recipe.launch_args):
        if key in spellings:
            value = tokens[-1].split("=", 1)[-1] if len(tokens) == 1 else tokens[-1]
    if value is None and config_file and recipe.accelerate_config is not None:
        import yaml

        with open(recipe.accelerate_config) as f:
            value = (yaml.safe_load(f) or {}).get(name)
    return default if value is None else value


def check_inputs(script_args: ScriptArguments, training_args: GRPOConfig, model_args: ModelConfig) -> None:
    """What the user named, checked in moments and before anything loads (by `pacs train`, in the process that
    launches accelerate too, so that a mistake ends there with one line, not on every rank; and by `pacs plan`, which
    refuses what `pacs train` refuses): a model, the data file, the reward functions, and the reward that
    `dynamic_sampling_metric` names (before the data loads and the output folder is made). (The checkpoint to resume from
    is the resume decision's, `pacs.grpo.resume.resume_decision`, which `pacs train` makes once per process.) Raises
    `ValueError` or `FileNotFoundError` naming the fix."""
    from ..data import check_dataset_name
    from ..grpo.checks import check_dynamic_sampling, check_model_folder, check_model_path
    from ..rewards import get_reward_funcs

    if not model_args.model_name_or_path:
        raise ValueError(
            "No model given: pass --model_name_or_path <hub id or local directory> (or set model_name_or_path in the "
            "recipe)."
        )
    check_model_path(model_args.model_name_or_path)
    check_model_folder(model_args.model_name_or_path)
    check_dataset_name(script_args.dataset_name)
    reward_funcs = get_reward_funcs(
        script_args.reward_funcs, training_args.max_completion_length, script_args.soft_punish_cache
    )
    check_dynamic_sampling(training_args, None, reward_funcs)  # a metric names a reward: known before the data loads
