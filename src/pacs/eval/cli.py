"""`pacs eval`: sample n completions per benchmark problem and report unbiased pass@k.

pacs eval --model Qwen/Qwen2.5-Math-7B --benchmarks math500,aime24,aime25,amc23 --n 32 --output-dir eval/base
"""

from __future__ import annotations

import argparse
import logging


logger = logging.getLogger(__name__)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults only where they say something (not for on/off flags or unset options)."""

    def _get_help_string(self, action):
        if action.nargs == 0 or action.default is None:
            return action.help
        return super()._get_help_string(action)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the `eval` subcommand on `subparsers` (from `ArgumentParser.add_subparsers`)."""
    parser = subparsers.add_parser(
        "eval",
        help="Sample completions on math benchmarks and report pass@k.",
        description=(
            "Sample --n completions per problem with the paper's prompt and settings (temperature 0.6, top-p 0.95, "
            "4096 new tokens, chat template), verify them with math-verify and write eval_rollouts.jsonl, "
            "eval_metrics.json (pass@k in %%, k = 1, 2, 4, ... n) and eval_passk.png to --output-dir. "
            "Uses vLLM when it is installed and a GPU is present, transformers otherwise."
        ),
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--model", required=True, help="Local checkpoint directory or hub model id.")
    parser.add_argument(
        "--benchmarks",
        default="math500,aime24,aime25,amc23",
        help="Comma-separated bundled benchmarks (math500, aime24, aime25, amc23) or paths of .jsonl/.json/.parquet "
        "files with problem and answer columns (see --problem-column, --answer-column).",
    )
    parser.add_argument(
        "--problem-column",
        default="problem",
        help="Column holding the problem (text, or a list of role/content messages) in --benchmarks files.",
    )
    parser.add_argument(
        "--answer-column", default="answer", help="Column holding the gold final answer in --benchmarks files."
    )
    parser.add_argument("--n", type=int, default=32, help="Samples per problem.")
    parser.add_argument("--output-dir", required=True, help="Directory for rollouts, metrics and the plot.")
    parser.add_argument("--limit", type=int, default=None, help="Evaluate only the first N problems per benchmark.")
    parser.add_argument("--max-new-tokens", type=int, default=4096, help="Generation length limit.")
    parser.add_argument("--temperature", type=float, default=0.6, help="Sampling temperature (0: greedy).")
    parser.add_argument("--top-p", type=float, default=0.95, help="Nucleus sampling threshold.")
    parser.add_argument("--seed", type=int, default=0, help="Random seed for sampling.")
    parser.add_argument("--batch-size", type=int, default=64, help="Sequences per generate call (transformers).")
    parser.add_argument(
        "--backend", choices=["auto", "vllm", "transformers"], default="auto", help="Generation backend."
    )
    parser.add_argument(
        "--no-chat-template",
        dest="chat_template",
        action="store_false",
        help="Feed the plain prompt instead of applying the tokenizer's chat template.",
    )
    parser.add_argument("--tokenizer", default=None, help="Tokenizer path or id, if not stored with the model.")
    parser.add_argument("--reward-timeout", type=float, default=3.0, help="Seconds per answer verification.")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--overwrite", action="store_true", help="Replace an earlier evaluation in --output-dir.")
    group.add_argument(
        "--resume", action="store_true", help="Keep the samples in --output-dir and generate only the missing ones."
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="Hide the progress bar.")
    parser.set_defaults(func=run_eval)
    return parser


def run_eval(args: argparse.Namespace) -> int:
    """Run `pacs eval` from parsed arguments; returns the exit code."""
    from .run import evaluate

    try:
        evaluate(
            model=args.model,
            benchmarks=args.benchmarks,
            n=args.n,
            output_dir=args.output_dir,
            limit=args.limit,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            batch_size=args.batch_size,
            overwrite=args.overwrite,
            resume=args.resume,
            tokenizer=args.tokenizer,
            backend=args.backend,
            chat_template=args.chat_template,
            reward_timeout=args.reward_timeout,
            progress=args.progress,
            problem_column=args.problem_column,
            answer_column=args.answer_column,
        )
    except (OSError, ValueError) as e:  # wrong arguments, paths or files: the message says what to do
        logger.error("%s", e)
        return 2
    logger.info("Wrote %s/eval_metrics.json, eval_rollouts.jsonl and eval_passk.png", args.output_dir)
    return 0
