"""Tests for `pacs.grpo.checks`: a user's dataset, reward functions and model path are checked before anything is
generated.

The first part tests the functions on their own. The second part builds `PACSTrainer` on the tiny model and checks that
each mistake stops the run, with the fix in the message, when the trainer is built or at the start of `train()`, before
the model generates anything.
"""

import functools
import inspect
import logging
import math

import pytest
import torch
from datasets import Dataset, IterableDataset

from pacs.grpo._compat import TRL_REWARD_KWARGS
from pacs.grpo.checks import check_model_path, check_train_dataset
from pacs.grpo.guards import MAX_UNLABELED_BATCHES
from pacs.rewards import format_reward, math_reward
from tests.tool_calls import multiply, scripted_generate


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
    from tests.tiny_config import tiny_pacs_config

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

    with caplog.at_level(logging.WARNING, logger="pacs.grpo.checks"):
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


# ---------------------------------------------------------------------------------------------------------------------
# Never refuse what GRPOTrainer accepts: TRL 1.16's environments (`environment_factory`), tools, rollout functions and
# iterable datasets. The trainer cases follow the environment tests of TRL's tests/test_grpo_trainer.py, rewritten for
# PACSTrainer on the tiny offline model (with TRL's Qwen3 tool-calling chat template) and trained, not only built.
# ---------------------------------------------------------------------------------------------------------------------


class CounterEnvironment:
    def reset(self, **kwargs):
        self.calls = 0
        return "Count."

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.calls += 1
        return step


def _any_reward(completions, **kwargs):
    return [0.0 for _ in completions]


def test_environment_owned_data_needs_no_prompt_column():
    routing = Dataset.from_dict({"environment": ["counter", "echo"] * 2})
    factories = {"counter": CounterEnvironment, "echo": CounterEnvironment}
    check_train_dataset(routing, _any_reward, environment_factory=factories)
    check_train_dataset(Dataset.from_dict({"seed": [1, 2]}), None, environment_factory=CounterEnvironment)
    check_train_dataset(None, None, environment_factory=CounterEnvironment)  # the environment owns all the data
    with pytest.raises(ValueError, match="no 'prompt' column"):  # without an environment it is still an error
        check_train_dataset(routing, _any_reward)


def test_several_environments_need_an_environment_column():
    factories = {"counter": CounterEnvironment, "echo": CounterEnvironment}
    with pytest.raises(ValueError, match=r"no 'environment' column.*\['counter', 'echo'\].*environment_factory=My"):
        check_train_dataset(prompts_only(), None, environment_factory=factories)
    check_train_dataset(prompts_only(), None, environment_factory={None: CounterEnvironment})  # TRL's default key


def test_rewards_receive_environments_only_with_an_environment_factory():
    def env_reward(completions, environments, prompts, completion_ids, trainer_state, log_extra, log_metric):
        return [0.0 for _ in completions]

    check_train_dataset(prompts_only(), env_reward, environment_factory=CounterEnvironment)
    with pytest.raises(ValueError, match="`environments`"):  # no environment: TRL never passes it
        check_train_dataset(prompts_only(), env_reward)

    def no_kwargs(completions, prompts, completion_ids, trainer_state, log_extra, log_metric):
        return [0.0 for _ in completions]

    check_train_dataset(prompts_only(), no_kwargs)
    with pytest.raises(ValueError, match=r"\['environments'\] would be unexpected"):
        check_train_dataset(prompts_only(), no_kwargs, environment_factory=CounterEnvironment)


class SeededEnvironment(CounterEnvironment):  # reset needs a column of the row
    def reset(self, seed, **kwargs):
        return super().reset()


class ClosedEnvironment(CounterEnvironment):  # reset takes no row at all
    def reset(self):
        return super().reset()


class AnswerEnvironment(CounterEnvironment):
    def reset(self, answer, **kwargs):
        return super().reset()


class PromptOnlyEnvironment(CounterEnvironment):  # no **kwargs, but names every column it gets
    def reset(self, prompt):
        return super().reset()


class StaticEnvironment(CounterEnvironment):
    @staticmethod
    def reset(seed, **kwargs):
        return "Count."


def _seeded(n=8):
    return Dataset.from_dict({"prompt": [f"Count {i}" for i in range(n)], "seed": list(range(n))})


# What TRL does with the rows: environment.reset(**row), after remove_unused_columns; each refusal below is a run that
# GRPOTrainer stops at its first generation or at train() (test_grpo_trainer_fails_where_the_environment_check_refuses)
ENVIRONMENT_REFUSALS = {
    "routing column dropped": (
        lambda: Dataset.from_dict({"prompt": ["a", "b"] * 4, "environment": ["counter", "echo"] * 4}),
        {"counter": CounterEnvironment, "echo": CounterEnvironment},
        True,
        r"drops the 'environment' column of train_dataset.*\['counter', 'echo'\].*remove_unused_columns=False",
    ),
    "reset's column dropped": (
        _seeded,
        SeededEnvironment,
        True,
        r"SeededEnvironment.reset needs the keyword `seed`.*remove_unused_columns=True",
    ),
    "reset's column missing": (
        prompts_only,
        AnswerEnvironment,
        False,
        r"AnswerEnvironment.reset needs .*`answer`.*def reset\(self, answer=None",
    ),
    "reset without **kwargs": (
        prompts_only,
        ClosedEnvironment,
        False,
        r"ClosedEnvironment.reset does not take \*\*kwargs.*\['prompt'\]",
    ),
    "environment-owned data dropped": (
        lambda: Dataset.from_dict({"seed": list(range(8))}),
        CounterEnvironment,
        True,
        r"'No columns in the dataset match",
    ),
}


@pytest.mark.parametrize("case", list(ENVIRONMENT_REFUSALS))
def test_environment_rows_are_checked_against_reset(case):
    data, factory, remove_unused_columns, message = ENVIRONMENT_REFUSALS[case]
    with pytest.raises(ValueError, match=message):
        check_train_dataset(data(), None, remove_unused_columns=remove_unused_columns, environment_factory=factory)
    if remove_unused_columns:  # GRPOConfig's default keeps every column: then the same data and environment train
        check_train_dataset(data(), None, environment_factory=factory)


def test_environment_resets_that_fit_their_rows_pass():
    check_train_dataset(_seeded(), None, environment_factory=SeededEnvironment)
    check_train_dataset(_seeded(), None, environment_factory=StaticEnvironment)  # a staticmethod has no self
    check_train_dataset(prompts_only(), None, environment_factory=PromptOnlyEnvironment)
    check_train_dataset(prompts_only(), None, remove_unused_columns=True, environment_factory=PromptOnlyEnvironment)
    routing = Dataset.from_dict({"prompt": ["a", "b"], "environment": ["seeded", "prompt"], "seed": [1, 2]})
    with pytest.raises(ValueError, match=r"PromptOnlyEnvironment.reset \(environment 'prompt'\).*\['seed'\]"):
        check_train_dataset(
            routing, None, environment_factory={"seeded": SeededEnvironment, "prompt": PromptOnlyEnvironment}
        )
    # `environment` is TRL's routing field, never a reset keyword with several environments: not unexpected here
    check_train_dataset(
        routing.remove_columns("seed"),
        None,
        environment_factory={"p": PromptOnlyEnvironment, "prompt": PromptOnlyEnvironment},
    )
    # factories that are not classes are not built here, so not checked; TRL's own `reset` check covers them
    check_train_dataset(prompts_only(), None, environment_factory=lambda: ClosedEnvironment())
    check_train_dataset(prompts_only(), None, environment_factory=functools.partial(AnswerEnvironment))


def test_a_dropped_routing_column_with_a_default_environment_warns(caplog):
    routing = Dataset.from_dict({"prompt": ["a", "b"], "environment": ["counter", None]})
    with caplog.at_level(logging.WARNING, logger="pacs.grpo.checks"):
        check_train_dataset(
            routing,
            None,
            remove_unused_columns=True,
            environment_factory={None: CounterEnvironment, "counter": CounterEnvironment},
        )
    assert "every row goes to the environment of key None" in caplog.text


class EchoEnvironment:
    def reset(self, **kwargs):
        self.calls = 0
        return "Echo."

    def shout(self, text: str) -> str:
        """
        Shout the given text.

        Args:
            text: Text to shout.

        Returns:
            The text in upper case.
        """
        self.calls += 1
        return text.upper()


def _tool_call(name, **arguments):
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _train_with_environments(model_dir, tmp_path, reply, **kwargs):
    """PACSTrainer with PACS's default 4 optimizer steps per generation; `reply` scripts the completions."""
    from unittest.mock import patch

    from pacs import PACSTrainer
    from tests.tiny_config import tiny_pacs_config

    config = {"max_steps": 4, "num_generations": 2, "max_completion_length": 64, **kwargs.pop("config", {})}
    trainer = PACSTrainer(model=model_dir, args=tiny_pacs_config(tmp_path / "out", **config), **kwargs)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with patch.object(trainer.model, "generate", side_effect=scripted_generate(trainer.processing_class, reply)):
        trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)]
    return trainer, changed


def _used_a_tool(environments, **kwargs):
    """1.0 for a rollout whose environment's tool was called."""
    return [float(env.calls > 0) for env in environments]


@pytest.mark.filterwarnings("ignore:You are using 'environment_factory'")
def test_trainer_trains_with_several_environments_named_by_rows(tool_model_dir, tmp_path):
    # TRL's test_train_with_multiple_environments: rows carry only `environment`; each rollout sees its own tools
    reset_kwargs = []

    class Counter(CounterEnvironment):
        def reset(self, **kwargs):
            reset_kwargs.append(kwargs)
            return super().reset(**kwargs)

    def reply(prompt, i):
        if "<tool_response>" in prompt:
            return "Done!"
        if i % 2:  # one completion of each group calls its environment's tool: mixed labels in every group
            return "I won't."
        return _tool_call("increment", step=1) if "Count." in prompt else _tool_call("shout", text="hi")

    trainer, changed = _train_with_environments(
        tool_model_dir,
        tmp_path,
        reply,
        reward_funcs=_used_a_tool,
        train_dataset=Dataset.from_dict({"environment": ["counter", "echo"] * 8}),
        environment_factory={"counter": Counter, "echo": EchoEnvironment},
        config={"per_device_train_batch_size": 4, "shuffle_dataset": False},
    )
    assert trainer.args.steps_per_generation == 4  # PACS's default: one generation, four optimizer steps
    assert [t.__name__ for t in trainer._env_tools["counter"]] == ["increment"]
    assert [t.__name__ for t in trainer._env_tools["echo"]] == ["shout"]
    logs = trainer.state.log_history
    assert logs[0]["tools/call_frequency"] == pytest.approx(0.5) and logs[0]["tools/failure_frequency"] == 0.0
    assert logs[0]["pacs/rollout_label_mean"] == pytest.approx(0.5)  # the labels are the environments' outcomes
    assert reset_kwargs and all("environment" not in kwargs for kwargs in reset_kwargs)
    assert all(math.isfinite(entry["loss"]) for entry in logs if "loss" in entry)
    assert changed, "no parameter changed"


class ScoredEnvironment:  # owns its reward
    def reset(self, **kwargs):
        self.calls = 0
        return "Scored."

    def act(self, x: int) -> int:
        """
        Act.

        Args:
            x: A value.

        Returns:
            The value.
        """
        self.calls += 1
        return x

    def get_reward(self) -> float:
        return float(self.calls > 0)


class PlainEnvironment:  # no `get_reward`: scored by the reward functions only
    def reset(self, **kwargs):
        return "Plain."

    def play(self, x: int) -> int:
        """
        Play.

        Args:
            x: A value.

        Returns:
            The value.
        """
        return x


def _act_in_even_rows(prompt, i):
    if "<tool_response>" in prompt:
        return "Done!"
    return "I won't." if i % 2 else _tool_call("act" if "Scored." in prompt else "play", x=1)


@pytest.mark.filterwarnings("ignore:You are using 'environment_factory'")
def test_trainer_trains_on_environment_owned_rewards_of_mixed_environments(tool_model_dir, tmp_path):
    # TRL's test_environment_owned_reward_mixed_environments, trained: one reward column for ScoredEnvironment (two
    # names map to it), None (no label from it) for PlainEnvironment rollouts, which format_reward still scores
    def format_reward(completions, **kwargs):
        return [0.0 for _ in completions]

    trainer, changed = _train_with_environments(
        tool_model_dir,
        tmp_path,
        _act_in_even_rows,
        reward_funcs=format_reward,
        train_dataset=Dataset.from_dict({"environment": ["scored", "scored2", "plain"] * 4}),
        environment_factory={"scored": ScoredEnvironment, "scored2": ScoredEnvironment, "plain": PlainEnvironment},
        config={"per_device_train_batch_size": 4, "max_steps": 1},
    )
    assert trainer.reward_func_names == ["format_reward", "ScoredEnvironment"]
    assert trainer.reward_weights.tolist() == [1.0, 1.0]
    environments = [ScoredEnvironment(), PlainEnvironment()]
    environments[0].reset()
    assert trainer.reward_funcs[-1](completions=["", ""], environments=environments) == [0.0, None]
    first = trainer.state.log_history[0]
    assert 0.0 < first["rewards/ScoredEnvironment/mean"] < 1.0  # the mean over the rollouts it scored
    assert first["pacs/rollout_label_mean"] == pytest.approx(first["reward"])  # labels: weighted sums, None as 0
    assert changed, "no parameter changed"


@pytest.mark.filterwarnings("ignore:You are using 'environment_factory'")
def test_trainer_trains_on_environment_owned_data_and_reward_alone(tool_model_dir, tmp_path):
    # TRL's test_train_with_environment_owned_data and test_train_with_environment_owned_reward: no train_dataset (the
    # environment's reset() returns the prompt, max_steps sets the length), no reward_funcs (get_reward is the label)
    trainer, changed = _train_with_environments(
        tool_model_dir,
        tmp_path,
        _act_in_even_rows,
        environment_factory=ScoredEnvironment,
        config={"per_device_train_batch_size": 4, "max_steps": 1},
    )
    assert trainer.reward_func_names == ["ScoredEnvironment"]
    first = trainer.state.log_history[0]
    assert first["rewards/ScoredEnvironment/mean"] == pytest.approx(0.5)
    assert first["pacs/rollout_label_mean"] == pytest.approx(0.5)
    assert changed, "no parameter changed"


@pytest.mark.filterwarnings("ignore:You are using 'environment_factory'")
@pytest.mark.parametrize("case", list(ENVIRONMENT_REFUSALS))
def test_grpo_trainer_fails_where_the_environment_check_refuses(tool_model_dir, tmp_path, case, monkeypatch):
    # The check refuses nothing GRPOTrainer trains on: GRPOTrainer itself stops on each case, but only at train() (after
    # the model has loaded), while PACSTrainer stops at construction with the fix
    from trl import GRPOTrainer

    import pacs

    data, factory, remove_unused_columns, message = ENVIRONMENT_REFUSALS[case]
    kwargs = {
        "reward_funcs": _any_reward,
        "train_dataset": data(),
        "environment_factory": factory,
        "config": {"per_device_train_batch_size": 4, "max_steps": 1, "remove_unused_columns": remove_unused_columns},
    }
    with pytest.raises(ValueError, match=message):
        _train_with_environments(tool_model_dir, tmp_path, _act_in_even_rows, **kwargs)
    monkeypatch.setattr(pacs, "PACSTrainer", GRPOTrainer)
    with pytest.raises((TypeError, ValueError), match=r"reset\(\)|environment=None|No columns in the dataset match"):
        _train_with_environments(tool_model_dir, tmp_path, _act_in_even_rows, **kwargs)


def test_trainer_trains_with_tools(tool_model_dir, tmp_path):
    # TRL's test_train_with_tools: every group has one completion that calls the tool and one that does not
    def called_a_tool(completions, **kwargs):
        return [float(any(message.get("tool_calls") for message in completion)) for completion in completions]

    def reply(prompt, i):
        if "<tool_response>" in prompt:
            return "It is 12."
        return "I don't know." if i % 2 else _tool_call("multiply", a=3, b=4)

    questions = [[{"role": "user", "content": f"What is {i} times 4?"}] for i in range(16)]
    trainer, changed = _train_with_environments(
        tool_model_dir,
        tmp_path,
        reply,
        reward_funcs=called_a_tool,
        train_dataset=Dataset.from_dict({"prompt": questions}),
        tools=[multiply],
        config={"per_device_train_batch_size": 4, "max_steps": 1},
    )
    first = trainer.state.log_history[0]
    assert first["tools/call_frequency"] == pytest.approx(0.5) and first["tools/failure_frequency"] == 0.0
    assert first["pacs/rollout_label_mean"] == pytest.approx(0.5)
    assert changed, "no parameter changed"


def test_trainer_trains_with_a_rollout_func_whose_fields_feed_the_rewards(tiny_model_dir, tmp_path):
    # the reward needs `found`, which is no dataset column: the rollout function returns it (TRL merges it into the
    # reward keywords), so the check lets it through and PACSTrainer trains on it
    from pacs import PACSTrainer
    from tests.tiny_config import tiny_pacs_config

    def rollout(prompts, trainer):
        tokenizer = trainer.processing_class
        texts = ["No idea." if i % 2 else "It is 4." for i in range(len(prompts))]
        completion_ids = [tokenizer.encode(text) + [tokenizer.eos_token_id] for text in texts]
        return {
            "prompt_ids": [tokenizer.encode(prompt) for prompt in prompts],
            "completion_ids": completion_ids,
            "logprobs": [[0.0] * len(ids) for ids in completion_ids],
            "found": [i % 2 == 0 for i in range(len(prompts))],
        }

    def found_reward(completions, found, **kwargs):
        return [float(f) for f in found]

    args = tiny_pacs_config(tmp_path / "out", max_steps=2)
    trainer = PACSTrainer(
        tiny_model_dir, reward_funcs=found_reward, args=args, train_dataset=prompts_only(16), rollout_func=rollout
    )
    trainer.train()
    first = trainer.state.log_history[0]
    assert first["rewards/found_reward/mean"] == pytest.approx(0.5) and first["pacs/frac_mixed_groups"] == 1.0


def test_trainer_trains_on_an_iterable_dataset(tiny_model_dir, tmp_path):
    def parity_reward(completions, **kwargs):
        return [float(len(c) % 2) for c in completions]

    trainer = _build_and_train(
        tiny_model_dir,
        tmp_path,
        parity_reward,
        prompts_only(32).to_iterable_dataset(),
        max_steps=4,
        steps_per_generation=4,
    )
    assert trainer.state.global_step == 4
    assert all(math.isfinite(entry["loss"]) for entry in trainer.state.log_history if "loss" in entry)
