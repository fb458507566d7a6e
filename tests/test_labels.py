"""From rewards to PACS labels: `pacs.labels.reward_to_label` on known values, and `PACSTrainer` with a learned reward
model (a tiny `Qwen3ForSequenceClassification`, built offline) whose unbounded scores become labels through
`pacs_label_transform`."""

import logging
import math

import pytest
import torch
from datasets import Dataset

from pacs import PACSTrainer
from pacs.labels import label_transforms, reward_to_label, soft_label_message
from tests.tiny_config import tiny_pacs_config


NAN = float("nan")


# ---------------------------------------------------------------------------------------------------------------------
# The transforms, on known values
# ---------------------------------------------------------------------------------------------------------------------


def test_transforms_on_known_values():
    scores = torch.tensor([[-2.0], [0.0], [0.5], [3.0], [NAN]])  # (B, 1)
    none = reward_to_label(scores, "none")
    assert torch.equal(none[:4], scores[:4]) and math.isnan(none[4, 0])
    clip = reward_to_label(scores, "clip")
    assert clip[:4, 0].tolist() == [0.0, 0.0, 0.5, 1.0] and math.isnan(clip[4, 0])
    sig = reward_to_label(scores, "sigmoid", temperature=2.0, offset=1.0)  # sigmoid((s - 1) / 2)
    expected = [1 / (1 + math.exp(-(s - 1.0) / 2.0)) for s in (-2.0, 0.0, 0.5, 3.0)]
    assert sig[:4, 0].tolist() == pytest.approx(expected, abs=1e-6) and math.isnan(sig[4, 0])
    assert reward_to_label(torch.tensor([[1.0]]), "sigmoid", offset=1.0).item() == 0.5  # the offset maps to 1/2


def test_one_transform_per_reward_function():
    scores = torch.tensor([[4.0, 1.0, 1.5], [-4.0, 0.0, -0.5]])  # (B, F=3)
    labels = reward_to_label(scores, ["sigmoid", "none", "clip"])
    assert labels[:, 0].tolist() == pytest.approx([1 / (1 + math.exp(-4)), 1 / (1 + math.exp(4))])
    assert labels[:, 1].tolist() == [1.0, 0.0] and labels[:, 2].tolist() == [1.0, 0.0]
    assert torch.equal(reward_to_label(scores, ["clip"]), reward_to_label(scores, "clip"))  # one name for all
    with pytest.raises(ValueError, match=r"names 2 transforms .* for 3 reward functions"):
        reward_to_label(scores, ["clip", "none"])
    with pytest.raises(ValueError, match=r"Unknown pacs_label_transform 'tanh'"):
        label_transforms("tanh", 1)


def test_soft_labels_are_named_unless_asked_for():
    scorable = torch.tensor([True, True, True, False])
    message = soft_label_message(torch.tensor([0.25, 1.0, 0.0, 0.5]), scorable, "none")
    assert message.startswith("PACS trains 1 of 3 scored completions on rewards strictly between 0 and 1 (e.g. 0.25)")
    assert "binary 0/1 labels" in message and "arXiv:2509.02522" in message
    assert soft_label_message(torch.tensor([0.0, 1.0, 1.0, 0.5]), scorable, ["none"]) is None  # (not scored)
    assert soft_label_message(torch.tensor([0.25, 1.0, 0.0, 0.5]), scorable, "sigmoid") is None  # soft by choice
    assert soft_label_message(torch.tensor([0.25, 1.0, 0.0, 0.5]), scorable, ["sigmoid", "clip"]) is not None


def test_soft_labels_are_said_once_in_a_run(tiny_model_dir, tmp_path, caplog):
    def partial_credit(completions, **kwargs):
        return [0.5 if i % 2 else 1.0 for i in range(len(completions))]

    args = tiny_pacs_config(tmp_path / "out", max_steps=2)  # two generations, both with soft labels
    trainer = PACSTrainer(model=tiny_model_dir, reward_funcs=partial_credit, args=args, train_dataset=prompts())
    with caplog.at_level(logging.WARNING, logger="pacs.trainer"):
        trainer.train()
    said = [r.getMessage() for r in caplog.records if "as soft labels" in r.getMessage()]
    assert len(said) == 1 and "8 of 16 scored completions" in said[0], said


# ---------------------------------------------------------------------------------------------------------------------
# PACSTrainer with a learned reward model
# ---------------------------------------------------------------------------------------------------------------------


def prompts(n=16):
    return Dataset.from_dict({"prompt": [f"What is {i} + {3 * i}?" for i in range(n)]})


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory) -> str:
    """A random tiny `Qwen3ForSequenceClassification` (num_labels=1) and its tokenizer: scores far outside [0, 1]."""
    from transformers import Qwen3Config, Qwen3ForSequenceClassification

    from pacs.testing import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen3ForSequenceClassification(config)
    with torch.no_grad():
        model.score.weight.mul_(20.0)  # a reward model's logit, O(1-10): unbounded, as Bradley-Terry scores are
    path = tmp_path_factory.mktemp("tiny-reward-model")
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return str(path)


class LabelRecorder:
    """Wraps `_calculate_rewards` to keep the raw scores and the labels of every scored generation batch."""

    def __init__(self, trainer):
        self.raw, self.labels = [], []
        self._after_rewards = trainer._after_rewards
        trainer._after_rewards = self

    def __call__(self, rewards_per_func, scorable, mode):
        columns = self._after_rewards(rewards_per_func, scorable, mode)
        self.raw.append(rewards_per_func.detach().clone())
        self.labels.append(columns["pacs_labels"].detach().clone())  # the labels ride with the batch
        return columns


def test_reward_model_path_trains_with_sigmoid_labels(tiny_model_dir, reward_model_dir, tmp_path):
    args = tiny_pacs_config(tmp_path / "out", max_steps=2, pacs_label_transform="sigmoid", pacs_label_temperature=2.0)
    trainer = PACSTrainer(model=tiny_model_dir, reward_funcs=reward_model_dir, args=args, train_dataset=prompts())
    recorder = LabelRecorder(trainer)
    trainer.train()

    raw, labels = recorder.raw[0][:, 0], recorder.labels[0]  # (B_glob,)
    assert ((raw < 0) | (raw > 1)).any(), "the reward model's scores should leave [0, 1] for this test to mean much"
    assert torch.allclose(labels, torch.sigmoid(raw / 2.0))
    assert ((labels > 0) & (labels < 1)).all()  # soft labels
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and all(math.isfinite(entry["loss"]) for entry in logs)
    assert logs[0]["pacs/rollout_label_mean"] == pytest.approx(labels.mean().item(), rel=1e-5)
    assert logs[0]["pacs/rollout_label_std"] > 0
    assert logs[0]["reward"] == pytest.approx(raw.mean().item(), rel=1e-4, abs=1e-4)  # TRL's `reward` stays raw


def test_reward_model_without_transform_fails_naming_the_setting(tiny_model_dir, reward_model_dir, tmp_path):
    args = tiny_pacs_config(tmp_path / "out", max_steps=1)
    trainer = PACSTrainer(model=tiny_model_dir, reward_funcs=reward_model_dir, args=args, train_dataset=prompts())
    with pytest.raises(ValueError, match=r"needs it in \[0, 1\].*pacs_label_transform='none'.*'sigmoid'"):
        trainer.train()


def test_reward_model_object_next_to_a_verifier(tiny_model_dir, reward_model_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    def parity(completions, **kwargs):
        return [float(len(c) % 2) for c in completions]

    args = tiny_pacs_config(
        tmp_path / "out",
        max_steps=1,
        pacs_label_transform=["sigmoid", "none"],
        pacs_label_offset=1.0,
        reward_weights=[0.5, 0.5],
    )
    trainer = PACSTrainer(
        model=tiny_model_dir,
        reward_funcs=[AutoModelForSequenceClassification.from_pretrained(reward_model_dir), parity],
        reward_processing_classes=[AutoTokenizer.from_pretrained(reward_model_dir), None],
        args=args,
        train_dataset=prompts(),
    )
    recorder = LabelRecorder(trainer)
    trainer.train()
    raw, labels = recorder.raw[0], recorder.labels[0]  # (B_glob, 2), (B_glob,)
    assert torch.allclose(labels, 0.5 * torch.sigmoid(raw[:, 0] - 1.0) + 0.5 * raw[:, 1])
    assert math.isfinite(trainer.state.log_history[0]["loss"])


def test_docstring_examples_run():
    import doctest

    import pacs.labels

    result = doctest.testmod(pacs.labels)
    assert result.attempted > 0 and result.failed == 0
