"""Tests for `pacs.checks`: a user's dataset, reward functions and model path are checked before anything is generated.

The first part tests the functions on their own. The second part builds `PACSTrainer` on the tiny model and checks that
each mistake stops the run, with the fix in the message, when the trainer is built or at the start of `train()`, before
the model generates anything.
"""

import asyncio
import functools
import inspect
import logging
import math

import pytest
import torch
from datasets import Dataset, IterableDataset

from pacs.checks import (
    MAX_UNLABELED_BATCHES,
    TRL_REWARD_KWARGS,
    UnlabeledBatchTracker,
    check_model_path,
    check_train_dataset,
    validate_reward_output,
    validated_reward_func,
)
from pacs.rewards import format_reward, math_reward


def answer_reward(completions, answer, **kwargs):
    """A user's reward that reads its gold answers from an `answer` column."""
    return [float(a in c) for c, a in zip(completions, answer)]


def prompts_only(n=8):
    return Dataset.from_dict({"prompt": [f"What is {i} + {i}?" for i in range(n)]})


# ---------------------------------------------------------------------------------------------------------------------
# check_train_dataset
# ---------------------------------------------------------------------------------------------------------------------


def test_trl_reward_kwargs_match_the_installed_trl():
    # the keywords GRPOTrainer._calculate_rewards passes besides the dataset columns
    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer._calculate_rewards)
    for key in TRL_REWARD_KWARGS - {"prompts", "completions", "completion_ids"}:
        assert f'reward_kwargs["{key}"]' in source, key
    assert "prompts=prompts, completions=completions, completion_ids=completion_ids_list" in source


def test_a_valid_dataset_passes():
    ds = Dataset.from_dict({"prompt": ["a", "b"], "solution": ["1", "2"], "answer": ["1", "2"]})
    check_train_dataset(ds, [math_reward, format_reward, answer_reward])
    check_train_dataset(ds, math_reward, reward_func_names=["math"])
    check_train_dataset(ds, "some-org/reward-model")  # reward models are not checked
    check_train_dataset(None, math_reward)


def test_missing_prompt_column_names_the_rename():
    ds = Dataset.from_dict({"problem": ["a"], "solution": ["1"]})
    with pytest.raises(ValueError) as info:
        check_train_dataset(ds, math_reward)
    message = str(info.value)
    assert "no 'prompt' column" in message and "['problem', 'solution']" in message
    assert 'dataset.rename_column("problem", "prompt")' in message


def test_empty_dataset():
    with pytest.raises(ValueError, match=r"train_dataset is empty \(0 rows.*dataset_limit"):
        check_train_dataset(Dataset.from_dict({"prompt": [], "solution": []}), math_reward)


def test_math_reward_without_solution_column():
    ds = Dataset.from_dict({"prompt": ["a"], "answer": ["1"]})
    with pytest.raises(ValueError) as info:
        check_train_dataset(ds, math_reward)
    message = str(info.value)
    assert "math_reward needs the keyword `solution`" in message and "no column 'solution'" in message
    assert "['prompt', 'answer']" in message
    assert 'dataset.rename_column("answer", "solution")' in message and "functools.partial(math_reward" in message


def test_custom_reward_with_answer_argument():
    ds = Dataset.from_dict({"prompt": ["a"], "solution": ["1"]})
    with pytest.raises(
        ValueError, match=r"answer_reward needs the keyword `answer`.*rename_column\(\"solution\", \"answer\"\)"
    ):
        check_train_dataset(ds, [math_reward, answer_reward])
    # named as the trainer names it
    with pytest.raises(ValueError, match="my_answer needs the keyword"):
        check_train_dataset(ds, [math_reward, answer_reward], reward_func_names=["math_reward", "my_answer"])
    # mapped with a partial or given a default: nothing missing any more
    check_train_dataset(ds, functools.partial(answer_reward, answer=["1"]))

    def with_default(completions, answer=None, **kwargs):
        return [0.0] * len(completions)

    check_train_dataset(ds, with_default)


def test_eval_dataset_is_named():
    with pytest.raises(ValueError, match="eval_dataset has no column 'solution'"):
        check_train_dataset(prompts_only(), math_reward, name="eval_dataset")


def test_reward_without_kwargs_or_asking_for_prompt():
    def strict(completions, solution):
        return [0.0] * len(completions)

    ds = Dataset.from_dict({"prompt": ["a"], "solution": ["1"]})
    with pytest.raises(ValueError, match=r"strict\(completions, solution\) does not take \*\*kwargs.*Add \*\*kwargs"):
        check_train_dataset(ds, strict)

    def explicit(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, solution):
        return [0.0] * len(completions)

    check_train_dataset(ds, explicit)  # takes every keyword TRL passes: fine without **kwargs

    def by_prompt(prompt, completions, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="`prompt`, which TRL never passes.*`prompts`"):
        check_train_dataset(ds, by_prompt)


def test_kwargs_only_and_callable_objects():
    class Judge:
        def __call__(self, completions, solution, **kwargs):
            return [0.0] * len(completions)

    check_train_dataset(prompts_only(), lambda completions, **kw: [0.0] * len(completions))
    with pytest.raises(ValueError, match="Judge needs the keyword `solution`"):
        check_train_dataset(prompts_only(), Judge())


def test_remove_unused_columns_drops_what_the_reward_needs():
    ds = Dataset.from_dict({"prompt": ["a"], "solution": ["1"]})
    with pytest.raises(ValueError, match="remove_unused_columns=False"):
        check_train_dataset(ds, math_reward, remove_unused_columns=True)


def test_iterable_dataset():
    def rows():
        yield {"prompt": "a", "answer": "1"}

    streamed = IterableDataset.from_generator(rows)  # columns unknown without reading: skipped, nothing read
    check_train_dataset(streamed, math_reward)
    typed = Dataset.from_dict({"prompt": ["a"], "answer": ["1"]}).to_iterable_dataset()  # features known
    with pytest.raises(ValueError, match="no column 'solution'"):
        check_train_dataset(typed, math_reward)


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
    with caplog.at_level(logging.WARNING, logger="pacs.checks"):
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


# ---------------------------------------------------------------------------------------------------------------------
# check_model_path
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hub_id", ["Qwen/Qwen3-4B-Base", "gpt2", "HuggingFaceTB/SmolLM2-135M-Instruct", "org/m.v1_x"])
def test_hub_ids_pass_untouched(hub_id):
    assert check_model_path(hub_id) == hub_id


def test_existing_paths_pass(tmp_path, monkeypatch):
    assert check_model_path(str(tmp_path)) == str(tmp_path)
    assert check_model_path(tmp_path) == str(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    assert check_model_path("ckpt") == "ckpt" and check_model_path("./ckpt") == "./ckpt"


@pytest.mark.parametrize(
    "path", ["/no/such/dir", "./typo", "../typo", "~/no-such-model", "runs/a/b", "runs\\ckpt", "runs/"]
)
def test_missing_paths_are_named(path):
    with pytest.raises(ValueError, match=r"No such model directory or hub id: .*Qwen/Qwen3-4B-Base"):
        check_model_path(path)


def test_a_missing_subdirectory_of_an_existing_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    with pytest.raises(ValueError, match="No such model directory or hub id: 'outputs/run-1'"):
        check_model_path("outputs/run-1")


# ---------------------------------------------------------------------------------------------------------------------
# Integration: PACSTrainer stops before anything is generated.
# These tests need the calls wired into pacs/trainer.py (see the report of issue 11); until then they fail.
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def no_generation(monkeypatch):
    """Make any generation an error, so that a check that fires too late shows up as this failure instead."""
    from pacs import PACSTrainer

    def refuse(self, *args, **kwargs):
        raise AssertionError("the trainer started generating before the check fired")

    monkeypatch.setattr(PACSTrainer, "_generate_and_score_completions", refuse)


def _build_and_train(model_dir, tmp_path, reward_funcs, dataset, **config):
    from pacs import PACSTrainer
    from pacs.testing import tiny_pacs_config

    args = tiny_pacs_config(tmp_path / "out", **{"max_steps": 1, "steps_per_generation": 1, **config})
    trainer = PACSTrainer(model=model_dir, reward_funcs=reward_funcs, args=args, train_dataset=dataset)
    trainer.train()
    return trainer


def test_trainer_rejects_dataset_without_prompt(tiny_model_dir, tmp_path, no_generation):
    ds = Dataset.from_dict({"problem": ["1 + 1?"] * 8, "solution": ["2"] * 8})
    with pytest.raises(ValueError, match=r"no 'prompt' column.*rename_column\(\"problem\", \"prompt\"\)"):
        _build_and_train(tiny_model_dir, tmp_path, math_reward, ds)


def test_trainer_rejects_empty_dataset(tiny_model_dir, tmp_path, no_generation):
    ds = Dataset.from_dict({"prompt": [], "solution": []})
    with pytest.raises(ValueError, match="train_dataset is empty"):
        _build_and_train(tiny_model_dir, tmp_path, math_reward, ds)


def test_trainer_rejects_math_reward_without_solution(tiny_model_dir, tmp_path, no_generation):
    ds = Dataset.from_dict({"prompt": ["1 + 1?"] * 8, "answer": ["2"] * 8})
    with pytest.raises(
        ValueError, match=r"math_reward needs the keyword `solution`.*rename_column\(\"answer\", \"solution\"\)"
    ):
        _build_and_train(tiny_model_dir, tmp_path, math_reward, ds)


def test_trainer_rejects_custom_reward_missing_column(tiny_model_dir, tmp_path, no_generation):
    ds = Dataset.from_dict({"prompt": ["1 + 1?"] * 8, "solution": ["2"] * 8})
    with pytest.raises(ValueError, match=r"answer_reward needs the keyword `answer`.*\['prompt', 'solution'\]"):
        _build_and_train(tiny_model_dir, tmp_path, [math_reward, answer_reward], ds, reward_weights=[0.5, 0.5])


def test_trainer_rejects_missing_model_directory(tmp_path, no_generation):
    with pytest.raises(ValueError, match="No such model directory or hub id"):
        _build_and_train(str(tmp_path / "no-such-model"), tmp_path, math_reward, prompts_only())


@pytest.mark.parametrize(
    "returned, message",
    [
        (lambda n: [math.nan] * n, r"bad_reward returned nan for completion 0.*return None to skip"),
        (lambda n: ["1.0"] * n, r"bad_reward returned '1.0' \(str\)"),
        (lambda n: 1.0, r"bad_reward returned 1.0 instead of a list"),
    ],
)
def test_trainer_rejects_bad_reward_values(tiny_model_dir, tmp_path, returned, message):
    def bad_reward(completions, **kwargs):
        return returned(len(completions))

    with pytest.raises(ValueError, match=message):
        _build_and_train(tiny_model_dir, tmp_path, bad_reward, prompts_only())


def test_trainer_rejects_bad_values_from_async_rewards(tiny_model_dir, tmp_path):
    async def async_reward(completions, **kwargs):
        return [math.nan] * len(completions)

    with pytest.raises(ValueError, match="async_reward returned nan"):
        _build_and_train(tiny_model_dir, tmp_path, async_reward, prompts_only())


def test_trainer_stops_when_no_completion_ever_gets_a_reward(tiny_model_dir, tmp_path, caplog):
    def never(completions, **kwargs):
        return [None] * len(completions)

    with caplog.at_level(logging.WARNING, logger="pacs.checks"):
        with pytest.raises(RuntimeError, match=f"{MAX_UNLABELED_BATCHES} consecutive train generation batches"):
            _build_and_train(
                tiny_model_dir,
                tmp_path,
                never,
                prompts_only(),
                max_steps=MAX_UNLABELED_BATCHES + 2,
                steps_per_generation=1,
            )  # one generation batch of 4 completions per optimizer step
    assert caplog.text.count("every reward function returned None for all 4 completions") == MAX_UNLABELED_BATCHES


def test_trainer_with_valid_rewards_keeps_their_names(tiny_model_dir, tmp_path):
    # the validating wrapper is invisible: same logged metric names, training runs
    def parity_reward(completions, **kwargs):
        return [float(len(c) % 2) for c in completions]

    trainer = _build_and_train(tiny_model_dir, tmp_path, parity_reward, prompts_only())
    assert trainer.reward_func_names == ["parity_reward"]
    assert any("rewards/parity_reward/mean" in entry for entry in trainer.state.log_history)
    assert getattr(trainer.reward_funcs[0], "_pacs_validated", False), "reward functions are not wrapped"


def test_rollout_func_fields_may_feed_the_rewards():
    check_train_dataset(prompts_only(), answer_reward, rollout_func=lambda prompts, trainer: {})


def test_demo_model_argument_is_checked_too(tmp_path):
    from pacs.models import resolve_model

    assert resolve_model("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    with pytest.raises(ValueError, match="No such model directory or hub id"):
        resolve_model(str(tmp_path / "missing"))
