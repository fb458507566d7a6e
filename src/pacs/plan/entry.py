"""The entry points: `make_plan` (one run's plan), `plan_recipe` and the `pacs plan` command, and
`check_training_plan` (what `pacs train` runs before any model loads)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from .batch import batch_section, run_section, world_size_check
from .evaluation import evaluation_section
from .launch import Launch, VllmServe, recipe_launch, this_launch
from .memory import checkpoints_section, memory_limit, precision_check, training_memory
from .padding import padding_section
from .report import GiB, Plan
from .resolve import Run, resolve_run
from .shape import ModelShape, model_shape
from .vllm import vllm_section


logger = logging.getLogger(__name__)


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
    return plan_run(resolve_run(script_args, args, model_args, launch, shape, vllm_serve))


def plan_run(run: Run) -> Plan:
    """The plan of a resolved run: its sections in order, every problem found along the way."""
    plan = Plan()
    # 1. The run, and the world size its batch was written for
    run_section(plan, run)
    world_size_check(plan, run, replan=plan_run)  # its suggested fixes re-planned before they are printed
    # 2. Batch arithmetic
    batch_section(plan, run)
    # 3. What the forwards compute: padded (TRL) or packed (`padding_free`), and the packed row's attention mask
    padding_section(plan, run)
    # 4. Training memory (needs the shape)
    trainer = training_memory(plan, run) if run.shape is not None else None
    # 5. vLLM (a colocated engine shares the GPU memory with training, so it checks the memory limit itself)
    gpu = run.launch.gpu_memory_gib * GiB if run.launch.gpu_memory_gib else None
    if trainer is not None and gpu and not run.colocated:
        memory_limit(plan, trainer.peak, gpu, "training")
    if run.use_vllm:
        plan.vllm = vllm_section(plan, run, trainer)
    # 6. bf16 weights without fp32 master weights
    precision_check(plan, run)
    # 7. Checkpoints and evaluation (need the shape)
    if run.shape is not None:
        checkpoints_section(plan, run)
        evaluation_section(plan, run, trainer, plan.vllm.get("concurrent"))
    return plan


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
    from ..recipes.reader import check_inputs, read_recipe  # imports TRL: not at module level

    recipe = read_recipe(["--config", str(config), *overrides, "--use_cpu", "true"], prog="pacs plan")
    # what `pacs train` refuses first (a model, the data file, the rewards), the checkpoint aside
    check_inputs(recipe.script_args, recipe.training_args, recipe.model_args)
    launch = recipe_launch(recipe, accelerate_config, num_processes, num_machines, gpu_memory_gb)
    model_args = recipe.model_args
    shape = (
        model_shape(model_args.model_name_or_path, model_args.model_revision)
        if model_args.model_name_or_path
        else None
    )
    serve = VllmServe.parse(vllm_serve) if vllm_serve else None
    return make_plan(recipe.script_args, recipe.training_args, model_args, launch, shape, serve)


def check_training_plan(script_args, args, model_args) -> Plan:
    """The plan of the run being launched (`pacs train` calls it before any model loads): its own world size and
    DeepSpeed plugin, and the memory of GPU 0. Raises `ValueError` listing every failure."""
    launch = this_launch(args)
    try:
        shape = model_shape(model_args.model_name_or_path, model_args.model_revision)
    except Exception as error:  # an unknown model offline: the model-independent checks still run
        logger.warning("pacs plan: %s; the memory checks are skipped.", error)
        shape = None
    plan = make_plan(script_args, args, model_args, launch, shape)
    expected = getattr(script_args, "expected_gpu_memory_gb", None)
    gpu_gib = launch.gpu_memory_gib
    if gpu_gib is not None and expected and gpu_gib < 0.95 * expected:
        plan.warning(
            "expected_gpu_memory_gb",
            f"the recipe assumes GPUs of {expected:g} GiB, this one has {gpu_gib:.1f} GiB: check the plan with "
            f"`pacs plan --config <recipe> --gpu_memory_gb {gpu_gib:.0f}`.",
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


@dataclass
class PlanArguments:
    """
    The options of `pacs plan` itself; every other option is a recipe override or a launch key, as on `pacs train`'s
    command line (`--steps_per_generation 256`).

    Args:
        recipe (`str`):
            The recipe, `--config RECIPE` as on `pacs train`: a shipped one's name (`pacs recipes`) or a path.
            (`--recipe` is the same option: TRL's parser keeps the field name `config` for a file of options.)
        accelerate_config (`str`, *optional*):
            The accelerate launch config (ZeRO stage, processes): a shipped one's name (`zero3`, ...) or a path;
            defaults to the recipe's `accelerate_config`.
        num_processes (`int`, *optional*):
            World size; defaults to the launch config's, else the recipe's `expected_world_size`.
        num_machines (`int`, *optional*):
            Machines; defaults to the launch config's.
        gpu_memory_gb (`float`, *optional*):
            Memory of one GPU, in GiB as the GPU reports it; defaults to the recipe's `expected_gpu_memory_gb`.
        vllm_serve (`str`, *optional*):
            The options of `trl vllm-serve` for `vllm_mode: server`, in quotes.
    """

    recipe: str = field(
        metadata={
            "aliases": ["--config"],
            "help": "The recipe (--config, as on `pacs train`): a shipped one's name (`pacs recipes`) or a path.",
        }
    )
    accelerate_config: str | None = field(
        default=None,
        metadata={
            "help": "The accelerate launch config (ZeRO stage, processes): a shipped one's name (zero3, ...) or a "
            "path; defaults to the recipe's accelerate_config."
        },
    )
    num_processes: int | None = field(default=None, metadata={"help": "World size (defaults to the launch config's)."})
    num_machines: int | None = field(default=None, metadata={"help": "Machines (defaults to the launch config's)."})
    gpu_memory_gb: float | None = field(
        default=None,
        metadata={
            "help": "Memory of one GPU, in GiB as the GPU reports it (defaults to the recipe's expected_gpu_memory_gb)."
        },
    )
    vllm_serve: str | None = field(
        default=None, metadata={"help": "The options of `trl vllm-serve` for vllm_mode server, in quotes."}
    )


DESCRIPTION = (
    "Print what a recipe asks of the GPUs (batch, vLLM, memory, checkpoints, evaluation) and every problem found; "
    "exits 1 on a failure, 2 on a recipe, config, key or model that is unknown. Arguments it does not know are recipe "
    "overrides and launch keys, as on `pacs train`'s command line (e.g. --steps_per_generation 256)."
)


def add_parser(subparsers) -> None:
    """Register `pacs plan`; its options are [`PlanArguments`], read by `pacs.options.CommandParser` when it runs."""
    parser = subparsers.add_parser(
        "plan",
        add_help=False,  # `pacs plan --help` is the dataclass parser's
        help="Check a training recipe against its hardware before launching it.",
        description=DESCRIPTION,
    )
    parser.set_defaults(func=run, accepts_overrides=True)


def make_parser():
    """`pacs plan`'s option parser: [`PlanArguments`] through `pacs.options.CommandParser`."""
    from ..options import CommandParser

    usage = (
        "%(prog)s --config RECIPE [--accelerate_config NAME_OR_PATH] [--num_processes N] [--num_machines N] "
        "[--gpu_memory_gb G] [--vllm_serve 'OPTIONS'] [--KEY VALUE ...]"
    )  # spelled as on `pacs train` (`--recipe` is the same option: TRL's parser keeps `config` for a file)
    return CommandParser(PlanArguments, prog="pacs plan", usage=usage, description=DESCRIPTION)


def run(args) -> int:
    """`pacs plan`: print the plan; exit 0, 1 on a failure found (`pacs.cli` answers a recipe, config or model that is
    unknown with one line, exit 2)."""
    options, overrides = make_parser().parse_args_into_dataclasses(
        list(getattr(args, "overrides", [])), return_remaining_strings=True
    )
    plan = plan_recipe(
        options.recipe,
        overrides=overrides,
        accelerate_config=options.accelerate_config,
        num_processes=options.num_processes,
        num_machines=options.num_machines,
        gpu_memory_gb=options.gpu_memory_gb,
        vllm_serve=options.vllm_serve,
    )
    print(plan.render())  # the command's output
    return 1 if plan.errors else 0
