"""The weights vLLM samples from: a LoRA push that leaves the base weights untouched, and a monitor that sees stale ones.

1. **LoRA push without drift.** TRL 1.16 pushes a PEFT model to vLLM by merging the adapters into the base weights, in
   place, reading the merged weights, and unmerging them (`VLLMGeneration._iter_named_params`). In bf16,
   W + ΔW - ΔW is not W: every push moves the frozen base weights by up to one rounding step, and the moves add up
   (TRL issue #6688; `benchmarks/lora_push_drift/lora_push_drift.py` measures them, docs/recipes.md#lora).
   `install_lora_push` replaces that one method, on the trainer's `vllm_generation` only, by `iter_merged_params`: the same parameters,
   under the same names, gathered the same way under ZeRO-3, but each LoRA layer's merged weight W + scaling * B @ A
   is computed out of place (`merged_tensor`, the value peft's own merge writes), one layer at a time; the base
   weights are only read. Adapters peft cannot express as W + ΔW (DoRA and other LoRA variants, quantized or
   non-LoRA tuner layers) and FSDP keep TRL's round trip, with a warning.
2. **Weight-sync monitor.** TRL compares vLLM's sampling log-probs with the trainer's only when it corrects for them
   (`vllm_importance_sampling_correction`); the recipes turn the correction off, as the authors do, and then a weight
   push that silently fails (TRL #5312) leaves vLLM sampling from stale weights with nothing logged.
   `SamplingGapMonitor` returns TRL's own metrics, `sampling/sampling_logp_difference/{mean,max}`, computed as TRL does,
   at every generation when TRL does not, and warns once when the mean gap exceeds `STALE_GAP`. When the correction is
   on, `importance_sampling_metrics` says how it weighs each batch (`pacs/is_masked_frac`, `pacs/is_ratio_mean`).

Both are installed by `HardenedGRPOTrainer` (`__init__` and `_generate_and_score_completions`). What they need from TRL is
checked at import (`_compat.check_trl`).
"""

from __future__ import annotations

import logging

import torch
from accelerate.utils import is_peft_model
from trl.generation.vllm_generation import VLLMGeneration

from ._compat import VLLM_PARAM_ITERATOR, replace_method
from .terms import loss_mask


__all__ = [
    "STALE_GAP", "SamplingGapMonitor", "add_read_timeout", "importance_sampling_metrics", "install_lora_push",
    "iter_merged_params", "merged_tensor", "sampling_gap",
]  # fmt: skip

logger = logging.getLogger(__name__)

# Mean gap per token (nats) between vLLM's sampling log-probs and the trainer's beyond which bf16 rounding cannot
# explain it. bf16 keeps 8 significant bits. Measured on SmolLM2-135M-Instruct (the demo's model), 1,024 tokens sampled
# at temperature 1: bf16 against float32 log-probs differ by 0.016-0.018 per token on average (median 0.007, max
# 0.26-0.36), bf16 weights against bf16 autocast (two bf16 computations, as vLLM and the trainer) by 0.022 (max 0.44);
# under 0.02 in the vLLM tier (vLLM in bf16, the trainer in float32); about 2e-7 with both in float32. Mixture-of-experts
# models sit higher, where rounding flips a routing decision. 0.1 is 4-5x the measured bf16 floor, and below what stale
# weights give once training has moved them (0.26-1.6 in the vLLM tier with the push stopped). The max over tokens is
# logged but not judged: one rare token differs by tenths of a nat from rounding alone.
STALE_GAP = 0.1


# 1. the LoRA push ------------------------------------------------------------------------------------------------------
def _lora_layers():
    from peft.tuners.lora import layer

    return layer.Linear, layer.Embedding


def _exact(module) -> bool:
    """`merged_tensor` gives this tuner layer's merged weights: a plain LoRA Linear or Embedding, no variant (DoRA...)."""
    return type(module) in _lora_layers() and not getattr(module, "lora_variant", None)


@torch.no_grad()
def merged_tensor(layer, which: str = "weight") -> torch.Tensor:
    """The `weight` (or `bias`) of a LoRA layer's base layer with its active, unmerged adapters added, out of place.

    Bit for bit the value `peft`'s `merge` (as `PeftModel.merge_adapter`, TRL's push, calls it) writes into the base
    layer: per adapter, `W += scaling * B @ A` in the promoted dtype, rounded once to W's dtype (Embedding: ΔW rounded
    to W's dtype first, as peft does); for `lora_bias`, `b += scaling * lora_B.bias`. Nothing is written.

    Args:
        layer (`peft.tuners.lora.Linear` or `peft.tuners.lora.Embedding`):
            The LoRA layer (a plain one: see `_exact`).
        which (`str`, *optional*, defaults to `"weight"`):
            `"weight"` or `"bias"`.
    """
    base = layer.get_base_layer()
    tensor = getattr(base, which).data
    dtype = tensor.dtype
    embedding = isinstance(layer, _lora_layers()[1])
    for adapter in layer.active_adapters:
        if adapter in layer.merged_adapters or adapter not in (layer.lora_embedding_A if embedding else layer.lora_A):
            continue
        if which == "weight":
            delta = layer.get_delta_weight(adapter)  # (out, in): scaling * B @ A, transposed for fan_in_fan_out
            tensor = (tensor + (delta.to(dtype) if embedding else delta)).to(dtype)
        elif layer.lora_bias.get(adapter, False):
            tensor = (tensor + layer.lora_B[adapter].bias * layer.scaling[adapter]).to(dtype)
    return tensor


def iter_merged_params(self: VLLMGeneration):
    """`VLLMGeneration._iter_named_params` for a PEFT model without the in-place merge: each parameter under the name
    vLLM expects, a LoRA layer's base weight (and bias) replaced by `merged_tensor`, computed when its turn comes.

    Same gathering as TRL's (the whole model under ZeRO-3: peft cannot merge a sharded layer), same names, same order,
    same parameters skipped (the adapters themselves, `modules_to_save`' originals). Falls back to TRL's own method,
    warning once, where this cannot be exact (see `install_lora_push`).
    """
    model = self.model
    inexact = sorted({type(m).__name__ for m in model.modules() if _is_tuner_layer(m) and not _exact(m)})
    if self._dist.is_fsdp or inexact:
        _warn_round_trip(self, "FSDP" if self._dist.is_fsdp else f"tuner layers {', '.join(inexact)}")
        yield from VLLMGeneration._iter_named_params(self)
        return
    with self._dist.gather_params(list(model.parameters())):
        merged = {}  # id(base parameter) -> (LoRA layer, "weight" | "bias")
        for module in model.modules():
            if _is_tuner_layer(module):
                base = module.get_base_layer()
                merged[id(base.weight)] = (module, "weight")
                if getattr(base, "bias", None) is not None:
                    merged[id(base.bias)] = (module, "bias")
        for name, param in model.named_parameters():
            # TRL's naming, unchanged (`VLLMGeneration._iter_named_params`, DeepSpeed/plain branch)
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            if model.prefix in name or "original_module" in name:
                continue
            name = self._fix_param_name_to_vllm(name, extra_prefixes=["modules_to_save.default."])
            layer = merged.get(id(param))
            yield name, param.data if layer is None else merged_tensor(*layer)


def _is_tuner_layer(module) -> bool:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return isinstance(module, BaseTunerLayer)


def _warn_round_trip(generation, why: str) -> None:
    if not getattr(generation, "_pacs_round_trip_warned", False):
        generation._pacs_round_trip_warned = True
        logger.warning(
            "LoRA weight push to vLLM (%s): the adapters cannot be merged out of place, so TRL merges them into the "
            "base weights and unmerges them at every push, which in bf16 moves the frozen base weights a little each "
            "time (TRL issue #6688, docs/recipes.md#lora). Plain LoRA on Linear/Embedding layers, under DDP or "
            "DeepSpeed, avoids it.",
            why,
        )


def install_lora_push(trainer) -> None:
    """Push a PEFT model to vLLM with `iter_merged_params` instead of TRL's in-place merge; no-op without vLLM or PEFT.

    Replaces `_iter_named_params` on the trainer's `vllm_generation` instance only (`_compat.replace_method`):
    `sync_weights` (colocate and server mode) reads the parameters through it, and nothing else changes.
    """
    generation = getattr(trainer, "vllm_generation", None) if getattr(trainer, "use_vllm", False) else None
    if generation is not None and is_peft_model(generation.model):
        replace_method(generation, VLLM_PARAM_ITERATOR, iter_merged_params)


# 2. the weight-sync monitor --------------------------------------------------------------------------------------------
def sampling_gap(
    trainer_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and max of |trainer - vLLM| log-prob per completion token, as TRL computes
    `sampling/sampling_logp_difference` (one process's part; tokens vLLM could not score, NaN, left out).

    Args:
        trainer_logps (`torch.Tensor` of shape `(B, T)`): the trainer's log-probs of the sampled tokens.
        sampling_logps (`torch.Tensor` of shape `(B, T)`): vLLM's, at sampling time.
        mask (`torch.Tensor` of shape `(B, T)`): the tokens that count (completion mask x tool mask).

    >>> sampling_gap(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, float("nan")]]), torch.ones(1, 2))
    (tensor(0.5000), tensor(0.5000))
    """
    delta = torch.abs(trainer_logps - sampling_logps)
    delta = delta[mask.bool() & ~torch.isnan(delta)]
    if delta.numel() == 0:
        zero = torch.tensor(0.0, device=trainer_logps.device)
        return zero, zero.clone()
    return delta.mean(), delta.max()


class SamplingGapMonitor:
    """The weight-sync monitor of one trainer: called on every generation batch, it returns TRL's metrics
    `sampling/sampling_logp_difference/{mean,max}` for it where TRL did not log them, and warns once (all processes
    call it: it gathers) when the mean gap exceeds `STALE_GAP`.

    `output` is what `GRPOTrainer._generate_and_score_completions` returned: vLLM's log-probs
    (`sampling_per_token_logps`) and, whenever TRL needed them, the trainer's (`old_per_token_logps`: with the
    importance-sampling correction on, or when generation and optimizer steps are not aligned, PACS's default). When
    TRL computed neither, the trainer's log-probs are computed here, without gradient, and not added to `output`.
    """

    def __init__(self):
        self.warned = False

    def __call__(self, trainer, output: dict, mode: str) -> dict[str, float]:
        sampling = output.get("sampling_per_token_logps")
        if not getattr(trainer, "use_vllm", False) or sampling is None:
            return {}
        logps = output.get("old_per_token_logps")
        if logps is None:
            logps = _trainer_logps(trainer, output, mode)
        mean, max_ = sampling_gap(logps, sampling, loss_mask(output))
        gather = trainer.accelerator.gather
        mean, max_ = gather(mean).mean().item(), gather(max_).max().item()  # TRL's reduction over processes
        if mean > STALE_GAP and not self.warned:
            self.warned = True
            if trainer.accelerator.is_main_process:
                logger.warning(_STALE_MESSAGE, trainer.state.global_step, mean, max_, STALE_GAP)
        if trainer.vllm_importance_sampling_correction:  # TRL has logged the same two numbers
            return {}
        return {"sampling/sampling_logp_difference/mean": mean, "sampling/sampling_logp_difference/max": max_}


_STALE_MESSAGE = """
================================================================================================================
STALE vLLM WEIGHTS? At step %d, vLLM's sampling log-probs differ from the trainer's log-probs of the same tokens by
%.3g nats per token on average (max %.3g): more than bf16 rounding explains (threshold %.2g; at the bf16 floor the
gap is 1e-3 to 2e-2). vLLM is most likely sampling from stale weights: the weight push to vLLM failed or did not run
(TRL #5312), and training is off-policy without knowing it. Check that vLLM serves the same model as the trainer, that
the push runs at every generation (server mode: the NCCL weight-update group on vllm_group_port), and follow
sampling/sampling_logp_difference/mean: if it keeps growing with the steps, vLLM is not receiving the weights.
================================================================================================================"""


def _trainer_logps(trainer, output: dict, mode: str) -> torch.Tensor:
    """The trainer's log-probs `(B, T)` of the completion tokens, computed as TRL computes `old_per_token_logps`."""
    args = trainer.args
    batch_size = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
    return trainer._logps_without_grad(trainer.model, output, batch_size)


def importance_sampling_metrics(output: dict, gather) -> dict[str, float]:
    """How vLLM's importance-sampling correction (`vllm_importance_sampling_correction`) weighs one generation batch,
    over every process (each calls it: it gathers): `pacs/is_masked_frac`, the share of completions its mask modes
    drop (ratio 0), and `pacs/is_ratio_mean`, the mean ratio of the others; `{}` when TRL applied no correction.

    Args:
        output (`dict`): The batch (this process's rows), with TRL's `importance_sampling_ratio` `(B,)` or `(B, T)`.
        gather (`Callable`): `accelerator.gather`.

    >>> importance_sampling_metrics({"importance_sampling_ratio": torch.tensor([0.0, 0.5, 1.5, 0.0]),
    ...                              "prompt_ids": torch.zeros(4, 3)}, gather=lambda t: t)
    {'pacs/is_masked_frac': 0.5, 'pacs/is_ratio_mean': 1.0}
    """
    is_ratio = output.get("importance_sampling_ratio")
    if is_ratio is None:
        return {}
    ratio = gather(is_ratio.reshape(output["prompt_ids"].size(0), -1)[:, 0])  # (B_world,): one ratio per completion
    kept = ratio > 0
    return {
        "pacs/is_masked_frac": (~kept).float().mean().item(),
        "pacs/is_ratio_mean": ratio[kept].mean().item() if kept.any() else 0.0,
    }


def add_read_timeout(client, seconds: float | None) -> None:
    """Every HTTP request of TRL's `VLLMClient` `client` gives up after `seconds` without a reply, with an error that
    names the server; `None` leaves TRL's behaviour (no read timeout: a hung server hangs the trainer for good).

    `HardenedGRPOTrainer` applies `vllm_server_read_timeout` to the client of `vllm_mode="server"` (on the main
    process, which holds it). The other processes then wait in their next collective, up to `ddp_timeout`.
    """
    if seconds is None or client is None:
        return
    import requests

    request = client.session.request

    def request_with_timeout(method, url, *args, **kwargs):
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = seconds
        try:
            return request(method, url, *args, **kwargs)
        except requests.exceptions.Timeout as error:
            raise TimeoutError(
                f"The vLLM server at {client.base_url} sent no reply to {method} {url} within {seconds:g} s "
                "(vllm_server_read_timeout): it hangs or died. Restart it and relaunch with --resume_from_checkpoint "
                "auto; if a generation batch really takes longer, raise vllm_server_read_timeout."
            ) from error

    client.session.request = request_with_timeout
