"""Benchmark and training sets as `datasets.Dataset`s in TRL's conversational format, with the paper's prompt.

Every row has `prompt` (the paper's two turns, Appendix C.1: the system turn `SYSTEM_PROMPT`, "You are a helpful
assistant.", and a user turn holding the problem followed by the instruction `PROMPT_SUFFIX`), `solution` (the gold
final answer, a LaTeX string for `pacs.rewards.math_reward`), `id` and `problem`. `system_prompt=None` sends the user
turn alone (for models whose chat template has no system role). A training file whose problem column already holds a
conversation (a list of `{"role", "content"}` messages) keeps it as the prompt, unchanged;
`load_train_dataset(..., prompt_suffix=None)` turns the instruction off for plain-text problems, any other string
replaces it. A training file in TRL's own format (a `prompt` column, plain text or a conversation, and the columns its
reward functions take, e.g. `solution`) is kept as GRPOTrainer would train it: every column, the prompt unchanged.

>>> from pacs.data import load_benchmark
>>> ds = load_benchmark("aime24", limit=2)
>>> ds.column_names
['id', 'problem', 'prompt', 'solution']
>>> [turn["role"] for turn in ds[0]["prompt"]]
['system', 'user']
>>> ds[0]["prompt"][1]["content"].endswith("put your final answer within \\\\boxed{}.")
True

The five benchmarks of the paper ship inside the package (`src/pacs/bundled_data/`, sources in the README there),
so that evaluation runs offline. Their hub copies, for reference or for loading with
`load_train_dataset(..., split="test")`:

| name | rows | hub alternative |
| --- | --- | --- |
| `math500` | 500 | `HuggingFaceH4/MATH-500` (split `test`) |
| `aime24` | 30 | `HuggingFaceH4/aime_2024` (split `train`) |
| `aime25` | 30 | `math-ai/aime25` (split `test`) |
| `amc23` | 40 | `math-ai/amc23` (split `test`, problem column `question`) |
| `beyondaime` | 100 | `ByteDance-Seed/BeyondAIME` (split `test`) |
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)

__all__ = [
    "BENCHMARKS",
    "DATA_DIR",
    "DatasetUnavailableError",
    "PROMPT_SUFFIX",
    "SYSTEM_PROMPT",
    "TRAIN_DATASETS",
    "drop_long_prompts",
    "load_benchmark",
    "load_train_dataset",
    "make_prompt",
]

DATA_DIR = Path(__file__).parent / "bundled_data"
"""The folder of the bundled JSON Lines files (package data; named apart from this module, `pacs.data`)."""

PROMPT_SUFFIX = " Please reason step by step, and put your final answer within \\boxed{}."
"""Appended to every problem: the prompt of the paper (and of DeepScaleR, Qwen2.5-Math)."""

SYSTEM_PROMPT = "You are a helpful assistant."
"""The system turn of the paper's prompt (Appendix C.1); `system_prompt=None` leaves it out."""

BENCHMARKS: dict[str, dict[str, Any]] = {
    "math500": {"file": "math500.jsonl", "rows": 500, "hub": "HuggingFaceH4/MATH-500"},
    "aime24": {"file": "aime24.jsonl", "rows": 30, "hub": "HuggingFaceH4/aime_2024"},
    "aime25": {"file": "aime25.jsonl", "rows": 30, "hub": "math-ai/aime25"},
    "amc23": {"file": "amc23.jsonl", "rows": 40, "hub": "math-ai/amc23"},
    "beyondaime": {"file": "beyondaime.jsonl", "rows": 100, "hub": "ByteDance-Seed/BeyondAIME"},
}
"""The paper's evaluation benchmarks: bundled file, row count and a hub alternative."""

TRAIN_DATASETS: dict[str, dict[str, Any]] = {
    "deepscaler": {"hub": "agentica-org/DeepScaleR-Preview-Dataset"},
    "math_train": {"file": "math_train.jsonl", "rows": 7474},
    "aime_1983_2023": {"file": "aime_1983_2023.jsonl", "rows": 975},
}
"""Training sets by short name: `deepscaler` (the paper's, from the hub) and bundled ones for offline runs."""


def make_prompt(
    problem: str, suffix: str | None = PROMPT_SUFFIX, system_prompt: str | None = SYSTEM_PROMPT
) -> list[dict[str, str]]:
    """The paper's prompt for `problem` (Appendix C.1): a system turn and a user turn, as a TRL conversational prompt.

    Args:
        problem (`str`):
            The problem statement.
        suffix (`str` or `None`, *optional*, defaults to `PROMPT_SUFFIX`):
            Appended to the problem; `None` or `""` for none.
        system_prompt (`str` or `None`, *optional*, defaults to `SYSTEM_PROMPT`):
            The system turn, "You are a helpful assistant."; `None` or `""` sends the user turn alone (for models
            whose chat template has no system role).

    >>> make_prompt("What is 1+1?")[0]
    {'role': 'system', 'content': 'You are a helpful assistant.'}
    >>> make_prompt("What is 1+1?")[1]["content"]
    'What is 1+1? Please reason step by step, and put your final answer within \\\\boxed{}.'
    >>> make_prompt("What is 1+1?", suffix=None, system_prompt=None)
    [{'role': 'user', 'content': 'What is 1+1?'}]
    """
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*system, {"role": "user", "content": f"{problem}{suffix or ''}"}]


def _as_conversation(value: Any, source: str, column: str, index: int) -> list[dict[str, Any]] | None:
    """`value` as a list of `{"role", "content"}` messages if it is one, `None` if it is plain text; else an error."""
    if isinstance(value, str) or value is None:
        return None
    if isinstance(value, dict) and "role" in value:
        value = [value]
    messages = list(value) if isinstance(value, (list, tuple)) else None
    if not messages or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
        raise ValueError(
            f"{source}, row {index}: column {column!r} holds {str(value)[:200]!r}, neither a string nor a list of "
            '{"role": ..., "content": ...} messages. Give each row a problem statement or a conversation, or name '
            "another column with problem_column=... (`--problem_column`)."
        )
    return [dict(m) for m in messages]


def _problem_text(messages: list[dict[str, Any]]) -> str:
    """The last user turn's text (the problem, for the `problem` column of a conversational row)."""
    user = [m for m in messages if m.get("role") == "user"] or messages
    content = user[-1]["content"]
    if isinstance(content, list):  # content blocks: [{"type": "text", "text": ...}, ...]
        content = " ".join(str(block.get("text", "")) for block in content if isinstance(block, dict))
    return str(content)


def _read_json_rows(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}, line {lineno}: not valid JSON ({e}); a .jsonl file holds one object a line."
                ) from e
        return rows
    data = json.loads(text)
    if isinstance(data, dict) and "data" in data and isinstance(data["data"], list):
        data = data["data"]
    if isinstance(data, dict):  # column-oriented: {"problem": [...], "answer": [...]}
        columns = list(data)
        if not all(isinstance(v, list) for v in data.values()):
            raise ValueError(f"{path}: expected a list of rows or a mapping of columns to lists.")
        return [dict(zip(columns, values)) for values in zip(*data.values())]
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of rows (objects), got {type(data).__name__}.")
    return data


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive number of problems, or None for all of them; got {limit!r}.")


def _to_pacs_format(
    dataset: Dataset,
    source: str,
    problem_column: str,
    answer_column: str,
    id_column: str,
    limit: int | None,
    prompt_suffix: str | None = PROMPT_SUFFIX,
    system_prompt: str | None = SYSTEM_PROMPT,
    keep_columns: Sequence[str] = (),
) -> Dataset:
    """Select the first `limit` rows and map them to `id`, `problem`, `prompt`, `solution` (the math format), or keep
    TRL's format as it is (a `prompt` column and no `problem_column`), adding `solution` from `answer_column`."""
    trl_format = problem_column == "prompt" or (
        problem_column not in dataset.column_names and "prompt" in dataset.column_names
    )
    if not trl_format and problem_column not in dataset.column_names:
        raise ValueError(
            f"{source} has no column {problem_column!r} and no 'prompt' column (its columns are "
            f"{dataset.column_names}): give it TRL's `prompt` column (a string or a list of role/content messages), "
            "or name the column that holds the problems with problem_column=... (`--problem_column`)."
        )
    if trl_format and "prompt" not in dataset.column_names:
        raise ValueError(
            f"{source} has no column 'prompt' (its columns are {dataset.column_names}); name the column that holds "
            "the problems with problem_column=... (`--problem_column`)."
        )
    if not trl_format and answer_column not in dataset.column_names:
        raise ValueError(
            f"{source} has no column {answer_column!r} (its columns are {dataset.column_names}); pass "
            "answer_column=... (`--answer_column`) to name the column that holds the gold final answers."
        )
    if limit is not None and limit < len(dataset):
        logger.info("%s: kept the first %d of %d problems (limit=%d)", source, limit, len(dataset), limit)
        dataset = dataset.select(range(limit))
    if trl_format:
        return _trl_format(dataset, answer_column)
    has_id = id_column in dataset.column_names
    stem = Path(str(source)).stem if os.path.exists(str(source)) else str(source).split("/")[-1]
    built = ("id", "problem", "prompt", "solution")
    kept = [c for c in keep_columns if c in dataset.column_names and c not in built]

    def convert(row, idx):
        answer = row[answer_column]
        messages = _as_conversation(row[problem_column], source, problem_column, idx)
        if messages is None:  # plain text: the paper's prompt
            problem = "" if row[problem_column] is None else str(row[problem_column])
            prompt = make_prompt(problem, prompt_suffix, system_prompt)
        else:  # already a conversation: passed through as it is, system turns included
            problem, prompt = _problem_text(messages), messages
        return {
            "id": str(row[id_column]) if has_id else f"{stem}-{idx}",
            "problem": problem,
            "prompt": prompt,
            "solution": "" if answer is None else str(answer),
            **{column: row[column] for column in kept},
        }

    from datasets import Dataset as _Dataset

    rows = [convert(row, i) for i, row in enumerate(dataset)]
    return _Dataset.from_list(rows) if rows else _Dataset.from_dict({k: [] for k in (*built, *kept)})


def _trl_format(dataset: Dataset, answer_column: str) -> Dataset:
    """TRL's format as GRPOTrainer trains it: every column kept, `prompt` unchanged (plain text or a conversation);
    a `solution` column added from `answer_column` when the data has that one and no `solution` (the math rewards')."""
    if "solution" in dataset.column_names or answer_column not in dataset.column_names:
        return dataset
    solutions = ["" if answer is None else str(answer) for answer in dataset[answer_column]]
    return dataset.add_column("solution", solutions)


def _load_bundled(file: str) -> Dataset:
    from datasets import Dataset

    return Dataset.from_list(_read_json_rows(DATA_DIR / file))


def load_benchmark(name: str, limit: int | None = None, system_prompt: str | None = SYSTEM_PROMPT) -> Dataset:
    """Load one of the paper's benchmarks from the data bundled with `pacs` (no network needed).

    Args:
        name (`str`):
            One of `"math500"`, `"aime24"`, `"aime25"`, `"amc23"`, `"beyondaime"` (case and `-`/`_` are ignored:
            `"MATH-500"` works).
        limit (`int` or `None`, *optional*, defaults to `None`):
            Keep only the first `limit` problems.
        system_prompt (`str` or `None`, *optional*, defaults to `SYSTEM_PROMPT`):
            The system turn of every prompt; `None` sends the user turn alone.

    Returns:
        `datasets.Dataset` with columns `id`, `problem`, `prompt`, `solution`.
    """
    key = str(name).lower().replace("-", "").replace("_", "")
    if key not in BENCHMARKS:
        raise ValueError(
            f"Unknown benchmark {name!r}; valid names are {sorted(BENCHMARKS)}. For another test set, load it with "
            "`load_train_dataset(path_or_hub_id, split=...)` and pass it to `pacs.eval.evaluate(datasets={...})`."
        )
    _check_limit(limit)
    info = BENCHMARKS[key]
    return _to_pacs_format(
        _load_bundled(info["file"]), key, "problem", "answer", "id", limit, system_prompt=system_prompt
    )


def load_train_dataset(
    name_or_path: str,
    problem_column: str = "problem",
    answer_column: str = "answer",
    limit: int | None = None,
    split: str = "train",
    id_column: str = "id",
    prompt_suffix: str | None = PROMPT_SUFFIX,
    system_prompt: str | None = SYSTEM_PROMPT,
    keep_columns: Sequence[str] = (),
) -> Dataset:
    """Load a training set: a short name, a local file, or a hub dataset id.

    Args:
        name_or_path (`str`):
            `"deepscaler"` (hub: `agentica-org/DeepScaleR-Preview-Dataset`, the paper's training set), a bundled set
            for offline runs (`"math_train"`: MATH train, 7,474 problems; `"aime_1983_2023"`; or a benchmark name), a
            local `.jsonl`, `.json` or `.parquet` file, or any hub dataset id.
        problem_column (`str`, *optional*, defaults to `"problem"`):
            Column holding the problem: a plain-text statement (the paper's prompt is built around it), or a
            conversation (a list of `{"role", "content"}` messages, passed through). When the data has no such column
            but a `prompt` column, it is in TRL's format and kept as it is (see Returns).
        answer_column (`str`, *optional*, defaults to `"answer"`):
            Column holding the gold final answer (not a worked solution).
        limit (`int` or `None`, *optional*, defaults to `None`):
            Keep only the first `limit` rows.
        split (`str`, *optional*, defaults to `"train"`):
            Split to load from a hub dataset.
        id_column (`str`, *optional*, defaults to `"id"`):
            Column holding a row id; rows are numbered when it is missing.
        prompt_suffix (`str` or `None`, *optional*, defaults to `PROMPT_SUFFIX`):
            Appended to every plain-text problem to make the user turn (the paper's instruction by default); `None`
            or `""` adds nothing, any other string replaces it. Conversational problems are never changed: they pass
            through as they are, system messages included.
        system_prompt (`str` or `None`, *optional*, defaults to `SYSTEM_PROMPT`):
            The system turn put before every plain-text problem's user turn ("You are a helpful assistant.", the
            paper's); `None` or `""` sends the user turn alone. Conversational problems are never changed.
        keep_columns (`Sequence[str]`, *optional*, defaults to `()`):
            Further columns of a math-format file to keep as they are (`pacs train` keeps those its reward
            functions take as keywords).

    Returns:
        `datasets.Dataset`. The math format (a `problem_column`): columns `id`, `problem` (the statement; for a
        conversation its last user turn), `prompt` (conversational), `solution` (from `answer_column`, required)
        and `keep_columns`. TRL's format (a `prompt` column, no `problem_column`): the data as GRPOTrainer trains it,
        every column kept and `prompt` unchanged (plain text or a conversation; `prompt_suffix` and `system_prompt`
        do not apply), plus `solution` from `answer_column` when the data has that column and no `solution`.

    >>> ds = load_train_dataset("math_train", limit=1, prompt_suffix=None, system_prompt=None)
    >>> ds[0]["prompt"][0]["content"] == ds[0]["problem"]
    True
    """
    _check_limit(limit)
    dataset, source = _load_raw_train_dataset(str(name_or_path), split)
    return _to_pacs_format(
        dataset, source, problem_column, answer_column, id_column, limit, prompt_suffix, system_prompt, keep_columns
    )


DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


class DatasetUnavailableError(FileNotFoundError, RuntimeError):
    """A hub dataset that could not be loaded (offline, no such id, no such split): an ordinary mistake that
    `pacs train` answers in one line, before anything launches."""


def check_dataset_name(name: str) -> None:
    """Fail with one line when `name` is meant as a local file (a data file's suffix, or a path: `./`, `/`, `~`,
    more than one `/`) that does not exist, instead of a hub lookup's error; anything else passes (a bundled set, a
    hub id), unchecked.

    >>> check_dataset_name("math_train"); check_dataset_name("agentica-org/DeepScaleR-Preview-Dataset")
    >>> check_dataset_name("data/typo.jsonl")
    Traceback (most recent call last):
    ...
    FileNotFoundError: No such data file: 'data/typo.jsonl'. Pass an existing .jsonl, .json or .parquet file, a bundled set (math_train, ...) or a hub dataset id (owner/name).
    """
    name = str(name)
    looks_local = name.lower().endswith(DATA_FILE_SUFFIXES) or name.startswith((".", "/", "~")) or name.count("/") > 1
    if looks_local and not os.path.exists(os.path.expanduser(name)):
        raise FileNotFoundError(
            f"No such data file: {name!r}. Pass an existing .jsonl, .json or .parquet file, a bundled set "
            "(math_train, ...) or a hub dataset id (owner/name)."
        )


def _load_raw_train_dataset(name: str, split: str) -> tuple[Dataset, str]:
    """The rows of `load_train_dataset`'s `name_or_path` as stored (bundled, local file or hub), and their source."""
    from datasets import Dataset

    key = name.lower().replace("-", "_")
    if key in TRAIN_DATASETS and "file" in TRAIN_DATASETS[key]:
        dataset, source = _load_bundled(TRAIN_DATASETS[key]["file"]), key
    elif key.replace("_", "") in BENCHMARKS:
        dataset, source = _load_bundled(BENCHMARKS[key.replace("_", "")]["file"]), key.replace("_", "")
    elif os.path.exists(name):
        path = Path(name)
        if path.is_dir() or path.suffix not in (".jsonl", ".json", ".parquet"):
            raise ValueError(f"{name}: expected a .jsonl, .json or .parquet file with problem and answer columns.")
        dataset = (
            Dataset.from_parquet(str(path)) if path.suffix == ".parquet" else Dataset.from_list(_read_json_rows(path))
        )
        source = name
    else:
        check_dataset_name(name)
        hub_id = TRAIN_DATASETS.get(key, {}).get("hub", name)
        if "/" not in hub_id:
            raise ValueError(
                f"{name!r} is neither a known dataset ({sorted(TRAIN_DATASETS)} or a benchmark {sorted(BENCHMARKS)}), "
                "nor an existing file, nor a hub id of the form 'owner/name'."
            )
        from datasets import load_dataset

        try:
            dataset = load_dataset(hub_id, split=split)
        except Exception as e:
            raise DatasetUnavailableError(
                f"Could not load {hub_id!r} (split {split!r}) from the Hugging Face Hub: {e}. Offline, use the bundled "
                "'math_train' set or a local .jsonl/.json/.parquet file instead."
            ) from e
        source = hub_id
    return dataset, source


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
