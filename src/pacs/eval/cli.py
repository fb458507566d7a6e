"""`pacs eval`: sample n completions per benchmark problem and report unbiased pass@k, by default as the paper does.

pacs eval --model Qwen/Qwen3-4B --output-dir eval/qwen3-4b                 # the paper's protocol (GPU, vLLM)
pacs eval --model Qwen/Qwen3-4B --output-dir eval/qwen3-4b --diversity     # + the diversity score
pacs eval --model runs/ckpt --n 4 --limit 10 --max-new-tokens 1024 --output-dir eval/quick   # a laptop
"""

from __future__ import annotations

import argparse
import logging

from ..data import SYSTEM_PROMPT
from .diversity import DEFAULT_DIVERSITY_MODEL
from .report import PAPER_BASELINES
from .run import DEFAULT_BENCHMARKS


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
        help="Sample completions on math benchmarks and report pass@k (the paper's protocol).",
        description=(
            "Sample --n completions per problem with the paper's protocol by default (arXiv:2509.02522v2, Appendix "
            "C.3: MATH-500, AMC23, AIME 2024, AIME 2025 and BeyondAIME; n 128; temperature 0.6, top-p 0.95; 8192 new "
            "tokens; the chat template with the system turn 'You are a helpful assistant.'; vLLM with prefix "
            "caching at 0.9 GPU memory, tensor parallel 1), verify them with math-verify and write "
            "eval_rollouts.jsonl, eval_metrics.json (pass@k in %, k = 1, 2, 4, ... n, per benchmark and their "
            "average), eval_report.md (pass@1 and the pass@k table for k = 1, 4, 8, 16, 32, 64, with the paper's "
            "values beside them for Qwen3-4B/8B) and eval_passk.png to --output-dir. Uses vLLM when it is installed "
            "and a GPU is present, transformers otherwise. The defaults take GPU-hours (128 samples x 700 problems "
            "of up to 8192 tokens): on a laptop or CPU, lower --n (e.g. 4) and --limit (e.g. 10), and "
            "--max-new-tokens."
        ),
        formatter_class=_HelpFormatter,
    )
    _add_data_arguments(parser)
    _add_generation_arguments(parser)
    _add_output_arguments(parser)
    parser.set_defaults(func=run_eval)
    return parser


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """What to evaluate: the model, the benchmarks and their prompt."""
    parser.add_argument("--model", required=True, help="Local checkpoint directory or hub model id.")
    parser.add_argument(
        "--benchmarks",
        default=",".join(DEFAULT_BENCHMARKS),
        help="Comma-separated bundled benchmarks (math500, amc23, aime24, aime25, beyondaime) or paths of "
        ".jsonl/.json/.parquet files with problem and answer columns (see --problem-column, --answer-column).",
    )
    parser.add_argument(
        "--problem-column",
        default="problem",
        help="Column holding the problem (text, or a list of role/content messages) in --benchmarks files.",
    )
    parser.add_argument(
        "--answer-column", default="answer", help="Column holding the gold final answer in --benchmarks files."
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="Evaluate only the first N problems per benchmark (default: all)."
    )
    parser.add_argument(
        "--no-chat-template",
        dest="chat_template",
        action="store_false",
        help="Feed the plain prompt instead of applying the tokenizer's chat template.",
    )
    parser.add_argument(
        "--no-system-prompt",
        dest="system_prompt",
        action="store_const",
        const=None,
        default=SYSTEM_PROMPT,
        help="Send the user turn alone, without the paper's system turn 'You are a helpful assistant.' (for models "
        "whose chat template has no system role).",
    )
    parser.add_argument("--tokenizer", default=None, help="Tokenizer path or id, if not stored with the model.")


def _add_generation_arguments(parser: argparse.ArgumentParser) -> None:
    """How to sample: the paper's settings by default, and the backend's."""
    parser.add_argument(
        "--n", type=int, default=128, help="Samples per problem (the paper's 128); a laptop user lowers it, e.g. 4."
    )
    parser.add_argument("--max-new-tokens", type=int, default=8192, help="Generation length limit (the paper's).")
    parser.add_argument("--temperature", type=float, default=0.6, help="Sampling temperature (0: greedy).")
    parser.add_argument("--top-p", type=float, default=0.95, help="Nucleus sampling threshold.")
    parser.add_argument("--seed", type=int, default=0, help="Random seed for sampling.")
    parser.add_argument("--batch-size", type=int, default=64, help="Sequences per generate call (transformers).")
    parser.add_argument(
        "--backend", choices=["auto", "vllm", "transformers"], default="auto", help="Generation backend."
    )
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=0.9, help="vLLM's share of GPU memory (the paper's 0.9)."
    )
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM's tensor parallel size.")


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the results go and what they hold besides pass@k."""
    parser.add_argument("--output-dir", required=True, help="Directory for rollouts, metrics, tables and the plot.")
    parser.add_argument(
        "--diversity",
        action="store_true",
        help="Add the paper's diversity score per benchmark (Appendix E): the mean pairwise cosine distance between "
        "the embeddings of a problem's responses, averaged over problems. Needs pip install 'pacs[eval]'.",
    )
    parser.add_argument(
        "--diversity-model",
        default=DEFAULT_DIVERSITY_MODEL,
        help="sentence-transformers model that embeds the responses: a hub id or a local directory.",
    )
    parser.add_argument(
        "--paper-reference",
        choices=["auto", "none", *PAPER_BASELINES],
        default="auto",
        help="The paper's Table 1 row shown beside the measured pass@1: 'auto' picks it from --model's name "
        "(Qwen/Qwen3-4B, Qwen/Qwen3-8B, or a local folder named so).",
    )
    parser.add_argument("--reward-timeout", type=float, default=3.0, help="Seconds per answer verification.")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--overwrite", action="store_true", help="Replace an earlier evaluation in --output-dir.")
    group.add_argument(
        "--resume", action="store_true", help="Keep the samples in --output-dir and generate only the missing ones."
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="Hide the progress bar.")


def run_eval(args: argparse.Namespace) -> int:
    """Run `pacs eval` from parsed arguments; returns the exit code."""
    from .run import evaluate

    vllm_kwargs = {"tensor_parallel_size": args.tensor_parallel_size}
    if args.backend != "transformers" and _has_gpu():
        vllm_kwargs["gpu_memory_utilization"] = args.gpu_memory_utilization

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
            system_prompt=args.system_prompt,
            vllm_kwargs=vllm_kwargs,
            diversity=args.diversity,
            diversity_model=args.diversity_model,
            paper_reference=None if args.paper_reference == "none" else args.paper_reference,
        )
    except (OSError, ValueError, ImportError) as e:  # wrong arguments, paths or files: the message says what to do
        logger.error("%s", e)
        return 2
    logger.info("Wrote %s/eval_metrics.json, eval_report.md, eval_rollouts.jsonl and eval_passk.png", args.output_dir)
    return 0


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()
