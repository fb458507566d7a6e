"""The hardened layer's extension points, pinned by a recording subclass of the layer itself (`HardenedGRPOTrainer`,
GRPO's own loss): their order, their arguments and the mode each receives, the columns `_after_rewards` returns riding
with the batch, and the model's mode where TRL reads it (`_compute_loss`, `log`), in training and in evaluation under
TRL's continuous batching (which sets the model to training mode after generating, even in evaluation). No point runs
before GRPOTrainer's `__init__`. With dynamic sampling, `_after_rewards` and `_sampling_signal` run once per round,
the others once per generation batch."""

import pytest
from datasets import Dataset

from pacs.grpo import HardenedGRPOConfig, HardenedGRPOTrainer


TRAIN_LABEL, EVAL_LABEL = 0.25, 0.75
COLUMN = "recorded_reward"  # the recorder's own per-row column


def split_reward(completions, split, **kwargs):
    """One value for training prompts, another for evaluation ones: a statistic names the batch it came from."""
    return [EVAL_LABEL if s == "eval" else TRAIN_LABEL for s in split]


def tiny_grpo_config(output_dir, **overrides) -> HardenedGRPOConfig:
    base = dict(
        output_dir=str(output_dir), use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=8, max_steps=1, steps_per_generation=1, learning_rate=1e-2, logging_steps=1,
        save_strategy="no", report_to="none", seed=0,
    )  # fmt: skip
    return HardenedGRPOConfig(**{**base, **overrides})


class Recorder(HardenedGRPOTrainer):
    """Records every extension point: `(point, mode, details)`, and the model's mode at `_compute_loss` and `log`.
    Its `_after_rewards` returns one column, the first reward function's score, which must ride with the batch."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events = []  # after GRPOTrainer's `__init__`: no point has run yet

    def _before_generation(self, mode):
        self.events.append(("_before_generation", mode, {"training": self.model.training}))
        super()._before_generation(mode)

    def _after_rewards(self, rewards_per_func, scorable, mode):
        columns = super()._after_rewards(rewards_per_func, scorable, mode)
        columns = {**columns, COLUMN: rewards_per_func[:, 0]}  # (B_global,)
        details = {"rewards": tuple(rewards_per_func.shape), "scorable": tuple(scorable.shape)}
        details |= {"columns": {k: tuple(v.shape) for k, v in columns.items()}, "training": self.model.training}
        self.events.append(("_after_rewards", mode, details))
        return columns

    def _sampling_signal(self, output, rewards_per_func, scorable):
        # with dynamic sampling, training only: each round's batch on this process, with `_after_rewards`' columns
        details = {"keys": set(output), "rewards": tuple(rewards_per_func.shape), "scorable": tuple(scorable.shape)}
        self.events.append(("_sampling_signal", "train", details))
        return super()._sampling_signal(output, rewards_per_func, scorable)

    def _after_scoring(self, output, mode):
        self.events.append(("_after_scoring", mode, {"keys": set(output), "rows": output["prompt_ids"].size(0)}))
        return super()._after_scoring(output, mode)

    def _after_monitors(self, output, mode):
        output = super()._after_monitors(output, mode)
        column = output[COLUMN]
        self.events.append(("_after_monitors", mode, {"column": column.tolist(), "training": self.model.training}))
        return output

    def _compute_loss(self, model, inputs):
        self.events.append(("_compute_loss", None, {"training": self.model.training}))
        return super()._compute_loss(model, inputs)

    def log(self, logs, *args, **kwargs):
        self.events.append(
            ("log", None, {"training": self.model.training, "eval": any(k.startswith("eval_") for k in logs)})
        )
        return super().log(logs, *args, **kwargs)


def _datasets(n_train=2, n_eval=1):
    train = Dataset.from_dict({"prompt": [f"train {i}" for i in range(n_train)], "split": ["train"] * n_train})
    evaluation = Dataset.from_dict({"prompt": [f"eval {i}" for i in range(n_eval)], "split": ["eval"] * n_eval})
    return train, evaluation


def _points(events):
    return [(name, m) for name, m, _ in events if name not in ("_compute_loss", "log")]


@pytest.mark.parametrize("continuous_batching", [False, True])
def test_every_point_gets_its_batch_and_mode_in_training_and_evaluation(tiny_model_dir, tmp_path, continuous_batching):
    train, evaluation = _datasets()
    args = tiny_grpo_config(
        tmp_path / "out", per_device_eval_batch_size=4, eval_strategy="steps", eval_steps=1,
        use_transformers_continuous_batching=continuous_batching,
    )  # fmt: skip
    trainer = Recorder(
        model=tiny_model_dir, reward_funcs=split_reward, args=args, train_dataset=train, eval_dataset=evaluation
    )
    trainer.train()
    events = trainer.events
    batch = ["_before_generation", "_after_rewards", "_after_scoring", "_after_monitors"]
    # one training generation, then one evaluation batch; each point in order, with the batch's mode
    assert _points(events) == [(p, "train") for p in batch] + [(p, "eval") for p in batch]
    by_point = {(name, mode): details for name, mode, details in events if mode}
    for mode in ("train", "eval"):
        assert by_point[("_before_generation", mode)]["training"] == (mode == "train")
        rewards = by_point[("_after_rewards", mode)]
        assert rewards["rewards"] == (4, 1) and rewards["scorable"] == (4,)
        assert rewards["columns"] == {COLUMN: (4,)}  # the layer adds none of its own
        # the model is back in the batch's mode as soon as TRL has generated: before the rewards
        assert rewards["training"] == (mode == "train")
        scored = by_point[("_after_scoring", mode)]
        assert {COLUMN, "advantages"} <= scored["keys"] and scored["rows"] == 4
        expected = EVAL_LABEL if mode == "eval" else TRAIN_LABEL
        assert by_point[("_after_monitors", mode)]["column"] == [expected] * 4  # the column rides with the batch
    # the model's mode where TRL reads it: the training loss in training mode, the evaluation loss and its log in eval
    loss_modes = [d["training"] for name, _, d in events if name == "_compute_loss"]
    assert loss_modes == [True, False]
    logs = [d for name, _, d in events if name == "log"]
    assert all(d["training"] is False for d in logs if d["eval"]) and any(d["eval"] for d in logs)
    # evaluation statistics only under eval_ keys, training ones only without
    history = trainer.state.log_history
    train_means = [e["reward"] for e in history if "reward" in e]
    eval_means = [e["eval_reward"] for e in history if "eval_reward" in e]
    assert train_means == [pytest.approx(TRAIN_LABEL)] and eval_means == [pytest.approx(EVAL_LABEL)]


def test_checkpoint_points_get_the_folder(tiny_model_dir, tmp_path):
    train, _ = _datasets()
    args = tiny_grpo_config(tmp_path / "out", save_strategy="steps", save_steps=1)
    trainer = Recorder(model=tiny_model_dir, reward_funcs=split_reward, args=args, train_dataset=train)
    saved, loaded = [], []
    trainer._save_extra_state = lambda folder: saved.append(folder)
    trainer.train()
    assert [p.rsplit("/", 1)[-1] for p in saved] == ["checkpoint-1"]
    resumed = Recorder(
        model=tiny_model_dir,
        reward_funcs=split_reward,
        args=tiny_grpo_config(tmp_path / "out", max_steps=2),
        train_dataset=train,
    )
    resumed._load_extra_state = lambda checkpoint: loaded.append(checkpoint)
    resumed.train(resume_from_checkpoint=True)
    assert loaded == saved
    assert resumed.state.global_step == 2


def test_with_dynamic_sampling_each_round_gets_the_rewards_point_and_the_sampling_signal(tiny_model_dir, tmp_path):
    # split_reward makes every group uniform: round 1 (train 0 or train 1), one top-up round of the other prompt, then
    # no fresh prompt is left, and the fallback fills the batch
    train, _ = _datasets()
    args = tiny_grpo_config(tmp_path / "out", dynamic_sampling=True)
    trainer = Recorder(model=tiny_model_dir, reward_funcs=split_reward, args=args, train_dataset=train)
    trainer.train()
    round_points = [("_after_rewards", "train"), ("_sampling_signal", "train")]
    assert _points(trainer.events) == [
        ("_before_generation", "train"), *round_points, *round_points, ("_after_scoring", "train"),
        ("_after_monitors", "train"),
    ]  # fmt: skip
    for name, _, details in trainer.events:
        if name == "_sampling_signal":  # this process's rows of the round, with the rewards point's column
            assert details["rewards"] == (4, 1) and details["scorable"] == (4,)
            assert {COLUMN, "advantages", "completion_mask"} <= details["keys"]
