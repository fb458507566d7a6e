"""No warning whose cause is one of pacs's own defaults: a tiny run with `-W always` prints none of them."""

import os
import warnings

from datasets import Dataset

import pacs
from pacs import PACSConfig, PACSTrainer
from tests.tiny_config import tiny_pacs_config


PACKAGE_DIR = os.path.dirname(pacs.__file__)
_OURS = ("`gradient_checkpointing` is deprecated", "`gradient_checkpointing_kwargs` is deprecated")


def _deprecations(record) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, (FutureWarning, DeprecationWarning))]


def test_configs_with_pacs_defaults_warn_about_nothing(tmp_path):
    # GRPOConfig's default gradient_checkpointing=True is transformers 5's deprecated name; the shipped recipes set
    # it too. PACSConfig moves it to the new name (pacs.grpo._compat), with the same effect.
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        default = tiny_pacs_config(tmp_path)
        recipe_like = PACSConfig(output_dir=str(tmp_path), use_cpu=True, gradient_checkpointing=True)
        off = PACSConfig(output_dir=str(tmp_path), use_cpu=True, gradient_checkpointing=False)
    assert _deprecations(record) == [], [str(w.message) for w in _deprecations(record)]
    assert default.gradient_checkpointing and recipe_like.gradient_checkpointing and not off.gradient_checkpointing
    if hasattr(off, "activation_checkpointing"):  # transformers 5: both names read the same
        assert default.activation_checkpointing and not off.activation_checkpointing


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def test_a_tiny_run_emits_no_deprecation_caused_by_pacs(tiny_model_dir, tmp_path):
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(16)]})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        args = tiny_pacs_config(tmp_path / "out", max_steps=2, save_strategy="steps", save_steps=1)
        trainer = PACSTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset)
        trainer.train()
        trainer.save_model()
    ours = [
        f"{w.filename}:{w.lineno}: {w.message}"
        for w in _deprecations(record)
        if w.filename.startswith(PACKAGE_DIR) or str(w.message).startswith(_OURS)
    ]
    # what may remain comes from TRL's own calls into transformers (e.g. `model.is_gradient_checkpointing` in
    # trl.models.utils under transformers 5), not from a pacs default
    assert ours == []


def test_the_demo_configs_warn_about_nothing(tmp_path):
    from pacs.demo import TRAINERS, parse_args, trainer_config

    args = parse_args([])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        configs = [trainer_config(args, str(tmp_path), algorithm) for algorithm in TRAINERS]
    assert _deprecations(record) == [], [str(w.message) for w in _deprecations(record)]
    assert not any(c.gradient_checkpointing for c in configs)  # off at this size, under either name


def test_a_tied_lm_head_missing_from_a_checkpoint_is_no_loss(tiny_model_dir):
    # the tiny Qwen3 ties lm_head to the embeddings: a checkpoint holds the weight once, and a load that "misses"
    # lm_head.weight lost nothing (tie_weights restores it); anything else missing is a real loss
    from transformers import AutoModelForCausalLM

    from pacs.grpo._compat import only_tied_keys_missing

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.tie_word_embeddings
    assert only_tied_keys_missing(model, ["lm_head.weight"])
    assert not only_tied_keys_missing(model, ["lm_head.weight", "model.norm.weight"])
    assert not only_tied_keys_missing(model, [])
    model.config.tie_word_embeddings = False
    assert not only_tied_keys_missing(model, ["lm_head.weight"])
