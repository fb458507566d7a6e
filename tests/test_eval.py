"""Tests for `pacs.eval`: the pass@k estimator, metrics over uneven sample counts, and `pacs eval` end to end."""

import argparse
import itertools
import json
import math
import os
import re

import pytest

from pacs.eval import compute_metrics, default_ks, evaluate, pass_at_k


@pytest.fixture
def one_torch_thread():
    """The tiny model gains nothing from intra-op threads, and on a busy 2-core runner they make it 25x slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _brute_force_pass_at_k(n, c, k):
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_brute_force(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_force_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_large_n():
    n = 1024
    for c in (0, 1, 3, 100, 512, 1023, 1024):
        for k in (1, 2, 16, 256, 1024):
            exact = 1 - math.comb(n - c, k) / math.comb(n, k)  # Python's big integers: exact, then one division
            got = pass_at_k(n, c, k)
            assert 0.0 <= got <= 1.0
            assert got == pytest.approx(exact, rel=1e-12, abs=1e-12), (c, k)
    assert pass_at_k(1024, 512, 1) == pytest.approx(0.5)


def test_pass_at_k_rejects_bad_arguments():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)


def test_default_ks():
    assert default_ks(1) == [1]
    assert default_ks(32) == [1, 2, 4, 8, 16, 32]
    assert default_ks(12) == [1, 2, 4, 8, 12]


def test_metrics_with_uneven_sample_counts():
    # problem a: 4 samples, 1 correct; problem b: 2 samples (an interrupted run), both correct
    rollouts = [{"benchmark": "x", "problem_id": "a", "correct": i == 0} for i in range(4)]
    rollouts += [{"benchmark": "x", "problem_id": "b", "correct": True} for _ in range(2)]
    metrics = compute_metrics(rollouts, {"x": ["a", "b"]})
    assert metrics["x"]["num_problems"] == 2 and metrics["x"]["n"] == 2
    assert set(metrics["x"]) == {"num_problems", "n", "pass@1", "pass@2"}
    assert metrics["x"]["pass@1"] == pytest.approx(100 * (0.25 + 1.0) / 2)
    assert metrics["x"]["pass@2"] == pytest.approx(100 * (0.5 + 1.0) / 2)
    with pytest.raises(ValueError, match="no samples for problems"):
        compute_metrics(rollouts, {"x": ["a", "c"]})


def _run_cli(argv):
    from pacs.eval.cli import add_parser

    parser = argparse.ArgumentParser(prog="pacs")
    add_parser(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def _read_rollouts(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_pacs_eval_end_to_end(tiny_model_dir, tmp_path, one_torch_thread):
    out = str(tmp_path / "eval")
    argv = ["eval", "--model", tiny_model_dir, "--n", "4", "--limit", "3", "--max-new-tokens", "16"]
    argv += ["--output-dir", out, "--batch-size", "16", "--no-progress"]
    assert _run_cli(argv) == 0

    assert sorted(os.listdir(out)) == [
        "eval_config.json",
        "eval_metrics.json",
        "eval_passk.png",
        "eval_rollouts.jsonl",
    ]
    metrics = json.load(open(os.path.join(out, "eval_metrics.json")))
    assert list(metrics) == ["math500", "aime24", "aime25", "amc23"]
    for m in metrics.values():
        assert m["num_problems"] == 3 and m["n"] == 4
        assert set(m) == {"num_problems", "n", "pass@1", "pass@2", "pass@4"}
        assert all(0.0 <= m[f"pass@{k}"] <= 100.0 for k in (1, 2, 4))
    rollouts = _read_rollouts(os.path.join(out, "eval_rollouts.jsonl"))
    assert len(rollouts) == 4 * 3 * 4
    expected_keys = {
        "benchmark",
        "problem_id",
        "sample_index",
        "completion",
        "extracted_answer",
        "correct",
        "solution",
    }
    assert all(set(r) == expected_keys for r in rollouts)
    assert sorted({r["sample_index"] for r in rollouts}) == [0, 1, 2, 3]
    assert os.path.getsize(os.path.join(out, "eval_passk.png")) > 1000

    # never overwritten silently
    assert _run_cli(argv) == 2
    with pytest.raises(FileExistsError, match="--overwrite"):
        evaluate(tiny_model_dir, ["aime24"], n=1, output_dir=out, limit=1)

    # resume: only the missing samples are generated; a problem outside the first run keeps its own count
    argv_resume = [a if a != "4" else "6" for a in argv] + ["--resume", "--benchmarks", "aime24"]
    argv_resume[argv_resume.index("--limit") + 1] = "4"
    assert _run_cli(argv_resume) == 0
    rollouts = _read_rollouts(os.path.join(out, "eval_rollouts.jsonl"))
    aime = [r for r in rollouts if r["benchmark"] == "aime24"]
    assert len(aime) == 4 * 6 and len(rollouts) == 4 * 3 * 4 + 3 * 2 + 6
    metrics = json.load(open(os.path.join(out, "eval_metrics.json")))
    assert list(metrics) == ["aime24"] and metrics["aime24"]["n"] == 6 and "pass@6" in metrics["aime24"]


def test_evaluate_custom_datasets_with_model_object(tiny_model_dir, tmp_path, one_torch_thread):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pacs.data import make_prompt

    ds = Dataset.from_list(
        [{"id": f"q{i}", "prompt": make_prompt(f"What is {i} + {i}?"), "solution": str(2 * i)} for i in range(2)]
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    metrics = evaluate(
        model, datasets={"held_out": ds}, tokenizer=tokenizer, n=2, output_dir=tmp_path, max_new_tokens=8,
        temperature=0.0, progress=False, plot=False,
    )  # fmt: skip
    assert metrics == json.load(open(tmp_path / "eval_metrics.json"))
    assert metrics["held_out"]["num_problems"] == 2 and metrics["held_out"]["n"] == 2
    assert tokenizer.padding_side == AutoTokenizer.from_pretrained(tiny_model_dir).padding_side


def test_pacs_console_script_has_eval():
    cli = pytest.importorskip("pacs.cli", exc_type=ImportError)
    args = cli.build_parser().parse_args(["eval", "--model", "m", "--output-dir", "o"])
    assert args.n == 32 and args.temperature == 0.6 and args.top_p == 0.95 and args.max_new_tokens == 4096
    assert args.func.__name__ == "run_eval"


# ---------------------------------------------------------------------------------------------------------------------
# Users' own files and mistakes: caught before a model loads, output directory untouched
# ---------------------------------------------------------------------------------------------------------------------


def test_pacs_eval_reads_a_file_with_other_column_names(tiny_model_dir, tmp_path, one_torch_thread):
    path = tmp_path / "mine.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"What is {i} + {i}?", "final": str(2 * i)}) + "\n" for i in range(3))
    )
    out = tmp_path / "eval"
    argv = ["eval", "--model", tiny_model_dir, "--benchmarks", str(path), "--problem-column", "question"]
    argv += ["--answer-column", "final", "--n", "1", "--limit", "2", "--max-new-tokens", "4", "--temperature", "0"]
    assert _run_cli([*argv, "--output-dir", str(out), "--no-progress"]) == 0
    metrics = json.load(open(out / "eval_metrics.json"))
    assert list(metrics) == ["mine"] and metrics["mine"]["num_problems"] == 2
    assert [r["solution"] for r in _read_rollouts(out / "eval_rollouts.jsonl")] == ["0", "2"]


def test_unknown_benchmark_mentions_files(tmp_path, caplog):
    with pytest.raises(
        ValueError, match=r"Unknown benchmark 'gsm8k'.*math500.*no file .*gsm8k.*\.jsonl, \.json or \.parquet"
    ):
        evaluate("some/model", ["gsm8k"], output_dir=tmp_path / "out")
    assert (
        _run_cli(["eval", "--model", "some/model", "--benchmarks", "my_set.jsonl", "--output-dir", str(tmp_path)]) == 2
    )
    assert "--problem-column" in caplog.text and "my_set.jsonl" in caplog.text


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--batch-size", "0", r"batch_size \(--batch-size\) must be at least 1"),
        ("--temperature", "-0.1", r"temperature \(--temperature\) must be >= 0"),
        ("--limit", "0", r"limit \(--limit\) must be at least 1"),
        ("--n", "0", r"n \(--n\) must be at least 1"),
        ("--max-new-tokens", "0", r"max_new_tokens \(--max-new-tokens\) must be at least 1"),
        ("--top-p", "0", r"top_p \(--top-p\) must be in \(0, 1\]"),
    ],
)
def test_pacs_eval_rejects_bad_settings(tmp_path, caplog, flag, value, message):
    out = tmp_path / "out"
    assert _run_cli(["eval", "--model", "some/model", "--output-dir", str(out), flag, value]) == 2
    assert re.search(message, caplog.text)
    assert not out.exists()


def test_missing_model_writes_nothing(tiny_model_dir, tmp_path, caplog):
    out = tmp_path / "eval"
    argv = ["eval", "--benchmarks", "aime24", "--n", "1", "--limit", "1", "--output-dir", str(out)]
    for model in (str(tmp_path / "no-such-checkpoint"), "./runs/typo", "a/b/c"):
        assert _run_cli([*argv, "--model", model]) == 2
        assert "No such model directory or hub id" in caplog.text and model in caplog.text
        assert "Repo id must be" not in caplog.text
        assert not out.exists()
    # a directory that exists but holds no model: transformers' error, and still nothing written
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _run_cli([*argv, "--model", str(empty)]) == 2
    assert not out.exists()
    # an earlier evaluation survives a failed --overwrite run, so the corrected rerun still finds it
    out.mkdir()
    (out / "eval_metrics.json").write_text("{}")
    assert _run_cli([*argv, "--model", str(empty), "--overwrite"]) == 2
    assert (out / "eval_metrics.json").read_text() == "{}" and sorted(os.listdir(out)) == ["eval_metrics.json"]


def test_no_chat_template_error_writes_nothing(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = None
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(ValueError, match="--no-chat-template"):
        evaluate(model, ["aime24"], tokenizer=tokenizer, n=1, limit=1, output_dir=tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_cli_column_flags_default():
    from pacs.eval.cli import add_parser

    parser = argparse.ArgumentParser(prog="pacs")
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["eval", "--model", "m", "--output-dir", "o"])
    assert (args.problem_column, args.answer_column) == ("problem", "answer")
