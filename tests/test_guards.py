"""`pacs.grpo.guards`: an optimizer step whose gradient norm is not finite is skipped (weights and optimizer states
untouched), counted in `pacs/skipped_steps`, and the next step trains; too many in a row stop training with an error
that says what to check. On a plain optimizer, and in `PACSTrainer` with whole groups and with groups split over
micro-batches; across two processes (DDP) and under DeepSpeed ZeRO-3 (its own skip, counted). The runtime checks of
the reward functions' outputs and of batches without a single reward follow at the end."""

import asyncio
import functools
import inspect
import json
import logging
import math
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from pacs import PACSTrainer
from pacs.grpo.guards import (
    MAX_UNLABELED_BATCHES,
    METRIC,
    NonFiniteGradientError,
    NonFiniteGradientGuard,
    UnlabeledBatchTracker,
    validate_reward_output,
    validated_reward_func,
)
from pacs.rewards import math_reward
from tests.launching import ZERO3_CPU_ACCELERATE_CONFIG, accelerate_launch, run_launched
from tests.tiny_config import tiny_pacs_config


def answer_reward(completions, answer, **kwargs):
    return [float(a in c) for c, a in zip(completions, answer)]


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def prompts(n=32):
    return Dataset.from_dict({"prompt": [f"What is {i} + {3 * i}?" for i in range(n)]})


class _Trainer:
    """What the guard reads of a trainer: its metrics and whether DeepSpeed runs the step."""

    is_deepspeed_enabled = False

    def __init__(self):
        self._metrics = {"train": {}}
        self.callbacks = []

    def add_callback(self, callback):
        self.callbacks.append(callback)


class _State:
    global_step = 0


def test_plain_optimizer_skips_a_non_finite_step_and_takes_the_next():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4))
    optimizer = torch.optim.AdamW([w], lr=0.1)
    trainer = _Trainer()
    guard = NonFiniteGradientGuard.install(trainer, optimizer, max_skipped=3)
    assert NonFiniteGradientGuard.install(trainer, optimizer, max_skipped=3) is guard  # once per optimizer
    assert trainer.callbacks == [guard]

    def step(grad):
        w.grad = grad
        optimizer.step()
        guard.on_optimizer_step(None, _State(), None)
        optimizer.zero_grad()

    step(torch.ones(4))
    after_first = w.detach().clone()
    state = {k: v.clone() for k, v in optimizer.state[w].items()}
    step(torch.tensor([1.0, float("nan"), 1.0, 1.0]))  # skipped
    assert torch.equal(w.detach(), after_first)
    assert all(torch.equal(optimizer.state[w][k], v) for k, v in state.items())  # moments and step count
    assert guard.skipped == 1 and trainer._metrics["train"][METRIC] == [1.0]
    step(torch.tensor([float("inf"), 0.0, 0.0, 0.0]))  # an infinite norm too
    step(torch.ones(4))
    assert not torch.equal(w.detach(), after_first) and torch.isfinite(w).all()
    assert float(optimizer.state[w]["step"]) == 2 and guard.in_a_row == 0 and guard.skipped == 2


def test_plain_optimizer_stops_after_max_skipped_in_a_row():
    w = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([w], lr=0.1)
    guard = NonFiniteGradientGuard.install(_Trainer(), optimizer, max_skipped=2)
    for i in range(2):
        w.grad = torch.full((2,), float("nan"))
        optimizer.step()
        if i == 0:
            guard.on_optimizer_step(None, _State(), None)
    with pytest.raises(NonFiniteGradientError, match="2 optimizer steps in a row.*learning_rate"):
        guard.on_optimizer_step(None, _State(), None)


class NaNAtSteps(TrainerCallback):
    """Makes the final norm's output NaN in the forward passes with grad of the listed optimizer steps (0-based), and
    records the weights and one optimizer state after every step."""

    def __init__(self, trainer, steps):
        self.trainer, self.steps, self.active = trainer, set(steps), False
        self.params, self.moments = [], []
        trainer.model.model.norm.register_forward_hook(self.hook)

    def hook(self, module, inputs, output):
        if self.active and torch.is_grad_enabled():
            return output * float("nan")
        return output

    def on_step_begin(self, args, state, control, **kwargs):
        self.active = state.global_step in self.steps

    def on_step_end(self, args, state, control, **kwargs):
        self.active = False
        self.params.append(torch.cat([p.detach().flatten().clone() for p in self.trainer.model.parameters()]))
        optimizer = self.trainer.optimizer.optimizer if hasattr(self.trainer.optimizer, "optimizer") else None
        optimizer = optimizer or self.trainer.optimizer
        first = next(p for group in optimizer.param_groups for p in group["params"])
        self.moments.append(optimizer.state[first]["exp_avg"].clone() if first in optimizer.state else None)


@pytest.mark.parametrize(
    "layout",
    [
        dict(per_device_train_batch_size=4, gradient_accumulation_steps=1, steps_per_generation=4),  # whole groups
        dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, steps_per_generation=8),  # split groups
    ],
    ids=["whole-groups", "split-groups"],
)
def test_trainer_skips_the_nan_step_and_trains_on(tiny_model_dir, tmp_path, layout):
    args = tiny_pacs_config(tmp_path / "out", max_steps=4, **layout)
    trainer = PACSTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())
    spy = NaNAtSteps(trainer, steps=[1])
    trainer.add_callback(spy)
    trainer.train()

    assert trainer._pacs_split == (layout["per_device_train_batch_size"] < 4)
    p1, p2, p3, p4 = spy.params
    assert torch.isfinite(p4).all()
    assert torch.equal(p2, p1), "the NaN step changed the weights"
    assert torch.equal(spy.moments[1], spy.moments[0]), "the NaN step changed the optimizer state"
    assert not torch.equal(p3, p2) and not torch.equal(p4, p3), "the steps after it must train"
    counts = [entry[METRIC] for entry in trainer.state.log_history if METRIC in entry]
    assert counts == [0.0, 1.0, 1.0, 1.0]


def test_trainer_stops_after_max_skipped_steps(tiny_model_dir, tmp_path):
    args = tiny_pacs_config(tmp_path / "out", max_steps=6, steps_per_generation=4, pacs_max_skipped_steps=2)
    trainer = PACSTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())
    spy = NaNAtSteps(trainer, steps=range(1, 6))
    trainer.add_callback(spy)
    with pytest.raises(NonFiniteGradientError, match="2 optimizer steps in a row"):
        trainer.train()
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


GUARD_SCRIPT = Path(__file__).parent / "scripts" / "train_guard.py"


@pytest.mark.distributed
@pytest.mark.parametrize("launch", ["ddp-2", "zero3"])
def test_guard_across_processes_and_under_deepspeed(tiny_model_dir, tmp_path, launch):
    # DDP: the NaN is on rank 0 only, and both ranks skip together; ZeRO-3: DeepSpeed skips and the guard counts it
    (tmp_path / "out").mkdir()
    cmd = accelerate_launch()
    if launch == "ddp-2":
        cmd += ["--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    else:
        (tmp_path / "zero3_cpu.yaml").write_text(ZERO3_CPU_ACCELERATE_CONFIG)
        cmd += ["--config_file", str(tmp_path / "zero3_cpu.yaml")]
    cmd += [str(GUARD_SCRIPT), tiny_model_dir, str(tmp_path / "out")]
    result = run_launched(cmd, tmp_path)
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("rank*.json"))]
    assert len(records) == (2 if launch == "ddp-2" else 1)
    for record in records:
        assert record["zero_stage"] == (None if launch == "ddp-2" else 3)
        assert record["finite_params"] and record["nan_step_unchanged"] and record["next_steps_changed"]
        assert record["skipped_steps"] == [0.0, 1.0, 1.0, 1.0]
    assert "Optimizer step 2 skipped" in result.stderr + result.stdout


# ---------------------------------------------------------------------------------------------------------------------
# validate_reward_output / validated_reward_func
# ---------------------------------------------------------------------------------------------------------------------


def test_valid_outputs():
    import numpy as np

    validate_reward_output("r", [1.0, 0, True, None], 4)
    validate_reward_output("r", (0.5,), 1)
    validate_reward_output("r", [np.float32(1.0), torch.tensor(0.0)], 2)
    validate_reward_output("r", np.array([1.0, 0.0]), 2)
    validate_reward_output("r", torch.tensor([1.0, 0.0]), 2)


@pytest.mark.parametrize(
    "output, message",
    [
        ([1.0, math.nan], r"my_reward returned nan for completion 1 of 2; return None to skip a completion"),
        ([1.0, math.inf], r"my_reward returned inf for completion 1 of 2"),
        ([1.0, "1.0"], r"my_reward returned '1.0' \(str\) for completion 1 of 2.*float\(value\)"),
        ([1.0, [1.0]], r"my_reward returned \[1.0\] \(list\) for completion 1"),
        (1.0, r"my_reward returned 1.0 instead of a list with one reward per completion \(2 here\)"),
        ("1", r"my_reward returned '1' instead of a list"),
        (None, r"my_reward returned None instead of a list"),
        ([1.0], r"my_reward returned 1 rewards for 2 completions"),
        (torch.zeros(2, 1), r"my_reward returned \(2, 1\) instead of a list"),
    ],
)
def test_bad_outputs_name_the_function_and_value(output, message):
    with pytest.raises(ValueError, match=message):
        validate_reward_output("my_reward", output, 2)


def test_wrapper_keeps_name_signature_and_validates():
    def nan_reward(completions, solution, **kwargs):
        return [math.nan] * len(completions)

    wrapped = validated_reward_func(nan_reward)
    assert wrapped.__name__ == "nan_reward" and inspect.signature(wrapped) == inspect.signature(nan_reward)
    assert validated_reward_func(wrapped) is wrapped  # idempotent
    with pytest.raises(ValueError, match="nan_reward returned nan for completion 0 of 2"):
        wrapped(completions=["a", "b"], solution=["1", "2"])
    assert validated_reward_func(math_reward)(completions=["\\boxed{1}"], solution=["1"]) == [1.0]
    assert validated_reward_func("org/reward-model") == "org/reward-model"


def test_wrapper_keeps_async_functions_async():
    from trl.trainer.utils import get_callable_name, is_async_callable

    async def judge(completions, **kwargs):
        return ["yes"] * len(completions)

    wrapped = validated_reward_func(judge)
    assert is_async_callable(wrapped) and get_callable_name(wrapped) == "judge"
    with pytest.raises(ValueError, match=r"judge returned 'yes' \(str\)"):
        asyncio.run(wrapped(completions=["a"]))


def test_wrapper_of_partial_and_callable_object_keeps_trl_name():
    from trl.trainer.utils import get_callable_name

    class Scorer:
        def __call__(self, completions, **kwargs):
            return [0.5] * len(completions)

    assert get_callable_name(validated_reward_func(Scorer())) == "Scorer"
    partial = functools.partial(answer_reward, answer=["x"])
    assert get_callable_name(validated_reward_func(partial)) == "answer_reward"
    assert validated_reward_func(partial)(completions=["x"]) == [1.0]


# ---------------------------------------------------------------------------------------------------------------------
# UnlabeledBatchTracker
# ---------------------------------------------------------------------------------------------------------------------


def test_tracker_warns_every_unlabeled_batch_and_stops_when_it_persists(caplog):
    tracker = UnlabeledBatchTracker()
    assert tracker.patience == MAX_UNLABELED_BATCHES == 3
    with caplog.at_level(logging.WARNING, logger="pacs.grpo.guards"):
        tracker.update(0, 8)
        tracker.update(0, 8)
        assert tracker.consecutive == 2 and caplog.text.count("every reward function returned None for all 8") == 2
        tracker.update(1, 8)  # one label resets the count
        assert tracker.consecutive == 0
        tracker.update(0, 8, mode="eval")  # eval batches are counted apart
        tracker.update(0, 8)
        tracker.update(0, 8)
        with pytest.raises(RuntimeError, match=r"3 consecutive train generation batches.*return numbers"):
            tracker.update(0, 8)
    with pytest.raises(ValueError, match="patience"):
        UnlabeledBatchTracker(patience=0)


def test_wrapper_counts_completions_from_whatever_list_it_is_given():
    # TRL calls an environment's own reward (`get_reward`) with `environments=` alone: 2 environments are 2 completions
    def get_reward(environments, **kwargs):
        return [1.0 for _ in environments]

    wrapped = validated_reward_func(get_reward)
    assert wrapped(environments=["env0", "env1"]) == [1.0, 1.0]
    with pytest.raises(ValueError, match="returned 2 rewards for 3 completions"):
        validated_reward_func(lambda environments, **kw: [1.0, 1.0])(environments=["a", "b", "c"])
    with pytest.raises(ValueError, match="returned 1 rewards for 2 completions"):
        validated_reward_func(lambda prompts, **kw: [1.0])(prompts=["p", "q"])
    # nothing to count from: the count is not checked, every value still is
    assert validated_reward_func(lambda **kw: [0.0, 1.0])() == [0.0, 1.0]
    with pytest.raises(ValueError, match=r"returned nan for completion 1; return None"):
        validated_reward_func(lambda **kw: [0.0, math.nan])()


def test_a_timed_out_collective_says_a_process_stopped_answering():
    from pacs.grpo.guards import stopped_rank_error

    gloo = RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 60000ms for recv operation")
    error = stopped_rank_error(gloo, ddp_timeout=60, world_size=2)
    assert str(error).startswith("A process stopped answering: a collective of this 2-process run waited ddp_timeout")
    assert "(60 s)" in str(error) and "a whole generation plus an evaluation" in str(error) and "\n" not in str(error)
    assert "Timed out waiting 60000ms" in str(error)  # the backend's own line, for the search engine
    nccl = RuntimeError("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLGATHER)")
    assert stopped_rank_error(nccl, 1800, 16) is not None
    # anything else, or one process, is left as it is
    assert stopped_rank_error(RuntimeError("CUDA out of memory"), 60, 2) is None
    assert stopped_rank_error(gloo, 60, 1) is None
