"""`PACSTrainer` with vLLM on vLLM's CPU build: colocated (`vllm_mode="colocate"`), and server mode with the
weight push stubbed.

make test-vllm PYTEST_ARGS="-k colocate"
make test-vllm PYTEST_ARGS="-k server"
"""

import gc
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset

from pacs import PACSTrainer
from tests.tiny_config import tiny_pacs_config


pytestmark = pytest.mark.vllm


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def _dataset(n: int = 64) -> Dataset:
    return Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}?" for i in range(n)]})


def _train(model_dir, out_dir, peft_config=None, **overrides):
    """Train with vLLM colocated; return the trainer and, per micro-batch, (labels, labels recomputed from the
    completion tokens the loss saw)."""
    base = dict(use_vllm=True, vllm_mode="colocate", max_completion_length=16, steps_per_generation=4, max_steps=8)
    args = tiny_pacs_config(out_dir, **{**base, **overrides})
    trainer = PACSTrainer(
        model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=_dataset(), peft_config=peft_config
    )
    seen = []
    compute_loss = trainer._compute_loss
    tokenizer = trainer.processing_class

    def spy(model, inputs):
        texts = tokenizer.batch_decode(inputs["completion_ids"], skip_special_tokens=True)
        seen.append((inputs["pacs_labels"].tolist(), parity_reward(texts)))
        return compute_loss(model, inputs)

    trainer._compute_loss = spy
    trainer.train()
    return trainer, seen


def _release(trainer) -> None:
    """Free the vLLM engine (its KV cache) before the next test builds one."""
    trainer.vllm_generation.llm = None
    del trainer
    gc.collect()


def _logs(trainer, key):
    return [e[key] for e in trainer.state.log_history if key in e]


def _check_run(trainer, seen, generations: int, importance_sampling: bool) -> None:
    assert seen and all(labels == recomputed for labels, recomputed in seen), "labels must follow their completions"
    all_labels = [label for labels, _ in seen for label in labels]
    assert 0 < sum(all_labels) < len(all_labels), "the run should see both labels"
    pacs_keys = {k for e in trainer.state.log_history for k in e if k.startswith("pacs/")}
    assert {"pacs/loss", "pacs/psi_std", "pacs/critic_brier"} <= pacs_keys
    for key in pacs_keys:
        assert all(math.isfinite(v) for v in _logs(trainer, key)), key
    is_logged = _logs(trainer, "pacs/is_ratio_mean")
    if importance_sampling:  # TRL compares vLLM's sampling log-probs with the trainer's only when it corrects for them
        assert len(_logs(trainer, "sampling/sampling_logp_difference/mean")) == generations
        assert len(is_logged) == generations and len(_logs(trainer, "pacs/is_masked_frac")) == generations
    else:
        assert not is_logged
    psi = _logs(trainer, "pacs/psi_std")
    assert any(v > 0 for v in psi), "off-policy steps (3 of 4 per generation) must score psi != 0"


@pytest.mark.parametrize(
    "overrides, importance_sampling",
    [
        ({}, True),
        ({"vllm_importance_sampling_correction": False, "num_iterations": 2}, False),
    ],
    ids=["is_correction", "no_is_correction_two_iterations"],
)
def test_colocate_trains(vllm_model_dir, tmp_path, overrides, importance_sampling):
    # steps_per_generation = 4 x gradient_accumulation_steps, as in the paper: 8 steps = 2 generations (with
    # num_iterations=2, each generation batch is used twice: 1 generation)
    trainer, seen = _train(vllm_model_dir, tmp_path, **overrides)
    generations = 8 // (4 * overrides.get("num_iterations", 1))
    _check_run(trainer, seen, generations, importance_sampling)
    if importance_sampling:
        # vLLM samples in bfloat16 here (TRL passes it no dtype; vLLM downcasts float32 on CPU): a bf16-sized gap
        assert max(_logs(trainer, "sampling/sampling_logp_difference/mean")) < 0.02
    _release(trainer)


def test_colocate_vllm_follows_trained_weights(vllm_model_dir, tmp_path, vllm_float32):
    # 4 generations, 2 optimizer steps apart at lr 1e-2: the weights move far. After each push vLLM's sampling
    # log-probs must equal the trainer's log-probs of the same completions (TRL's old_per_token_logps, computed at
    # generation time) to float32 precision. Without the push the gap is 0.3-1 nats per token.
    trainer, seen = _train(vllm_model_dir, tmp_path, steps_per_generation=2, max_steps=8)
    diff_max = _logs(trainer, "sampling/sampling_logp_difference/max")
    print(
        "sampling log-prob gap per generation: max",
        diff_max,
        "mean",
        _logs(trainer, "sampling/sampling_logp_difference/mean"),
    )
    assert len(diff_max) == 4
    assert max(diff_max) < 1e-4, diff_max
    assert max(_logs(trainer, "sampling/sampling_logp_difference/mean")) < 1e-5
    _release(trainer)


def test_colocate_moe_follows_trained_weights_and_keeps_aux_loss(vllm_moe_model_dir, tmp_path, vllm_float32):
    # A mixture-of-experts model: TRL pushes transformers' fused expert tensors (`mlp.experts.gate_up_proj`, one 3-D
    # tensor per layer) and vLLM must sample from them after every push; generation runs without router logits
    # (PACSTrainer._generate_single_turn) while the update keeps the load-balancing loss. Without the experts'
    # repack in the CPU push the gap is 0.02-0.09 nats per token from the first push on.
    trainer, seen = _train(vllm_moe_model_dir, tmp_path, steps_per_generation=2, max_steps=8)
    _check_run(trainer, seen, 4, True)
    diff_max = _logs(trainer, "sampling/sampling_logp_difference/max")
    print("MoE sampling log-prob gap per generation: max", diff_max)
    assert len(diff_max) == 4 and max(diff_max) < 1e-4, diff_max
    aux = _logs(trainer, "aux_loss")
    assert len(aux) == 8 and all(math.isfinite(v) and v > 0 for v in aux)
    assert trainer.model.config.output_router_logits
    _release(trainer)


@pytest.mark.parametrize("per_device", [1, 2])
def test_colocate_split_groups(vllm_model_dir, tmp_path, per_device):
    # a group of 4 spans 4 / per_device micro-batches; steps_per_generation = 4 x gradient_accumulation_steps
    ga = 4 // per_device
    trainer, seen = _train(
        vllm_model_dir,
        tmp_path,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=ga,
        steps_per_generation=4 * ga,
        max_steps=4,
    )
    assert trainer._pacs_split
    _check_run(trainer, seen, 1, True)
    # every optimizer step's micro-batches together hold one whole group
    assert len(seen) == 4 * ga
    _release(trainer)


def test_colocate_lora_pushes_merged_weights(vllm_model_dir, tmp_path, vllm_float32):
    # TRL merges the adapters into the base weights to push them, and unmerges them after: vLLM must then sample
    # from the merged model (float32: the same precision as the weight push check above)
    from peft import LoraConfig

    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    trainer, seen = _train(vllm_model_dir, tmp_path, peft_config=lora, steps_per_generation=2, learning_rate=5e-2)
    _check_run(trainer, seen, 4, True)
    lora_b = [p for n, p in trainer.model.named_parameters() if "lora_B" in n]
    assert lora_b and max(p.abs().max().item() for p in lora_b) > 1e-3, "the adapters must have moved"
    assert max(_logs(trainer, "sampling/sampling_logp_difference/max")) < 1e-4
    assert not any(getattr(m, "merged", False) for m in trainer.model.modules()), "adapters unmerged after the push"
    _release(trainer)


# Server mode --------------------------------------------------------------------------------------------------------
SERVER_SCRIPT = Path(__file__).parent / "scripts" / "train_server.py"


def test_server_mode_stubbed_weight_push_one_process(vllm_server, vllm_model_dir, tmp_path, monkeypatch):
    from tests.vllm_tier.scripts.train_server import train

    record = train(vllm_model_dir, str(tmp_path), vllm_server, 4, 1, 1, 2)  # one group per step, 2 steps
    assert record["layout"] is None and len(record["seen"]) == 2
    assert all(s["labels"] == s["recomputed"] for s in record["seen"]), "labels must follow their completions"
    logs = [e for e in record["log_history"] if "pacs/loss" in e]
    assert len(logs) == 2 and all(
        math.isfinite(e["pacs/loss"]) and math.isfinite(e["pacs/is_ratio_mean"]) for e in logs
    )


def test_server_mode_stubbed_weight_push_two_processes_exchange(vllm_server, vllm_model_dir, tmp_path, free_port):
    # 2 processes x 1 row x 2 accumulation steps = one group of 4 per optimizer step, 2 optimizer steps per
    # generation: each process received one whole group from the server, and the rows are exchanged so that each
    # step holds a whole group. 4 steps: 2 generations.
    out = tmp_path / "out"
    out.mkdir()
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--main_process_port", str(free_port)]
    cmd = [*launch, str(SERVER_SCRIPT), vllm_model_dir, str(out), vllm_server, "1", "2", "4", "4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in records] == [2, 2] and all(r["layout"] == "exchange" for r in records)
    for r in records:
        assert len(r["seen"]) == 8 and all(s["labels"] == s["recomputed"] for s in r["seen"])
    for step in range(4):  # micro-batches 2*step, 2*step+1 of both processes form one optimizer step
        rows = sorted(i for r in records for s in r["seen"][2 * step : 2 * step + 2] for i in s["index"])
        assert len(rows) == 4 and len({i // 4 for i in rows}) == 1, f"step {step} must hold one whole group: {rows}"
    logs = [e for e in records[0]["log_history"] if "pacs/loss" in e]
    assert len(logs) == 4 and all(math.isfinite(e["pacs/loss"]) for e in logs)
    assert len([e for e in records[0]["log_history"] if "pacs/is_ratio_mean" in e]) == 2
