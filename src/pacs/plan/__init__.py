"""`pacs plan`: what a recipe will ask of the GPUs, checked before a GPU is spent.

`pacs plan --config RECIPE [--accelerate_config FILE] [--num_processes N] [--gpu_memory_gb G] [overrides ...]` reads
the recipe (a shipped one by name, or a path) with `pacs train`'s own reader (`pacs.recipes.reader.read_recipe`: the same
overrides and launch keys), the accelerate config the recipe names (its `accelerate_config` key; DeepSpeed ZeRO stage,
processes, machines) unless told another, and the model's shape (a local directory's `config.json`; the Qwen3 family
from a table; another hub id's `config.json` from the HF cache, or from the hub when online), and prints the resolved
plan: batch arithmetic, what TRL asks of vLLM, the KV cache against the generation batch, a per-GPU memory estimate,
checkpoints on disk and the cost of one in-training evaluation. It reports every problem it finds, each naming the
setting and a value that works, and exits non-zero on a failure.

`pacs train` runs the same checks (`check_training_plan`) at start, before any model loads.

The memory and time figures are estimates (the constants are named in the modules that use them): they are meant to
catch settings that cannot work, an order of magnitude off, not to replace a profiler. What is exact: the batch
arithmetic, what TRL passes to vLLM (`trl/trainer/grpo_trainer.py`, `trl/generation/vllm_generation.py` of TRL 1.16),
parameter counts and the KV cache's bytes per token.

The modules, in the order a plan is made:

- `shape`: the model's sizes and parameter counts (`model_shape`);
- `launch`: processes, machines, DeepSpeed, GPU memory (`Launch`), and a vLLM server's command (`VllmServe`);
- `resolve`: the run resolved once from the recipe's parsed arguments into one frozen `Run`, which every part reads;
- `report`: the printed `Plan`, its sections and its findings;
- `batch`, `memory`, `vllm`, `evaluation`: one part of the plan each, with its checks;
- `entry`: `make_plan`, `plan_recipe` and the `pacs plan` command, `check_training_plan` for `pacs train`.

>>> shape = model_shape("Qwen/Qwen3-8B-Base")
>>> round(shape.num_params / 1e9, 2), shape.kv_bytes_per_token()
(8.19, 147456)
"""

from .._compat import TRL_MAX_NUM_BATCHED_TOKENS
from .entry import add_parser, check_training_plan, make_plan, plan_recipe, plan_run, run
from .launch import Launch, VllmServe, read_accelerate_config
from .report import GB, Finding, GiB, Plan
from .resolve import Run, batch_arithmetic, resolve_run
from .shape import QWEN3_SHAPES, ModelShape, ParamCounts, count_parameters, model_shape, shape_from_config


__all__ = [
    "GB",
    "QWEN3_SHAPES",
    "TRL_MAX_NUM_BATCHED_TOKENS",
    "Finding",
    "GiB",
    "Launch",
    "ModelShape",
    "ParamCounts",
    "Plan",
    "Run",
    "VllmServe",
    "add_parser",
    "batch_arithmetic",
    "check_training_plan",
    "count_parameters",
    "make_plan",
    "model_shape",
    "plan_recipe",
    "plan_run",
    "read_accelerate_config",
    "resolve_run",
    "run",
    "shape_from_config",
]
