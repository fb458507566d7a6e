"""Tests of `PACSTrainer` on mixture-of-experts models: a tiny offline Qwen3-MoE (and GPT-OSS) trains with PACS's
defaults (4 optimizer steps per generation) and keeps the load-balancing loss in the update.

Their config says `output_router_logits=True` (as a checkpoint saved by TRL's SFTTrainer with the auxiliary loss does),
which makes `generate` compute the load-balancing loss on every decoding step and crash on a padded batch of prompts
unless `PACSTrainer` turns it off for generation (see `PACSTrainer._generate_single_turn`).
"""

import json
import math
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from pacs import PACSTrainer
from pacs.testing import build_qwen3_moe, build_tiny_tokenizer
from tests.launching import ZERO3_CPU_ACCELERATE_CONFIG, accelerate_launch, run_launched
from tests.tiny_config import tiny_pacs_config


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def prompts_of_different_lengths(n=16):
    # different lengths: the generation batch is left-padded, so `generate` keeps its attention mask
    return Dataset.from_dict({"prompt": [f"What is {i} + {1000 * i}?" for i in range(n)]})


def build_gpt_oss(tokenizer):
    from transformers import GenerationConfig, GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=16,
        output_router_logits=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = GptOssForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    return model


@pytest.fixture(scope="module", params=["qwen3_moe", "gpt_oss"])
def moe_model_dir(request, tmp_path_factory) -> str:
    tokenizer = build_tiny_tokenizer()
    model = build_qwen3_moe(tokenizer) if request.param == "qwen3_moe" else build_gpt_oss(tokenizer)
    assert model.config.output_router_logits
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_moe_trains_with_pacs_defaults_and_logs_aux_loss(moe_model_dir, tmp_path):
    args = tiny_pacs_config(tmp_path, max_steps=4)  # one generation batch, PACS's 4 optimizer steps on it
    assert args.steps_per_generation == 4
    trainer = PACSTrainer(
        moe_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts_of_different_lengths()
    )
    assert trainer.aux_loss_enabled
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    trainer.train()

    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(steps) == 4
    assert all(math.isfinite(entry["aux_loss"]) and entry["aux_loss"] > 0 for entry in steps)
    assert all(math.isfinite(entry["loss"]) for entry in steps)
    routers = [n for n in before if "router" in n or ".gate.weight" in n]
    assert routers and any(not torch.equal(before[n], trainer.model.get_parameter(n)) for n in routers)
    assert trainer.model.config.output_router_logits  # turned off only while generating, then restored


@pytest.mark.distributed
def test_moe_trains_under_zero3_on_two_cpu_processes(tmp_path):
    # ZeRO-3 shards every parameter and gathers it for each forward, collectively: the two processes route their
    # tokens to different experts, which hangs or crashes MoE code that gathers only the experts it uses.
    tokenizer = build_tiny_tokenizer()
    model = build_qwen3_moe(tokenizer)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "out").mkdir()
    (tmp_path / "zero3_cpu.yaml").write_text(ZERO3_CPU_ACCELERATE_CONFIG)
    cmd = [*accelerate_launch(), "--config_file", str(tmp_path / "zero3_cpu.yaml"), "--num_processes", "2"]
    cmd += [str(Path(__file__).parent / "scripts" / "train_tiny.py")]
    cmd += [str(tmp_path / "model"), str(tmp_path / "out")]  # 2 steps per generation, prompts of different lengths
    run_launched(cmd, tmp_path)

    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("rank*.json"))]
    assert [(r["rank"], r["world_size"], r["zero_stage"]) for r in records] == [(0, 2, 3), (1, 2, 3)]
    assert all(r["finite_params"] and r["update_norm"] > 0 for r in records)
    assert records[0]["prompt_ids"][0] != records[1]["prompt_ids"][0]  # the ranks routed different tokens
    steps = [e for e in records[0]["log_history"] if "loss" in e]
    assert len(steps) == 3
    assert all(math.isfinite(e["aux_loss"]) and e["aux_loss"] > 0 and math.isfinite(e["pacs/loss"]) for e in steps)
