"""Dynamic sampling (`pacs.grpo.dynamic_sampling`) with vLLM on vLLM's CPU build: colocated (full model and LoRA) and
in server mode (the weight push stubbed, as tests/vllm_tier/test_trainer_vllm.py).

make test-vllm PYTEST_ARGS="-k dynamic_sampling"

- Every round generates through the same vLLM client; the weights are pushed once per generation batch, before its
  first round (TRL pushes when the optimizer step changed), however many rounds follow: the tests count the pushes.
- In server mode each request sends every G-th prompt of the gathered batch (TRL's `all_prompts[::G]`): a top-up
  round's rows are each prompt G times in a row, so the request holds distinct prompts, one per group.
- Every group that reaches the loss has differing rewards (no fallback happens here), and the sampling-gap monitor and
  `pacs/is_*` describe the assembled batch, once per generation batch: at float32 the assembled rows' vLLM log-probs
  equal the trainer's for the same tokens (rows mixed up by the assembly would not).
- LoRA: the out-of-place push with several rounds leaves the frozen base weights bit for bit.
"""

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from pacs.grpo import HardenedGRPOConfig
from pacs.grpo.dynamic_sampling import uniform_signal
from tests.recording import RecordingGRPO


pytestmark = pytest.mark.vllm

SERVER_SCRIPT = Path(__file__).parent / "scripts" / "train_server.py"


def hard_reward(prompts, completions, **kwargs):
    """Only prompts marked "mixed" can be solved (by odd-length completions): the others make uniform groups."""
    return [float("mixed" in p and len(c) % 2 == 1) for p, c in zip(prompts, completions, strict=True)]


def _dataset(n: int = 64) -> Dataset:
    return Dataset.from_dict({"prompt": [f"Q{i} {'mixed' if i % 3 == 0 else 'hard'}?" for i in range(n)]})


def _train(model_dir, out_dir, peft_config=None, **overrides):
    settings = dict(
        output_dir=str(out_dir), use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=16, steps_per_generation=2, max_steps=4, learning_rate=1e-2, logging_steps=1,
        save_strategy="no", report_to="none", seed=0, use_vllm=True, vllm_mode="colocate", dynamic_sampling=True,
    )  # fmt: skip
    args = HardenedGRPOConfig(**{**settings, **overrides})
    trainer = RecordingGRPO(  # and counts the weight pushes and vLLM calls (below)
        model=model_dir, reward_funcs=hard_reward, args=args, train_dataset=_dataset(), peft_config=peft_config
    )
    trainer.batches, trainer.pushes, trainer.calls = [], [], []
    generation = trainer.vllm_generation
    sync_weights, generate = generation.sync_weights, generation.generate  # the tier's CPU push (_push.py)

    def counting_sync():
        trainer.pushes.append(trainer.state.global_step)
        sync_weights()

    def counting_generate(*args, **kwargs):
        trainer.calls.append(trainer.state.global_step)
        return generate(*args, **kwargs)

    generation.sync_weights, generation.generate = counting_sync, counting_generate
    trainer.frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    trainer.train()
    return trainer


def _logs(trainer, key):
    return [e[key] for e in trainer.state.log_history if key in e]


def _uniform_groups(trainer, batch) -> int:
    decode = trainer.processing_class.batch_decode
    prompts = decode(batch["prompt_ids"], skip_special_tokens=True)
    texts = [
        trainer.processing_class.decode(ids[mask.bool()], skip_special_tokens=True)
        for ids, mask in zip(batch["completion_ids"], batch["completion_mask"], strict=True)
    ]
    rewards = torch.tensor(hard_reward(prompts, texts))
    return int(uniform_signal(rewards, torch.ones_like(rewards, dtype=torch.bool), trainer.num_generations).sum())


def _check_rounds(trainer, generations: int) -> list[float]:
    rounds = _logs(trainer, "pacs/ds/rounds")
    assert len(rounds) == len(trainer.batches) == generations and max(rounds) > 1, rounds
    assert _logs(trainer, "pacs/ds/fallback_groups") == [0] * generations
    # one push per generation batch, at its first round; every round went through vLLM
    assert trainer.pushes == [2 * g for g in range(generations)], trainer.pushes
    assert trainer.calls == [2 * g for g, r in enumerate(rounds) for _ in range(int(r))], (trainer.calls, rounds)
    assert all(_uniform_groups(trainer, batch) == 0 for batch in trainer.batches)
    return rounds


def _release(trainer) -> None:
    trainer.vllm_generation.llm = None
    del trainer
    gc.collect()


def test_dynamic_sampling_colocate_pushes_once_per_generation_batch(vllm_model_dir, tmp_path, vllm_float32):
    # the correction off (the recipes' setting): the layer's monitor computes the sampling gap, once per generation
    # batch, on the assembled rows; at float32 it is at rounding level only if every row kept its own vLLM log-probs
    trainer = _train(vllm_model_dir, tmp_path, vllm_importance_sampling_correction=False)
    _check_rounds(trainer, 2)
    gaps = _logs(trainer, "sampling/sampling_logp_difference/mean")
    assert len(gaps) == 2 and max(gaps) < 1e-5, gaps
    assert max(_logs(trainer, "sampling/sampling_logp_difference/max")) < 1e-4
    assert not _logs(trainer, "pacs/is_ratio_mean")
    _release(trainer)


def test_dynamic_sampling_colocate_lora_keeps_base_weights_bit_identical(vllm_model_dir, tmp_path, vllm_float32):
    # several rounds per generation batch, one out-of-place LoRA push each; TRL's correction on: pacs/is_* describe
    # the assembled batch, once per generation batch (a ratio of 1 at float32, nothing masked)
    from peft import LoraConfig

    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    trainer = _train(vllm_model_dir, tmp_path, lora, learning_rate=5e-2)
    _check_rounds(trainer, 2)
    assert any("base_layer" in n for n in trainer.frozen)
    params = dict(trainer.model.named_parameters())
    changed = [n for n, p in trainer.frozen.items() if not params[n].detach().equal(p)]
    assert not changed, f"frozen base weights moved: {changed[:5]}"
    assert max(p.abs().max().item() for n, p in params.items() if "lora_B" in n) > 1e-3, "the adapters must move"
    ratios, masked = _logs(trainer, "pacs/is_ratio_mean"), _logs(trainer, "pacs/is_masked_frac")
    assert len(ratios) == len(masked) == 2 and masked == [0.0, 0.0], (ratios, masked)
    assert all(abs(r - 1) < 1e-3 for r in ratios), ratios
    assert max(_logs(trainer, "sampling/sampling_logp_difference/max")) < 1e-4
    _release(trainer)


def test_dynamic_sampling_server_mode_two_processes(vllm_server, vllm_model_dir, tmp_path, free_port):
    # PACS, 2 processes x 4 rows, groups of 4, 2 optimizer steps per generation, 4 steps: 2 generation batches. Every
    # request to the server holds one distinct prompt per group of the round; pushes once per generation batch
    out = tmp_path / "out"
    out.mkdir()
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--main_process_port", str(free_port)]
    cmd = [
        *launch,
        str(SERVER_SCRIPT),
        vllm_model_dir,
        str(out),
        vllm_server,
        "4",
        "1",
        "2",
        "4",
        "--dynamic-sampling",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    logs = [e for e in records[0]["log_history"] if "pacs/ds/rounds" in e]
    rounds = [int(e["pacs/ds/rounds"]) for e in logs]
    assert len(rounds) == 2 and max(rounds) > 1 and all(e["pacs/ds/fallback_groups"] == 0 for e in logs), logs
    for r in records:
        assert r["pushes"] == [0, 2], r["pushes"]  # every process takes part in each push, once per batch
        assert len(r["seen"]) == 4 and all(s["labels"] == s["recomputed"] for s in r["seen"])
        for s in r["seen"]:  # each micro-batch is one whole group of one prompt, whose labels differ
            assert len(set(s["prompts"])) == 1 and 0 < sum(s["labels"]) < 4, s
    requests = records[0]["requests"]
    assert [q["step"] for q in requests] == [2 * g for g, n in enumerate(rounds) for _ in range(n)]
    for request in requests:  # 2 processes x 8 rows = 4 groups: 4 distinct prompts, 4 completions each
        assert request["n"] == 4 and len(request["prompts"]) == len(set(request["prompts"])) == 4, request
    assert not records[1]["requests"]  # only the main process talks to the server
