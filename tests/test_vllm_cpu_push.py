"""The vLLM tier's CPU-only weight push (tests/vllm_tier/_push.py), on stand-ins for vLLM's objects (the real engine:
tests/vllm_tier/)."""

from types import SimpleNamespace

import torch
from trl.generation.vllm_generation import VLLMGeneration

from tests.vllm_tier._push import push_weights_to_vllm_cpu, vllm_cpu_weight_push


class _Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(3, 2))
        self.repacked = 0
        self.quant_method = SimpleNamespace(process_weights_after_loading=self._repack)

    def _repack(self, layer):
        assert layer is self
        self.repacked += 1


class _Experts(torch.nn.Module):
    """Stands in for vLLM's fused experts: `quant_method.moe_kernel.fused_experts` prepacks for the CPU kernel."""

    def __init__(self):
        super().__init__()
        self.prepacked = 0
        fused_experts = SimpleNamespace(process_weights_after_loading=self._prepack)
        self.quant_method = SimpleNamespace(moe_kernel=SimpleNamespace(fused_experts=fused_experts))

    def _prepack(self, layer):
        assert layer is self
        self.prepacked += 1


def _generation(tied: bool = True, num_moe_layers: int = 0):
    model = torch.nn.Module()
    model.lm_head, model.model = _Head(), torch.nn.Module()
    model.model.embed_tokens = torch.nn.Embedding(3, 2)
    model.model.layers = torch.nn.ModuleList([_Experts() for _ in range(num_moe_layers)])
    model.config = SimpleNamespace(tie_word_embeddings=tied)
    calls = []
    runner = SimpleNamespace(reload_weights=lambda weights_iterator: calls.append(list(weights_iterator)))
    runner.get_model = lambda: model
    llm = SimpleNamespace(
        llm_engine=SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner))),
        reset_prefix_cache=lambda: calls.append("reset"),
    )
    weights = [("model.embed_tokens.weight", torch.ones(3, 2))]
    generation = SimpleNamespace(
        llm=llm, mode="colocate", enable_sleep_mode=False, _iter_named_params=lambda: iter(weights)
    )
    return generation, model, calls, weights


def test_push_reloads_reties_and_repacks_the_output_layer():
    generation, model, calls, weights = _generation()
    push_weights_to_vllm_cpu(generation)
    assert calls == [weights, "reset"]  # every weight through vLLM's reload, then the prefix cache dropped
    assert model.lm_head.weight is model.model.embed_tokens.weight and model.lm_head.repacked == 1


def test_push_prepacks_every_mixture_of_experts_layer_again():
    generation, model, calls, weights = _generation(num_moe_layers=2)
    push_weights_to_vllm_cpu(generation)
    assert calls == [weights, "reset"]
    assert [layer.prepacked for layer in model.model.layers] == [1, 1]
    assert model.lm_head.repacked == 1


def test_push_leaves_an_untied_output_layer_alone():
    generation, model, calls, _ = _generation(tied=False)
    push_weights_to_vllm_cpu(generation)
    assert model.lm_head.weight is not model.model.embed_tokens.weight and model.lm_head.repacked == 0


def test_context_replaces_only_the_colocate_push_and_restores_it():
    original = VLLMGeneration.sync_weights
    generation, model, calls, _ = _generation()
    with vllm_cpu_weight_push():
        assert VLLMGeneration.sync_weights is not original
        VLLMGeneration.sync_weights(generation)
        assert model.lm_head.repacked == 1
    assert VLLMGeneration.sync_weights is original
