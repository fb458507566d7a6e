"""`pacs.grpo.vllm_sync` without vLLM: the out-of-place LoRA merge against peft's own merge (through TRL's push), and the
weight-sync monitor on hand-made tensors. With the real engine: tests/vllm_tier/test_vllm_sync.py."""

import contextlib
import json
import logging
import types
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model
from trl.generation.vllm_generation import VLLMGeneration

from pacs.grpo import HardenedGRPOTrainer
from pacs.grpo.vllm_sync import STALE_GAP, SamplingGapMonitor, install_lora_push, iter_merged_params, sampling_gap
from pacs.testing import build_qwen3, build_tiny_tokenizer
from tests.launching import ZERO3_CPU_ACCELERATE_CONFIG, accelerate_launch, run_launched


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def _trained_adapter(model, seed: int = 1) -> None:
    """Give every lora_B (zero at init) and LoRA bias a trained-looking value: ΔW about as large as W."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            param.data.copy_(torch.randn(param.shape, generator=gen) * 0.05)


def _qwen_lora(tokenizer, dtype, autocast_adapter_dtype=True, **lora):
    model = build_qwen3(tokenizer, seed=0).to(dtype)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], **lora)
    torch.manual_seed(0)
    model = get_peft_model(model, config, autocast_adapter_dtype=autocast_adapter_dtype)
    _trained_adapter(model)
    return model


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(40, 16)
        self.proj = torch.nn.Linear(16, 24)
        self.head = torch.nn.Linear(24, 8)


def _net_lora(dtype, **lora):
    torch.manual_seed(0)
    model = get_peft_model(_Net().to(dtype), LoraConfig(r=4, lora_alpha=8, **lora))
    _trained_adapter(model)
    return model


def _generation(model):
    """A `VLLMGeneration` with only what `_iter_named_params` reads (no vLLM, one process, no ZeRO-3)."""
    generation = VLLMGeneration.__new__(VLLMGeneration)
    generation.model = model
    generation._dist = SimpleNamespace(is_fsdp=False, gather_params=lambda params: contextlib.nullcontext())
    return generation


def _trl_push(model) -> list[tuple[str, torch.Tensor]]:
    """What TRL's push hands vLLM (merge in place, read, unmerge), copied while it is read."""
    return [(name, tensor.clone()) for name, tensor in VLLMGeneration._iter_named_params(_generation(model))]


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def _assert_unchanged(model, snapshot) -> None:
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, snapshot[name]), name


@pytest.mark.parametrize(
    "dtype, autocast_adapter_dtype",
    [(torch.bfloat16, True), (torch.bfloat16, False), (torch.float32, True)],
    ids=["bf16-base-fp32-adapters", "bf16", "fp32"],
)
def test_out_of_place_push_equals_peft_merge_and_leaves_base_untouched(tokenizer, dtype, autocast_adapter_dtype):
    ours, theirs = (_qwen_lora(tokenizer, dtype, autocast_adapter_dtype) for _ in range(2))
    before = _snapshot(ours)
    pushed = [(name, tensor.clone()) for name, tensor in iter_merged_params(_generation(ours))]
    expected = _trl_push(theirs)
    assert [name for name, _ in pushed] == [name for name, _ in expected]  # same names, same order
    assert "model.layers.0.self_attn.q_proj.weight" in dict(pushed) and not any("lora" in n for n, _ in pushed)
    assert not any(tensor.requires_grad for _, tensor in pushed), "no graph kept per push (the adapters need grad)"
    for (name, tensor), (_, reference) in zip(pushed, expected, strict=True):
        assert tensor.dtype == reference.dtype and torch.equal(tensor, reference), name  # bit for bit
    q_proj = ours.base_model.model.model.layers[0].self_attn.q_proj
    assert not torch.equal(dict(pushed)["model.layers.0.self_attn.q_proj.weight"], q_proj.base_layer.weight)
    for _ in range(20):
        for _ in iter_merged_params(_generation(ours)):
            pass
    _assert_unchanged(ours, before)
    assert not any(getattr(m, "merged", False) for m in ours.modules())


def test_trl_round_trip_moves_bf16_base_weights(tokenizer):
    # the defect the out-of-place push removes: TRL's merge / unmerge in place, in bf16 (TRL #6688)
    model = _qwen_lora(tokenizer, torch.bfloat16, autocast_adapter_dtype=False)
    before = _snapshot(model)
    for _ in range(20):
        _trl_push(model)
    name = "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"
    assert not torch.equal(model.state_dict()[name], before[name])


@pytest.mark.parametrize(
    "lora", [dict(target_modules=["emb", "proj"]), dict(target_modules=["proj", "head"], lora_bias=True)]
)
def test_embedding_and_lora_bias_equal_peft_merge(lora):
    ours, theirs = _net_lora(torch.bfloat16, **lora), _net_lora(torch.bfloat16, **lora)
    for name, param in ours.named_parameters():
        if "lora_B" in name and name.endswith("bias"):
            assert param.abs().sum() > 0, name
    before = _snapshot(ours)
    pushed = [(name, tensor.clone()) for name, tensor in iter_merged_params(_generation(ours))]
    expected = _trl_push(theirs)
    assert [n for n, _ in pushed] == [n for n, _ in expected]
    for (name, tensor), (_, reference) in zip(pushed, expected, strict=True):
        assert torch.equal(tensor, reference), name
    _assert_unchanged(ours, before)


def test_dora_keeps_trl_round_trip_and_warns_once(caplog):
    model = _net_lora(torch.float32, target_modules=["proj"], use_dora=True)
    generation = _generation(model)
    with caplog.at_level(logging.WARNING, logger="pacs.grpo.vllm_sync"):
        for _ in range(2):
            pushed = dict(iter_merged_params(generation))
    assert "proj.weight" in pushed
    warnings = [r for r in caplog.records if "cannot be merged out of place" in r.getMessage()]
    assert len(warnings) == 1 and "Linear" in warnings[0].getMessage()
    assert not any(getattr(m, "merged", False) for m in model.modules()), "TRL's round trip unmerges"


def test_install_replaces_the_push_on_peft_models_only(tokenizer):
    peft_gen = _generation(_net_lora(torch.float32, target_modules=["proj"]))
    install_lora_push(SimpleNamespace(use_vllm=True, vllm_generation=peft_gen))
    assert peft_gen._iter_named_params.__func__ is iter_merged_params
    plain_gen = _generation(_Net())
    install_lora_push(SimpleNamespace(use_vllm=True, vllm_generation=plain_gen))
    assert "_iter_named_params" not in vars(plain_gen)
    install_lora_push(SimpleNamespace(use_vllm=False))  # no vLLM: nothing to do


ZERO3_SCRIPT = """
import json, sys
import deepspeed, torch
from datasets import Dataset
from peft import LoraConfig
from trl.distributed import DistributedBackend
from trl.generation.vllm_generation import VLLMGeneration
from pacs import PACSTrainer
from tests.tiny_config import tiny_pacs_config
from pacs.grpo.vllm_sync import iter_merged_params

def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]

model_dir, out = sys.argv[1:3]
lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
dataset = Dataset.from_dict({"prompt": [f"What is {i}?" for i in range(16)]})
args = tiny_pacs_config(out, max_steps=2, learning_rate=5e-2)
trainer = PACSTrainer(model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset, peft_config=lora)
trainer.train()  # the adapters move; DeepSpeed has partitioned every parameter
model, params = trainer.model, list(trainer.model.parameters())
generation = VLLMGeneration.__new__(VLLMGeneration)
generation.model, generation._dist = model, DistributedBackend(trainer.accelerator)

def gathered():
    with deepspeed.zero.GatheredParameters(params):
        return {name: p.detach().clone() for name, p in model.named_parameters()}

before = gathered()
ours = [(name, t.clone()) for name, t in iter_merged_params(generation)]
after = gathered()
theirs = [(name, t.clone()) for name, t in VLLMGeneration._iter_named_params(generation)]
record = {
    "zero3": generation._dist.is_zero3,
    "partitioned": any(p.numel() == 0 for p in params) and all(hasattr(p, "ds_id") for p in params),
    "lora_b_moved": max(p.abs().max().item() for n, p in before.items() if "lora_B" in n) > 1e-3,
    "names_equal": [n for n, _ in ours] == [n for n, _ in theirs],
    "values_equal": all(torch.equal(a, b) for (_, a), (_, b) in zip(ours, theirs)),
    "merged_differs": not torch.equal(dict(ours)["model.layers.0.self_attn.q_proj.weight"],
        before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"]),
    "base_untouched": all(torch.equal(before[n], after[n]) for n in before),
    "pushed": len(ours),
}
json.dump(record, open(f"{out}/rank0.json", "w"))
"""


@pytest.mark.distributed
def test_out_of_place_push_under_deepspeed_zero3(tiny_model_dir, tmp_path):
    # ZeRO-3 shards every parameter: the push gathers the whole model, as TRL's does, and merges out of place
    (tmp_path / "out").mkdir()
    (tmp_path / "zero3_cpu.yaml").write_text(ZERO3_CPU_ACCELERATE_CONFIG)
    (tmp_path / "push.py").write_text(ZERO3_SCRIPT)
    cmd = [*accelerate_launch(), "--config_file", str(tmp_path / "zero3_cpu.yaml")]
    cmd += [str(tmp_path / "push.py"), tiny_model_dir, str(tmp_path / "out")]
    run_launched(cmd, tmp_path)
    record = json.loads((tmp_path / "out" / "rank0.json").read_text())
    assert record["zero3"] and record["partitioned"] and record["lora_b_moved"], record
    assert record["pushed"] > 0 and record["names_equal"] and record["values_equal"], record
    assert record["merged_differs"] and record["base_untouched"], record


def test_drift_benchmark_smoke(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / "lora_push_drift" / "lora_push_drift.py"
    spec = importlib.util.spec_from_file_location("lora_push_drift", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    runs = bench.main(["--smoke"])["runs"]  # checks itself against peft's merge / unmerge and merged_tensor
    assert len(runs) == 4 and all([row["pushes"] for row in run["rows"]] == [1, 10] for run in runs)
    assert all(run["rows"][-1]["max_abs"] > 0 for run in runs), "TRL's round trip moves bf16 base weights"
    assert "pacs.grpo.vllm_sync" in capsys.readouterr().out


# the weight-sync monitor -------------------------------------------------------------------------------------------
def test_sampling_gap_masks_and_skips_nan():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    vllm = torch.tensor([[-1.2, float("nan"), -3.0], [-0.5, -1.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    mean, max_ = sampling_gap(trainer, vllm, mask)  # counted: 0.2, 0, 0, 1.0 (NaN and masked token left out)
    assert mean.item() == pytest.approx(0.3) and max_.item() == pytest.approx(1.0)
    mean, max_ = sampling_gap(trainer, vllm, torch.zeros_like(mask))
    assert mean.item() == 0.0 and max_.item() == 0.0


def _monitored_trainer(correction: bool, trainer_logps=None):
    calls = []

    def get_logps(model, input_ids, attention_mask, logits_to_keep, batch_size=None, **kwargs):
        calls.append((input_ids.shape, logits_to_keep, batch_size))
        return trainer_logps, None, None

    trainer = SimpleNamespace(
        use_vllm=True,
        vllm_importance_sampling_correction=correction,
        model=SimpleNamespace(training=True, is_gradient_checkpointing=False),
        accelerator=SimpleNamespace(gather=lambda t: t.reshape(1), is_main_process=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        state=SimpleNamespace(global_step=7),
        args=SimpleNamespace(
            per_device_train_batch_size=2, per_device_eval_batch_size=2, gradient_checkpointing_kwargs=None
        ),
        _get_per_token_logps_and_entropies=get_logps,
    )
    trainer._per_token_logps = types.MethodType(HardenedGRPOTrainer._per_token_logps, trainer)  # the trainer's batch
    trainer._logps_without_grad = types.MethodType(HardenedGRPOTrainer._logps_without_grad, trainer)
    trainer._sampling_monitor = SamplingGapMonitor()
    trainer._record = types.MethodType(HardenedGRPOTrainer._record, trainer)
    return trainer, calls


def log_sampling_gap(trainer, output):
    """What `HardenedGRPOTrainer._generate_and_score_completions` does with the monitor: log what it returns."""
    mode = "train" if trainer.model.training else "eval"
    trainer._record(mode, trainer._sampling_monitor(trainer, output, mode))


def _output(gap: float, with_trainer_logps: bool = True) -> dict:
    sampling = torch.full((2, 3), -1.0)
    output = {
        "prompt_ids": torch.ones(2, 4, dtype=torch.long),
        "prompt_mask": torch.ones(2, 4, dtype=torch.long),
        "completion_ids": torch.ones(2, 3, dtype=torch.long),
        "completion_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
        "sampling_per_token_logps": sampling,
    }
    if with_trainer_logps:
        output["old_per_token_logps"] = sampling - gap
    return output


def _stale_warnings(caplog):
    return [r for r in caplog.records if "STALE vLLM WEIGHTS" in r.getMessage()]


def test_monitor_logs_trl_metrics_without_correction_and_stays_quiet_at_bf16_floor(caplog):
    trainer, _ = _monitored_trainer(correction=False)
    with caplog.at_level(logging.WARNING, logger="pacs.grpo.vllm_sync"):
        for _ in range(3):
            log_sampling_gap(trainer, _output(0.01))
    metrics = trainer._metrics["train"]
    assert metrics["sampling/sampling_logp_difference/mean"] == pytest.approx([0.01] * 3)
    assert metrics["sampling/sampling_logp_difference/max"] == pytest.approx([0.01] * 3)
    assert not _stale_warnings(caplog)


def test_monitor_warns_once_on_stale_weights(caplog):
    trainer, _ = _monitored_trainer(correction=False)
    with caplog.at_level(logging.WARNING, logger="pacs.grpo.vllm_sync"):
        log_sampling_gap(trainer, _output(STALE_GAP / 2))
        assert not _stale_warnings(caplog)
        for _ in range(3):
            log_sampling_gap(trainer, _output(0.8))
    warnings = _stale_warnings(caplog)
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "vLLM" in message and "stale weights" in message and "0.8" in message and "step 7" in message
    assert trainer._metrics["train"]["sampling/sampling_logp_difference/mean"][-1] == pytest.approx(0.8)


def test_monitor_leaves_metrics_to_trl_when_correcting_but_still_warns(caplog):
    trainer, _ = _monitored_trainer(correction=True)
    with caplog.at_level(logging.WARNING, logger="pacs.grpo.vllm_sync"):
        log_sampling_gap(trainer, _output(0.8))
    assert "sampling/sampling_logp_difference/mean" not in trainer._metrics["train"]  # TRL logged them already
    assert len(_stale_warnings(caplog)) == 1


def test_monitor_computes_trainer_logps_when_trl_did_not():
    # generation and optimizer steps aligned, correction off: TRL computed no old_per_token_logps
    trainer, calls = _monitored_trainer(correction=False, trainer_logps=torch.full((2, 3), -1.25))
    output = _output(0.0, with_trainer_logps=False)
    log_sampling_gap(trainer, output)
    assert calls == [(torch.Size([2, 7]), 3, 2)]  # prompt + completion, the completion's log-probs, micro-batches
    assert trainer._metrics["train"]["sampling/sampling_logp_difference/mean"] == pytest.approx([0.25])
    assert "old_per_token_logps" not in output, "PACS's anchor must stay on-policy"


def test_monitor_is_silent_without_vllm_logprobs():
    trainer, _ = _monitored_trainer(correction=False)
    output = _output(0.8)
    del output["sampling_per_token_logps"]
    log_sampling_gap(trainer, output)
    trainer.use_vllm = False
    log_sampling_gap(trainer, _output(0.8))
    assert not trainer._metrics["train"]


def test_a_hung_vllm_server_stops_the_client_with_its_address():
    # a stand-in server that accepts the request and never answers (a SIGSTOPped `trl vllm-serve`); TRL's own
    # VLLMClient._post, whose session has no read timeout, on a client built without vLLM
    import socket
    import threading
    import time

    import requests
    from trl.generation.vllm_client import VLLMClient

    from pacs.grpo.vllm_sync import add_read_timeout

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    client = object.__new__(VLLMClient)
    client.session, client.base_url = requests.Session(), f"http://127.0.0.1:{server.getsockname()[1]}"
    add_read_timeout(client, 1.0)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"vLLM server at {client.base_url} sent no reply .* within 1 s"):
        client._post(f"{client.base_url}/v1/completions", json={"prompt": "1+1="})
    assert time.monotonic() - started < 10 and accepted  # it reached the server, which never replied
    server.close()
