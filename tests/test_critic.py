"""Tests of `pacs.critic`: the within-group ranking and the mixed-group Brier score, against hand-computed values
(ties, uniform groups, weights, soft labels, pooling over micro-batches), and as `PACSTrainer` logs them (the
reference anchor against an independent computation, the rollout anchor's 0.5, the split path)."""

import itertools
import math

import pytest
import torch
from torch.nn.utils import vector_to_parameters
from transformers import AutoModelForCausalLM

from pacs.critic import CriticTally, critic_metrics, ranking_sums
from pacs.grpo.trainer import first_step_of_generation
from pacs.loss import compute_score, pacs_loss
from tests import test_reference as ref  # its trainer factory and direct log-probs


def brute_force_ranking(psi, labels, valid, G):
    """The ranking by enumerating pairs: (correct, incorrect) of one group, ties 1/2."""
    good = total = 0.0
    for g in range(len(psi) // G):
        rows = [i for i in range(g * G, g * G + G) if valid[i]]
        for i, j in itertools.product(rows, rows):
            if labels[i] >= 0.5 and labels[j] < 0.5:
                total += 1
                good += 1.0 if psi[i] > psi[j] else 0.5 if psi[i] == psi[j] else 0.0
    return good, total


def test_ranking_on_hand_made_values():
    # group 1: psi orders (1 > 0 > -1); labels 1, 0, 1, 0 -> pairs (0,1) right, (0,3) right, (2,1) tie, (2,3) right
    # group 2: uniform (all correct) -> no pair, not mixed, whatever psi says
    # group 3: a tie and a wrong order; its last row has weight 0 and would make a right-ordered pair if it counted
    psi = torch.tensor([1.0, 0.0, 0.0, -1.0, 5.0, -5.0, 0.0, 0.0, 0.2, 0.2, 0.3, -9.0])
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    valid = torch.tensor([True] * 11 + [False])
    s = ranking_sums(psi, labels, valid, 4)
    assert float(s["pairs"]) == 4 + 0 + 2  # group 3: (8, 9), (8, 10)
    assert float(s["concordant"]) == 3.5 + 0.5 + 0.0  # group 3: a tie (0.5) and 0.2 < 0.3 (0)
    assert (float(s["concordant"]), float(s["pairs"])) == brute_force_ranking(psi, labels, valid, 4)
    probs = torch.sigmoid(psi.double())
    mixed = [0, 1, 2, 3, 8, 9, 10]  # rows of mixed groups with weight > 0
    assert float(s["mixed_rows"]) == 7
    assert float(s["brier_sum"]) == pytest.approx(((probs[mixed] - labels[mixed].double()) ** 2).sum().item())


def test_psi_zero_ranks_at_one_half_and_brier_at_one_quarter():
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    tally = CriticTally()
    tally.add(ranking_sums(torch.zeros(6), labels, torch.ones(6) > 0, 3))
    metrics = tally.flush(fresh=True)
    assert metrics == {"pacs/critic_ranking": 0.5, "pacs/critic_ranking_fresh": 0.5, "pacs/critic_brier_mixed": 0.25}


def test_uniform_groups_log_nothing():
    tally = CriticTally()
    tally.add(
        ranking_sums(torch.tensor([3.0, -3.0, 1.0, 2.0]), torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.ones(4) > 0, 2)
    )
    assert tally.flush(fresh=True) == {}


def test_soft_labels_split_at_one_half():
    # labels 0.7 and 0.5 count as correct, 0.49 as incorrect; the Brier score uses the soft labels themselves
    s = ranking_sums(torch.tensor([1.0, 2.0, 0.0]), torch.tensor([0.7, 0.5, 0.49]), torch.ones(3) > 0, 3)
    assert (float(s["concordant"]), float(s["pairs"])) == (2.0, 2.0)
    probs = torch.sigmoid(torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64))
    expected = ((probs - torch.tensor([0.7, 0.5, 0.49], dtype=torch.float64)) ** 2).sum().item()
    assert float(s["brier_sum"]) == pytest.approx(expected)


def test_a_non_finite_psi_is_left_out():
    # one NaN and one inf in the first group: their pairs are not counted (a NaN compared as discordant before)
    psi = torch.tensor([float("nan"), 1.0, -1.0, float("inf"), 0.5, -0.5])
    labels = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    s = ranking_sums(psi, labels, torch.ones(6, dtype=torch.bool), 3)
    assert (float(s["concordant"]), float(s["pairs"])) == (2.0, 2.0)  # (1, 2) and (4, 5)
    assert float(s["mixed_rows"]) == 4 and torch.isfinite(s["brier_sum"])
    metrics = critic_metrics(psi, labels, torch.ones(6), torch.zeros(6), 3)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["pacs/psi_mean"] == 0.0 and metrics["pacs/psi_std"] == pytest.approx(0.625**0.5)  # the 4 finite


@pytest.mark.parametrize("class_weight", ["positive_only", "negative_only", "balanced", None])
def test_pairs_are_counted_whatever_the_class_weight(class_weight):
    # the loss weighs one class 0 under positive_only / negative_only; the critic still ranks every pair of samples
    psi_logps = torch.tensor([[0.3], [0.1], [-0.2], [0.4], [0.0], [-0.1], [0.2], [0.5]])
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    sample_weight = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0])  # the last one could not be scored
    _, stats = pacs_loss(psi_logps, torch.zeros_like(psi_logps), torch.ones(8, 1), labels, 4,
                         class_weight=class_weight, sample_weight=sample_weight)  # fmt: skip
    assert stats["counted"].tolist() == [True] * 7 + [False]
    s = ranking_sums(stats["psi"], labels, stats["counted"], 4)
    assert float(s["pairs"]) == 4 + 2  # group 2 without its unscored row
    if class_weight in ("positive_only", "negative_only"):
        assert (stats["weights"][:7] == 0).sum() >= 3  # what the metrics used to select the rows by


def test_tally_pools_pairs_not_ratios():
    # micro-batch 1: one group with 1 right pair of 1; micro-batch 2: one group with 1 right pair of 4
    # pooled: 2 / 5 = 0.4 (the mean of the two ratios would be 0.625)
    tally = CriticTally()
    tally.add(ranking_sums(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0]), torch.ones(2) > 0, 2))
    psi, labels = torch.tensor([0.0, 0.0, 1.0, 2.0]), torch.tensor([1.0, 1.0, 0.0, 0.0])
    tally.add(ranking_sums(psi, labels, torch.ones(4) > 0, 4))
    metrics = tally.flush(fresh=False)
    assert metrics["pacs/critic_ranking"] == pytest.approx(1 / 5) or metrics["pacs/critic_ranking"] == 0.2
    assert "pacs/critic_ranking_fresh" not in metrics
    assert tally.flush(fresh=True) == {}  # flushed: the next step starts from nothing


def test_first_step_of_generation_rule():
    # 2 micro-batches per optimizer step, 4 per generation, 2 iterations: a generation feeds 4 optimizer steps
    assert [first_step_of_generation(k, 2, 4, 2) for k in range(10)] == [1, 1, 0, 0, 0, 0, 0, 0, 1, 1]


# ---------------------------------------------------------------------------------------------------------------------
# As PACSTrainer logs them
# ---------------------------------------------------------------------------------------------------------------------


def _trainer(tiny_model_dir, tmp_path, **overrides):
    return ref.make_trainer(tiny_model_dir, tmp_path, trainer_cls=ref.StepRecorder, **overrides)


def _logs(trainer):
    trainer.train()
    return [e for e in trainer.state.log_history if "pacs/loss" in e]


def test_fresh_ranking_equals_an_independent_computation_with_the_reference_anchor(tiny_model_dir, tmp_path):
    # pi_ref never reset, 2 optimizer steps per generation: steps 3, 5, ... are fresh with psi != 0 (step 1 has
    # psi == 0 by construction and logs no fresh ranking)
    trainer = _trainer(tiny_model_dir, tmp_path, max_steps=12, learning_rate=0.05, pacs_reference_reset_generations=0)
    logs = _logs(trainer)
    assert "pacs/critic_ranking_fresh" not in logs[0]
    assert all("pacs/critic_ranking_fresh" not in logs[k] for k in range(1, 12, 2))  # not a generation's first step
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    checked = []
    for k in range(2, 12, 2):
        record = trainer.records[k]
        inputs = record["inputs"]
        vector_to_parameters(record["params"], policy.parameters())
        with torch.no_grad():
            log_ratio = ref.completion_logps(policy, inputs) - ref.completion_logps(reference, inputs)
        r = (log_ratio * inputs["completion_mask"]).sum(-1)  # beta = 1
        psi = compute_score(r, 4, "rloo")
        good, total = brute_force_ranking(psi.tolist(), inputs["pacs_labels"].tolist(), [True] * len(psi), 4)
        if total == 0:
            assert "pacs/critic_ranking_fresh" not in logs[k]
            continue
        assert logs[k]["pacs/critic_ranking_fresh"] == pytest.approx(good / total, abs=1e-6), k
        assert logs[k]["pacs/critic_ranking"] == logs[k]["pacs/critic_ranking_fresh"]
        checked.append(good / total)
    assert len(checked) >= 2 and any(value != 0.5 for value in checked), checked


def test_rollout_anchor_ranks_at_one_half_on_every_first_step(tiny_model_dir, tmp_path):
    logs = _logs(_trainer(tiny_model_dir, tmp_path, max_steps=6, pacs_anchor="rollout"))
    fresh = [logs[k].get("pacs/critic_ranking_fresh") for k in (0, 2, 4)]
    assert [v for v in fresh if v is not None] and all(v in (None, 0.5) for v in fresh)
    assert all(logs[k].get("pacs/critic_brier_mixed", 0.25) == pytest.approx(0.25) for k in (0, 2, 4))


def test_no_fresh_ranking_on_a_generation_right_after_a_reset(tiny_model_dir, tmp_path):
    # reset before generation 3 (step 5): psi == 0 there by construction
    logs = _logs(_trainer(tiny_model_dir, tmp_path, max_steps=8, pacs_reference_reset_generations=2))
    assert "pacs/critic_ranking_fresh" not in logs[4] and "pacs/critic_ranking_fresh" not in logs[0]
    assert any("pacs/critic_ranking_fresh" in logs[k] for k in (2, 6))


@pytest.mark.parametrize("batch,accumulation", [(2, 2), (1, 4)])
def test_split_path_logs_the_whole_groups_ranking(tiny_model_dir, tmp_path, batch, accumulation):
    make_trainer = ref.make_trainer
    common = dict(max_steps=6, pacs_reference_reset_generations=0)
    whole = _logs(make_trainer(tiny_model_dir, tmp_path, "whole", **common))
    split = _logs(
        make_trainer(
            tiny_model_dir, tmp_path, "split", per_device_train_batch_size=batch,
            gradient_accumulation_steps=accumulation, steps_per_generation=2 * accumulation, **common,
        )
    )  # fmt: skip
    for key in ("pacs/critic_ranking", "pacs/critic_ranking_fresh", "pacs/critic_brier_mixed"):
        a, b = [e.get(key) for e in whole], [e.get(key) for e in split]
        assert [x is None for x in a] == [x is None for x in b], key
        assert [x for x in a if x is not None] == pytest.approx([x for x in b if x is not None], abs=1e-5), key
    assert any("pacs/critic_ranking" in e for e in split)


@pytest.mark.parametrize("class_weight", ["positive_only", "negative_only"])
def test_one_class_weights_still_log_the_ranking(tiny_model_dir, tmp_path, class_weight):
    # whole groups and the split path: a class of weight 0 in the loss is still ranked by the critic's metrics
    make_trainer = ref.make_trainer
    common = dict(max_steps=4, pacs_reference_reset_generations=0, pacs_class_weight=class_weight)
    whole = _logs(make_trainer(tiny_model_dir, tmp_path, "whole", **common))
    split = _logs(make_trainer(tiny_model_dir, tmp_path, "split", per_device_train_batch_size=2,
                               gradient_accumulation_steps=2, steps_per_generation=4, **common))  # fmt: skip
    for logs in (whole, split):
        assert any("pacs/critic_ranking" in e for e in logs) and any("pacs/critic_brier_mixed" in e for e in logs)
        assert all(0.0 < e["pacs/label_mean"] < 1.0 for e in logs if "pacs/critic_ranking" in e)
