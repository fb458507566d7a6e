"""The plan's first two sections: what runs (model, launch, GPU memory, shape) and TRL's batch arithmetic; and the
check that the launch has the world size the recipe's batch was written for."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .report import Plan
from .resolve import Run, batch_arithmetic


def run_section(plan: Plan, run: Run) -> None:
    rows = plan.section("Run")
    launch, shape = run.launch, run.shape
    training = f"LoRA r={run.lora_r}" if run.use_peft else "full fine-tuning"
    rows += [
        ("algorithm", run.algorithm),
        ("model", f"{run.model_name_or_path} ({training}, dtype {run.dtype})"),
        ("launch", launch.describe()),
        (
            "GPU memory",
            f"{launch.gpu_memory_gib:g} GiB per GPU" if launch.gpu_memory_gib else "unknown (pass --gpu_memory_gb)",
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


def world_size_check(plan: Plan, run: Run, replan: Callable[[Run], Plan] | None = None) -> None:
    """A launch on another world size than the recipe's changes its batch: refuse it, saying how to keep the batch
    (the completions per generation and per optimizer step both scale as 1 / world size) or accept the new one.

    `replan` (the whole plan of a run, `plan_run`) re-plans each suggested fix before it is printed: a fix whose plan
    fails on a setting that the plan of accepting the new batch does not is named as refused, never as a way out
    (the paper's batch on 1 process needs max_num_seqs 8192, which vLLM refuses)."""
    expected, W = run.expected_world_size, run.world_size
    if expected is None or expected == W:
        return
    intended, actual = batch_arithmetic(run, expected), batch_arithmetic(run, W)
    ga, spg = expected * run.gradient_accumulation_steps / W, expected * run.steps_per_generation / W
    rescale = f"--gradient_accumulation_steps {ga:g} --steps_per_generation {spg:g} --expected_world_size {W}"
    refused = _refused_by_its_plan(run, replan, int(ga), int(spg)) if ga.is_integer() and spg.is_integer() else []
    if not (ga.is_integer() and spg.is_integer()):
        keep = (
            f"or keep the recipe's batch on {W}: a per_device_train_batch_size that makes gradient_accumulation_steps "
            "and steps_per_generation integers; "
        )
    else:
        keep = "" if refused else f"or keep the recipe's batch on {W}: {rescale}; "
    no_way = (
        f" The recipe's batch does not fit {W} process(es): {rescale} fails this plan's {', '.join(refused)} check."
        if refused
        else ""
    )
    plan.error(
        "expected_world_size",
        f"the recipe assumes {expected} processes, this launch has {W}: a generation would hold "
        f"{actual['completions_per_generation']} completions instead of {intended['completions_per_generation']}. "
        f"Launch {expected} processes (the recipe's accelerate config, or --num_processes {expected}); {keep}"
        f"or accept the smaller batch: --expected_world_size {W}.{no_way}",
    )


def _refused_by_its_plan(run: Run, replan: Callable[[Run], Plan] | None, ga: int, spg: int) -> list[str]:
    """The settings on which the plan of the rescaled batch fails and the plan of the smaller batch (the same run,
    expected_world_size = world size) does not: what keeping the batch would newly break."""
    if replan is None:
        return []
    W = run.world_size
    accepted = replan(dataclasses.replace(run, expected_world_size=W))
    rescaled = dataclasses.replace(
        run,
        gradient_accumulation_steps=ga,
        steps_per_generation=spg,
        expected_world_size=W,
        completions_per_generation=run.per_device_train_batch_size * W * spg,
    )  # optimizer steps per generation: unchanged (spg / ga is)
    already = {f.setting for f in accepted.errors}
    return sorted({f.setting for f in replan(rescaled).errors} - already)


def batch_section(plan: Plan, run: Run) -> None:
    """TRL's batch arithmetic."""
    B, GA, SPG = run.per_device_train_batch_size, run.gradient_accumulation_steps, run.steps_per_generation
    W, G, C = run.world_size, run.num_generations, run.max_completion_length
    completions, steps = run.completions_per_generation, run.optimizer_steps_per_generation
    rows = plan.section("Batch (TRL's arithmetic)")
    rows += [
        ("world size", str(W)),
        ("completions per generation", f"{B} x {W} x {SPG} = {completions} ({completions // G} prompts x {G})"),
        ("completions per optimizer step", f"{B} x {W} x {GA} = {B * W * GA}"),
        ("optimizer steps per generation", f"{SPG} x {run.num_iterations} / {GA} = {steps:g}"),
        (
            "sequence length",
            f"{run.prompt_tokens} prompt ({run.prompt_source}) + {C} completion = {run.seq_tokens} tokens at most",
        ),
    ]
    rounds = run.dynamic_sampling_max_rounds
    if rounds is None:
        rows.append(("dynamic sampling", "off"))
    else:  # every round generates a whole generation batch
        most = rounds * completions
        rows.append(
            (
                "dynamic sampling",
                f"on: up to {rounds} rounds per generation = {most} completions generated per generation at most, "
                f"{most / steps:g} per optimizer step (off: {completions / steps:g})",
            )
        )
    if run.runs_steps:
        rows.append(("run", f"{run.max_steps} optimizer steps = {run.max_steps / steps:g} generations"))
