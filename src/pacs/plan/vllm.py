"""What TRL asks of vLLM, and whether vLLM can give it: a colocated engine's settings, the KV cache it has left
beside the trainer, and the GPU memory while generating and while training; or a `trl vllm-serve` server's."""

from __future__ import annotations

import math

from .._compat import TRL_MAX_NUM_BATCHED_TOKENS
from .memory import CUDA_OVERHEAD_GIB, TrainerMemory, memory_limit
from .report import GiB, Plan, gib
from .resolve import Run
from .shape import ModelShape


# Assumptions of the estimates (named so that a reader can redo the arithmetic).
VLLM_FIXED_OVERHEAD_GIB = 1.0  # per engine: CUDA graphs, workspace (besides weights, profile peak and KV cache)
VLLM_SLEEPING_GIB = 0.5  # what a sleeping engine (level 2) keeps
MIN_CONCURRENT_SEQUENCES = 8  # a vLLM share is suggested so that at least this many full-length sequences fit


def vllm_section(plan: Plan, run: Run, trainer: TrainerMemory | None) -> dict:
    """The section "vLLM (mode)" and its checks; returns the colocated engine's figures (max_num_seqs, concurrent
    sequences, KV cache tokens) where they are known, else {}."""
    rows = plan.section(f"vLLM ({run.vllm_mode})")
    if run.vllm_mode == "server":
        _server(plan, rows, run)
        return {}
    max_num_seqs = run.per_device_train_batch_size * run.tensor_parallel_size * run.steps_per_generation
    rows += _colocate_rows(run, max_num_seqs)
    _colocate_checks(plan, run, max_num_seqs)
    if run.shape is None or not run.launch.gpu_memory_gib:
        rows.append(("KV cache", "unknown (needs the model's shape and --gpu_memory_gb)"))
        return {}
    return _kv_cache(plan, rows, run, trainer, max_num_seqs)


def _server(plan: Plan, rows: list, run: Run) -> None:
    """vllm_mode server: the `trl vllm-serve` command's parallelism, context length and memory share."""
    rows.append(("engine", "trl vllm-serve on GPUs of its own; the training processes send prompts and weights"))
    serve, shape, launch = run.vllm_serve, run.shape, run.launch
    if serve is None:
        rows.append(("server", "not given (pass --vllm_serve '<its options>' to check it)"))
        return
    rows.append(
        (
            "server",
            f"tensor_parallel_size {serve.tensor_parallel_size}, data_parallel_size {serve.data_parallel_size}, "
            f"gpu_memory_utilization {serve.gpu_memory_utilization:g}, max_model_len {serve.max_model_len}",
        )
    )
    if shape is not None and serve.data_parallel_size > 1 and not shape.is_moe:
        tp = serve.data_parallel_size * serve.tensor_parallel_size
        while shape.num_heads % tp:
            tp -= 1
        plan.error(
            "tensor_parallel_size",
            f"trl vllm-serve --data_parallel_size {serve.data_parallel_size} on a dense model: TRL 1.16 says "
            "'For dense models, keep this at 1' (vLLM errors out, vLLM PR #30739). Use tensor parallelism on "
            f"the server's GPUs: --data_parallel_size 1 --tensor_parallel_size {tp}.",
        )
    if serve.max_model_len is not None and serve.max_model_len < run.seq_tokens:
        plan.warning(
            "max_model_len",
            f"the server's --max_model_len {serve.max_model_len} is below prompt + completion = {run.seq_tokens}: "
            f"use --max_model_len {run.seq_tokens}.",
        )
    gpu = launch.gpu_memory_gib * GiB if launch.gpu_memory_gib else None
    if shape is not None and gpu:
        weights = 2 * shape.num_params / serve.tensor_parallel_size
        if serve.gpu_memory_utilization * gpu < weights + VLLM_FIXED_OVERHEAD_GIB * GiB:
            plan.error(
                "gpu_memory_utilization",
                f"the server's share {serve.gpu_memory_utilization:g} x {launch.gpu_memory_gib:g} GiB cannot "
                f"hold {gib(weights)} of weights per GPU: raise --gpu_memory_utilization or "
                "--tensor_parallel_size.",
            )


def _colocate_rows(run: Run, max_num_seqs: int) -> list:
    """What TRL passes to the colocated engine's `LLM(...)`."""
    B, TP, SPG = run.per_device_train_batch_size, run.tensor_parallel_size, run.steps_per_generation
    max_model_len, share, shape = run.vllm_max_model_length, run.vllm_gpu_memory_utilization, run.shape
    gpu_gib = run.launch.gpu_memory_gib
    return [
        (
            "max_num_seqs",
            f"per_device_train_batch_size x vllm_tensor_parallel_size x steps_per_generation = {B} x {TP} x {SPG} = {max_num_seqs}",
        ),
        ("max_num_batched_tokens", f"{TRL_MAX_NUM_BATCHED_TOKENS} (hard-coded by TRL)"),
        (
            "max_model_len",
            f"{max_model_len}"
            if max_model_len
            else f"the model's ({shape.max_position_embeddings if shape else '?'})",
        ),
        ("gpu_memory_utilization", f"{share:g}" + (f" = {share * gpu_gib:.1f} GiB per GPU" if gpu_gib else "")),
        ("tensor_parallel_size", str(TP)),
        ("sleep mode", "on (weights and KV cache freed while training)" if run.vllm_enable_sleep_mode else "off"),
        ("generation batch per engine", f"{B * TP * SPG} completions of up to {run.max_completion_length} tokens"),
    ]


def _colocate_checks(plan: Plan, run: Run, max_num_seqs: int) -> None:
    """The settings with which the colocated engines cannot be grouped or vLLM refuses to start."""
    B, TP, W = run.per_device_train_batch_size, run.tensor_parallel_size, run.world_size
    max_model_len, seq_tokens, completions = run.vllm_max_model_length, run.seq_tokens, run.completions_per_generation
    if W % TP:
        plan.error(
            "vllm_tensor_parallel_size",
            f"{TP} does not divide the world size {W}: TRL groups the colocated engines by "
            f"vllm_tensor_parallel_size processes. Use a divisor of {W}.",
        )
    if max_num_seqs > TRL_MAX_NUM_BATCHED_TOKENS:
        spg_max = TRL_MAX_NUM_BATCHED_TOKENS // (B * TP)
        need_w = math.ceil(completions / (TRL_MAX_NUM_BATCHED_TOKENS // TP))
        plan.error(
            "max_num_seqs",
            f"TRL asks vLLM for max_num_seqs = per_device_train_batch_size x vllm_tensor_parallel_size x "
            f"steps_per_generation = {max_num_seqs} but hard-codes max_num_batched_tokens = "
            f"{TRL_MAX_NUM_BATCHED_TOKENS}, and vLLM refuses max_num_batched_tokens < max_num_seqs: vLLM will not "
            f"start. Use steps_per_generation <= {spg_max} (e.g. {spg_max} with gradient_accumulation_steps "
            f"{max(1, spg_max // 4)} for 4 optimizer steps per generation), or keep the generation of "
            f"{completions} completions over >= {need_w} processes.",
        )
    if max_model_len is not None and max_model_len < seq_tokens:
        plan.warning(
            "vllm_max_model_length",
            f"vllm_max_model_length {max_model_len} < prompt + max_completion_length = {seq_tokens}: long prompts "
            f"get fewer completion tokens, or are refused. Use vllm_max_model_length {seq_tokens}.",
        )


def _engine_memory(shape: ModelShape, TP: int, max_num_seqs: int) -> tuple[float, float]:
    """Bytes of one colocated engine rank besides its KV cache: its weights, and its overhead."""
    weights = 2 * shape.num_params / TP  # vLLM loads the checkpoint's bf16
    profile = (
        TRL_MAX_NUM_BATCHED_TOKENS * (4 * shape.hidden_size + 6 * shape.mlp_width) * 2
        + min(max_num_seqs, TRL_MAX_NUM_BATCHED_TOKENS) * shape.vocab_size * 4 * 2
    )  # the profile run's activations over the token budget, and the sampler's fp32 logits + probabilities
    overhead = VLLM_FIXED_OVERHEAD_GIB * GiB + profile
    return weights, overhead


def _kv_cache(plan: Plan, rows: list, run: Run, trainer: TrainerMemory | None, max_num_seqs: int) -> dict:
    """The colocated engine's share of the GPU: its weights, overhead and KV cache, the sequences it decodes at once,
    and (with the trainer's estimate) the GPU memory while generating and while training."""
    shape, TP, gpu_gib = run.shape, run.tensor_parallel_size, run.launch.gpu_memory_gib
    gpu, share = gpu_gib * GiB, run.vllm_gpu_memory_utilization
    if shape.num_heads % TP:
        plan.error("vllm_tensor_parallel_size", f"{TP} does not divide the model's {shape.num_heads} attention heads.")
    weights, overhead = _engine_memory(shape, TP, max_num_seqs)
    kv_per_token = shape.kv_bytes_per_token(TP)
    model_len = run.vllm_max_model_length or shape.max_position_embeddings or run.seq_tokens
    budget = share * gpu
    kv = budget - weights - overhead
    # the largest share that still fits next to the trainer's persistent memory while generating
    trainer_resident = trainer.persistent if trainer is not None else CUDA_OVERHEAD_GIB * GiB
    share_max = math.floor((gpu - trainer_resident) / gpu * 100) / 100
    share_min = math.ceil((weights + overhead + MIN_CONCURRENT_SEQUENCES * model_len * kv_per_token) / gpu * 100) / 100
    fix = _share_fix(share_min, share_max)
    rows += [
        ("engine weights", f"{gib(weights)} (bf16{', 1/' + str(TP) + ' per rank' if TP > 1 else ''})"),
        (
            "engine overhead",
            f"{gib(overhead)} (CUDA graphs, profile run over {TRL_MAX_NUM_BATCHED_TOKENS} tokens, sampler; estimate)",
        ),
    ]
    if kv <= 0:
        rows.append(("KV cache", "none left"))
        plan.error(
            "vllm_gpu_memory_utilization",
            f"{share:g} x {gpu_gib:g} GiB = {gib(budget)} cannot hold the engine's {gib(weights)} of "
            f"weights and {gib(overhead)} of overhead (vLLM: 'No available memory for the cache blocks'). " + fix,
        )
        return {}
    kv_tokens = kv / kv_per_token
    rows.append(("KV cache", f"{gib(kv)} = {kv_tokens / 1e3:.0f}k tokens ({kv_per_token / 1024:.0f} KiB per token)"))
    concurrent = _concurrency(plan, rows, run, kv_tokens, model_len, fix)
    if trainer is not None:
        _memory_share(plan, rows, run, trainer, budget, fix)
    return {"max_num_seqs": max_num_seqs, "concurrent": concurrent, "kv_tokens": kv_tokens}


def _concurrency(plan: Plan, rows: list, run: Run, kv_tokens: float, model_len: int, fix: str) -> int:
    """The full-length sequences of `model_len` tokens the KV cache holds at once, and the waves a generation batch
    takes; checks that it holds enough."""
    concurrent = int(kv_tokens // model_len)
    batch = run.per_device_train_batch_size * run.tensor_parallel_size * run.steps_per_generation
    waves = math.ceil(batch / max(concurrent, 1))
    rows.append(
        (
            "concurrency",
            f"{concurrent} sequences of {model_len} tokens at once, for a batch of {batch}: "
            f"{waves} wave(s) in the worst case (all completions at full length)",
        )
    )
    if concurrent < 1:
        plan.error(
            "vllm_gpu_memory_utilization",
            f"the KV cache ({kv_tokens:.0f} tokens) cannot hold one sequence of max_model_len {model_len} (vLLM "
            f"refuses to start). " + fix + " Or lower vllm_max_model_length.",
        )
    elif concurrent < MIN_CONCURRENT_SEQUENCES:
        plan.warning(
            "vllm_gpu_memory_utilization",
            f"the KV cache holds only {concurrent} full-length sequences at once: generation runs {waves} waves. "
            + fix,
        )
    return concurrent


def _memory_share(plan: Plan, rows: list, run: Run, trainer: TrainerMemory, budget: float, fix: str) -> None:
    """The GPU memory with the colocated engine beside the trainer: awake while generating, asleep (or not) while
    training."""
    gpu_gib = run.launch.gpu_memory_gib
    gpu = gpu_gib * GiB
    generating = trainer.persistent + budget
    rows.append(("while generating", f"{gib(generating)} (the trainer's weights/gradients/optimizer + vLLM's share)"))
    if generating > gpu:
        plan.error(
            "vllm_gpu_memory_utilization",
            f"while vLLM generates, the trainer keeps {gib(trainer.persistent)} and vLLM takes {gib(budget)}: "
            f"{gib(generating)} > {gpu_gib:g} GiB. " + fix,
        )
    asleep = run.vllm_enable_sleep_mode
    training = trainer.peak + (VLLM_SLEEPING_GIB * GiB if asleep else budget)
    rows.append(
        ("while training", f"{gib(training)} (training peak + vLLM {'asleep' if asleep else 'awake: sleep mode off'})")
    )
    memory_limit(plan, training, gpu, "training (with vLLM colocated)")


def _share_fix(share_min: float, share_max: float) -> str:
    if share_min <= share_max:
        return f"vllm_gpu_memory_utilization between {share_min:.2f} and {share_max:.2f} works."
    return (
        f"No vllm_gpu_memory_utilization fits: vLLM needs >= {share_min:.2f} of the GPU and the trainer leaves "
        f"{max(share_max, 0):.2f}. Free the trainer's memory (ZeRO-3, more processes, LoRA, optimizer offload), use "
        "vllm_tensor_parallel_size > 1, a smaller model, or vllm_mode server."
    )
