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


def test_class_weight_none_from_cli_string():
    assert make(pacs_class_weight="none").pacs_class_weight is None


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            {"per_device_train_batch_size": 6, "num_generations": 4},
            r"per_device_train_batch_size \(6\) must be a multiple of num_generations \(4\) so that each completion "
            r"group lands whole in one micro-batch; use 4 or 8 or 12",
        ),
        (
            {"per_device_train_batch_size": 8, "per_device_eval_batch_size": 6, "num_generations": 4},
            r"per_device_eval_batch_size \(6\) must be a multiple of the number of generations used for evaluation "
            r"\(4\)",
        ),
        (
            {"per_device_train_batch_size": 8, "num_generations": 4, "num_generations_eval": 3},
            r"per_device_eval_batch_size \(8\) must be a multiple .* \(3\)",
        ),
        ({"num_generations": 1, "per_device_train_batch_size": 1}, r"needs num_generations >= 2, got 1"),
        ({"pacs_score": "ppo"}, r"Unknown pacs_score 'ppo'; use one of 'rloo', 'grpo', 'naive'"),
        ({"pacs_reward_proxy": "sum"}, r"Unknown pacs_reward_proxy 'sum'; use one of 'log_ratio', 'mean_logp'"),
        ({"pacs_class_weight": "question"}, r"Unknown pacs_class_weight 'question'; use one of 'balanced'"),
        ({"pacs_beta": 0.0}, r"pacs_beta must be > 0 .* got 0.0; the paper uses 1.0 or 2.0"),
        ({"pacs_beta": -1.0}, r"pacs_beta must be > 0"),
        ({"use_liger_kernel": True}, r"use_liger_kernel=True .* set use_liger_kernel=False"),
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
    assert "have no effect" not in caplog.text


def test_every_pacs_field_documented_consistently():
    doc = PACSConfig.__doc__
    own = [f for f in dataclasses.fields(PACSConfig) if f.name.startswith("pacs_")]
    assert {f.name for f in own} == {"pacs_beta", "pacs_reward_proxy", "pacs_score", "pacs_class_weight"}
    for f in own:
        assert f"{f.name} (`" in doc, f"{f.name} missing from the docstring"
        assert f.metadata.get("help"), f"{f.name} has no help text"
        default = "None" if f.default is None else repr(f.default).replace("'", '"')
        assert f"defaults to `{default}`" in doc.split(f"{f.name} (`")[1].split("\n")[0]


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
        ]
    )
    assert (args.pacs_beta, args.pacs_score, args.pacs_class_weight) == (2.0, "grpo", None)
