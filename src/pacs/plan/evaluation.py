"""The cost of one in-training evaluation (`eval_benchmark` every `eval_steps`) against the training between two, and
the settings that bring it down when it is too high."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .memory import TrainerMemory
from .report import GB, Plan, human_s
from .resolve import Run


# Assumptions of the estimates (named so that a reader can redo the arithmetic).
DECODE_BYTES_PER_S = 2.0e12  # effective HBM bandwidth while decoding (H100 SXM: 3.35e12 peak)
TRAIN_FLOPS_PER_S = 4.0e14  # achieved bf16 FLOP/s per GPU in training (H100 SXM: 9.9e14 dense peak)
WEIGHT_PUSH_S_PER_GB = 0.5  # one weight push to a colocated engine, per GB of 16-bit weights (estimate)
EVAL_WARN_FRACTION = 0.25  # warn when evaluation adds more than this fraction to the training time
BENCHMARK_SIZES = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40}


@dataclass(frozen=True)
class _Evaluation:
    """One evaluation: its problems and completions, the sequential generation calls per process, and the time."""

    problems: int
    completions: int
    calls: int
    pushes: bool  # each call pushes the weights to a sleeping colocated engine first
    eval_s: float
    train_s: float  # the training between two evaluations


def evaluation_section(plan: Plan, run: Run, trainer: TrainerMemory | None, concurrent: int | None) -> None:
    """The section "In-training evaluation" (the shape must be known); `concurrent`: the sequences the colocated
    engine decodes at once, where known."""
    rows = plan.section("In-training evaluation")
    if not run.evaluates:
        rows.append(("evaluation", "off (eval_strategy no)"))
        return
    problems = BENCHMARK_SIZES.get(run.eval_benchmark)
    if problems is None:
        rows.append(("evaluation", f"{run.eval_benchmark}: size unknown"))
        return
    problems = min(problems, run.eval_limit) if run.eval_limit else problems
    cost = _estimate(run, problems, concurrent)
    k, per_call, C = run.num_generations_eval, run.per_device_eval_batch_size, run.max_completion_length
    evaluations = run.max_steps // run.eval_steps if run.runs_steps and run.eval_steps else 0
    rows += [
        (
            "one evaluation",
            f"{problems} {run.eval_benchmark} problems x {k} = {cost.completions} completions, "
            f"per_device_eval_batch_size {per_call}",
        ),
        (
            "vLLM calls" if run.use_vllm else "generate calls",
            f"{cost.calls} sequential per process, each up to {C} decoding steps"
            + (", each with a full weight push (sleep mode)" if cost.pushes else ""),
        ),
        (
            "time",
            f"~{human_s(cost.eval_s)} per evaluation, {evaluations} in the run; ~{human_s(cost.train_s)} of training "
            f"between two (every {run.eval_steps} steps) (assumes {DECODE_BYTES_PER_S / 1e12:g} TB/s decoding, "
            f"{TRAIN_FLOPS_PER_S / 1e12:g} TFLOP/s training per GPU, full-length completions)",
        ),
    ]
    if cost.train_s and cost.eval_s > EVAL_WARN_FRACTION * cost.train_s:
        _too_costly(plan, run, trainer, cost)


def _estimate(run: Run, problems: int, concurrent: int | None) -> _Evaluation:
    """The time of one evaluation of `problems` problems, and of the training between two."""
    shape, TP, C = run.shape, run.tensor_parallel_size, run.max_completion_length
    per_call = run.per_device_eval_batch_size
    completions = problems * run.num_generations_eval
    calls = math.ceil(completions / (per_call * run.world_size))
    step_s = 2 * shape.num_params / TP / DECODE_BYTES_PER_S  # one decoding step reads every weight once
    pushes = run.colocated and run.vllm_enable_sleep_mode
    push_s = WEIGHT_PUSH_S_PER_GB * 2 * shape.num_params / GB if pushes else 0.0
    concurrent = concurrent or per_call
    eval_s = calls * (math.ceil(per_call * TP / max(concurrent, 1)) * C * step_s + push_s)
    train_s = _training_s_between_evaluations(run, step_s, push_s, concurrent)
    return _Evaluation(problems, completions, calls, pushes, eval_s, train_s)


def _training_s_between_evaluations(run: Run, step_s: float, push_s: float, concurrent: int) -> float:
    """Training between two evaluations: the rollouts (waves of full-length decoding) + forward/backward."""
    P, TP = run.shape.num_params, run.tensor_parallel_size
    gens = run.eval_steps / run.optimizer_steps_per_generation if run.eval_steps else 0
    gen_batch = run.per_device_train_batch_size * TP * run.steps_per_generation
    rollout_s = math.ceil(gen_batch / max(concurrent, 1)) * run.max_completion_length * step_s + push_s
    tokens_per_gen = gen_batch / TP * run.seq_tokens  # per process
    flops = (8 if run.gradient_checkpointing else 6) * P * tokens_per_gen * run.num_iterations
    flops += 2 * P * tokens_per_gen  # the old log-probabilities after each generation
    return gens * (rollout_s + flops / TRAIN_FLOPS_PER_S)


def _too_costly(plan: Plan, run: Run, trainer: TrainerMemory | None, cost: _Evaluation) -> None:
    """Warn about an evaluation that costs more than EVAL_WARN_FRACTION of the training, with the settings that fix
    it."""
    per_call, steps_per_generation = run.per_device_eval_batch_size, run.optimizer_steps_per_generation
    fixes = _larger_eval_batch(run, trainer, cost.completions)
    fraction = EVAL_WARN_FRACTION * cost.train_s / cost.eval_s
    if cost.problems * fraction >= 1:
        fixes.append(f"eval_limit {int(cost.problems * fraction)}")
    fixes.append(f"eval_steps {math.ceil(run.eval_steps / fraction / steps_per_generation) * steps_per_generation:g}")
    fixes.append("eval_strategy no and `pacs eval` on the checkpoints")
    plan.warning(
        "per_device_eval_batch_size",
        f"evaluation costs ~{human_s(cost.eval_s)} every {run.eval_steps} steps against ~{human_s(cost.train_s)} of "
        f"training ({cost.eval_s / cost.train_s:.0%}): {cost.calls} sequential vLLM calls of {per_call} completions"
        + (" with a weight push each" if cost.pushes else "")
        + ". Any of: "
        + "; ".join(fixes)
        + ".",
    )


def _larger_eval_batch(run: Run, trainer: TrainerMemory | None, completions: int) -> list[str]:
    """A larger per_device_eval_batch_size, if one fits: it means fewer sequential vLLM calls; it is bounded by the
    trainer's forward over it (no grad, one layer's transients at a time), which must fit where training fits."""
    W, k = run.world_size, run.num_generations_eval
    one_call = math.ceil(completions / W / k) * k
    if trainer is None:
        return []
    shape = run.shape
    h, q, kv, i = shape.hidden_size, shape.q_dim, shape.kv_dim, shape.mlp_width
    per_sequence = run.seq_tokens * (3 * h + q + 2 * kv + 3 * i) * 2
    fit = int((trainer.peak - trainer.persistent) // per_sequence) // k * k
    batch = min(one_call, fit)
    if batch <= run.per_device_eval_batch_size:
        return []
    return [
        f"per_device_eval_batch_size {batch} ({math.ceil(completions / (batch * W))} vLLM calls per "
        "process; its forward without grad fits in the training peak)"
    ]
