"""The launch: processes, machines, DeepSpeed ZeRO stage and GPU memory, from an accelerate config and the recipe
(`pacs plan`) or from the run itself (`pacs train`); and the `trl vllm-serve` command of a server-mode run."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from .report import GiB


@dataclass(frozen=True)
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

    def describe(self) -> str:
        """One line: processes, machines, the backend and its offloads, and where the launch comes from."""
        backend = f"DeepSpeed ZeRO-{self.zero_stage}" if self.deepspeed else "no DeepSpeed (DDP or one process)"
        if self.offload_optimizer or self.offload_params:
            backend += ", offload " + "+".join(
                name for name, on in (("optimizer", self.offload_optimizer), ("params", self.offload_params)) if on
            )
        where = f" ({self.source})" if self.source else ""
        return f"{self.world_size} processes on {self.num_machines} machine(s), {backend}{where}"


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


def recipe_launch(
    recipe,
    accelerate_config: str | None = None,
    num_processes: int | None = None,
    num_machines: int | None = None,
    gpu_memory_gb: float | None = None,
) -> Launch:
    """The launch of `recipe` (a `pacs.recipes.reader.Recipe`), as `plan_recipe` documents: each setting from the first of the
    argument, the recipe's launch keys, the accelerate config, the recipe's own `expected_*` keys."""
    script_args = recipe.script_args
    accelerate_config = accelerate_config or recipe.accelerate_config
    launch = read_accelerate_config(accelerate_config) if accelerate_config else None
    launched = (
        launch_option(recipe.launch_args, "--num_processes"),
        launch_option(recipe.launch_args, "--num_machines"),
    )
    expected = getattr(script_args, "expected_world_size", None)
    world_size = num_processes or launched[0] or (launch.world_size if launch else None) or expected or 1
    num_machines = num_machines or launched[1]
    if launch is None:
        launch = Launch(world_size=world_size, source="no accelerate config: plain processes")
    return dataclasses.replace(
        launch,
        world_size=world_size,
        num_machines=num_machines or launch.num_machines,
        gpu_memory_gib=gpu_memory_gb or getattr(script_args, "expected_gpu_memory_gb", None),
    )


def launch_option(launch_args: list[str], name: str) -> int | None:
    """The integer value of an `accelerate launch` option (`--num_processes 4` or `--num_processes=4`)."""
    for i, arg in enumerate(launch_args):
        key, _, value = arg.partition("=")
        if key.lstrip("-").replace("-", "_") == name.lstrip("-") and (value or i + 1 < len(launch_args)):
            return int(value or launch_args[i + 1])
    return None


def this_launch(args) -> Launch:
    """The launch of the run in progress (`args`: its `PACSConfig` / `GRPOConfig`): its world size, its DeepSpeed
    plugin, and the memory of GPU 0 (None on CPU)."""
    import torch

    plugin = getattr(args, "deepspeed_plugin", None)
    gpu_gib = None
    if torch.cuda.is_available() and not args.use_cpu:
        gpu_gib = torch.cuda.get_device_properties(0).total_memory / GiB
    return Launch(
        world_size=args.world_size,
        zero_stage=plugin.zero_stage if plugin is not None else None,
        offload_optimizer=bool(plugin and plugin.offload_optimizer_device not in (None, "none")),
        offload_params=bool(plugin and plugin.offload_param_device not in (None, "none")),
        mixed_precision="bf16" if args.bf16 else "no",
        gpu_memory_gib=gpu_gib,
        source="this run",
    )


@dataclass(frozen=True)
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
