"""The model's shape: the sizes the estimates need, and its parameter counts.

Where a shape comes from, in this order:

1. a local model directory's `config.json`;
2. the Qwen3 table below, for the Qwen3 family (the shipped recipes' models): their plans are then the same on every
   machine, online or offline, whatever its HF cache holds;
3. a hub id's `config.json` in the local HF cache;
4. the hub, when online.

Wherever the config is on disk (1, 3, 4), the parameter counts are the model's own: transformers builds it from its
config on the meta device (`accelerate.init_empty_weights`: no memory, no weights) and its parameters are counted,
each tied matrix once. The Qwen3/Llama formula of `ModelShape` counts the table's models (exact for Qwen3: the tests
check it against published sizes and against a model built on the meta device), and any model whose architecture
transformers cannot build.

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
from dataclasses import dataclass
from pathlib import Path


logger = logging.getLogger(__name__)

LORA_TARGETS_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of a model built from its config on the meta device."""

    total: int  # every parameter once: tied input and output embeddings are one matrix
    lm_head: int  # the output projection (vocab x hidden); the input embedding where there is no head
    layer: int | None  # the largest decoder layer; None where the layers are not found


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that the estimates need (Qwen3 / Llama layout: GQA, SwiGLU MLP).

    The parameter counts are `counted` (the model built on the meta device) where set; else the Qwen3/Llama formula.
    """

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
    counted: ParamCounts | None = None

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
        if self.counted is not None and self.counted.layer is not None:
            return self.counted.layer
        h = self.hidden_size
        attention = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + 2 * self.head_dim  # + q_norm, k_norm
        if self.is_moe:
            mlp = self.num_experts * 3 * h * self.moe_intermediate_size + h * self.num_experts  # + router
        else:
            mlp = 3 * h * self.intermediate_size
        return attention + mlp + 2 * h  # + the two RMSNorms

    @property
    def embedding_params(self) -> int:
        """One vocab x hidden matrix (the LM head)."""
        return self.counted.lm_head if self.counted is not None else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        if self.counted is not None:
            return self.counted.total
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
    """The shape of `name_or_path`: its local `config.json`, the Qwen3 table, its `config.json` in the HF cache, or
    the hub's when online (the module's docstring says why in this order)."""
    local = Path(name_or_path) / "config.json"
    if local.is_file():
        return _shape_on_disk(local, name_or_path, revision, source=f"{local}")
    if Path(name_or_path).is_dir():  # a local folder without config.json: nothing to download, it is not a model
        raise ValueError(
            f"{name_or_path} is not a model folder: it has no config.json. Pass the folder that `save_pretrained` "
            "wrote, or a hub id such as 'Qwen/Qwen3-4B-Base'."
        )
    table = qwen3_table_shape(name_or_path)
    if table is not None:
        return table
    cached = _cached_config(name_or_path, revision)
    if cached is not None:
        return _shape_on_disk(cached, name_or_path, revision, source=f"the HF cache ({name_or_path})")
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        raise ValueError(
            f"The shape of {name_or_path!r} is unknown offline (HF_HUB_OFFLINE=1): pass a local model directory, "
            f"download its config.json into the HF cache (`hf download {name_or_path} config.json`), or run online "
            "so that its config.json can be read from the hub."
        )
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(name_or_path, "config.json", revision=revision)
    return _shape_on_disk(Path(path), name_or_path, revision, source=f"the hub ({name_or_path})")


def qwen3_table_shape(name_or_path: str) -> ModelShape | None:
    """The shape of a Qwen3 model from the table (its parameters by the formula), or None for another name."""
    match = re.fullmatch(
        r"qwen3-(0\.6b|1\.7b|4b|8b|14b|32b|30b-a3b)(-base|-instruct-2507|-thinking-2507)?",
        name_or_path.split("/")[-1].lower(),
    )
    if not match:
        return None
    context = {"-base": 32768, None: 40960}.get(match[2], 262144)
    fields = {**QWEN3_SHAPES[f"qwen3-{match[1]}"], "max_position_embeddings": context}
    return ModelShape(name=name_or_path, source="pacs.plan's Qwen3 table", **fields)


def _cached_config(repo_id: str, revision: str | None) -> Path | None:
    """The `config.json` of hub id `repo_id` in the local HF cache, if it is there."""
    from huggingface_hub import try_to_load_from_cache

    try:
        path = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except ValueError:  # not a hub id (a local path that does not exist, ...)
        return None
    return Path(path) if isinstance(path, str) else None


def _shape_on_disk(config_file: Path, name_or_path: str, revision: str | None, source: str) -> ModelShape:
    """The shape of a model whose `config_file` is on disk, with its parameters counted on the meta device."""
    shape = shape_from_config(json.loads(config_file.read_text()), name_or_path, source)
    return dataclasses.replace(shape, counted=count_parameters(name_or_path, revision))


def count_parameters(name_or_path: str, revision: str | None = None) -> ParamCounts | None:
    """The parameters of `name_or_path` (a local directory, or a hub id whose config is in the HF cache), counted on
    the model built from its config on the meta device; None where the config is not on disk or transformers cannot
    build the model (remote code is never run).

    Each parameter counts once: with tied embeddings the input embedding and the LM head are one matrix. transformers
    does not tie the weights of a model built under `init_empty_weights`, so they are tied here before counting.
    """
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    from .._compat import without_zero3_init

    try:
        config = AutoConfig.from_pretrained(name_or_path, revision=revision, local_files_only=True)
        with without_zero3_init(), init_empty_weights():  # zero.Init cannot partition meta tensors
            model = AutoModelForCausalLM.from_config(config)
        model.tie_weights()
    except Exception as error:  # not on disk, remote code, an architecture transformers does not know, ...
        logger.info("pacs plan: the parameters of %s come from the formula (%s)", name_or_path, error)
        return None
    unique = {id(p): p for p in model.parameters()}.values()
    head = model.get_output_embeddings()
    if head is None:
        head = model.get_input_embeddings()
    layers = getattr(model.base_model, "layers", None)
    return ParamCounts(
        total=sum(p.numel() for p in unique),
        lm_head=head.weight.numel(),
        layer=max(sum(p.numel() for p in layer.parameters()) for layer in layers) if layers else None,
    )
