"""`pacs eval`: sample n completions per benchmark problem and report unbiased pass@k, by default as the paper does.

pacs eval --model Qwen/Qwen3-4B --output_dir eval/qwen3-4b                 # the paper's protocol (GPU, vLLM)
pacs eval --model Qwen/Qwen3-4B --output_dir eval/qwen3-4b --diversity     # + the diversity score
pacs eval --model runs/ckpt --n 4 --limit 10 --max_new_tokens 1024 --output_dir eval/quick   # a laptop
pacs eval --config eval.yaml --n 8                                         # settings from a file, one overridden

The options are two dataclasses read by TRL's `TrlParser` (a `transformers.HfArgumentParser` that also reads
`--config FILE.yaml`): [`EvalArguments`] (what to evaluate, where the results go) and `pacs.eval.EvalSettings` (how to
sample and report; the keywords of `pacs.eval.evaluate`). `--help` is their field help; nothing is restated here.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field, fields

from .run import DEFAULT_BENCHMARKS


logger = logging.getLogger(__name__)

__all__ = ["EvalArguments", "add_parser", "make_parser", "run_eval"]

DESCRIPTION = (
    "Sample --n completions per problem with the paper's protocol by default (arXiv:2509.02522v2, Appendix C.3: "
    "MATH-500, AMC23, AIME 2024, AIME 2025 and BeyondAIME; n 128; temperature 0.6, top-p 0.95; 8192 new tokens; the "
    "chat template with the system turn 'You are a helpful assistant.'; vLLM with prefix caching at 0.9 GPU memory, "
    "tensor parallel 1), verify them with math-verify and write eval_rollouts.jsonl, eval_metrics.json (pass@k in %, "
    "k = 1, 2, 4, ... n, per benchmark and their average), eval_report.md (pass@1 and the pass@k table for k = 1, 4, "
    "8, 16, 32, 64, with the paper's values beside them for Qwen3-4B/8B) and eval_passk.png to --output_dir. Uses "
    "vLLM when it is installed and a GPU is present, transformers otherwise. The defaults take GPU-hours (128 samples "
    "x 700 problems of up to 8192 tokens): on a laptop or CPU, lower --n (e.g. 4) and --limit (e.g. 10), and "
    "--max_new_tokens. Every option can also come from a YAML file (--config eval.yaml, keys as the option names "
    "with underscores); options on the command line override it. Everything that can be checked without the model "
    "(settings, paths, benchmarks, the output directory, the diversity score's package and model files) is checked "
    "before it loads."
)


@dataclass
class EvalArguments:
    """What `pacs eval` evaluates and where the results go; how it samples and reports is `EvalSettings`.

    Args:
        model (`str`):
            Local checkpoint directory or hub model id.
        output_dir (`str`):
            Directory for the rollouts, metrics, tables and the plot.
        benchmarks (`str`, *optional*, defaults to `"math500,amc23,aime24,aime25,beyondaime"`):
            Comma-separated bundled benchmarks, or paths of .jsonl/.json/.parquet files with problem and answer
            columns (see `problem_column`, `answer_column`).
        tokenizer (`str` or `None`, *optional*, defaults to `None`):
            Tokenizer path or hub id, if not stored with the model.
    """

    model: str = field(metadata={"help": "Local checkpoint directory or hub model id."})
    output_dir: str = field(metadata={"help": "Directory for rollouts, metrics, tables and the plot."})
    benchmarks: str = field(
        default=",".join(DEFAULT_BENCHMARKS),
        metadata={
            "help": "Comma-separated bundled benchmarks (math500, amc23, aime24, aime25, beyondaime) or paths of "
            ".jsonl/.json/.parquet files with problem and answer columns (see --problem_column, --answer_column)."
        },
    )
    tokenizer: str | None = field(
        default=None, metadata={"help": "Tokenizer path or id, if not stored with the model."}
    )


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults only where they say something (not for unset options)."""

    def _get_help_string(self, action):
        if action.default in (None, argparse.SUPPRESS) or action.nargs == 0:
            return action.help
        return super()._get_help_string(action)


def make_parser():
    """The `pacs eval` option parser: `pacs.options.CommandParser` (TRL's `TrlParser`) over [`EvalArguments`] and
    `EvalSettings`."""
    from ..options import CommandParser
    from .settings import EvalSettings

    parser = CommandParser(
        (EvalArguments, EvalSettings), prog="pacs eval", description=DESCRIPTION, formatter_class=_HelpFormatter
    )
    # the two options that are not a field: the file TrlParser reads, and the short form of --system_prompt ''
    parser.add_argument(
        "--config", default=argparse.SUPPRESS, metavar="FILE.yaml", help="Read the options from a YAML file first."
    )
    parser.add_argument(
        "--no_system_prompt",
        "--no-system-prompt",
        dest="system_prompt",
        action="store_const",
        const="",
        default=argparse.SUPPRESS,
        help="Send the user turn alone (the same as --system_prompt '').",
    )
    return parser


# the two options that are not a field (`make_parser`), and the config-file keys that say what they mean
EXTRA_OPTIONS = {"config": None, "no_system_prompt": "write `system_prompt: ''` there"}


def _unknown_options(config_extra: list[str], cli_extra: list[str]) -> ValueError | None:
    """The error naming each unknown option (of the command line or the --config file) and the closest valid ones
    (`pacs.options.unknown_options_error`), or None."""
    from ..options import field_options, unknown_options_error
    from .settings import EvalSettings

    fields_ = field_options([EvalArguments, EvalSettings])
    unknown = []
    for where, extra in (("in the --config file", config_extra), ("on the command line", cli_extra)):
        for option in (a.split("=")[0] for a in extra if a.startswith("-")):
            name = option.lstrip("-")
            # a --config file sets fields by name: `progress: false`, never `no_progress: true` (an option, not a key)
            if where.endswith("file") and EXTRA_OPTIONS.get(name):
                unknown.append((option, where, EXTRA_OPTIONS[name]))
            elif where.endswith("file") and name.startswith("no_") and name[3:] in fields_:
                unknown.append((option, where, f"write `{name[3:]}: false` there"))
            else:
                unknown.append((option, where))
    if not unknown and (config_extra or cli_extra):
        return ValueError(f"unexpected values {config_extra + cli_extra} (`pacs eval --help` lists every option)")
    return unknown_options_error(unknown, [*fields_, *EXTRA_OPTIONS], "an option of `pacs eval`") if unknown else None


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the `eval` subcommand on `subparsers` (from `ArgumentParser.add_subparsers`); its options are read by
    [`make_parser`] when it runs, so that `pacs --help` imports nothing heavy."""
    parser = subparsers.add_parser(
        "eval",
        help="Sample completions on math benchmarks and report pass@k (the paper's protocol).",
        description=DESCRIPTION,
        add_help=False,  # `pacs eval --help` is make_parser's help, with every field
    )
    parser.set_defaults(func=run_eval, accepts_overrides=True)
    return parser


def run_eval(args: argparse.Namespace) -> int:
    """Run `pacs eval` on the options in `args.overrides`; returns the exit code. An ordinary mistake (an option, a
    setting, a path, a file, a missing package) raises `ValueError`, which `pacs.cli` reports in one line, exit 2."""
    return _run_eval(args.overrides)


def _run_eval(argv: list[str]) -> int:
    from .run import evaluate

    parser = make_parser()
    try:
        arguments, settings, config_extra, cli_extra = parser.parse_args_and_config(
            argv, return_remaining_strings=True, separate_remaining_strings=True
        )
    except OSError as error:  # an unreadable --config
        raise ValueError(str(error)) from error
    unknown = _unknown_options(config_extra, cli_extra)
    if unknown:
        raise unknown
    try:
        evaluate(
            model=arguments.model,
            benchmarks=arguments.benchmarks,
            output_dir=arguments.output_dir,
            tokenizer=arguments.tokenizer,
            **{f.name: getattr(settings, f.name) for f in fields(settings)},
        )
    except (OSError, ImportError) as error:  # wrong paths or files, a missing package: the message says what to do
        raise ValueError(str(error)) from error
    logger.info(
        "Wrote %s/eval_metrics.json, eval_report.md, eval_rollouts.jsonl and eval_passk.png", arguments.output_dir
    )
    return 0
