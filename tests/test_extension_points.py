"""The hardened layer's extension points, pinned by a recording subclass: their order, their arguments and the mode
each receives, and the model's mode where TRL reads it (`_compute_loss`, `log`), in training and in evaluation under
TRL's continuous batching (which sets the model to training mode after generating, even in evaluation)."""

import pytest
from datasets import Dataset

from pacs import PACSTrainer
from pacs.testing import tiny_pacs_config


TRAIN_LABEL, EVAL_LABEL = 0.25, 0.75


def split_reward(completions, split, **kwargs):
    """One value for training prompts, another for evaluation ones: a label statistic names the batch it came from."""
    return [EVAL_LABEL if s == "eval" else TRAIN_LABEL for s in split]


class Recorder(PACSTrainer):
    """Records every extension point: `(point, mode, details)`, and the model's mode at `_compute_loss` and `log`."""

    def __init__(self, *args, **kwargs):
        self.events = []  # `_check_args` runs before the model loads: the list must exist first (a test's liberty)
        super().__init__(*args, **kwargs)

    def _check_args(self, args):
        layout = super()._check_args(args)
        self.events.append(("_check_args", None, {"args": type(args).__name__, "layout": dict(layout)}))
        return layout

    def _before_generation(self, mode):
        self.events.append(("_before_generation", mode, {"training": self.model.training}))
        super()._before_generation(mode)

    def _after_rewards(self, rewards_per_func, scorable, mode):
        columns = super()._after_rewards(rewards_per_func, scorable, mode)
        details = {"rewards": tuple(rewards_per_func.shape), "scorable": tuple(scorable.shape)}
        details |= {"columns": {k: tuple(v.shape) for k, v in columns.items()}, "training": self.model.training}
        self.events.append(("_after_rewards", mode, details))
        return columns

    def _after_scoring(self, output, mode):
        self.events.append(("_after_scoring", mode, {"keys": set(output), "rows": output["prompt_ids"].size(0)}))
        return super()._after_scoring(output, mode)

    def _after_monitors(self, output, mode):
        output = super()._after_monitors(output, mode)
        labels = output["pacs_labels"]
        self.events.append(("_after_monitors", mode, {"labels": labels.tolist(), "training": self.model.training}))
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
    return [(name, m) for name, m, _ in events if name not in ("_check_args", "_compute_loss", "log")]


@pytest.mark.parametrize("continuous_batching", [False, True])
def test_every_point_gets_its_batch_and_mode_in_training_and_evaluation(tiny_model_dir, tmp_path, continuous_batching):
    train, evaluation = _datasets()
    args = tiny_pacs_config(
        tmp_path / "out", max_steps=1, steps_per_generation=1, per_device_eval_batch_size=4,
        eval_strategy="steps", eval_steps=1, use_transformers_continuous_batching=continuous_batching,
    )  # fmt: skip
    trainer = Recorder(
        model=tiny_model_dir, reward_funcs=split_reward, args=args, train_dataset=train, eval_dataset=evaluation
    )
    assert trainer.events == [("_check_args", None, {"args": "PACSConfig", "layout": {"pacs_split": None}})]
    assert trainer._layout == {"pacs_split": None}  # stored by __init__, after GRPOTrainer's
    trainer.train()
    events = trainer.events[1:]
    batch = ["_before_generation", "_after_rewards", "_after_scoring", "_after_monitors"]
    # one training generation, then one evaluation batch; each point in order, with the batch's mode
    assert _points(events) == [(p, "train") for p in batch] + [(p, "eval") for p in batch]
    by_point = {(name, mode): details for name, mode, details in events if mode}
    for mode in ("train", "eval"):
        assert by_point[("_before_generation", mode)]["training"] == (mode == "train")
        rewards = by_point[("_after_rewards", mode)]
        assert rewards["rewards"] == (4, 1) and rewards["scorable"] == (4,)
        assert rewards["columns"] == {"pacs_labels": (4,), "pacs_scorable": (4,)}  # pacs_index: `_after_scoring`
        # the model is back in the batch's mode as soon as TRL has generated: before the rewards
        assert rewards["training"] == (mode == "train")
        scored = by_point[("_after_scoring", mode)]
        assert {"pacs_labels", "pacs_scorable", "advantages"} <= scored["keys"] and scored["rows"] == 4
        expected = EVAL_LABEL if mode == "eval" else TRAIN_LABEL
        assert by_point[("_after_monitors", mode)]["labels"] == [expected] * 4  # the labels ride with the batch
    # the model's mode where TRL reads it: the training loss in training mode, the evaluation loss and its log in eval
    loss_modes = [d["training"] for name, _, d in events if name == "_compute_loss"]
    assert loss_modes == [True, False]
    logs = [d for name, _, d in events if name == "log"]
    assert all(d["training"] is False for d in logs if d["eval"]) and any(d["eval"] for d in logs)
    # evaluation label statistics only under eval_ keys, training ones only without
    history = trainer.state.log_history
    train_means = [e["pacs/rollout_label_mean"] for e in history if "pacs/rollout_label_mean" in e]
    eval_means = [e["eval_pacs/rollout_label_mean"] for e in history if "eval_pacs/rollout_label_mean" in e]
    assert train_means == [pytest.approx(TRAIN_LABEL)] and eval_means == [pytest.approx(EVAL_LABEL)]
    assert all("eval_pacs/label_mean" not in e or "pacs/loss" not in e for e in history)


def test_checkpoint_points_get_the_folder(tiny_model_dir, tmp_path):
    train, _ = _datasets()
    args = tiny_pacs_config(tmp_path / "out", max_steps=1, steps_per_generation=1, save_strategy="steps", save_steps=1)
    trainer = Recorder(model=tiny_model_dir, reward_funcs=split_reward, args=args, train_dataset=train)
    saved, loaded = [], []
    trainer._save_extra_state = lambda folder: saved.append(folder)
    trainer.train()
    assert [p.rsplit("/", 1)[-1] for p in saved] == ["checkpoint-1"]
    resumed = Recorder(
        model=tiny_model_dir,
        reward_funcs=split_reward,
        args=tiny_pacs_config(tmp_path / "out", max_steps=2, steps_per_generation=1, save_strategy="no"),
        train_dataset=train,
    )
    resumed._load_extra_state = lambda checkpoint: loaded.append(checkpoint)
    resumed.train(resume_from_checkpoint=True)
    assert loaded == saved
    assert resumed.state.global_step == 2
