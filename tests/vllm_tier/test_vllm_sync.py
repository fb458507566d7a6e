"""`pacs.grpo.vllm_sync` with vLLM colocated on vLLM's CPU build: the LoRA push leaves the base weights bit-identical, and the
weight-sync monitor sees a push that stops working.

make test-vllm PYTEST_ARGS="-k vllm_sync"
"""

import gc
import logging

import pytest
from datasets import Dataset

from pacs import PACSTrainer
from pacs.grpo.vllm_sync import STALE_GAP
from tests.tiny_config import tiny_pacs_config


pytestmark = pytest.mark.vllm

GAP = "sampling/sampling_logp_difference/mean"


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def _trainer(model_dir, out_dir, peft_config=None, **overrides):
    base = dict(
        use_vllm=True,
        vllm_mode="colocate",
        max_completion_length=16,
        vllm_importance_sampling_correction=False,  # the recipes' setting: TRL itself logs no gap then
    )
    args = tiny_pacs_config(out_dir, **{**base, **overrides})
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(64)]})
    return PACSTrainer(
        model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset, peft_config=peft_config
    )


def _logged(trainer, key):
    return [(e["step"], e[key]) for e in trainer.state.log_history if key in e]


def _stale_warnings(caplog):
    return [r.getMessage() for r in caplog.records if "STALE vLLM WEIGHTS" in r.getMessage()]


def _release(trainer) -> None:
    trainer.vllm_generation.llm = None
    del trainer
    gc.collect()


def test_lora_push_keeps_base_weights_bit_identical(vllm_model_dir, tmp_path, vllm_float32, caplog):
    # 4 generations (2 optimizer steps apart, 4 pushes) at a learning rate that moves the adapters far. TRL's own push
    # (merge in place, unmerge) moves the frozen base weights even in float32 (7.5e-9 after 2 pushes); PACS's push
    # computes W + scaling * B @ A out of place: the base weights stay bit for bit, and vLLM samples from the merged
    # weights (its log-probs equal the trainer's to float32 precision, as the full-model push check in
    # test_trainer_vllm.py). The monitor logs the gap with the correction off, and stays quiet.
    from peft import LoraConfig

    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    trainer = _trainer(vllm_model_dir, tmp_path, lora, steps_per_generation=2, max_steps=8, learning_rate=5e-2)
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    assert any("base_layer" in n for n in frozen)
    with caplog.at_level(logging.WARNING, logger="pacs.grpo.vllm_sync"):
        trainer.train()
    lora_b = [p for n, p in trainer.model.named_parameters() if "lora_B" in n]
    assert max(p.abs().max().item() for p in lora_b) > 1e-3, "the adapters must have moved"
    changed = [n for n, p in trainer.model.named_parameters() if n in frozen and not p.detach().equal(frozen[n])]
    assert not changed, f"frozen base weights moved: {changed[:5]}"
    gaps = _logged(trainer, GAP)
    print("LoRA push: sampling log-prob gap per generation", gaps)
    assert len(gaps) == 4 and max(g for _, g in gaps) < 1e-5, gaps
    assert max(g for _, g in _logged(trainer, "sampling/sampling_logp_difference/max")) < 1e-4
    assert not _stale_warnings(caplog)
    _release(trainer)


def test_monitor_sees_the_push_stop(vllm_model_dir, tmp_path, vllm_float32, monkeypatch, caplog):
    # One generation per optimizer step (generation and optimizer steps aligned: TRL computes no trainer log-probs,
    # the monitor does), the correction off. The weight push works for the first 2 steps, then stops (a no-op, as a
    # push that silently fails): while it works the gap is at float32's floor and nothing is said; once vLLM samples
    # from stale weights the gap exceeds what rounding explains and the warning comes, once.
    from trl.generation.vllm_generation import VLLMGeneration

    working_push = VLLMGeneration.sync_weights  # the tier's CPU push (tests/vllm_tier/_push.py)
    trainer = _trainer(vllm_model_dir, tmp_path, steps_per_generation=1, max_steps=6)

    def sync_weights(self):
        if trainer.state.global_step < 2:
            working_push(self)

    monkeypatch.setattr(VLLMGeneration, "sync_weights", sync_weights)
    with caplog.at_level(logging.WARNING, logger="pacs.grpo.vllm_sync"):
        trainer.train()
    gaps = _logged(trainer, GAP)
    print("push stopped after step 2: sampling log-prob gap per generation", gaps)
    assert len(gaps) == 6
    assert all(g < 1e-5 for step, g in gaps if step <= 2), gaps  # log step s: generated after s - 1 updates
    assert max(g for step, g in gaps if step > 2) > STALE_GAP, gaps
    warnings = _stale_warnings(caplog)
    assert len(warnings) == 1 and "vLLM" in warnings[0] and "stale weights" in warnings[0]
    _release(trainer)
