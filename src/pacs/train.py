"""`pacs train`: train with PACS (arXiv:2509.02522), or hardened GRPO, from a YAML recipe, as `trl grpo` does.

Every run is `--config RECIPE` plus command-line overrides (`--learning_rate 2e-6`, `--max_steps 10`, ...). A recipe
is a shipped one by name (`pacs recipes` lists them) or a YAML file by path (a path that exists wins). Its keys are
the fields of [`ScriptArguments`] below, of `pacs.PACSConfig` (`pacs.grpo.HardenedGRPOConfig` for `algorithm: grpo`)
and of TRL's `ModelConfig`, parsed by `TrlParser`, so `--config`, the help texts and the recipes come from one
definition; plus the launch keys: `accelerate_config` and the options of `accelerate launch` (`--num_processes 4`,
...). Any other key is an error that names the closest valid ones.

How it launches (TRL's convention: the launcher launches, the script trains, as `trl grpo` and `trl/scripts/grpo.py`):
[`main`] trains in its own process; `python -m pacs.train ...` and `examples/train_qwen.py` run it (on every rank of
an `accelerate launch`, where the launch keys are set aside), and Python calls it with the argument dataclasses
([`parse_args`] reads them). `pacs train` ([`train_command`]) reads the command line once and, when the recipe or the
command line names an `accelerate_config` (a shipped one by name: `zero3`, `zero2`, `ddp`, `zero3_multinode`,
`zero3_hostfile`; or a path) or launch options, runs `accelerate launch --config_file <it> [launch options] -m
pacs.train <the command line>`; without them, it runs `main` in this process. Before any model loads, the run checks
itself as `pacs plan` does (`pacs.plan.check_training_plan`).

Check a launch before spending a GPU (the same checks; docs/recipes.md):

    pacs plan --config qwen3_4b_pacs

CPU smoke run, offline, in seconds, against a local model directory (the tiny model the tests build):

    python -c "from pacs.testing import build_tiny_model; build_tiny_model('/tmp/tiny-qwen3')"
    HF_HUB_OFFLINE=1 pacs train --config tiny_cpu --model_name_or_path /tmp/tiny-qwen3

One node, 8 GPUs, DeepSpeed ZeRO-3 (the recipe's `accelerate_config: zero3`), vLLM colocated (the paper's setting):

    pacs train --config qwen3_4b_pacs

Two nodes x 8 GPUs (the same command on every node, with that node's rank; the 8B recipe assumes 16 processes):

    pacs train --config qwen3_8b_pacs --num_machines 2 --num_processes 16 --machine_rank $NODE_RANK \
        --main_process_ip $MASTER_ADDR --main_process_port 29500

Resume from the newest complete checkpoint in `output_dir` with `--resume_from_checkpoint true`, or give a checkpoint
folder (docs/recipes.md, "Resuming after a crash"). Models load by hub id or local path, without running code from the
hub unless `--trust_remote_code true`.
"""

import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from trl import GRPOConfig, ModelConfig, get_peft_config

from pacs.data import drop_long_prompts, load_benchmark, load_train_dataset
from pacs.grpo.checkpoints import run_identity
from pacs.grpo.checks import MissingColumnError, check_trainer_datasets, reward_keywords
from pacs.grpo.resume import Resume, resume_decision
from pacs.plan import batch_arithmetic, check_training_plan
from pacs.recipes.reader import (  # noqa: F401 (ScriptArguments, Recipe, make_parser: `pacs.train`'s public names)
    ALGORITHMS,
    Recipe,
    ScriptArguments,
    check_inputs,
    launch_setting,
    make_parser,
    read_recipe,
)
from pacs.rewards import get_reward_funcs
from pacs.run_lock import (
    check_output_dir,
    clear_for_fresh_start,
    hold_output_dir,
    release_output_dir,
    stop_with_launcher,
)


logger = logging.getLogger(__name__)


def load_datasets(script_args: ScriptArguments, training_args: GRPOConfig, keep_columns: Sequence[str] = ()):
    """The training set (`--dataset_name`: the math format, `problem`/`answer`, or TRL's, a `prompt` column and the
    columns the rewards take; `keep_columns` of a math-format file are kept too) and the evaluation set
    (`--eval_benchmark`, when `eval_strategy` is on)."""
    train_dataset = load_train_dataset(
        script_args.dataset_name,
        problem_column=script_args.problem_column,
        answer_column=script_args.answer_column,
        limit=script_args.dataset_limit or None,
        prompt_suffix=script_args.prompt_suffix,
        system_prompt=script_args.system_prompt or None,
        keep_columns=keep_columns,
    )
    eval_dataset = None
    if training_args.eval_strategy != "no":
        if script_args.eval_benchmark is None:
            raise ValueError(
                f"eval_strategy is {training_args.eval_strategy!r} but there is nothing to evaluate on: pass "
                "--eval_benchmark math500 (or aime24, aime25, amc23), or --eval_strategy no."
            )
        eval_dataset = load_benchmark(
            script_args.eval_benchmark, limit=script_args.eval_limit, system_prompt=script_args.system_prompt or None
        )
    return train_dataset, eval_dataset


def load_inputs(script_args: ScriptArguments, training_args: GRPOConfig, model_args: ModelConfig | None = None):
    """The reward functions and the data, checked against each other (`pacs.grpo.checks`): the columns each reward
    takes are kept and must be there, and `prompt` must be. With `model_args`, the training prompts longer than
    `max_prompt_tokens` are dropped first (this needs the tokenizer). Returns the training set, the evaluation set
    and the reward functions; every refusal is a `ValueError` of one message."""
    reward_funcs = get_reward_funcs(
        script_args.reward_funcs, training_args.max_completion_length, script_args.soft_punish_cache
    )
    train_dataset, eval_dataset = load_datasets(script_args, training_args, reward_keywords(reward_funcs))
    if model_args is not None and script_args.max_prompt_tokens is not None:  # the paper filters overlong prompts
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            model_args.model_name_or_path,
            revision=model_args.model_revision,
            trust_remote_code=training_args.trust_remote_code,
        )
        train_dataset = drop_long_prompts(
            train_dataset, tokenizer, script_args.max_prompt_tokens, training_args.chat_template_kwargs
        )
    datasets = {"train_dataset": train_dataset, "eval_dataset": eval_dataset}
    try:
        check_trainer_datasets({k: v for k, v in datasets.items() if v is not None}, reward_funcs, training_args)
    except MissingColumnError as error:  # the layer's fix is Python's; a data file's, from the command line:
        raise MissingColumnError(f"{error} {_missing_column_fix(script_args)}") from error
    return train_dataset, eval_dataset, reward_funcs


def _missing_column_fix(script_args: ScriptArguments) -> str:
    """What a `pacs train` user with a data file does about a column a reward needs."""
    return (
        f"From the command line or the recipe: add that key to every row of {script_args.dataset_name}; or, when the "
        "reward wants the gold answer (`solution`), name the column that holds it with --answer_column COLUMN (and "
        "the problem's with --problem_column COLUMN; recipe keys answer_column, problem_column); or pass --reward_funcs "
        "a reward whose parameters are the file's columns (mymodule.my_reward, from the working directory)."
    )


def prepare(script_args: ScriptArguments, training_args: GRPOConfig, model_args: ModelConfig):
    """Everything before the model loads, where every ordinary mistake is a `ValueError` (or `FileNotFoundError`) of
    one message: the inputs, the plan, the resume decision, the data and rewards checked against each other. Returns
    the training set, the evaluation set, the reward functions and the resume decision (`pacs.grpo.resume.Resume`)."""
    if "LOCAL_RANK" in os.environ:  # a launched worker: it stops when its launcher is gone (`pacs.run_lock`)
        stop_with_launcher()
    check_inputs(script_args, training_args, model_args)
    # before any model loads: what `pacs plan` checks (batch, vLLM's limits, precision, memory) on this run's hardware
    try:
        check_training_plan(script_args, training_args, model_args)
    except ValueError:
        if script_args.check_plan:
            raise
        logger.exception("check_plan is false: training despite the plan's failures")

    # the output folder's lock, and how this process's run resumes (an elastic restart: the newest complete
    # checkpoint), or a refusal; decided once here and handed to the trainer
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    first_process = training_args.process_index == 0
    resume = _decide(script_args, training_args, model_args.model_name_or_path, world_size, first_process)

    # 1. The model is loaded by the trainer from its id or path, so that ZeRO-3 can shard it while it loads.
    model_init_kwargs = {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs

    # 2. Data and rewards: TRL hands every column of the data to every reward function as a keyword argument (the
    # math format's gold answers sit in `solution`); checked against each other here (the trainer checks them again,
    # `pacs.grpo.checks`, for users who build it themselves).
    return (*load_inputs(script_args, training_args, model_args), resume)


def main(script_args: ScriptArguments, training_args: GRPOConfig, model_args: ModelConfig) -> None:
    """Train in this process: the checks, the data and rewards (`prepare`), the trainer, `train()`, the saved model.

    The one training entry point, as `main` is in TRL's `trl/scripts/grpo.py`: Python calls it with the three argument
    dataclasses ([`parse_args`] reads them from a command line), `python -m pacs.train` and `examples/train_qwen.py`
    run it on every rank of a launch, and `pacs train` runs it here when there is nothing to launch. The output
    folder's lock is released once, when it returns or raises (a process that exits releases it anyway)."""
    try:
        train(script_args, training_args, model_args, *prepare(script_args, training_args, model_args))
    finally:
        release_output_dir(training_args.output_dir)


def train(script_args, training_args, model_args, train_dataset, eval_dataset, reward_funcs, resume: Resume) -> None:
    """The trainer (PACS, or the GRPO baseline on identical arguments and the same hardened layer) on what `prepare`
    returned, `train()` as `resume` says, the saved model."""
    trainer_cls = ALGORITHMS[script_args.algorithm].trainer_class()
    trainer = trainer_cls(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=get_peft_config(model_args),
    )
    _log_run(trainer, script_args.algorithm, len(train_dataset))
    _train_and_save(trainer, script_args, training_args, resume)


def _decide(script_args, training_args, model: str, world_size: int, first_process: bool, launcher: bool = False):
    """The output folder's lock (`pacs.run_lock`: the run's first process takes it; a launching process only checks
    it), its overwrite policy (a fresh start with `overwrite_output_dir`: the first process deletes the old
    checkpoints), then the resume decision (`pacs.grpo.resume.resume_decision`), once. Returns the decision
    (`Resume`); raises `OutputDirInUse` or `ResumeRefused` (one line; `pacs train` exits 2)."""
    if first_process:
        lock = check_output_dir if launcher else hold_output_dir
        lock(training_args.output_dir, training_args.ddp_timeout)
    setting = training_args.resume_from_checkpoint
    clear_for_fresh_start(training_args.output_dir, setting, script_args.overwrite_output_dir, delete=first_process)
    identity = run_identity(model, world_size, training_args)
    return resume_decision(setting, training_args, identity, verbose=first_process)


def _train_and_save(trainer, script_args: ScriptArguments, training_args: GRPOConfig, resume: Resume) -> None:
    # 4. Train as this process's resume decision says (`prepare`); a run whose checkpoint is already at max_steps
    #    trains nothing and keeps its final model (pacs.grpo.resume).
    trainer.train(resume_from_checkpoint=resume)

    # 5. Save (LoRA: the adapter; ZeRO-3: the gathered 16-bit weights) and push like any TRL script.
    if not resume.finished:
        trainer.save_model(training_args.output_dir)
        if trainer.accelerator.is_main_process:
            logger.info("Model saved to %s", os.path.abspath(training_args.output_dir))
        if training_args.push_to_hub:
            trainer.push_to_hub(dataset_name=script_args.dataset_name)
    if hasattr(trainer, "end"):  # transformers >= 5.18: finish the trackers and destroy the process group
        trainer.end()


def _log_run(trainer, algorithm: str, problems: int) -> None:
    """One line on what trains where: the backend (DeepSpeed stage, processes) and TRL's batch arithmetic."""
    if not trainer.accelerator.is_main_process:
        return
    state = trainer.accelerator.state
    stage = state.deepspeed_plugin.zero_stage if trainer.is_deepspeed_enabled else None
    backend = f"DeepSpeed ZeRO-{stage}" if stage is not None else "no DeepSpeed"
    batch = batch_arithmetic(trainer.args)
    logger.info(
        "%s on %d training problems, %d process(es), %s: %d completions per generation, %d per optimizer step, "
        "%g optimizer steps per generation",
        algorithm, problems, state.num_processes, backend, batch["completions_per_generation"],
        batch["completions_per_optimizer_step"], batch["optimizer_steps_per_generation"],
    )  # fmt: skip


def parse_args(
    argv: list[str] | None = None, prog: str = "python -m pacs.train"
) -> tuple[ScriptArguments, GRPOConfig, ModelConfig]:
    """The three argument dataclasses of a training command line (`sys.argv[1:]` by default) for [`main`]: the recipe
    and its overrides. The launch keys are set aside (a launched process trains as launched; outside a launch they are
    named in a warning). Raises `ValueError` (one message) on a mistake."""
    recipe = read_recipe(argv, prog=prog)
    if recipe.launch_args and "LOCAL_RANK" not in os.environ:
        logger.warning(
            "%s are options of `accelerate launch`: this process trains as launched and ignores them (use "
            "`pacs train`, which launches accelerate, or pass them to `accelerate launch`).",
            " ".join(recipe.launch_args),
        )
    return recipe.script_args, recipe.training_args, recipe.model_args


# ---------------------------------------------------------------------------------------------------------------------
# `pacs train`: the launcher. It reads the command line once, checks it, and launches `accelerate launch -m
# pacs.train <the same command line>` when the recipe or the command line names a launch; otherwise (or inside a
# launched process) it runs `main` here.
# ---------------------------------------------------------------------------------------------------------------------


def check_launch(recipe: Recipe) -> None:
    """What the accelerate launch needs, before it starts: DeepSpeed, for a config that launches it."""
    import yaml

    if recipe.accelerate_config is None:
        return
    config = yaml.safe_load(Path(recipe.accelerate_config).read_text()) or {}
    if config.get("distributed_type") != "DEEPSPEED" and not config.get("deepspeed_config"):
        return
    if importlib.util.find_spec("deepspeed") is None:
        stage = (config.get("deepspeed_config") or {}).get("zero_stage", "?")
        raise ValueError(
            f"The launch config {recipe.accelerate_config} runs DeepSpeed ZeRO-{stage}, which is not installed: "
            "pip install 'trl-pacs[deepspeed]' (or launch with --accelerate_config ddp, or none, on one GPU)."
        )


def launch(recipe: Recipe) -> None:
    """`accelerate launch --config_file <accelerate_config> [launch options] -m pacs.train <the command line>`, in this
    process, as TRL's `trl grpo` (trl/cli/accelerate_launcher.py). The launched script reads the launch keys of the
    command line and sets them aside, so the command line goes to it whole."""
    from accelerate.commands.launch import launch_command, launch_command_parser

    config = ["--config_file", str(recipe.accelerate_config)] if recipe.accelerate_config else []
    command = [*config, *recipe.launch_args, *_restart_options(recipe), "--module", "pacs.train", *recipe.argv]
    logger.info("accelerate launch %s", " ".join(command))
    launch_command(launch_command_parser().parse_args(command))


def _restart_options(recipe: Recipe) -> list[str]:
    """With `max_restarts` > 0: the c10d rendezvous on the command line (accelerate takes `rdzv_backend` from its
    config file only when the command line leaves it unset, and its default, `static`, is always set) and the
    environment torchrun's agent needs to restart a worker group (`pacs._compat.elastic_restart_env`)."""
    if int(launch_setting(recipe, "max_restarts", 0)) <= 0:
        return []
    import torch

    from pacs._compat import elastic_restart_env

    backend = launch_setting(recipe, "rdzv_backend")
    given = launch_setting(recipe, "rdzv_backend", config_file=False) is not None
    if given and backend != "c10d":
        logger.warning("rdzv_backend %s with max_restarts: a restarted worker group may hang; use c10d.", backend)
    ip = launch_setting(recipe, "main_process_ip") or "127.0.0.1"
    port = launch_setting(recipe, "main_process_port") or 29500
    for key, value in elastic_restart_env(torch.__version__, f"{ip}:{port}").items():
        os.environ.setdefault(key, value)
    return [] if given else ["--rdzv_backend", "c10d"]


def _check_before_launch(recipe: Recipe) -> None:
    """The launching process's resume decision, once here before anything starts, with machine 0's check that no
    live run holds the output folder (a refusal: exit 2, one line); the run's first process takes the lock."""
    first_machine = int(launch_setting(recipe, "machine_rank", 0)) == 0
    if not first_machine and recipe.script_args.overwrite_output_dir:
        return  # machine 0 decides what to delete
    world_size = int(launch_setting(recipe, "num_processes", 1))
    model = recipe.model_args.model_name_or_path or ""
    _decide(recipe.script_args, recipe.training_args, model, world_size, first_process=first_machine, launcher=True)


def train_command(argv: list[str]) -> int:
    """`pacs train ...` (registered in `pacs.cli`, which reports its `ValueError`s in one line, exit 2): `argv` is the
    whole command line after `train`, read once.

    Every ordinary mistake ends here, before the model loads or accelerate launches. The working directory is
    importable, as under `python -m`, so that `--reward_funcs mymodule.fn` finds `./mymodule.py`."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    recipe = read_recipe(argv)
    # inside a launched process (`accelerate launch ... pacs train`), or nothing to launch: the script's main, here
    if "LOCAL_RANK" in os.environ or (recipe.accelerate_config is None and not recipe.launch_args):
        main(recipe.script_args, recipe.training_args, recipe.model_args)
        return 0
    # the ranks check again, with their own view of the run (world size, GPU memory)
    check_inputs(recipe.script_args, recipe.training_args, recipe.model_args)
    check_launch(recipe)
    load_inputs(recipe.script_args, recipe.training_args)  # the data against the rewards, once, here
    _check_before_launch(recipe)  # the resume decision (or its refusal), once, before anything starts
    launch(recipe)
    return 0


if __name__ == "__main__":
    from pacs.options import run_command  # (the package's modules, not a second copy of this one as __main__)
    from pacs.train import main as _main
    from pacs.train import parse_args as _parse_args

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(run_command("python -m pacs.train", lambda: _main(*_parse_args())))
