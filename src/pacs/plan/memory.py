"""What the run keeps in memory and on disk: the training memory per GPU (model states, a reference copy, one
micro-batch's transients), bf16 weights that cannot learn, and the checkpoints' size."""

from __future__ import annotations

from dataclasses import dataclass

from .._compat import TRL_LM_HEAD_TILE
from ..anchors import ANCHORS
from .launch import Launch
from .report import GB, GiB, Plan, gib
from .resolve import Run
from .shape import ModelShape


# Assumptions of the estimates (named so that a reader can redo the arithmetic).
CUDA_OVERHEAD_GIB = 2.5  # per process: CUDA context, NCCL buffers, allocator fragmentation
MEMORY_WARN_FRACTION = 0.9  # warn when an estimate passes this fraction of the GPU
TYPICAL_WEIGHT = 0.02  # magnitude of a typical weight of a pretrained transformer (init scale 0.02)
CHECKPOINTS_WARN_GB = 200.0  # warn when the checkpoints kept can pass this size on disk
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2, None: 4}


@dataclass(frozen=True)
class TrainerMemory:
    persistent: float  # weights, gradients and optimizer states that stay on the GPU through generation
    peak: float  # persistent + the largest micro-batch's transients, during training


def training_memory(plan: Plan, run: Run) -> TrainerMemory:
    """The section "Training memory per GPU", and the trainer's memory (the shape must be known)."""
    launch, B = run.launch, run.per_device_train_batch_size
    rows = plan.section("Training memory per GPU (estimate)")
    weights, grads, states, master = _model_states(run)
    reference = _reference_model_bytes(run)
    persistent = weights + grads + states + reference + CUDA_OVERHEAD_GIB * GiB
    activations, activations_other, lm_head, zero3_live = _transients(run)
    peak = persistent + activations + lm_head + zero3_live
    on, off = ("on", "off") if run.gradient_checkpointing else ("off", "on")
    rows += [
        ("weights", f"{gib(weights)}" + (" (sharded)" if launch.zero_stage == 3 else "")),
        ("gradients", f"{gib(grads)} ({run.trainable / 1e6:.0f}M trainable parameters)"),
        ("optimizer states", f"{gib(states)} ({master})"),
        *(
            [("reference model", f"{gib(reference)} (frozen copy: beta > 0 or {_copying_anchors()})")]
            if reference
            else []
        ),
        ("CUDA context, NCCL, slack", f"{CUDA_OVERHEAD_GIB:.1f} GiB (assumed)"),
        (
            "activations",
            f"{gib(activations)} for a micro-batch of {B} x {run.seq_tokens} tokens, gradient checkpointing "
            f"{on} ({gib(activations_other)} with it {off})",
        ),
        ("LM head (fused, tiled)", gib(lm_head)),
    ]
    if zero3_live:
        rows.append(("ZeRO-3 gathered layers", gib(zero3_live)))
    rows.append(("training peak", gib(peak) + (f" of {launch.gpu_memory_gib:g} GiB" if launch.gpu_memory_gib else "")))
    return TrainerMemory(persistent=persistent, peak=peak)


def _copying_anchors() -> str:
    """The anchors that hold a frozen copy of the model (`pacs.anchors`), as a recipe sets them."""
    return " or ".join(f"pacs_anchor {name}" for name, info in ANCHORS.items() if info.model_copy)


def _model_states(run: Run) -> tuple[float, float, float, str]:
    """Bytes per GPU of the weights, gradients and optimizer states, and how the optimizer keeps them."""
    launch, trainable = run.launch, run.trainable
    W, P, stage = launch.world_size, run.shape.num_params, launch.zero_stage
    if launch.deepspeed and (launch.mixed_precision == "bf16" or run.dtype == "bfloat16"):
        # DeepSpeed in bf16: 16-bit weights and gradients, fp32 master weights + Adam moments (12 bytes/parameter)
        weights = 2 * P / (W if stage == 3 else 1)
        grads = 2 * trainable / (W if stage >= 2 else 1)
        states = 12 * trainable / (W if stage >= 1 else 1)
        master = "fp32 master weights + Adam moments, 12 B/param"
    else:
        w_bytes = DTYPE_BYTES.get(run.dtype, 4)
        t_bytes = 4 if run.use_peft else w_bytes  # PEFT upcasts adapters to fp32 outside ZeRO-3
        shard = W if launch.deepspeed else 1
        weights = w_bytes * P / (shard if stage == 3 else 1)
        grads = t_bytes * trainable / (shard if (stage or 0) >= 2 else 1)
        states = 2 * t_bytes * trainable / (shard if (stage or 0) >= 1 else 1)
        master = f"AdamW moments in the parameters' dtype, {2 * t_bytes} B/param"
    if launch.offload_optimizer:
        states, master = 0.0, master + ", offloaded to CPU"
    if launch.offload_params and stage == 3:
        weights = 0.0
    return weights, grads, states, master


def _reference_model_bytes(run: Run) -> float:
    """A frozen copy of the model: TRL's KL reference (beta > 0) or PACS's pi_ref (pacs_anchor reference); with LoRA
    both are the base model without (or with a second, frozen) adapter, so no copy."""
    if not run.reference_copy:
        return 0.0
    launch, P = run.launch, run.shape.num_params
    if launch.deepspeed:  # prepare_deepspeed: bf16, sharded under ZeRO-3, replicated otherwise
        return 2 * P / (launch.world_size if launch.zero_stage == 3 else 1)
    return DTYPE_BYTES.get(run.dtype, 4) * P


def _transients(run: Run) -> tuple[float, float, float, float]:
    """Bytes of one micro-batch of B sequences of seq_tokens tokens: the activations (and what they would be with
    gradient checkpointing switched), the fused LM head's, and ZeRO-3's gathered layers."""
    shape: ModelShape = run.shape
    B = run.per_device_train_batch_size
    tokens = B * run.seq_tokens
    per_layer = shape.activation_bytes_per_token() * tokens
    # with gradient checkpointing: the layer inputs kept, plus the layer being recomputed in backward (its activations
    # and the gradients in flight through it, about half as much again)
    checkpointed = shape.num_layers * tokens * shape.hidden_size * 2 + 1.5 * per_layer
    stored = shape.num_layers * per_layer
    activations, activations_other = (checkpointed, stored) if run.gradient_checkpointing else (stored, checkpointed)
    # TRL's fused LM head: [4096 x 32768] tiles (`pacs._compat`), fp32 gradient of the hidden states, and of the head
    # when it trains
    lm_head = TRL_LM_HEAD_TILE[0] * TRL_LM_HEAD_TILE[1] * 2 + B * run.max_completion_length * shape.hidden_size * 4
    if not run.use_peft:
        lm_head += shape.embedding_params * (4 + 2)  # fp32 accumulation + its cast
    if run.launch.zero_stage == 3:
        lm_head += shape.embedding_params * 2  # the gathered head
        zero3_live = 2 * 2 * shape.layer_params  # gathered layers in flight (current + prefetched)
    else:
        zero3_live = 0
    return activations, activations_other, lm_head, zero3_live


def memory_limit(plan: Plan, need: float, gpu: float, what: str) -> None:
    if need > gpu:
        plan.error(
            "per_device_train_batch_size",
            f"{what} is estimated at {gib(need)}, more than the GPU's {gib(gpu)}: lower per_device_train_batch_size "
            "(raising gradient_accumulation_steps and steps_per_generation to keep the batch), keep "
            "gradient_checkpointing on, or shard more (ZeRO-3, more processes, optimizer offload).",
        )
    elif need > MEMORY_WARN_FRACTION * gpu:
        plan.warning(
            "per_device_train_batch_size",
            f"{what} is estimated at {gib(need)} of {gib(gpu)} ({need / gpu:.0%}): near the limit. On an "
            "out-of-memory error lower per_device_train_batch_size (and raise gradient_accumulation_steps and "
            "steps_per_generation to keep the batch).",
        )


def precision_check(plan: Plan, run: Run) -> None:
    """16-bit weights without fp32 master weights (no DeepSpeed, no LoRA) at a learning rate whose updates round away."""
    dtype = run.dtype
    if dtype not in ("bfloat16", "float16") or run.launch.deepspeed or run.use_peft:
        return
    lr = run.learning_rate
    # an AdamW update is about lr per element; a 16-bit weight of magnitude w only moves if the update passes half
    # its unit in the last place: 2^-9 w for bf16 (8 significant bits), 2^-12 w for fp16
    bits = 8 if dtype == "bfloat16" else 11
    smallest = TYPICAL_WEIGHT * 2.0 ** -(bits + 1)
    if lr < smallest:
        plan.error(
            "dtype",
            f"dtype {dtype} without DeepSpeed keeps no fp32 master weights: AdamW updates of about lr = {lr:g} are "
            f"below half a {dtype} unit of a weight of {TYPICAL_WEIGHT} ({smallest:.1e}), so they round away and "
            "nothing learns (no error). Use `dtype: float32` (TRL's default; `bf16: true` still computes in bf16), "
            "a DeepSpeed launch config (fp32 master weights), or LoRA.",
        )


def checkpoints_section(plan: Plan, run: Run) -> None:
    """The section "Checkpoints": one checkpoint's size, how many the run saves and keeps, the disk they take."""
    rows = plan.section("Checkpoints")
    if not run.saves:
        rows.append(("saves", "none (save_strategy no)"))
        return
    size = _checkpoint_bytes(run)
    saves = run.max_steps // run.save_steps if run.runs_steps and run.save_steps >= 1 else None
    kept = run.save_total_limit
    rows += [
        (
            "one checkpoint",
            f"{size / GB:.1f} GB ({'weights only' if run.save_only_model else 'weights + optimizer states'})",
        ),
        ("saves", f"every {run.save_steps} steps: {saves if saves is not None else '?'} in the run"),
        ("kept", f"{kept} (save_total_limit)" if kept else "all (no save_total_limit)"),
    ]
    count = min(kept, saves) if kept and saves else (kept or saves or 0)
    total = count * size
    rows.append(("on disk", f"{total / GB:.0f} GB at most"))
    if not kept and total > CHECKPOINTS_WARN_GB * GB:
        plan.warning(
            "save_total_limit",
            f"no save_total_limit: {saves} checkpoints of {size / GB:.0f} GB = {total / 1e12:.1f} TB. Use "
            "save_total_limit: 2 (PACSTrainer never deletes the newest complete checkpoint).",
        )


def _checkpoint_bytes(run: Run) -> float:
    """One checkpoint: the weights (and pi_ref's, once reset), and the optimizer states unless save_only_model."""
    launch: Launch = run.launch
    P, trainable = run.shape.num_params, run.trainable
    if launch.deepspeed:
        weights = (2 * trainable) if run.use_peft else 2 * P + 2 * P  # 16-bit model + DeepSpeed's model states
        states = 12 * trainable
    else:
        weights = (4 * trainable) if run.use_peft else DTYPE_BYTES.get(run.dtype, 4) * P
        states = 2 * (4 if run.use_peft else DTYPE_BYTES.get(run.dtype, 4)) * trainable
    if run.reference_resets:
        weights += 2 * P  # pi_ref's weights, once it has been reset
    return weights + (0 if run.save_only_model else states)
