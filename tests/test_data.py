"""Tests for `pacs.data`: the bundled benchmarks, the paper's prompt, and loading training sets from files."""

import json
import logging
from pathlib import Path

import pytest

from pacs.data import (
    BENCHMARKS,
    DATA_DIR,
    PROMPT_SUFFIX,
    SYSTEM_PROMPT,
    load_benchmark,
    load_train_dataset,
    make_prompt,
)
from pacs.rewards import score_completions


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
SHARED_BEYONDAIME = Path(__file__).resolve().parents[2] / "shared" / "data" / "beyondaime.jsonl"


@pytest.mark.parametrize(
    "name, rows", [("math500", 500), ("aime24", 30), ("aime25", 30), ("amc23", 40), ("beyondaime", 100)]
)
def test_bundled_benchmark_loads_and_every_gold_parses(name, rows):
    ds = load_benchmark(name)
    assert len(ds) == rows == BENCHMARKS[name]["rows"]
    assert ds.column_names == ["id", "problem", "prompt", "solution"]
    assert len(set(ds["id"])) == rows
    row = ds[0]
    assert row["prompt"] == [SYSTEM, {"role": "user", "content": row["problem"] + PROMPT_SUFFIX}]
    # a gold answer that does not parse would score None for every completion
    boxed = ["\\boxed{" + s + "}" for s in ds["solution"]]
    scored = score_completions(boxed, ds["solution"])
    assert [r for r, _ in scored] == [1.0] * rows


def test_paper_prompt():
    # Appendix C.1: the system turn "You are a helpful assistant." and the user turn with the instruction
    user = {
        "role": "user",
        "content": "What is $1+1$? Please reason step by step, and put your final answer within \\boxed{}.",
    }
    assert SYSTEM_PROMPT == "You are a helpful assistant."
    assert make_prompt("What is $1+1$?") == [SYSTEM, user]
    # the user turn alone, for models without a system role
    for off in (None, ""):
        assert make_prompt("What is $1+1$?", system_prompt=off) == [user]
        assert load_benchmark("aime24", limit=1, system_prompt=off)[0]["prompt"][0]["role"] == "user"
        assert len(load_train_dataset("math_train", limit=1, system_prompt=off)[0]["prompt"]) == 1
    assert make_prompt("x", system_prompt="Be brief.")[0] == {"role": "system", "content": "Be brief."}


def test_beyondaime_is_the_shared_file():
    # the bundled copy holds the 100 problems of the shared file, with integer answers, in the same order
    bundled = (DATA_DIR / "beyondaime.jsonl").read_text(encoding="utf-8")
    if SHARED_BEYONDAIME.exists():  # the workspace's copy, next to the checkout
        assert bundled == SHARED_BEYONDAIME.read_text(encoding="utf-8")
    rows = [json.loads(line) for line in bundled.splitlines()]
    ds = load_benchmark("BeyondAIME")
    assert len(ds) == 100 and ds["id"] == [r["id"] for r in rows] and ds["problem"] == [r["problem"] for r in rows]
    assert all(s.isdigit() for s in ds["solution"])
    assert "beyondaime.jsonl" in (DATA_DIR / "README.md").read_text() and "CC0" in (DATA_DIR / "README.md").read_text()


def test_limit_and_name_normalisation():
    assert len(load_benchmark("MATH-500", limit=3)) == 3
    with pytest.raises(ValueError, match=r"valid names are \['aime24', 'aime25', 'amc23', 'beyondaime', 'math500'\]"):
        load_benchmark("gsm8k")


def test_bundled_train_set():
    ds = load_train_dataset("math_train", limit=5)
    assert len(ds) == 5 and ds.column_names == ["id", "problem", "prompt", "solution"]
    assert ds[0]["prompt"][0] == SYSTEM and ds[0]["prompt"][1]["content"].endswith(PROMPT_SUFFIX)


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_local_files_with_custom_columns(tmp_path, suffix):
    rows = [{"question": f"What is {i} + {i}?", "final": str(2 * i)} for i in range(4)]
    path = tmp_path / f"train{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        from datasets import Dataset

        Dataset.from_list(rows).to_parquet(str(path))
    ds = load_train_dataset(str(path), problem_column="question", answer_column="final", limit=3)
    assert len(ds) == 3
    assert ds["solution"] == ["0", "2", "4"]
    assert ds["id"] == ["train-0", "train-1", "train-2"]
    assert ds[1]["prompt"] == [SYSTEM, {"role": "user", "content": "What is 1 + 1?" + PROMPT_SUFFIX}]


def test_missing_column_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"problem": "1+1", "solution": "2"}) + "\n")
    with pytest.raises(ValueError, match=r"no column 'answer'.*answer_column="):
        load_train_dataset(str(path))


def test_bad_inputs(tmp_path):
    (tmp_path / "x.csv").write_text("problem,answer\n")
    with pytest.raises(ValueError, match=r"\.jsonl, \.json or \.parquet"):
        load_train_dataset(str(tmp_path / "x.csv"))
    (tmp_path / "broken.jsonl").write_text('{"problem": "1"}\n{oops\n')
    with pytest.raises(ValueError, match="line 2"):
        load_train_dataset(str(tmp_path / "broken.jsonl"))
    with pytest.raises(ValueError, match="neither a known dataset"):
        load_train_dataset("not_a_dataset")


def test_hub_dataset_offline_error_points_to_bundled_set():
    # conftest sets HF_HUB_OFFLINE / HF_DATASETS_OFFLINE: the hub is unreachable, the error says what to do instead
    with pytest.raises(RuntimeError, match="DeepScaleR-Preview-Dataset.*'math_train'"):
        load_train_dataset("deepscaler")


# ---------------------------------------------------------------------------------------------------------------------
# Users' own files: conversations, the instruction suffix, limits
# ---------------------------------------------------------------------------------------------------------------------

CONVERSATION = [
    {"role": "system", "content": "You are a careful mathematician."},
    {"role": "user", "content": "What is 2 + 2?"},
]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("problem_column", [None, "prompt"])
def test_conversational_prompts_pass_through(tmp_path, problem_column):
    # TRL's own format: a `prompt` column holding messages; used by default when there is no `problem` column
    path = _write_jsonl(tmp_path / "chat.jsonl", [{"prompt": CONVERSATION, "answer": "4"}] * 2)
    kwargs = {"problem_column": problem_column} if problem_column else {}
    ds = load_train_dataset(path, **kwargs)
    assert ds[0]["prompt"] == CONVERSATION  # system message kept, no suffix, not a repr of the list
    assert ds[0]["solution"] == "4" and ds[0]["answer"] == "4"  # the math rewards' `solution`, the user's column kept


@pytest.mark.parametrize("prompt", ["What is 2 + 2?", CONVERSATION])
def test_trl_format_is_kept_as_grpo_trainer_trains_it(tmp_path, prompt):
    # TRL's format: `prompt` (plain text or a conversation) and the columns the rewards take, here `target`, kept as
    # they are: no paper prompt around a plain-text prompt, no column dropped or added (there is no `answer`)
    rows = [{"prompt": prompt, "target": "4", "difficulty": 1}] * 3
    ds = load_train_dataset(_write_jsonl(tmp_path / "trl.jsonl", rows), limit=2)
    assert ds.column_names == ["prompt", "target", "difficulty"] and len(ds) == 2
    assert ds[0]["prompt"] == prompt and ds[0]["target"] == "4"
    # a `solution` of its own is never replaced by `answer_column`
    rows = [{"prompt": prompt, "solution": "4", "answer": "5"}]
    assert load_train_dataset(_write_jsonl(tmp_path / "both.jsonl", rows))[0]["solution"] == "4"


def test_the_math_format_keeps_the_columns_asked_for(tmp_path):
    rows = [{"problem": "1 + 1?", "answer": "2", "hint": "add", "level": 1}]
    ds = load_train_dataset(_write_jsonl(tmp_path / "math.jsonl", rows), keep_columns=["hint", "absent", "solution"])
    assert ds.column_names == ["id", "problem", "prompt", "solution", "hint"]
    assert ds[0]["hint"] == "add" and ds[0]["solution"] == "2"


def test_data_without_problem_or_prompt_is_refused_naming_both(tmp_path):
    path = _write_jsonl(tmp_path / "q.jsonl", [{"question": "1 + 1?", "answer": "2"}])
    with pytest.raises(ValueError, match=r"has no column 'problem' and no 'prompt' column.*--problem_column"):
        load_train_dataset(path)


def test_conversation_in_a_custom_column_from_parquet(tmp_path):
    from datasets import Dataset

    path = tmp_path / "chat.parquet"
    Dataset.from_list([{"messages": CONVERSATION, "final": "4"}]).to_parquet(str(path))
    ds = load_train_dataset(str(path), problem_column="messages", answer_column="final")
    assert ds[0]["prompt"] == CONVERSATION


def test_malformed_conversation_is_named(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"problem": [{"text": "hi"}], "answer": "1"}])
    with pytest.raises(ValueError, match=r"row 0: column 'problem'.*role.*content.*problem_column="):
        load_train_dataset(path)


def test_prompt_suffix_can_be_turned_off_or_replaced(tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl", [{"problem": "What is 1 + 1?", "answer": "2"}])
    assert load_train_dataset(path)[0]["prompt"][-1]["content"] == "What is 1 + 1?" + PROMPT_SUFFIX
    for off in (None, ""):
        assert load_train_dataset(path, prompt_suffix=off)[0]["prompt"] == [
            SYSTEM,
            {"role": "user", "content": "What is 1 + 1?"},
        ]
    mine = " Answer with a number in \\boxed{}."
    assert load_train_dataset(path, prompt_suffix=mine)[0]["prompt"][-1]["content"] == "What is 1 + 1?" + mine
    assert make_prompt("x", suffix=None) == [SYSTEM, {"role": "user", "content": "x"}]
    # a conversation never gets the suffix, whatever it is
    chat = _write_jsonl(tmp_path / "c.jsonl", [{"prompt": CONVERSATION, "answer": "4"}])
    assert load_train_dataset(chat, prompt_suffix=mine)[0]["prompt"] == CONVERSATION


def test_a_limit_that_cuts_is_logged(tmp_path, caplog):
    path = _write_jsonl(tmp_path / "mine.jsonl", [{"problem": f"{i} + 1?", "answer": str(i + 1)} for i in range(20)])
    with caplog.at_level(logging.INFO, logger="pacs.data"):
        assert len(load_train_dataset(path, limit=16)) == 16
    assert "kept the first 16 of 20 problems" in caplog.text and "mine.jsonl" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pacs.data"):
        assert len(load_train_dataset(path, limit=50)) == 20  # nothing cut: nothing logged
        assert len(load_benchmark("aime24", limit=2)) == 2
    assert "mine.jsonl: kept" not in caplog.text
    assert "aime24: kept the first 2 of 30 problems" in caplog.text


@pytest.mark.parametrize("limit", [0, -1])
def test_limit_must_be_positive(limit):
    with pytest.raises(ValueError, match="limit must be a positive number"):
        load_train_dataset("math_train", limit=limit)
    with pytest.raises(ValueError, match="limit must be a positive number"):
        load_benchmark("aime24", limit=limit)
