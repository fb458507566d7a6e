"""Tests for `pacs.eval`: the pass@k estimator, metrics over uneven sample counts, the paper's protocol defaults, its
tables and numbers, the diversity score, and `pacs eval` end to end."""

import itertools
import json
import math
import os
import re
import sys

import pytest

from pacs.eval import compute_metrics, default_ks, evaluate, pass_at_k
from pacs.eval.diversity import diversity_score, pairwise_cosine_distance
from pacs.eval.report import PAPER_BASELINES, average_metrics, format_report, paper_reference


BENCHMARKS = ["math500", "amc23", "aime24", "aime25", "beyondaime"]


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
    from pacs.cli import main

    return main(argv)


@pytest.fixture
def stderr(capsys):
    """What `pacs eval` wrote to stderr so far (`pacs.cli` reports a mistake there in one line), as `caplog.text`."""

    class Stderr:
        seen = ""

        @property
        def text(self) -> str:
            self.seen += capsys.readouterr().err
            return self.seen

        def clear(self) -> None:
            capsys.readouterr()
            self.seen = ""

    return Stderr()


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
        "eval_report.md",
        "eval_rollouts.jsonl",
    ]
    metrics = json.load(open(os.path.join(out, "eval_metrics.json")))
    assert list(metrics) == [*BENCHMARKS, "average"]  # the paper's five, in its Table 1 order, and their mean
    for name in BENCHMARKS:
        m = metrics[name]
        assert m["num_problems"] == 3 and m["n"] == 4
        assert set(m) == {"num_problems", "n", "pass@1", "pass@2", "pass@4"}
        assert all(0.0 <= m[f"pass@{k}"] <= 100.0 for k in (1, 2, 4))
    assert metrics["average"]["num_benchmarks"] == 5
    for k in (1, 2, 4):
        assert metrics["average"][f"pass@{k}"] == pytest.approx(sum(metrics[b][f"pass@{k}"] for b in BENCHMARKS) / 5)
    report = open(os.path.join(out, "eval_report.md")).read()
    assert "| pass@1 (%)" in report and "BeyondAIME" in report and "Average" in report and "k=4" in report
    assert "paper" not in report  # a tiny model is none of the paper's
    config = json.load(open(os.path.join(out, "eval_config.json")))
    assert config["system_prompt"] == "You are a helpful assistant." and config["n"] == 4
    rollouts = _read_rollouts(os.path.join(out, "eval_rollouts.jsonl"))
    assert len(rollouts) == 5 * 3 * 4
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
    assert len(aime) == 4 * 6 and len(rollouts) == 5 * 3 * 4 + 3 * 2 + 6
    metrics = json.load(open(os.path.join(out, "eval_metrics.json")))
    assert list(metrics) == ["aime24", "average"] and metrics["aime24"]["n"] == 6 and "pass@6" in metrics["aime24"]


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
    assert metrics["average"]["pass@1"] == metrics["held_out"]["pass@1"]
    assert tokenizer.padding_side == AutoTokenizer.from_pretrained(tiny_model_dir).padding_side


def test_pacs_eval_defaults_are_the_papers_protocol(capsys):
    from pacs import cli
    from pacs.eval.cli import make_parser

    arguments, args = make_parser().parse_args_and_config(["--model", "m", "--output-dir", "o"])
    assert (arguments.model, arguments.output_dir) == ("m", "o")
    assert args.n == 128 and args.temperature == 0.6 and args.top_p == 0.95 and args.max_new_tokens == 8192
    assert arguments.benchmarks.split(",") == BENCHMARKS
    assert args.system_prompt == "You are a helpful assistant." and not args.diversity
    assert args.diversity_model == "Qwen/Qwen3-Embedding-0.6B"
    assert (args.gpu_memory_utilization, args.tensor_parallel_size) == (0.9, 1)
    # the Python API is the same dataclass, with the same defaults
    from pacs.eval import DEFAULT_BENCHMARKS, EvalSettings

    assert args == EvalSettings()
    assert list(DEFAULT_BENCHMARKS) == BENCHMARKS
    # --help shows them, the diversity option, and tells a laptop user what to lower
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["eval", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for needle in ("(default: 128)", "(default: 8192)", "(default: 0.6)", "(default: 0.95)", "--diversity",
                   "--diversity_model", "math500,amc23,aime24,aime25,beyondaime", "lower --n", "--limit",
                   "prefix caching", "--no_system_prompt", "--config", "pacs[eval]"):  # fmt: skip
        assert needle in text, needle


def test_every_eval_option_is_a_documented_field():
    # one definition: the options are the dataclasses' fields, each with help text and a docstring entry
    import dataclasses

    from pacs.eval import EvalSettings
    from pacs.eval.cli import EvalArguments, make_parser

    options = {a.dest for a in make_parser()._actions} - {"help", "config"}
    for cls in (EvalArguments, EvalSettings):
        for f in dataclasses.fields(cls):
            assert f.name in options, f.name
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"
            assert f"{f.name} (`" in cls.__doc__, f"{cls.__name__}.{f.name} missing from the docstring"
    assert options == {f.name for cls in (EvalArguments, EvalSettings) for f in dataclasses.fields(cls)}


def test_pacs_eval_reads_a_config_file_and_the_command_line_overrides_it(tmp_path):
    from pacs.eval.cli import make_parser

    config = tmp_path / "eval.yaml"
    config.write_text(
        "model: runs/ckpt\noutput_dir: eval/x\nn: 8\nbenchmarks: aime24,aime25\nsystem_prompt: null\n"
        "vllm_kwargs:\n  max_model_len: 12288\n"
    )
    arguments, settings = make_parser().parse_args_and_config(["--config", str(config), "--n", "4"])
    assert (arguments.model, arguments.benchmarks, settings.n) == ("runs/ckpt", "aime24,aime25", 4)
    assert settings.system_prompt is None and settings.vllm_kwargs == {"max_model_len": 12288}
    _, settings = make_parser().parse_args_and_config(
        ["--model", "m", "--output-dir", "o", "--no-system-prompt", "--vllm-kwargs", '{"max_model_len": 4096}']
    )
    assert settings.system_prompt is None and settings.vllm_kwargs == {"max_model_len": 4096}


def test_pacs_eval_names_the_closest_option(tmp_path, stderr):
    from pacs import cli

    assert cli.main(["eval", "--model", "m", "--output_dir", str(tmp_path), "--max-tokens", "4"]) == 2
    assert "pacs eval: error: Unknown key(s), not an option of `pacs eval`:" in stderr.text
    assert "max-tokens (on the command line): did you mean max_new_tokens" in stderr.text
    stderr.clear()
    config = tmp_path / "eval.yaml"
    config.write_text("model: m\noutput_dir: o\ntemprature: 0.1\n")
    assert cli.main(["eval", "--config", str(config)]) == 2
    assert "temprature (in the --config file): did you mean temperature" in stderr.text
    stderr.clear()
    # an option that negates a field is no key of a --config file: the field's name and value, never the option
    config.write_text("model: m\noutput_dir: o\nno_progress: true\nno_system_prompt: true\nprogres: false\n")
    assert cli.main(["eval", "--config", str(config)]) == 2
    err = stderr.text
    assert "no_progress (in the --config file): write `progress: false` there" in err
    assert "no_system_prompt (in the --config file): write `system_prompt: ''` there" in err
    assert "did you mean no_progress" not in err and "progres (in the --config file): did you mean progress?" in err


def test_no_system_prompt_sends_the_user_turn_alone():
    from pacs.eval.run import _load_datasets

    with_system = _load_datasets(["aime24", "beyondaime"], None, 1)
    assert [t["role"] for t in with_system["beyondaime"][0]["prompt"]] == ["system", "user"]
    alone = _load_datasets(["aime24"], None, 1, system_prompt=None)
    assert [t["role"] for t in alone["aime24"][0]["prompt"]] == ["user"]


def test_evaluate_refuses_unknown_settings(tmp_path):
    with pytest.raises(TypeError, match=r"unknown settings \['num_samples'\]"):
        evaluate("some/model", ["aime24"], output_dir=tmp_path, num_samples=4)
    with pytest.raises(ValueError, match="paper_reference"):
        evaluate("some/model", ["aime24"], output_dir=tmp_path, paper_reference="Qwen3-14B")


def test_no_function_of_the_evaluation_exceeds_80_lines():
    import ast
    import pathlib

    import pacs.eval

    for path in pathlib.Path(pacs.eval.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno + 1 <= 80, f"{path.name}:{node.name}"


# ---------------------------------------------------------------------------------------------------------------------
# The paper's numbers beside ours, the average, the pass@k table
# ---------------------------------------------------------------------------------------------------------------------


def test_paper_reference_matches_the_papers_models_only():
    assert paper_reference("Qwen/Qwen3-4B") == "Qwen3-4B" and paper_reference("Qwen/Qwen3-8B") == "Qwen3-8B"
    assert paper_reference("/data/models/qwen3-8b/") == "Qwen3-8B"
    assert paper_reference("/cache/hub/models--Qwen--Qwen3-4B/snapshots/abc123") == "Qwen3-4B"
    for other in ("Qwen/Qwen3-4B-Base", "Qwen/Qwen3-8B-Base", "Qwen/Qwen3-4B-Instruct-2507", "runs/ckpt", "Qwen3"):
        assert paper_reference(other) is None, other
    assert paper_reference(object()) is None
    # the values quoted from the paper's Table 1 (issue 26), nothing else
    assert PAPER_BASELINES == {
        "Qwen3-4B": {"math500": 91.01, "aime24": 46.48, "beyondaime": 17.33},
        "Qwen3-8B": {"math500": 89.94, "aime24": 46.98, "beyondaime": 16.28},
    }


def _fake_metrics(n=128):
    metrics = {}
    for i, name in enumerate(BENCHMARKS):
        metrics[name] = {"num_problems": 10, "n": n, **{f"pass@{k}": 10.0 * i + k / 10 for k in default_ks(n)}}
    metrics["average"] = average_metrics(metrics)
    return metrics


def test_report_tables_in_the_papers_layout():
    metrics = _fake_metrics()
    assert metrics["average"]["pass@1"] == pytest.approx((0 + 10 + 20 + 30 + 40) / 5 + 0.1)
    report = format_report(metrics, "Qwen/Qwen3-4B", "Qwen3-4B")
    lines = report.splitlines()
    header = [c.strip() for c in lines[0].split("|")[1:-1]]
    assert header == ["pass@1 (%)", "MATH-500", "AMC23", "AIME24", "AIME25", "BeyondAIME", "Average"]
    measured = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert measured == ["Qwen/Qwen3-4B", "0.10", "10.10", "20.10", "30.10", "40.10", "20.10"]
    paper = [c.strip() for c in lines[3].split("|")[1:-1]]
    assert paper == ["paper, Qwen3-4B (Table 1)", "91.01", "-", "46.48", "-", "17.33", "-"]  # unknown values: "-"
    passk_header = next(line for line in lines if line.startswith("| pass@k"))
    assert [c.strip() for c in passk_header.split("|")[2:-1]] == ["k=1", "k=4", "k=8", "k=16", "k=32", "k=64"]
    assert "k=2 " not in report and "k=128" not in report  # the paper's k, not every power of two
    assert "diversity" not in report
    # fewer samples: only the k <= n
    small = format_report(_fake_metrics(n=8), "m")
    assert "k=8" in small and "k=16" not in small and "paper" not in small


def test_diversity_score_on_hand_made_embeddings():
    import torch

    # 1 - cos over the pairs i < j: (0, 1) orthogonal -> 1; (0, 2) and (1, 2) at 45 degrees -> 1 - 1/sqrt(2)
    e = torch.tensor([[1.0, 0.0], [0.0, 3.0], [2.0, 2.0]], dtype=torch.float64)
    assert pairwise_cosine_distance(e) == pytest.approx((1 + 2 * (1 - 1 / math.sqrt(2))) / 3, rel=1e-12)
    assert pairwise_cosine_distance(torch.tensor([[1.0, 1.0], [-2.0, -2.0]])) == pytest.approx(2.0)  # opposite
    assert pairwise_cosine_distance([[0.3, 0.4, 0.5]] * 4) == pytest.approx(0.0, abs=1e-12)  # identical
    # brute force over the pairs on random embeddings
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 5, generator=gen, dtype=torch.float64)
    pairs = [(i, j) for i in range(7) for j in range(i + 1, 7)]
    brute = sum(1 - torch.nn.functional.cosine_similarity(x[i], x[j], dim=0).item() for i, j in pairs) / len(pairs)
    assert pairwise_cosine_distance(x) == pytest.approx(brute, rel=1e-12)
    with pytest.raises(ValueError, match="n >= 2"):
        pairwise_cosine_distance([[1.0, 0.0]])
    with pytest.raises(ValueError, match="zero vector"):
        pairwise_cosine_distance([[1.0, 0.0], [0.0, 0.0]])

    # per problem, then the mean over problems; a problem with one response has no pair and is left out
    class Lookup:  # an "embedding model" that returns fixed vectors
        table = {"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [1.0, 0.0]}

        def encode(self, texts, **kwargs):
            return torch.tensor([self.table[t] for t in texts])

    score = diversity_score({"p1": ["a", "b"], "p2": ["a", "c", "a"], "p3": ["b"]}, Lookup())
    assert score == {"diversity": pytest.approx((1.0 + 0.0) / 2), "diversity_problems": 2}
    assert diversity_score({"p": ["a"]}, Lookup()) == {"diversity": None, "diversity_problems": 0}


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
    assert list(metrics) == ["mine", "average"] and metrics["mine"]["num_problems"] == 2
    assert [r["solution"] for r in _read_rollouts(out / "eval_rollouts.jsonl")] == ["0", "2"]


def test_unknown_benchmark_mentions_files(tmp_path, stderr):
    with pytest.raises(
        ValueError, match=r"Unknown benchmark 'gsm8k'.*math500.*no file .*gsm8k.*\.jsonl, \.json or \.parquet"
    ):
        evaluate("some/model", ["gsm8k"], output_dir=tmp_path / "out")
    assert (
        _run_cli(["eval", "--model", "some/model", "--benchmarks", "my_set.jsonl", "--output-dir", str(tmp_path)]) == 2
    )
    assert "--problem_column" in stderr.text and "my_set.jsonl" in stderr.text


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--batch-size", "0", r"batch_size \(--batch_size\) must be at least 1"),
        ("--temperature", "-0.1", r"temperature \(--temperature\) must be >= 0"),
        ("--limit", "0", r"limit \(--limit\) must be at least 1"),
        ("--n", "0", r"n \(--n\) must be at least 1"),
        ("--max-new-tokens", "0", r"max_new_tokens \(--max_new_tokens\) must be at least 1"),
        ("--top-p", "0", r"top_p \(--top_p\) must be in \(0, 1\]"),
    ],
)
def test_pacs_eval_rejects_bad_settings(tmp_path, stderr, flag, value, message):
    out = tmp_path / "out"
    assert _run_cli(["eval", "--model", "some/model", "--output-dir", str(out), flag, value]) == 2
    assert re.search(message, stderr.text)
    assert not out.exists()


def test_missing_model_writes_nothing(tiny_model_dir, tmp_path, stderr):
    out = tmp_path / "eval"
    argv = ["eval", "--benchmarks", "aime24", "--n", "1", "--limit", "1", "--output-dir", str(out)]
    for model in (str(tmp_path / "no-such-checkpoint"), "./runs/typo", "a/b/c"):
        assert _run_cli([*argv, "--model", model]) == 2
        assert "No such model directory or hub id" in stderr.text and model in stderr.text
        assert "Repo id must be" not in stderr.text
        assert not out.exists()
    # a directory that exists but holds no model: one line that says so, and still nothing written
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _run_cli([*argv, "--model", str(empty)]) == 2
    assert f"{empty} is not a model folder: it has no config.json" in stderr.text
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
    with pytest.raises(ValueError, match="--no_chat_template"):
        evaluate(model, ["aime24"], tokenizer=tokenizer, n=1, limit=1, output_dir=tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_cli_column_flags_default():
    from pacs.eval.cli import make_parser

    _, args = make_parser().parse_args_and_config(["--model", "m", "--output-dir", "o"])
    assert (args.problem_column, args.answer_column) == ("problem", "answer")


# ---------------------------------------------------------------------------------------------------------------------
# Every check that can fail runs before the model loads
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def no_model_load(monkeypatch):
    """Records each call of the generator's loader (there must be none) instead of loading."""
    import pacs.eval.backends

    calls = []
    monkeypatch.setattr(pacs.eval.backends, "_load_model", lambda *args, **kwargs: calls.append(args))
    return calls


def test_diversity_without_sentence_transformers_fails_before_the_model_loads(
    tiny_model_dir, tmp_path, stderr, monkeypatch, no_model_load
):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import sentence_transformers -> ImportError
    out = tmp_path / "eval"
    argv = ["eval", "--model", tiny_model_dir, "--benchmarks", "aime24", "--n", "1", "--limit", "1"]
    assert _run_cli([*argv, "--output-dir", str(out), "--diversity"]) == 2
    assert no_model_load == [] and not out.exists()
    assert "sentence-transformers, which is not installed: pip install 'trl-pacs[eval]'" in stderr.text


def test_diversity_model_files_are_checked_before_the_model_loads(tiny_model_dir, tmp_path, stderr, no_model_load):
    pytest.importorskip("sentence_transformers")
    out = tmp_path / "eval"
    argv = ["eval", "--model", tiny_model_dir, "--benchmarks", "aime24", "--n", "1", "--output-dir", str(out)]
    empty = tmp_path / "empty"
    empty.mkdir()
    for model, message in (
        ("no-such-org/no-such-embedder", "not in the Hugging Face cache and HF_HUB_OFFLINE is set"),  # conftest
        (str(tmp_path / "missing"), "No such model directory or hub id"),
        (str(empty), "a directory without a model: none of modules.json"),
    ):
        stderr.clear()
        assert _run_cli([*argv, "--diversity", "--diversity-model", model]) == 2
        assert message in stderr.text and model in stderr.text
    assert no_model_load == [] and not out.exists()


def test_benchmarks_and_output_directory_are_checked_before_the_model_loads(
    tiny_model_dir, tmp_path, stderr, no_model_load
):
    argv = ["eval", "--model", tiny_model_dir, "--n", "1", "--limit", "1"]
    assert _run_cli([*argv, "--benchmarks", "aime24,gsm8k", "--output-dir", str(tmp_path / "out")]) == 2
    assert "Unknown benchmark 'gsm8k'" in stderr.text
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out in (blocker, blocker / "eval"):
        stderr.clear()
        assert _run_cli([*argv, "--benchmarks", "aime24", "--output-dir", str(out)]) == 2
        assert "is a file" in stderr.text and "--output_dir" in stderr.text
    assert no_model_load == []


# ---------------------------------------------------------------------------------------------------------------------
# The diversity score end to end, with a sentence-transformers model built here (offline, no hub)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_embedding_model(tiny_model_dir, tmp_path_factory) -> str:
    """A sentence-transformers model: the tiny Qwen3's transformer body with mean pooling, saved to a directory."""
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers >= 6 moved the modules; 3.x-5.x have them here
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Pooling, Transformer

    body = Transformer(tiny_model_dir)
    model = SentenceTransformer(modules=[body, Pooling(64, pooling_mode="mean")], device="cpu")
    path = str(tmp_path_factory.mktemp("tiny-embedder"))
    model.save(path)
    return path


def test_pacs_eval_diversity_end_to_end(tiny_model_dir, tiny_embedding_model, tmp_path, one_torch_thread, monkeypatch):
    from sentence_transformers import SentenceTransformer

    out = tmp_path / "eval"
    argv = ["eval", "--model", tiny_model_dir, "--benchmarks", "aime24,beyondaime", "--n", "3", "--limit", "2"]
    argv += ["--max-new-tokens", "12", "--temperature", "1.0", "--output-dir", str(out), "--no-progress"]
    assert _run_cli([*argv, "--diversity", "--diversity-model", tiny_embedding_model]) == 0
    metrics = json.load(open(out / "eval_metrics.json"))
    # the score recomputed from the rollouts with the same embedder: per problem, then the mean over problems
    embedder = SentenceTransformer(tiny_embedding_model, device="cpu")
    rollouts = _read_rollouts(out / "eval_rollouts.jsonl")
    for name in ("aime24", "beyondaime"):
        per_problem = []
        for pid in sorted({r["problem_id"] for r in rollouts if r["benchmark"] == name}):
            texts = [r["completion"] for r in rollouts if r["benchmark"] == name and r["problem_id"] == pid]
            assert len(texts) == 3
            per_problem.append(pairwise_cosine_distance(embedder.encode(texts, convert_to_tensor=True)))
        assert metrics[name]["diversity_problems"] == 2
        assert metrics[name]["diversity"] == pytest.approx(sum(per_problem) / 2, rel=1e-5)
        assert 0.0 < metrics[name]["diversity"] <= 2.0  # random tiny model, sampled at T=1: responses differ
    assert metrics["average"]["diversity"] == pytest.approx(
        (metrics["aime24"]["diversity"] + metrics["beyondaime"]["diversity"]) / 2
    )
    assert "| diversity" in (out / "eval_report.md").read_text()
    assert json.load(open(out / "eval_config.json"))["diversity_model"] == tiny_embedding_model

    # on a finished run, --resume --diversity scores the saved responses without loading the generator again
    import pacs.eval.backends

    def no_model(*args, **kwargs):
        raise AssertionError("the generator was loaded although no sample was missing")

    monkeypatch.setattr(pacs.eval.backends, "_load_model", no_model)
    assert _run_cli([*argv, "--resume", "--diversity", "--diversity-model", tiny_embedding_model]) == 0
    again = json.load(open(out / "eval_metrics.json"))
    assert again["aime24"]["diversity"] == pytest.approx(metrics["aime24"]["diversity"], rel=1e-5)
    # without --diversity there is no score
    assert _run_cli([*argv, "--resume"]) == 0
    assert "diversity" not in json.load(open(out / "eval_metrics.json"))["aime24"]
