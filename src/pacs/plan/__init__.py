"""`pacs plan`: what a recipe will ask of the GPUs, checked before a GPU is spent.

`pacs plan --config RECIPE [--accelerate-config FILE] [--num-processes N] [--gpu-memory-gb G] [overrides ...]` reads
the recipe (a shipped one by name, or a path) with `pacs train`'s own reader (`pacs.train.read_recipe`: the same
overrides and launch keys), the accelerate config the recipe names (its `accelerate_config` key; DeepSpeed ZeRO stage,
processes, machines) unless told another, and the model's shape (its `config.json`, local; the Qwen3 family from a table; or from the hub when
online), and prints the resolved plan: batch arithmetic, what TRL asks of vLLM, the KV cache against the generation
batch, a per-GPU memory estimate, checkpoints on disk and the cost of one in-training evaluation. It reports every
problem it finds, each naming the setting and a value that works, and exits non-zero on a failure.

`pacs train` runs the same checks (`check_training_plan`) at start, before any model loads.

The memory and time figures are estimates (the constants are named below): they are meant to catch settings that
cannot work, an order of magnitude off, not to replace a profiler. What is exact: the batch arithmetic, what TRL
passes to vLLM (`trl/trainer/grpo_trainer.py`, `trl/generation/vllm_generation.py` of TRL 1.16), parameter counts
and the KV cache's bytes per token.

>>> shape = model_shape("Qwen/Qwen3-8B-Base")
>>> round(shape.num_params / 1e9, 2), shape.kv_bytes_per_token()
(8.19, 147456)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path


logger = logging.getLogger(__name__)

GiB = 2**30
GB = 1e9

# What TRL 1.16 asks of a colocated vLLM engine (trl/generation/vllm_generation.py, `LLM(...)`): a hard-coded token
# budget per scheduler step, and (trl/trainer/grpo_trainer.py) max_num_seqs = per-device batch x vLLM tensor-parallel
# size x steps_per_generation. vLLM refuses max_num_batched_tokens < max_num_seqs (vllm/config/scheduler.py).
TRL_MAX_NUM_BATCHED_TOKENS = 4096

# Assumptions of the estimates (named so that a reader can redo the arithmetic).
CUDA_OVERHEAD_GIB = 2.5  # per process: CUDA context, NCCL buffers, allocator fragmentation
VLLM_FIXED_OVERHEAD_GIB = 1.0  # per engine: CUDA graphs, workspace (besides weights, profile peak and KV cache)
VLLM_SLEEPING_GIB = 0.5  # what a sleeping engine (level 2) keeps
MEMORY_WARN_FRACTION = 0.9  # warn when an estimate passes this fraction of the GPU
MIN_CONCURRENT_SEQUENCES = 8  # a vLLM share is suggested so that at least this many full-length sequences fit
TYPICAL_WEIGHT = 0.02  # magnitude of a typical weight of a pretrained transformer (init scale 0.02)
DECODE_BYTES_PER_S = 2.0e12  # effective HBM bandwidth while decoding (H100 SXM: 3.35e12 peak)
TRAIN_FLOPS_PER_S = 4.0e14  # achieved bf16 FLOP/s per GPU in training (H100 SXM: 9.9e14 dense peak)
WEIGHT_PUSH_S_PER_GB = 0.5  # one weight push to a colocated engine, per GB of 16-bit weights (estimate)
EVAL_WARN_FRACTION = 0.25  # warn when evaluation adds more than this fraction to the training time
CHECKPOINTS_WARN_GB = 200.0  # warn when the checkpoints kept can pass this size on disk
BENCHMARK_SIZES = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2, None: 4}
LORA_TARGETS_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ---------------------------------------------------------------------------------------------------------------------
# The model's shape
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that the estimates need (Qwen3 / Llama layout: GQA, SwiGLU MLP)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None = None
    num_experts: int = 0  # mixture of experts: routed experts per layer (0: dense)
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    source: str = ""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def mlp_width(self) -> int:
        """The MLP width a token goes through: the dense MLP's, or the active experts' together."""
        return self.num_experts_per_tok * self.moe_intermediate_size if self.is_moe else self.intermediate_size

    @property
    def layer_params(self) -> int:
        h = self.hidden_size
        attention = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + 2 * self.head_dim  # + q_norm, k_norm
        if self.is_moe:
            mlp = self.num_experts * 3 * h * self.moe_intermediate_size + h * self.num_experts  # + router
        else:
            mlp = 3 * h * self.intermediate_size
        return attention + mlp + 2 * h  # + the two RMSNorms

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        heads = 1 if self.tie_word_embeddings else 2
        return self.num_layers * self.layer_params + heads * self.embedding_params + self.hidden_size

    def kv_bytes_per_token(self, tensor_parallel_size: int = 1, dtype_bytes: int = 2) -> int:
        """KV cache per token on one engine rank: K and V of every layer (vLLM replicates KV heads beyond TP)."""
        kv_heads = max(1, math.ceil(self.num_kv_heads / tensor_parallel_size))
        return 2 * self.num_layers * kv_heads * self.head_dim * dtype_bytes

    def activation_bytes_per_token(self) -> int:
        """Bytes autograd keeps per token for one decoder layer in bf16 with SDPA/flash attention (no score matrix).

        RMSNorm keeps its float32 input and its bf16 output (6 bytes per element, 2 norms, plus q/k norms); attention
        keeps q, k, v, the rotated q and k and its output; the SwiGLU MLP keeps gate, up, silu(gate) and their product.
        """
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.mlp_width
        return 12 * h + 6 * (q + kv) + 2 * (q + 2 * kv) + 4 * q + 8 * i

    def lora_params(self, rank: int, targets: list[str] | tuple[str, ...] | None) -> int:
        """Parameters of a LoRA adapter of rank `rank` on the named projections of every layer."""
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.mlp_width
        sizes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
        if not self.is_moe:
            sizes.update({"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)})
        if targets in (None, "all-linear", ["all-linear"]):
            targets = LORA_TARGETS_ALL
        return self.num_layers * sum(rank * sum(sizes[t]) for t in set(targets) if t in sizes)


def _qwen3(hidden, intermediate, layers, heads, tie, **moe) -> dict:
    return dict(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=moe.pop("kv_heads", 8),
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=tie,
        max_position_embeddings=moe.pop("max_position_embeddings", 32768),
        **moe,
    )


# The Qwen3 family, from the models' config.json on the hub (Base and post-trained checkpoints share the shapes).
# Checked against the parameter counts Qwen publishes (total / non-embedding): 0.6B 0.6/0.44, 1.7B 1.7/1.4,
# 4B 4.0/3.6, 8B 8.2/6.95, 14B 14.8/13.2, 32B 32.8/31.2, 30B-A3B 30.5 (3.3 active). max_position_embeddings (from
# memory, less certain than the shapes: only vLLM's default max_model_len reads it, when vllm_max_model_length is
# unset): 32768 for the Base checkpoints, 40960 for the post-trained ones, 262144 for the -2507 ones.
QWEN3_SHAPES = {
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16, tie=True),
    "qwen3-1.7b": _qwen3(2048, 6144, 28, 16, tie=True),
    "qwen3-4b": _qwen3(2560, 9728, 36, 32, tie=True),
    "qwen3-8b": _qwen3(4096, 12288, 36, 32, tie=False),
    "qwen3-14b": _qwen3(5120, 17408, 40, 40, tie=False),
    "qwen3-32b": _qwen3(5120, 25600, 64, 64, tie=False),
    "qwen3-30b-a3b": _qwen3(
        2048, 6144, 48, 32, tie=False, kv_heads=4, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768
    ),
}


def shape_from_config(config: dict, name: str, source: str) -> ModelShape:
    """A `ModelShape` from a `config.json` dictionary (the text config of a multimodal model)."""
    config = config.get("text_config") or config
    heads = config["num_attention_heads"]
    return ModelShape(
        name=name,
        hidden_size=config["hidden_size"],
        intermediate_size=config.get("intermediate_size") or 4 * config["hidden_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        vocab_size=config["vocab_size"],
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=config.get("max_position_embeddings"),
        num_experts=config.get("num_experts") or config.get("num_local_experts") or 0,
        num_experts_per_tok=config.get("num_experts_per_tok") or 0,
        moe_intermediate_size=config.get("moe_intermediate_size") or 0,
        source=source,
    )


def model_shape(name_or_path: str, revision: str | None = None) -> ModelShape:
    """The shape of `name_or_path`: its local `config.json`, the Qwen3 table, or the hub's `config.json` when online.

    The table comes before the hub so that plans of the shipped recipes are the same offline and online.
    """
    local = Path(name_or_path) / "config.json"
    if local.is_file():
        return shape_from_config(json.loads(local.read_text()), name_or_path, f"{local}")
    match = re.fullmatch(
        r"qwen3-(0\.6b|1\.7b|4b|8b|14b|32b|30b-a3b)(-base|-instruct-2507|-thinking-2507)?",
        name_or_path.split("/")[-1].lower(),
    )
    if match:
        context = {"-base": 32768, None: 40960}.get(match[2], 262144)
        fields = {**QWEN3_SHAPES[f"qwen3-{match[1]}"], "max_position_embeddings": context}
        return ModelShape(name=name_or_path, source="pacs.plan's Qwen3 table", **fields)
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        raise ValueError(
            f"The shape of {name_or_path!r} is unknown offline (HF_HUB_OFFLINE=1): pass a local model directory, or "
            "run online so that its config.json can be read from the hub."
        )
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(name_or_path, "config.json", revision=revision)
    return shape_from_config(json.loads(Path(path).read_text()), name_or_path, f"the hub ({name_or_path})")


# ---------------------------------------------------------------------------------------------------------------------
# The launch: processes, DeepSpeed, GPU memory
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Launch:
    """How the run is launched: processes, machines, DeepSpeed ZeRO stage (None without DeepSpeed), GPU memory."""

    world_size: int
    num_machines: int = 1
    zero_stage: int | None = None
    offload_optimizer: bool = False
    offload_params: bool = False
    mixed_precision: str = "bf16"
    gpu_memory_gib: float | None = None
    source: str = ""

    @property
    def deepspeed(self) -> bool:
        return self.zero_stage is not None


def read_accelerate_config(path: str | os.PathLike) -> Launch:
    """Processes, machines and the DeepSpeed settings of an accelerate config file (a path, or a shipped config's
    name: `zero3`)."""
    import yaml

    from ..recipes import ACCELERATE_CONFIGS_DIR, resolve_accelerate_config

    path = resolve_accelerate_config(path)
    shipped = path.resolve().parent == ACCELERATE_CONFIGS_DIR
    config = yaml.safe_load(path.read_text()) or {}
    deepspeed = config.get("deepspeed_config") or {}
    is_deepspeed = config.get("distributed_type") == "DEEPSPEED"
    return Launch(
        world_size=int(config.get("num_processes") or 1),
        num_machines=int(config.get("num_machines") or 1),
        zero_stage=int(deepspeed.get("zero_stage", 0)) if is_deepspeed else None,
        offload_optimizer=deepspeed.get("offload_optimizer_device", "none") not in (None, "none"),
        offload_params=deepspeed.get("offload_param_device", "none") not in (None, "none"),
        mixed_precision=str(config.get("mixed_precision") or "no"),
        source=f"accelerate config {path.stem}" if shipped else str(path),
    )


# ---------------------------------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Finding:
    """A problem: `error` stops the run, `warning` is a risk. `setting` names what to change."""

    level: str
    setting: str
    message: str

    def __str__(self) -> str:
        return f"{self.level.upper()} [{self.setting}] {self.message}"


@dataclass
class Plan:
    sections: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    vllm: dict = field(default_factory=dict)  # what the evaluation estimate reuses: max_num_seqs, concurrency

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]

    def section(self, title: str) -> list[tuple[str, str]]:
        rows: list[tuple[str, str]] = []
        self.sections.append((title, rows))
        return rows

    def error(self, setting: str, message: str) -> None:
        self.findings.append(Finding("error", setting, message))

    def warning(self, setting: str, message: str) -> None:
        self.findings.append(Finding("warning", setting, message))

    def render(self) -> str:
        lines = []
        for title, rows in self.sections:
            lines.append(title)
            width = max((len(k) for k, _ in rows), default=0)
            lines.extend(f"  {key:<{width}}  {value}" for key, value in rows)
            lines.append("")
        if self.findings:
            lines.append(f"Problems: {len(self.errors)} error(s), {len(self.warnings)} warning(s)")
            lines.extend(f"  {finding}" for finding in self.findings)
        else:
            lines.append("Problems: none")
        return "\n".join(lines)


def _gib(x: float) -> str:
    return f"{x / GiB:.1f} GiB"


def _human_s(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _get(obj, name, default=None):
    return getattr(obj, name, default) if obj is not None else default


@dataclass
class VllmServe:
    """The `trl vllm-serve` command a server-mode run talks to (its options, parsed with TRL's own parser)."""

    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    model: str | None = None

    @classmethod
    def parse(cls, command: str) -> VllmServe:
        import shlex

        from transformers import HfArgumentParser
        from trl.scripts.vllm_serve import ScriptArguments

        words = [w for w in shlex.split(command) if w not in ("trl", "vllm-serve")]
        (serve,) = HfArgumentParser(ScriptArguments).parse_args_into_dataclasses(words)
        return cls(
            serve.tensor_parallel_size,
            serve.data_parallel_size,
            serve.gpu_memory_utilization,
            serve.max_model_len,
            serve.model,
        )


def make_plan(
    script_args,
    args,
    model_args,
    launch: Launch,
    shape: ModelShape | None,
    vllm_serve: VllmServe | None = None,
) -> Plan:
    """The plan of one run: `script_args`, `args` (`PACSConfig` / `GRPOConfig`), `model_args` (TRL's `ModelConfig`)
    as `pacs train` parses them, launched as `launch`, for a model of shape `shape` (None: unknown, the
    model-dependent parts are skipped)."""
    plan = Plan()
    GA, SPG = args.gradient_accumulation_steps, args.steps_per_generation
    steps_per_generation = SPG * args.num_iterations / GA
    C = args.max_completion_length or 0
    use_vllm, mode = bool(args.use_vllm), args.vllm_mode
    TP = args.vllm_tensor_parallel_size if use_vllm and mode == "colocate" else 1
    prompt_tokens, prompt_source = _prompt_tokens(script_args, args, C)
    seq_tokens = prompt_tokens + C
    use_peft = bool(_get(model_args, "use_peft", False))
    dtype = str(_get(model_args, "dtype", None) or "float32")
    gpu = launch.gpu_memory_gib * GiB if launch.gpu_memory_gib else None

    # 1. The run
    _run_section(plan, script_args, model_args, launch, shape, use_peft, dtype)
    _world_size_check(plan, script_args, args, launch.world_size)

    # 2. Batch arithmetic
    completions_per_generation = _batch_section(
        plan, args, launch.world_size, steps_per_generation, prompt_tokens, prompt_source, seq_tokens
    )

    # 3. Memory (needs the shape)
    trainer = None
    if shape is not None:
        trainer = _training_memory(plan, args, model_args, launch, shape, seq_tokens, C)

    # 4. vLLM (its colocated engine shares the GPU memory with training)
    if trainer is not None and gpu and not (use_vllm and mode == "colocate"):
        _memory_limit(plan, trainer.peak, gpu, "training")
    if use_vllm:
        _vllm(
            plan, args, launch, shape, vllm_serve, trainer, TP, prompt_tokens, seq_tokens, completions_per_generation
        )

    # 5. bf16 weights without fp32 master weights
    _precision(plan, args, model_args, launch, dtype, use_peft)

    # 6. Checkpoints and evaluation
    if shape is not None:
        _checkpoints(plan, args, model_args, launch, shape)
        _evaluation(plan, script_args, args, launch, shape, trainer, seq_tokens, C, steps_per_generation)
    return plan


def _prompt_tokens(script_args, args, C: int) -> tuple[int, str]:
    """The longest prompt in tokens, and where that figure comes from."""
    prompt_tokens = _get(script_args, "max_prompt_tokens")
    max_model_len = args.vllm_max_model_length
    prompt_source = "max_prompt_tokens"
    if prompt_tokens is None:
        prompt_tokens = (max_model_len - C) if max_model_len else 512
        prompt_source = "vllm_max_model_length - max_completion_length" if max_model_len else "assumed"
    return prompt_tokens, prompt_source


def _run_section(plan: Plan, script_args, model_args, launch: Launch, shape: ModelShape | None, use_peft, dtype):
    rows = plan.section("Run")
    rows += [
        ("algorithm", str(_get(script_args, "algorithm", "pacs"))),
        (
            "model",
            f"{_get(model_args, 'model_name_or_path')} ({'LoRA r=' + str(model_args.lora_r) if use_peft else 'full fine-tuning'}, dtype {dtype})",
        ),
        ("launch", _launch_text(launch)),
        (
            "GPU memory",
            f"{launch.gpu_memory_gib:g} GiB per GPU" if launch.gpu_memory_gib else "unknown (pass --gpu-memory-gb)",
        ),
    ]
    if shape is not None:
        rows.append(
            (
                "model shape",
                f"{shape.num_params / 1e9:.2f}B parameters, {shape.num_layers} layers, hidden {shape.hidden_size}, "
                f"{shape.num_heads} heads / {shape.num_kv_heads} KV x {shape.head_dim}, MLP {shape.intermediate_size}, "
                f"vocab {shape.vocab_size}, {'tied' if shape.tie_word_embeddings else 'untied'} embeddings"
                + (f", {shape.num_experts} experts ({shape.num_experts_per_tok} active)" if shape.is_moe else "")
                + f" (from {shape.source})",
            )
        )


def batch_arithmetic(args, world_size: int | None = None) -> dict[str, float]:
    """TRL's batch arithmetic for `world_size` processes (defaults to the run's own, `args.world_size`).

    A generation holds `per_device_train_batch_size * world_size * steps_per_generation` completions; an optimizer
    step consumes `per_device_train_batch_size * world_size * gradient_accumulation_steps` of them; so each generation
    feeds `steps_per_generation / gradient_accumulation_steps * num_iterations` optimizer steps.
    """
    world_size = world_size or args.world_size
    completions_per_micro_step = args.per_device_train_batch_size * world_size
    completions_per_generation = completions_per_micro_step * args.steps_per_generation
    return {
        "world_size": world_size,
        "completions_per_generation": completions_per_generation,
        "prompts_per_generation": completions_per_generation // args.num_generations,
        "completions_per_optimizer_step": completions_per_micro_step * args.gradient_accumulation_steps,
        "optimizer_steps_per_generation": args.steps_per_generation
        * args.num_iterations
        / args.gradient_accumulation_steps,
    }


def _world_size_check(plan: Plan, script_args, args, W: int) -> None:
    """A launch on another world size than the recipe's changes its batch: refuse it, saying how to keep the batch
    (the completions per generation and per optimizer step both scale as 1 / world size) or accept the new one."""
    expected = _get(script_args, "expected_world_size")
    if expected is None or expected == W:
        return
    intended, actual = batch_arithmetic(args, expected), batch_arithmetic(args, W)
    ga, spg = expected * args.gradient_accumulation_steps / W, expected * args.steps_per_generation / W
    keep = (
        f"--gradient_accumulation_steps {ga:g} --steps_per_generation {spg:g} --expected_world_size {W}"
        if ga.is_integer() and spg.is_integer()
        else "a per_device_train_batch_size that makes gradient_accumulation_steps and steps_per_generation integers"
    )
    plan.error(
        "expected_world_size",
        f"the recipe assumes {expected} processes, this launch has {W}: a generation would hold "
        f"{actual['completions_per_generation']} completions instead of {intended['completions_per_generation']}. "
        f"Launch {expected} processes (the recipe's accelerate config, or --num_processes {expected}); or keep the "
        f"recipe's batch on {W}: {keep}; or accept the smaller batch: --expected_world_size {W}.",
    )


def _batch_section(plan: Plan, args, W, steps_per_generation, prompt_tokens, prompt_source, seq_tokens) -> int:
    """TRL's batch arithmetic; returns the completions of one generation."""
    B, GA, SPG = args.per_device_train_batch_size, args.gradient_accumulation_steps, args.steps_per_generation
    iterations, G, C = args.num_iterations, args.num_generations, args.max_completion_length or 0
    completions_per_generation = batch_arithmetic(args, W)["completions_per_generation"]
    rows = plan.section("Batch (TRL's arithmetic)")
    rows += [
        ("world size", str(W)),
        (
            "completions per generation",
            f"{B} x {W} x {SPG} = {completions_per_generation} ({completions_per_generation // G} prompts x {G})",
        ),
        ("completions per optimizer step", f"{B} x {W} x {GA} = {B * W * GA}"),
        ("optimizer steps per generation", f"{SPG} x {iterations} / {GA} = {steps_per_generation:g}"),
        (
            "sequence length",
            f"{prompt_tokens} prompt ({prompt_source}) + {C} completion = {seq_tokens} tokens at most",
        ),
    ]
    if args.max_steps and args.max_steps > 0:
        rows.append(
            ("run", f"{args.max_steps} optimizer steps = {args.max_steps / steps_per_generation:g} generations")
        )
    return completions_per_generation


def _launch_text(launch: Launch) -> str:
    backend = f"DeepSpeed ZeRO-{launch.zero_stage}" if launch.deepspeed else "no DeepSpeed (DDP or one process)"
    if launch.offload_optimizer or launch.offload_params:
        backend += ", offload " + "+".join(
            name for name, on in (("optimizer", launch.offload_optimizer), ("params", launch.offload_params)) if on
        )
    where = f" ({launch.source})" if launch.source else ""
    return f"{launch.world_size} processes on {launch.num_machines} machine(s), {backend}{where}"


@dataclass
class _Memory:
    persistent: float  # weights, gradients and optimizer states that stay on the GPU through generation
    peak: float  # persistent + the largest micro-batch's transients, during training
    trainable: int


def _training_memory(plan: Plan, args, model_args, launch: Launch, shape: ModelShape, seq_tokens: int, C: int):
    P = shape.num_params
    use_peft = bool(_get(model_args, "use_peft", False))
    dtype = str(_get(model_args, "dtype", None) or "float32")
    trainable = shape.lora_params(model_args.lora_r, model_args.lora_target_modules) if use_peft else P
    rows = plan.section("Training memory per GPU (estimate)")
    stage = launch.zero_stage
    weights, grads, states, master = _model_states(launch, shape, trainable, use_peft, dtype)
    reference = _reference_model_bytes(args, launch, shape, use_peft, dtype)
    persistent = weights + grads + states + reference + CUDA_OVERHEAD_GIB * GiB
    B = args.per_device_train_batch_size
    activations, activations_other, lm_head, zero3_live = _transients(args, launch, shape, seq_tokens, C, use_peft)
    peak = persistent + activations + lm_head + zero3_live
    rows += [
        ("weights", f"{_gib(weights)}" + (" (sharded)" if stage == 3 else "")),
        ("gradients", f"{_gib(grads)} ({trainable / 1e6:.0f}M trainable parameters)"),
        ("optimizer states", f"{_gib(states)} ({master})"),
        *(
            [("reference model", f"{_gib(reference)} (frozen copy: beta > 0 or pacs_anchor reference)")]
            if reference
            else []
        ),
        ("CUDA context, NCCL, slack", f"{CUDA_OVERHEAD_GIB:.1f} GiB (assumed)"),
        (
            "activations",
            f"{_gib(activations)} for a micro-batch of {B} x {seq_tokens} tokens, gradient checkpointing "
            f"{'on' if args.gradient_checkpointing else 'off'} ({_gib(activations_other)} with it "
            f"{'off' if args.gradient_checkpointing else 'on'})",
        ),
        ("LM head (fused, tiled)", _gib(lm_head)),
    ]
    if zero3_live:
        rows.append(("ZeRO-3 gathered layers", _gib(zero3_live)))
    rows.append(
        ("training peak", _gib(peak) + (f" of {launch.gpu_memory_gib:g} GiB" if launch.gpu_memory_gib else ""))
    )
    return _Memory(persistent=persistent, peak=peak, trainable=trainable)


def _model_states(launch: Launch, shape: ModelShape, trainable: int, use_peft: bool, dtype: str):
    """Bytes per GPU of the weights, gradients and optimizer states, and how the optimizer keeps them."""
    W, P, stage = launch.world_size, shape.num_params, launch.zero_stage
    if launch.deepspeed and (launch.mixed_precision == "bf16" or dtype == "bfloat16"):
        # DeepSpeed in bf16: 16-bit weights and gradients, fp32 master weights + Adam moments (12 bytes/parameter)
        weights = 2 * P / (W if stage == 3 else 1)
        grads = 2 * trainable / (W if stage >= 2 else 1)
        states = 12 * trainable / (W if stage >= 1 else 1)
        master = "fp32 master weights + Adam moments, 12 B/param"
    else:
        w_bytes = DTYPE_BYTES.get(dtype, 4)
        t_bytes = 4 if use_peft else w_bytes  # PEFT upcasts adapters to fp32 outside ZeRO-3
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


def _reference_model_bytes(args, launch: Launch, shape: ModelShape, use_peft: bool, dtype: str) -> float:
    """A frozen copy of the model: TRL's KL reference (beta > 0) or PACS's pi_ref (pacs_anchor reference); with LoRA
    both are the base model without (or with a second, frozen) adapter, so no copy."""
    P = shape.num_params
    reference = 0.0
    if not use_peft and (args.beta != 0.0 or _get(args, "pacs_anchor") == "reference"):
        if launch.deepspeed:  # prepare_deepspeed: bf16, sharded under ZeRO-3, replicated otherwise
            reference = 2 * P / (launch.world_size if launch.zero_stage == 3 else 1)
        else:
            reference = DTYPE_BYTES.get(dtype, 4) * P
    return reference


def _transients(args, launch: Launch, shape: ModelShape, seq_tokens: int, C: int, use_peft: bool):
    """Bytes of one micro-batch of B sequences of seq_tokens tokens: the activations (and what they would be with
    gradient checkpointing switched), the fused LM head's, and ZeRO-3's gathered layers."""
    B, stage = args.per_device_train_batch_size, launch.zero_stage
    tokens = B * seq_tokens
    per_layer = shape.activation_bytes_per_token() * tokens
    if args.gradient_checkpointing:
        # the layer inputs kept, plus the layer being recomputed in backward: its activations and the gradients in
        # flight through it (about half as much again)
        activations = shape.num_layers * tokens * shape.hidden_size * 2 + 1.5 * per_layer
        activations_other = shape.num_layers * per_layer
    else:
        activations = shape.num_layers * per_layer
        activations_other = shape.num_layers * tokens * shape.hidden_size * 2 + 1.5 * per_layer
    # TRL's fused LM head: [4096 x 32768] tiles, fp32 gradient of the hidden states, and of the head when it trains
    lm_head = 4096 * 32768 * 2 + B * C * shape.hidden_size * 4
    if not use_peft:
        lm_head += shape.embedding_params * (4 + 2)  # fp32 accumulation + its cast
    if stage == 3:
        lm_head += shape.embedding_params * 2  # the gathered head
        zero3_live = 2 * 2 * shape.layer_params  # gathered layers in flight (current + prefetched)
    else:
        zero3_live = 0
    return activations, activations_other, lm_head, zero3_live


def _vllm(plan, args, launch, shape, serve, trainer, TP, prompt_tokens, seq_tokens, completions_per_generation):
    rows = plan.section(f"vLLM ({args.vllm_mode})")
    if args.vllm_mode == "server":
        _vllm_server(plan, rows, launch, shape, serve, seq_tokens)
        return
    max_num_seqs = args.per_device_train_batch_size * TP * args.steps_per_generation
    rows += _vllm_colocate_rows(args, launch, shape, TP, max_num_seqs)
    _vllm_colocate_checks(plan, args, launch, TP, max_num_seqs, seq_tokens, completions_per_generation)
    if shape is None or not launch.gpu_memory_gib:
        rows.append(("KV cache", "unknown (needs the model's shape and --gpu-memory-gb)"))
        return
    _vllm_kv_cache(plan, rows, args, launch, shape, trainer, TP, seq_tokens, max_num_seqs)


def _vllm_server(plan: Plan, rows, launch: Launch, shape: ModelShape | None, serve: VllmServe | None, seq_tokens):
    """vllm_mode server: the `trl vllm-serve` command's parallelism, context length and memory share."""
    rows.append(("engine", "trl vllm-serve on GPUs of its own; the training processes send prompts and weights"))
    if serve is None:
        rows.append(("server", "not given (pass --vllm-serve '<its options>' to check it)"))
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
    if serve.max_model_len is not None and serve.max_model_len < seq_tokens:
        plan.warning(
            "max_model_len",
            f"the server's --max_model_len {serve.max_model_len} is below prompt + completion = {seq_tokens}: "
            f"use --max_model_len {seq_tokens}.",
        )
    gpu = launch.gpu_memory_gib * GiB if launch.gpu_memory_gib else None
    if shape is not None and gpu:
        weights = 2 * shape.num_params / serve.tensor_parallel_size
        if serve.gpu_memory_utilization * gpu < weights + VLLM_FIXED_OVERHEAD_GIB * GiB:
            plan.error(
                "gpu_memory_utilization",
                f"the server's share {serve.gpu_memory_utilization:g} x {launch.gpu_memory_gib:g} GiB cannot "
                f"hold {_gib(weights)} of weights per GPU: raise --gpu_memory_utilization or "
                "--tensor_parallel_size.",
            )


def _vllm_colocate_rows(args, launch: Launch, shape: ModelShape | None, TP: int, max_num_seqs: int) -> list:
    """What TRL passes to the colocated engine's `LLM(...)`."""
    B, SPG = args.per_device_train_batch_size, args.steps_per_generation
    max_model_len, share = args.vllm_max_model_length, args.vllm_gpu_memory_utilization
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
        (
            "gpu_memory_utilization",
            f"{share:g}" + (f" = {share * launch.gpu_memory_gib:.1f} GiB per GPU" if launch.gpu_memory_gib else ""),
        ),
        ("tensor_parallel_size", str(TP)),
        ("sleep mode", "on (weights and KV cache freed while training)" if args.vllm_enable_sleep_mode else "off"),
        ("generation batch per engine", f"{B * TP * SPG} completions of up to {args.max_completion_length} tokens"),
    ]


def _vllm_colocate_checks(plan: Plan, args, launch: Launch, TP, max_num_seqs, seq_tokens, completions_per_generation):
    """The settings with which the colocated engines cannot be grouped or vLLM refuses to start."""
    B, max_model_len = args.per_device_train_batch_size, args.vllm_max_model_length
    if launch.world_size % TP:
        plan.error(
            "vllm_tensor_parallel_size",
            f"{TP} does not divide the world size {launch.world_size}: TRL groups the colocated engines by "
            f"vllm_tensor_parallel_size processes. Use a divisor of {launch.world_size}.",
        )
    if max_num_seqs > TRL_MAX_NUM_BATCHED_TOKENS:
        spg_max = TRL_MAX_NUM_BATCHED_TOKENS // (B * TP)
        need_w = math.ceil(completions_per_generation / (TRL_MAX_NUM_BATCHED_TOKENS // TP))
        plan.error(
            "max_num_seqs",
            f"TRL asks vLLM for max_num_seqs = per_device_train_batch_size x vllm_tensor_parallel_size x "
            f"steps_per_generation = {max_num_seqs} but hard-codes max_num_batched_tokens = "
            f"{TRL_MAX_NUM_BATCHED_TOKENS}, and vLLM refuses max_num_batched_tokens < max_num_seqs: vLLM will not "
            f"start. Use steps_per_generation <= {spg_max} (e.g. {spg_max} with gradient_accumulation_steps "
            f"{max(1, spg_max // 4)} for 4 optimizer steps per generation), or keep the generation of "
            f"{completions_per_generation} completions over >= {need_w} processes.",
        )
    if max_model_len is not None and max_model_len < seq_tokens:
        plan.warning(
            "vllm_max_model_length",
            f"vllm_max_model_length {max_model_len} < prompt + max_completion_length = {seq_tokens}: long prompts "
            f"get fewer completion tokens, or are refused. Use vllm_max_model_length {seq_tokens}.",
        )


def _vllm_engine_memory(shape: ModelShape, TP: int, max_num_seqs: int) -> tuple[float, float]:
    """Bytes of one colocated engine rank besides its KV cache: its weights, and its overhead."""
    weights = 2 * shape.num_params / TP  # vLLM loads the checkpoint's bf16
    profile = (
        TRL_MAX_NUM_BATCHED_TOKENS * (4 * shape.hidden_size + 6 * shape.mlp_width) * 2
        + min(max_num_seqs, TRL_MAX_NUM_BATCHED_TOKENS) * shape.vocab_size * 4 * 2
    )  # the profile run's activations over the token budget, and the sampler's fp32 logits + probabilities
    overhead = VLLM_FIXED_OVERHEAD_GIB * GiB + profile
    return weights, overhead


def _vllm_kv_cache(plan: Plan, rows, args, launch: Launch, shape: ModelShape, trainer, TP, seq_tokens, max_num_seqs):
    """The colocated engine's share of the GPU: its weights, overhead and KV cache, the sequences it decodes at once,
    and (with the trainer's estimate) the GPU memory while generating and while training."""
    B, SPG = args.per_device_train_batch_size, args.steps_per_generation
    gpu = launch.gpu_memory_gib * GiB
    share = args.vllm_gpu_memory_utilization
    if shape.num_heads % TP:
        plan.error("vllm_tensor_parallel_size", f"{TP} does not divide the model's {shape.num_heads} attention heads.")
    weights, overhead = _vllm_engine_memory(shape, TP, max_num_seqs)
    kv_per_token = shape.kv_bytes_per_token(TP)
    model_len = args.vllm_max_model_length or shape.max_position_embeddings or seq_tokens
    budget = share * gpu
    kv = budget - weights - overhead
    # the largest share that still fits next to the trainer's persistent memory while generating
    trainer_resident = trainer.persistent if trainer is not None else CUDA_OVERHEAD_GIB * GiB
    share_max = math.floor((gpu - trainer_resident) / gpu * 100) / 100
    share_min = math.ceil((weights + overhead + MIN_CONCURRENT_SEQUENCES * model_len * kv_per_token) / gpu * 100) / 100
    fix = _share_fix(share_min, share_max)
    rows += [
        ("engine weights", f"{_gib(weights)} (bf16{', 1/' + str(TP) + ' per rank' if TP > 1 else ''})"),
        (
            "engine overhead",
            f"{_gib(overhead)} (CUDA graphs, profile run over {TRL_MAX_NUM_BATCHED_TOKENS} tokens, sampler; estimate)",
        ),
    ]
    if kv <= 0:
        rows.append(("KV cache", "none left"))
        plan.error(
            "vllm_gpu_memory_utilization",
            f"{share:g} x {launch.gpu_memory_gib:g} GiB = {_gib(budget)} cannot hold the engine's {_gib(weights)} of "
            f"weights and {_gib(overhead)} of overhead (vLLM: 'No available memory for the cache blocks'). " + fix,
        )
        return
    kv_tokens = kv / kv_per_token
    concurrent = int(kv_tokens // model_len)
    batch = B * TP * SPG
    waves = math.ceil(batch / max(concurrent, 1))
    rows += [
        ("KV cache", f"{_gib(kv)} = {kv_tokens / 1e3:.0f}k tokens ({kv_per_token / 1024:.0f} KiB per token)"),
        (
            "concurrency",
            f"{concurrent} sequences of {model_len} tokens at once, for a batch of {batch}: "
            f"{waves} wave(s) in the worst case (all completions at full length)",
        ),
    ]
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
    if trainer is not None:
        _vllm_memory_share(plan, rows, args, launch, trainer, budget, fix)
    plan.vllm = {"max_num_seqs": max_num_seqs, "concurrent": concurrent, "kv_tokens": kv_tokens}


def _vllm_memory_share(plan: Plan, rows, args, launch: Launch, trainer: _Memory, budget: float, fix: str) -> None:
    """The GPU memory with the colocated engine beside the trainer: awake while generating, asleep (or not) while
    training."""
    gpu = launch.gpu_memory_gib * GiB
    generating = trainer.persistent + budget
    rows.append(("while generating", f"{_gib(generating)} (the trainer's weights/gradients/optimizer + vLLM's share)"))
    if generating > gpu:
        plan.error(
            "vllm_gpu_memory_utilization",
            f"while vLLM generates, the trainer keeps {_gib(trainer.persistent)} and vLLM takes {_gib(budget)}: "
            f"{_gib(generating)} > {launch.gpu_memory_gib:g} GiB. " + fix,
        )
    training = trainer.peak + (VLLM_SLEEPING_GIB * GiB if args.vllm_enable_sleep_mode else budget)
    rows.append(
        (
            "while training",
            f"{_gib(training)} (training peak + vLLM {'asleep' if args.vllm_enable_sleep_mode else 'awake: sleep mode off'})",
        )
    )
    _memory_limit(plan, training, gpu, "training (with vLLM colocated)")


def _share_fix(share_min: float, share_max: float) -> str:
    if share_min <= share_max:
        return f"vllm_gpu_memory_utilization between {share_min:.2f} and {share_max:.2f} works."
    return (
        f"No vllm_gpu_memory_utilization fits: vLLM needs >= {share_min:.2f} of the GPU and the trainer leaves "
        f"{max(share_max, 0):.2f}. Free the trainer's memory (ZeRO-3, more processes, LoRA, optimizer offload), use "
        "vllm_tensor_parallel_size > 1, a smaller model, or vllm_mode server."
    )


def _memory_limit(plan: Plan, need: float, gpu: float, what: str) -> None:
    if need > gpu:
        plan.error(
            "per_device_train_batch_size",
            f"{what} is estimated at {_gib(need)}, more than the GPU's {_gib(gpu)}: lower per_device_train_batch_size "
            "(raising gradient_accumulation_steps and steps_per_generation to keep the batch), keep "
            "gradient_checkpointing on, or shard more (ZeRO-3, more processes, optimizer offload).",
        )
    elif need > MEMORY_WARN_FRACTION * gpu:
        plan.warning(
            "per_device_train_batch_size",
            f"{what} is estimated at {_gib(need)} of {_gib(gpu)} ({need / gpu:.0%}): near the limit. On an "
            "out-of-memory error lower per_device_train_batch_size (and raise gradient_accumulation_steps and "
            "steps_per_generation to keep the batch).",
        )


def _precision(plan, args, model_args, launch, dtype, use_peft):
    if dtype not in ("bfloat16", "float16") or launch.deepspeed or use_peft:
        return
    lr = args.learning_rate
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


def _checkpoints(plan, args, model_args, launch, shape):
    rows = plan.section("Checkpoints")
    if args.save_strategy in ("no", None) or str(args.save_strategy).endswith("NO"):
        rows.append(("saves", "none (save_strategy no)"))
        return
    P = shape.num_params
    use_peft = bool(_get(model_args, "use_peft", False))
    dtype = str(_get(model_args, "dtype", None) or "float32")
    trainable = shape.lora_params(model_args.lora_r, model_args.lora_target_modules) if use_peft else P
    if launch.deepspeed:
        weights = (2 * trainable) if use_peft else 2 * P + 2 * P  # 16-bit model + DeepSpeed's model states
        states = 12 * trainable
    else:
        weights = (4 * trainable) if use_peft else DTYPE_BYTES.get(dtype, 4) * P
        states = 2 * (4 if use_peft else DTYPE_BYTES.get(dtype, 4)) * trainable
    if not use_peft and _get(args, "pacs_anchor") == "reference" and _get(args, "pacs_reference_reset_generations"):
        weights += 2 * P  # pi_ref's weights, once it has been reset
    size = weights + (0 if args.save_only_model else states)
    saves = (
        args.max_steps // args.save_steps if args.max_steps and args.max_steps > 0 and args.save_steps >= 1 else None
    )
    kept = args.save_total_limit
    rows += [
        (
            "one checkpoint",
            f"{size / GB:.1f} GB ({'weights only' if args.save_only_model else 'weights + optimizer states'})",
        ),
        ("saves", f"every {args.save_steps} steps: {saves if saves is not None else '?'} in the run"),
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


def _evaluation(plan, script_args, args, launch, shape, trainer, seq_tokens, C, steps_per_generation):
    rows = plan.section("In-training evaluation")
    if str(args.eval_strategy).lower().endswith("no"):
        rows.append(("evaluation", "off (eval_strategy no)"))
        return
    benchmark = _get(script_args, "eval_benchmark")
    problems = BENCHMARK_SIZES.get(benchmark)
    if problems is None:
        rows.append(("evaluation", f"{benchmark}: size unknown"))
        return
    limit = _get(script_args, "eval_limit")
    problems = min(problems, limit) if limit else problems
    W, TP = (
        launch.world_size,
        (args.vllm_tensor_parallel_size if args.use_vllm and args.vllm_mode == "colocate" else 1),
    )
    k = args.num_generations_eval or args.num_generations
    completions = problems * k
    per_call = args.per_device_eval_batch_size
    calls = math.ceil(completions / (per_call * W))
    step_s = 2 * shape.num_params / TP / DECODE_BYTES_PER_S  # one decoding step reads every weight once
    pushes = args.use_vllm and args.vllm_mode == "colocate" and args.vllm_enable_sleep_mode
    push_s = WEIGHT_PUSH_S_PER_GB * 2 * shape.num_params / GB if pushes else 0.0
    concurrent = plan.vllm.get("concurrent") or per_call
    eval_s = calls * (math.ceil(per_call * TP / max(concurrent, 1)) * C * step_s + push_s)
    train_s = _training_s_between_evaluations(
        args, shape, TP, seq_tokens, C, steps_per_generation, step_s, push_s, concurrent
    )
    evaluations = args.max_steps // args.eval_steps if args.max_steps and args.max_steps > 0 and args.eval_steps else 0
    rows += [
        (
            "one evaluation",
            f"{problems} {benchmark} problems x {k} = {completions} completions, per_device_eval_batch_size {per_call}",
        ),
        (
            "vLLM calls" if args.use_vllm else "generate calls",
            f"{calls} sequential per process, each up to {C} decoding steps"
            + (", each with a full weight push (sleep mode)" if pushes else ""),
        ),
        (
            "time",
            f"~{_human_s(eval_s)} per evaluation, {evaluations} in the run; ~{_human_s(train_s)} of training between "
            f"two (every {args.eval_steps} steps) (assumes {DECODE_BYTES_PER_S / 1e12:g} TB/s decoding, "
            f"{TRAIN_FLOPS_PER_S / 1e12:g} TFLOP/s training per GPU, full-length completions)",
        ),
    ]
    if train_s and eval_s > EVAL_WARN_FRACTION * train_s:
        fixes = _larger_eval_batch(shape, trainer, seq_tokens, completions, W, k, per_call)
        fraction = EVAL_WARN_FRACTION * train_s / eval_s
        if problems * fraction >= 1:
            fixes.append(f"eval_limit {int(problems * fraction)}")
        fixes.append(
            f"eval_steps {math.ceil(args.eval_steps / fraction / steps_per_generation) * steps_per_generation:g}"
        )
        fixes.append("eval_strategy no and `pacs eval` on the checkpoints")
        plan.warning(
            "per_device_eval_batch_size",
            f"evaluation costs ~{_human_s(eval_s)} every {args.eval_steps} steps against ~{_human_s(train_s)} of "
            f"training ({eval_s / train_s:.0%}): {calls} sequential vLLM calls of {per_call} completions"
            + (" with a weight push each" if pushes else "")
            + ". Any of: "
            + "; ".join(fixes)
            + ".",
        )


def _training_s_between_evaluations(args, shape, TP, seq_tokens, C, steps_per_generation, step_s, push_s, concurrent):
    """Training between two evaluations: the rollouts (waves of full-length decoding) + forward/backward."""
    gens = args.eval_steps / steps_per_generation if args.eval_steps else 0
    gen_batch = args.per_device_train_batch_size * TP * args.steps_per_generation
    rollout_s = math.ceil(gen_batch / max(concurrent, 1)) * C * step_s + push_s
    tokens_per_gen = gen_batch / TP * seq_tokens  # per process
    flops = (8 if args.gradient_checkpointing else 6) * shape.num_params * tokens_per_gen * args.num_iterations
    flops += 2 * shape.num_params * tokens_per_gen  # the old log-probabilities after each generation
    return gens * (rollout_s + flops / TRAIN_FLOPS_PER_S)


def _larger_eval_batch(shape, trainer, seq_tokens, completions, W, k, per_call) -> list[str]:
    """A larger per_device_eval_batch_size, if one fits: it means fewer sequential vLLM calls; it is bounded by the
    trainer's forward over it (no grad, one layer's transients at a time), which must fit where training fits."""
    one_call = math.ceil(completions / W / k) * k
    if trainer is None:
        return []
    h, q, kv, i = shape.hidden_size, shape.q_dim, shape.kv_dim, shape.mlp_width
    per_sequence = seq_tokens * (3 * h + q + 2 * kv + 3 * i) * 2
    fit = int((trainer.peak - trainer.persistent) // per_sequence) // k * k
    batch = min(one_call, fit)
    if batch <= per_call:
        return []
    return [
        f"per_device_eval_batch_size {batch} ({math.ceil(completions / (batch * W))} vLLM calls per "
        "process; its forward without grad fits in the training peak)"
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Entry points: the command line and the training script
# ---------------------------------------------------------------------------------------------------------------------


def plan_recipe(
    config: str,
    overrides: list[str] | tuple[str, ...] = (),
    accelerate_config: str | None = None,
    num_processes: int | None = None,
    num_machines: int | None = None,
    gpu_memory_gb: float | None = None,
    vllm_serve: str | None = None,
) -> Plan:
    """The plan of `config` (a shipped recipe's name or a path; + `overrides`, as on `pacs train`'s command line)
    launched with `accelerate_config`.

    Accelerate config: `accelerate_config`, else an `--accelerate_config` override, else the recipe's own
    `accelerate_config` key. World size: `num_processes`, else a `--num_processes` override, else the accelerate
    config's, else the recipe's `expected_world_size`, else 1. GPU memory: `gpu_memory_gb`, else the recipe's
    `expected_gpu_memory_gb`.
    """
    from ..train import read_recipe

    recipe = read_recipe(["--config", str(config), *overrides, "--use_cpu", "true"], prog="pacs plan")
    script_args, args, model_args = recipe.script_args, recipe.training_args, recipe.model_args
    accelerate_config = accelerate_config or recipe.accelerate_config
    launch = read_accelerate_config(accelerate_config) if accelerate_config else None
    launched = (
        _launch_option(recipe.launch_args, "--num_processes"),
        _launch_option(recipe.launch_args, "--num_machines"),
    )
    expected = _get(script_args, "expected_world_size")
    world_size = num_processes or launched[0] or (launch.world_size if launch else None) or expected or 1
    num_machines = num_machines or launched[1]
    if launch is None:
        launch = Launch(world_size=world_size, source="no accelerate config: plain processes")
    launch = dataclasses.replace(
        launch,
        world_size=world_size,
        num_machines=num_machines or launch.num_machines,
        gpu_memory_gib=gpu_memory_gb or _get(script_args, "expected_gpu_memory_gb"),
    )
    shape = (
        model_shape(model_args.model_name_or_path, model_args.model_revision)
        if model_args.model_name_or_path
        else None
    )
    serve = VllmServe.parse(vllm_serve) if vllm_serve else None
    return make_plan(script_args, args, model_args, launch, shape, serve)


def _launch_option(launch_args: list[str], name: str) -> int | None:
    """The integer value of an `accelerate launch` option (`--num_processes 4` or `--num-processes=4`)."""
    for i, arg in enumerate(launch_args):
        key, _, value = arg.partition("=")
        if key.lstrip("-").replace("-", "_") == name.lstrip("-") and (value or i + 1 < len(launch_args)):
            return int(value or launch_args[i + 1])
    return None


def check_training_plan(script_args, args, model_args) -> Plan:
    """The plan of the run being launched (`pacs train` calls it before any model loads): its own world size and
    DeepSpeed plugin, and the memory of GPU 0. Raises `ValueError` listing every failure."""
    import torch

    plugin = getattr(args, "deepspeed_plugin", None)
    gpu_gib = None
    if torch.cuda.is_available() and not args.use_cpu:
        gpu_gib = torch.cuda.get_device_properties(0).total_memory / GiB
    launch = Launch(
        world_size=args.world_size,
        zero_stage=plugin.zero_stage if plugin is not None else None,
        offload_optimizer=bool(plugin and plugin.offload_optimizer_device not in (None, "none")),
        offload_params=bool(plugin and plugin.offload_param_device not in (None, "none")),
        mixed_precision="bf16" if args.bf16 else "no",
        gpu_memory_gib=gpu_gib,
        source="this run",
    )
    try:
        shape = model_shape(model_args.model_name_or_path, model_args.model_revision)
    except Exception as error:  # an unknown model offline: the model-independent checks still run
        logger.warning("pacs plan: %s; the memory checks are skipped.", error)
        shape = None
    plan = make_plan(script_args, args, model_args, launch, shape)
    expected = _get(script_args, "expected_gpu_memory_gb")
    if gpu_gib is not None and expected and gpu_gib < 0.95 * expected:
        plan.warning(
            "expected_gpu_memory_gb",
            f"the recipe assumes GPUs of {expected:g} GiB, this one has {gpu_gib:.1f} GiB: check the plan with "
            f"`pacs plan --config <recipe> --gpu-memory-gb {gpu_gib:.0f}`.",
        )
    if getattr(args, "process_index", 0) == 0:
        for finding in plan.warnings:
            logger.warning("pacs plan: %s", finding)
    if plan.errors:
        raise ValueError(
            "This run cannot work as configured (`pacs plan` on the same recipe prints the whole plan):\n"
            + "\n".join(f"  {finding}" for finding in plan.errors)
        )
    return plan


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan",
        allow_abbrev=False,  # recipe overrides (--vllm_mode ...) must never pass for an abbreviation of an option
        help="Check a training recipe against its hardware before launching it.",
        description=(
            "Print what a recipe asks of the GPUs (batch, vLLM, memory, checkpoints, evaluation) and every problem "
            "found; exits 1 on a failure. Arguments it does not know are recipe overrides and launch keys, as on "
            "`pacs train`'s command line (e.g. --steps_per_generation 256)."
        ),
    )
    parser.add_argument("--config", required=True, help="The recipe: a shipped one's name (`pacs recipes`) or a path.")
    parser.add_argument(
        "--accelerate-config",
        help="The accelerate launch config (ZeRO stage, processes): a shipped one's name (zero3, ...) or a path; "
        "defaults to the recipe's accelerate_config.",
    )
    parser.add_argument("--num-processes", type=int, help="World size (defaults to the launch config's).")
    parser.add_argument("--num-machines", type=int, help="Machines (defaults to the launch config's).")
    parser.add_argument(
        "--gpu-memory-gb",
        type=float,
        help="Memory of one GPU, in GiB as the GPU reports it (defaults to the recipe's expected_gpu_memory_gb).",
    )
    parser.add_argument("--vllm-serve", help="The options of `trl vllm-serve` for vllm_mode server, in quotes.")
    parser.set_defaults(func=run, accepts_overrides=True)


def run(args) -> int:
    try:
        plan = plan_recipe(
            args.config,
            overrides=getattr(args, "overrides", []),
            accelerate_config=args.accelerate_config,
            num_processes=args.num_processes,
            num_machines=args.num_machines,
            gpu_memory_gb=args.gpu_memory_gb,
            vllm_serve=args.vllm_serve,
        )
    except (ValueError, FileNotFoundError) as error:  # a recipe, config or key that does not exist; a model unknown
        print(f"pacs plan: error: {error}", file=sys.stderr)
        return 2
    print(plan.render())  # the command's output
    return 1 if plan.errors else 0
