"""`pacs_anchor="reference"` with vLLM colocated on vLLM's CPU build: pi_ref and its resets beside vLLM's weight push.

make test-vllm PYTEST_ARGS="-k reference"
"""

import gc

import pytest
from datasets import Dataset

from pacs import PACSTrainer
from tests.tiny_config import tiny_pacs_config


pytestmark = pytest.mark.vllm


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_colocate_reference_anchor_resets(vllm_model_dir, tmp_path, vllm_float32, lora):
    # 4 generations of 2 optimizer steps, pi_ref reset before generations 2-4: on each generation's first step the
    # policy equals pi_ref (psi == 0, KL 0); on the second it has moved. vLLM follows the pushed weights throughout.
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = tiny_pacs_config(
        tmp_path, use_vllm=True, vllm_mode="colocate", max_completion_length=16, steps_per_generation=2, max_steps=8,
        pacs_anchor="reference", pacs_reference_reset_generations=1, learning_rate=5e-2 if lora else 1e-2,
    )  # fmt: skip
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(64)]})
    trainer = PACSTrainer(
        model=vllm_model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset, peft_config=peft_config
    )
    trainer.train()
    logs = [e for e in trainer.state.log_history if "pacs/loss" in e]
    assert [e["pacs/reference_resets"] for e in logs] == [0, 0, 1, 1, 2, 2, 3, 3]
    for first in (0, 2, 4, 6):
        assert logs[first]["pacs/psi_std"] <= 1e-6 and logs[first]["pacs/reference_kl"] <= 1e-6, (first, logs)
    assert max(logs[k]["pacs/reference_kl"] for k in (1, 3, 5, 7)) > 0
    gap = [
        e["sampling/sampling_logp_difference/max"]
        for e in trainer.state.log_history
        if "sampling/sampling_logp_difference/max" in e
    ]
    assert len(gap) == 4 and max(gap) < 1e-4, gap  # vLLM samples from the trained weights, pi_ref is the trainer's
    trainer.vllm_generation.llm = None
    del trainer
    gc.collect()
