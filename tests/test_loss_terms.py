"""`pacs.loss_terms` against `GRPOTrainer._compute_loss` on the same batch: the KL term, the entropy bonus (static and
adaptive, with its controller) and the token metrics PACS re-does must be GRPOTrainer's own."""

import pytest
import torch
from datasets import Dataset
from trl import GRPOTrainer

from pacs import PACSTrainer
from pacs.grpo.terms import loss_mask
from tests.tiny_config import tiny_pacs_config


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def hand_made_batch(trainer, B=4, prompt_len=3, completion_len=6):
    """A batch as `_generate_and_score_completions` makes it, with advantages 0 (GRPO's policy term is then 0)."""
    g = torch.Generator().manual_seed(0)
    vocab = trainer.model.config.vocab_size
    completion_mask = torch.ones(B, completion_len, dtype=torch.long)
    completion_mask[1, 4:] = 0  # a shorter completion
    completion_mask[3, 2:] = 0
    tool_mask = torch.ones_like(completion_mask)
    tool_mask[2, 1:3] = 0  # tool output inside a completion: not the policy's
    inputs = {
        "prompt_ids": torch.randint(3, vocab, (B, prompt_len), generator=g),
        "prompt_mask": torch.ones(B, prompt_len, dtype=torch.long),
        "completion_ids": torch.randint(3, vocab, (B, completion_len), generator=g),
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.zeros(B),
    }
    with torch.no_grad():
        logps, _, _ = trainer._per_token_logps(trainer.model, inputs)
    inputs["old_per_token_logps"] = logps + 0.05 * torch.randn(logps.shape, generator=g)
    inputs["ref_per_token_logps"] = logps + 0.3 * torch.randn(logps.shape, generator=g)
    return inputs


def run_both(trainer, inputs):
    """(loss, metrics, entropy_coef) of GRPOTrainer's `_compute_loss` and of `_add_grpo_terms` (`pacs.loss_terms`) on a zero policy loss,
    each from the same controller state."""
    state = (trainer.entropy_coef, trainer._last_world_entropy, trainer._entropy_window_stats)
    results = []
    for which in ("grpo", "pacs"):
        trainer.entropy_coef, trainer._last_world_entropy, trainer._entropy_window_stats = state
        trainer._metrics["train"].clear()
        trainer.model.zero_grad()
        if which == "grpo":
            loss = GRPOTrainer._compute_loss(trainer, trainer.model, inputs)
        else:
            logps, entropies, aux = trainer._per_token_logps(
                trainer.model, inputs, compute_entropy=True, compute_aux_loss=trainer.aux_loss_enabled
            )
            zero = (logps * 0).sum()
            loss = trainer._add_grpo_terms("train", zero, zero, logps, entropies, aux, inputs, loss_mask(inputs))
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
        metrics = {k: list(v) for k, v in trainer._metrics["train"].items()}
        results.append((loss.item(), grad, metrics, trainer.entropy_coef, trainer._last_world_entropy))
    return results


@pytest.mark.parametrize(
    "settings",
    [
        dict(beta=0.1),
        dict(beta=0.1, use_bias_correction_kl=True),
        dict(beta=0.1, entropy_coef=0.05),
        dict(beta=0.0, use_adaptive_entropy=True, entropy_coef=0.01, entropy_target=100.0),
    ],
    ids=["kl", "kl-bias-corrected", "kl-entropy-bonus", "adaptive-entropy"],
)
def test_grpo_terms_equal_grpo_trainers_own(tiny_model_dir, tmp_path, settings):
    args = tiny_pacs_config(tmp_path / "out", gradient_accumulation_steps=2, steps_per_generation=8, **settings)
    trainer = PACSTrainer(
        model=tiny_model_dir, reward_funcs=parity_reward, args=args,
        train_dataset=Dataset.from_dict({"prompt": ["1 + 1 ="] * 8}),
    )  # fmt: skip
    trainer.loss_type = "grpo"  # GRPO's per-sequence token mean, which PACS's KL term follows
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    if settings.get("use_adaptive_entropy"):
        trainer._last_world_entropy = 0.0  # below the target: the bonus applies and its coefficient rises
    inputs = hand_made_batch(trainer)
    (grpo_loss, grpo_grad, grpo_metrics, *grpo_state), (loss, grad, metrics, *state) = run_both(trainer, inputs)
    assert grpo_loss != 0.0
    assert loss == pytest.approx(grpo_loss, rel=1e-6)
    torch.testing.assert_close(grad, grpo_grad, rtol=1e-5, atol=1e-8)
    shared = {"entropy", "kl", "entropy_coef", "aux_loss"} & set(grpo_metrics)
    assert "entropy" in shared and ("kl" in shared) == (settings["beta"] != 0)
    for key in shared:
        assert metrics[key] == pytest.approx(grpo_metrics[key], rel=1e-6), key
    assert state == pytest.approx(grpo_state)  # the adaptive controller moved alike
    if settings.get("use_adaptive_entropy"):
        assert state[0] != settings["entropy_coef"]  # it did move
