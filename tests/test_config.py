"""Tests of `pacs.config.PACSConfig`: defaults, every rejection with its message, documented fields."""

import dataclasses
import logging

import pytest

from pacs import PACSConfig


def make(**kwargs) -> PACSConfig:
    base = {"output_dir": "unused", "use_cpu": True, "bf16": False, "report_to": "none"}
    return PACSConfig(**{**base, **kwargs})


def test_defaults_are_the_papers():
    args = make()
    assert (args.pacs_beta, args.pacs_reward_proxy, args.pacs_score, args.pacs_class_weight) == (
        1.0,
        "log_ratio",
        "rloo",
        "balanced",
    )
    assert args.beta == 0.0  # TRL's KL coefficient is untouched and off
    assert args.pacs_label_transform == "none"  # rewards are labels as they are: verifiers' 0/1


@pytest.mark.parametrize("accumulation", [1, 3])
def test_default_takes_four_optimizer_steps_per_generation(accumulation, caplog):
    # TRL counts steps_per_generation in micro-batches; GRPOConfig's default (= gradient_accumulation_steps) would make
    # every step on-policy, psi == 0, and PACS exactly RLOO.
    with caplog.at_level(logging.WARNING, logger="pacs.config"):
        args = make(gradient_accumulation_steps=accumulation, per_device_train_batch_size=8)
    assert args.steps_per_generation == 4 * accumulation
    assert args.generation_batch_size == 8 * 4 * accumulation
    assert "on-policy" not in caplog.text


def test_explicit_generation_settings_are_kept():
    assert make(steps_per_generation=3).steps_per_generation == 3
    args = make(generation_batch_size=16, per_device_train_batch_size=8)  # TRL derives steps_per_generation
    assert (args.steps_per_generation, args.generation_batch_size) == (2, 16)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"steps_per_generation": 1},
        {"gradient_accumulation_steps": 4, "steps_per_generation": 4},
        {"gradient_accumulation_steps": 4, "steps_per_generation": 2},
        {"generation_batch_size": 8, "per_device_train_batch_size": 8},
    ],
)
def test_on_policy_setting_warns_with_the_fix(kwargs, caplog):
    with caplog.at_level(logging.WARNING, logger="pacs.config"):
        make(**kwargs)
    assert caplog.text.count("Every optimizer step is on-policy") == 1
    assert (
        "class-weighted RLOO" in caplog.text
        and "Set steps_per_generation to k * gradient_accumulation_steps" in caplog.text
    )


@pytest.mark.parametrize("kwargs", [{"steps_per_generation": 2}, {"steps_per_generation": 1, "num_iterations": 2}])
def test_off_policy_setting_does_not_warn(kwargs, caplog):
    with caplog.at_level(logging.WARNING, logger="pacs.config"):
        make(**kwargs)
    assert "on-policy" not in caplog.text


@pytest.mark.parametrize(
    "kwargs",
    [
        {"per_device_train_batch_size": 1, "num_generations": 4, "gradient_accumulation_steps": 4},  # a group spans 4
        {"per_device_train_batch_size": 2, "num_generations": 4, "gradient_accumulation_steps": 2},
        {"per_device_train_batch_size": 3, "num_generations": 3},
        {"per_device_train_batch_size": 12, "num_generations": 8, "gradient_accumulation_steps": 2},
    ],
)
def test_groups_only_need_to_fit_whole_in_an_optimizer_step(kwargs):
    make(**kwargs)


def test_eval_batch_is_not_checked_by_pacs():
    # Evaluation makes no update (psi == 0), so PACS needs no whole groups there; TRL's own check applies only when
    # an evaluation is scheduled.
    make(per_device_train_batch_size=3, num_generations=3, per_device_eval_batch_size=8)
    make(per_device_train_batch_size=8, num_generations=4, num_generations_eval=3)
    make(num_generations_eval=1)


def test_grpo_score_without_gradient_clipping_warns(caplog):
    for max_grad_norm in (0.0, -1.0, None):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pacs.config"):
            make(pacs_score="grpo", max_grad_norm=max_grad_norm)
        assert "pacs_score='grpo' without gradient clipping" in caplog.text and "max_grad_norm=1.0" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pacs.config"):
        make(pacs_score="grpo")  # max_grad_norm defaults to 1.0
        make(pacs_score="rloo", max_grad_norm=0.0)
    assert "without gradient clipping" not in caplog.text


def test_liger_layer_kernels_are_allowed():
    # TRL >= 1.15 applies only Liger's layer kernels and still calls _compute_loss, so the PACS loss runs
    assert make(use_liger_kernel=True).use_liger_kernel


def test_label_transform_per_reward_function():
    args = make(pacs_label_transform=["sigmoid", "none"], pacs_label_temperature=2.0, pacs_label_offset=-1.0)
    assert (args.pacs_label_transform, args.pacs_label_temperature, args.pacs_label_offset) == (
        ["sigmoid", "none"],
        2.0,
        -1.0,
    )
    assert make(pacs_label_transform=["clip"]).pacs_label_transform == "clip"  # one name from the command line


def test_class_weight_none_from_cli_string():
    assert make(pacs_class_weight="none").pacs_class_weight is None


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            {"per_device_train_batch_size": 3, "num_generations": 4},
            r"An optimizer step holds world_size x per_device_train_batch_size x gradient_accumulation_steps = "
            r"1 x 3 x 1 = 3 completions, not a multiple of num_generations \(4\).*use gradient_accumulation_steps=4 "
            r"\(or a multiple\), or per_device_train_batch_size=4",
        ),
        (
            {"per_device_train_batch_size": 6, "num_generations": 8, "gradient_accumulation_steps": 2},
            r"use gradient_accumulation_steps=4 \(or a multiple\), or per_device_train_batch_size=8",
        ),
        ({"num_generations": 1, "per_device_train_batch_size": 1}, r"needs num_generations >= 2, got 1"),
        ({"pacs_score": "ppo"}, r"Unknown pacs_score 'ppo'; use one of 'rloo', 'grpo', 'dr_grpo', 'naive'"),
        ({"pacs_reward_proxy": "sum"}, r"Unknown pacs_reward_proxy 'sum'; use one of 'log_ratio', 'mean_logp'"),
        ({"pacs_class_weight": "question"}, r"Unknown pacs_class_weight 'question'; use one of 'balanced'"),
        ({"pacs_uniform_groups": "filter"}, r"^Unknown pacs_uniform_groups 'filter'; use one of 'keep', 'drop'\.$"),
        ({"pacs_beta": 0.0}, r"pacs_beta must be > 0 .* got 0.0; the paper uses 1.0 or 2.0"),
        ({"pacs_beta": -1.0}, r"pacs_beta must be > 0"),
        ({"pacs_label_transform": "tanh"}, r"Unknown pacs_label_transform 'tanh'; use one of 'none', 'sigmoid'"),
        ({"pacs_label_transform": ["sigmoid", "minmax"]}, r"Unknown pacs_label_transform 'minmax'"),
        ({"pacs_label_temperature": 0.0}, r"pacs_label_temperature must be a finite number > 0"),
        ({"pacs_label_offset": float("nan")}, r"pacs_label_offset must be a finite number"),
        (
            {"use_vllm": True, "vllm_importance_sampling_mode": "token_truncate"},
            r"use 'sequence_mask' \(the default\) or 'sequence_truncate'",
        ),
    ],
)
def test_rejections_say_how_to_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(**kwargs)


def test_naive_score_allows_one_generation_in_pacs_checks():
    # PACS itself has no objection; TRL still requires >= 2 generations for training, with its own message.
    with pytest.raises(ValueError, match="at least 2 generations"):
        make(num_generations=1, per_device_train_batch_size=1, pacs_score="naive")


def test_grpo_only_settings_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="pacs.config"):
        make(epsilon=0.3, loss_type="grpo")
    assert "have no effect" in caplog.text
    assert "epsilon=0.3" in caplog.text and "loss_type='grpo'" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pacs.config"):
        make()
        make(entropy_coef=0.01)  # the entropy bonus is added to the PACS loss as in GRPO
        make(use_adaptive_entropy=True, entropy_target=0.3)
    assert "have no effect" not in caplog.text


def test_every_pacs_field_documented_consistently():
    doc = PACSConfig.__doc__
    own = [f for f in dataclasses.fields(PACSConfig) if f.name.startswith("pacs_")]
    assert {f.name for f in own} == {
        "pacs_beta",
        "pacs_reward_proxy",
        "pacs_score",
        "pacs_class_weight",
        "pacs_uniform_groups",
        "pacs_label_transform",
        "pacs_label_temperature",
        "pacs_label_offset",
        "pacs_anchor",
        "pacs_reference_reset_generations",
        "pacs_reset_optimizer",
        "pacs_reset_warmup_steps",
        "pacs_max_skipped_steps",
    }
    for f in own:
        assert f"{f.name} (`" in doc, f"{f.name} missing from the docstring"
        assert f.metadata.get("help"), f"{f.name} has no help text"
        default = "None" if f.default is None else repr(f.default).replace("'", '"')
        assert f"defaults to `{default}`" in doc.split(f"{f.name} (`")[1].split("\n")[0]
    # the one inherited field whose default PACS changes is documented as such
    (steps,) = [f for f in dataclasses.fields(PACSConfig) if f.name == "steps_per_generation"]
    assert "4 * gradient_accumulation_steps" in steps.metadata["help"]
    assert "steps_per_generation (`int`, *optional*)" in doc and "4 * gradient_accumulation_steps" in doc


def test_uniform_groups_docstring_and_help_say_the_same():
    # word for word, the docstring's `"keep"` being the help's 'keep'
    (f,) = [f for f in dataclasses.fields(PACSConfig) if f.name == "pacs_uniform_groups"]
    entry = PACSConfig.__doc__.split("pacs_uniform_groups (`")[1].split("\n", 1)[1].split("\n        pacs_")[0]
    assert " ".join(entry.split()).replace('`"', "'").replace('"`', "'") == f.metadata["help"]
    assert (
        f.metadata["choices"] == ["keep", "drop"]
        and PACSConfig(output_dir="x", use_cpu=True).pacs_uniform_groups == "keep"
    )


def test_parses_from_the_command_line():
    from trl import TrlParser

    (args,) = TrlParser((PACSConfig,)).parse_args_into_dataclasses(
        [
            "--output_dir",
            "x",
            "--use_cpu",
            "--bf16",
            "false",
            "--pacs_beta",
            "2",
            "--pacs_score",
            "grpo",
            "--pacs_class_weight",
            "none",
            "--per_device_train_batch_size",
            "8",
            "--pacs_label_transform",
            "sigmoid",
            "--pacs_label_temperature",
            "0.5",
            "--pacs_uniform_groups",
            "drop",
        ]
    )
    assert args.pacs_uniform_groups == "drop"
    assert (args.pacs_beta, args.pacs_score, args.pacs_class_weight) == (2.0, "grpo", None)
    assert (args.pacs_label_transform, args.pacs_label_temperature) == ("sigmoid", 0.5)
    assert args.steps_per_generation == 4 * args.gradient_accumulation_steps


def test_every_grpo_setting_is_classified_in_the_docs():
    from pathlib import Path

    from transformers import TrainingArguments
    from trl import GRPOConfig

    page = (Path(__file__).resolve().parents[1] / "docs" / "pacs_trainer.md").read_text()
    table = page.split("## GRPOConfig settings under PACS")[1].split("\n## ")[0]
    grpo_only = {f.name for f in dataclasses.fields(GRPOConfig)} - {
        f.name for f in dataclasses.fields(TrainingArguments)
    }
    missing = sorted(name for name in grpo_only if f"`{name}`" not in table)
    assert not missing, f"GRPOConfig settings missing from the table: {missing}"
    from pacs.config import GRPO_ONLY_LOSS_SETTINGS

    ignored = "\n".join(line for line in table.splitlines() if "without effect" in line)
    assert all(f"`{name}`" in ignored for name in GRPO_ONLY_LOSS_SETTINGS)
