"""`pacs.grpo.trainer`: the hardened GRPO layer, as a GRPO trainer in its own right and as the floor PACS stands on.

- The layers: nothing under `pacs/grpo/` imports PACS; each TRL method is overridden in one class of `PACSTrainer`'s
  hierarchy, and `pacs._compat` names exactly the private ones.
- As GRPO: `HardenedGRPOTrainer` trains exactly as TRL's `GRPOTrainer` on the same run (loss, metrics, weights), with
  the checks before work, the reward-output guard, the gradient guard, and an exact resume from a checkpoint in the
  middle of a generation batch.
"""

import ast
import math
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from pacs import PACSTrainer, _compat
from pacs.grpo import HardenedGRPOConfig, HardenedGRPOTrainer
from pacs.grpo.checkpoints import ROLLOUT_DIR
from pacs.grpo.guards import NonFiniteGradientGuard
from pacs.grpo.metrics import group_outcome_shares
from pacs.loss_terms import GRPOLossTerms
from pacs.testing import tiny_pacs_config


SRC = Path(__file__).resolve().parents[1] / "src" / "pacs"
# the PACS layer's rooms
PACS_MODULES = {"config", "trainer", "loss", "loss_terms", "labels", "critic", "split", "reference"}


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def prompts(n=32, column="prompt"):
    return Dataset.from_dict({column: [f"What is {i} + {2 * i}?" for i in range(n)]})


def grpo_settings(output_dir, **overrides) -> dict:
    """The tiny CPU run's settings (`tiny_pacs_config`), as plain GRPOConfig keywords, float32."""
    pacs_args = tiny_pacs_config(output_dir, **overrides)
    keys = (
        "output_dir", "use_cpu", "bf16", "per_device_train_batch_size", "gradient_accumulation_steps",
        "steps_per_generation", "num_generations", "max_completion_length", "max_steps", "learning_rate", "optim",
        "lr_scheduler_type", "seed", "save_strategy", "save_steps", "report_to", "logging_steps",
    )  # fmt: skip
    return {k: getattr(pacs_args, k) for k in keys} | {"bf16": False}


# ---------------------------------------------------------------------------------------------------------------------
# The layers
# ---------------------------------------------------------------------------------------------------------------------


def _imported_pacs_modules(path: Path) -> set[str]:
    """The top-level `pacs` modules `path` imports: `from pacs.X`, `import pacs.X`, `from ..X` / `from .. import X`
    (a module of `pacs/grpo/`) or `from .X` (a module of `pacs/`)."""
    level_of_pacs = 2 if path.parent.name == "grpo" else 1
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[1] for a in node.names if a.name.startswith("pacs.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("pacs."):
            names.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.level == level_of_pacs:
            names |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
    return names


def test_the_grpo_layer_imports_nothing_of_pacs():
    files = sorted((SRC / "grpo").glob("*.py"))
    assert len(files) >= 7
    for path in files:  # an allow-list: the floor (`_compat`) and the layer's own rooms
        assert _imported_pacs_modules(path) <= {"_compat"} | {f.stem for f in files}, path.name
    # and the check sees an upward import where there is one
    assert {"loss", "_compat"} <= _imported_pacs_modules(SRC / "split.py")


def _trl_methods() -> set[str]:
    """Every method and property of GRPOTrainer and its bases (transformers' Trainer), constructors aside."""
    return {
        name
        for cls in GRPOTrainer.__mro__[:-1]
        for name, value in vars(cls).items()
        if not name.startswith("__") and (callable(value) or isinstance(value, (property, staticmethod, classmethod)))
    }


def test_each_trl_method_is_overridden_in_one_class():
    # every class between PACSTrainer and GRPOTrainer, mixins included, counts
    layers = PACSTrainer.__mro__[: PACSTrainer.__mro__.index(GRPOTrainer)]
    assert [cls.__name__ for cls in layers] == ["PACSTrainer", "GRPOLossTerms", "HardenedGRPOTrainer"]
    owners = {name: [cls.__name__ for cls in layers if name in vars(cls)] for name in _trl_methods()}
    assert {name: who for name, who in owners.items() if len(who) > 1} == {}
    overridden = {name for name, who in owners.items() if who}
    # the PACS layer overrides the loss and the batch shuffle of TRL, and nothing the hardened layer overrides; its
    # loss terms (a mixin) override nothing of TRL
    assert {name for name in overridden if name in vars(PACSTrainer)} == {"_compute_loss", "_prepare_inputs"}
    assert not set(vars(GRPOLossTerms)) & _trl_methods()
    # every private GRPOTrainer method overridden is named in `_compat` (checked at import), by its layer, and vice versa
    private = {name for name in overridden if name.startswith("_") and name in vars(GRPOTrainer)}
    assert {name for name in private if name in vars(HardenedGRPOTrainer)} == set(_compat._OVERRIDDEN)
    assert {name for name in private if name in vars(PACSTrainer)} == set(_compat._PACS_OVERRIDDEN)
    # extension points: the hardened layer defines them, PACS extends them; TRL has none of these names; none runs
    # before GRPOTrainer's `__init__` (what a subclass derives from its config, the config's `__post_init__` checks)
    points = {"_before_generation", "_after_rewards", "_after_scoring", "_after_monitors", "_save_extra_state",
              "_load_extra_state"}  # fmt: skip
    assert points <= set(vars(HardenedGRPOTrainer)) and points <= set(vars(PACSTrainer))
    assert not points & _trl_methods()
    assert "_check_args" not in dir(PACSTrainer)
    # what only a loss-replacing subclass needs lives a floor up, not in the GRPO layer
    layer_source = "\n".join(path.read_text() for path in (SRC / "grpo").glob("*.py"))
    for name in ("_add_grpo_terms", "_entropy_bonus", "entropy_coef_delta", "_check_args", "shuffle_sequence_dict"):
        assert name not in layer_source, name


def test_each_trl_fact_is_checked_against_the_installed_trl(monkeypatch):
    import dataclasses
    import inspect

    assert all(f'"{key}"' in inspect.getsource(GRPOTrainer._compute_loss) for key in _compat.MULTIMODAL_KEYS)
    assert set(_compat.GRPO_ONLY_LOSS_SETTINGS) <= {f.name for f in dataclasses.fields(GRPOConfig)}
    _compat.check_trl()  # the installed TRL has every private name pacs touches
    _compat.check_trl("pacs")
    monkeypatch.setattr(_compat, "_STATE", (*_compat._STATE, "_a_renamed_buffer"))
    with pytest.raises(ImportError, match="without _a_renamed_buffer"):
        _compat.check_trl()
    _compat.check_trl("pacs")  # the layers' facts are checked apart: PACS's check does not read the layer's
    monkeypatch.setattr(_compat, "_PACS_STATE", (*_compat._PACS_STATE, "_a_renamed_controller"))
    with pytest.raises(ImportError, match="without _a_renamed_controller"):
        _compat.check_trl("pacs")


def test_the_pacs_trainer_holds_no_hardening():
    hardening = {"checks", "checkpoints", "guards", "vllm_sync"}
    tree = ast.parse((SRC / "trainer.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {
        f"{node.module}.{a.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names
    }
    assert not [name for name in imported if name.split(".")[-1] in hardening], imported
    # `pacs train` picks the trainer and its config from one table: no branch of the run tests the algorithm
    tests = [
        ast.unparse(node.test)
        for node in ast.walk(ast.parse((SRC / "train.py").read_text()))
        if isinstance(node, (ast.If, ast.IfExp, ast.While))
    ]
    assert len(tests) > 3 and not [test for test in tests if "algorithm" in test]


# ---------------------------------------------------------------------------------------------------------------------
# As a GRPO trainer
# ---------------------------------------------------------------------------------------------------------------------


OUTCOME_KEYS = ("pacs/frac_all_wrong_groups", "pacs/frac_all_right_groups")


def test_group_outcome_shares_separates_all_wrong_from_all_right():
    ok = torch.ones(8, dtype=torch.bool)
    rewards = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.4, 0.6])  # groups of 2: wrong, mixed, right, mixed
    assert group_outcome_shares(rewards, ok, 2) == {OUTCOME_KEYS[0]: 0.25, OUTCOME_KEYS[1]: 0.25}
    assert group_outcome_shares(rewards, ok, 4) == {OUTCOME_KEYS[0]: 0.0, OUTCOME_KEYS[1]: 0.0}
    # a completion no function scored is neither: a group with only unscored rows is in neither share
    scorable = torch.tensor([True, False, False, False, True, False, True, True])
    assert group_outcome_shares(rewards, scorable, 2) == {OUTCOME_KEYS[0]: 0.25, OUTCOME_KEYS[1]: 0.25}
    with pytest.raises(ValueError, match="num_generations=3"):
        group_outcome_shares(rewards, ok, 3)


def _train(trainer_cls, config_cls, model_dir, output_dir, **overrides):
    args = config_cls(**grpo_settings(output_dir, **overrides))
    trainer = trainer_cls(model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())
    trainer.train()
    return trainer


def test_trains_exactly_as_grpo_trainer(tiny_model_dir, tmp_path):
    # 2 optimizer steps per generation (the old log-probs path), 3 steps: TRL's loss, metrics and weights, unchanged
    settings = dict(max_steps=3, gradient_accumulation_steps=1, steps_per_generation=2, logging_steps=1)
    plain = _train(GRPOTrainer, GRPOConfig, tiny_model_dir, tmp_path / "plain", **settings)
    hardened = _train(HardenedGRPOTrainer, HardenedGRPOConfig, tiny_model_dir, tmp_path / "hardened", **settings)
    logs = [t.state.log_history for t in (plain, hardened)]
    losses = [[entry["loss"] for entry in log if "loss" in entry] for log in logs]
    assert len(losses[0]) == 3 and any(loss != 0 for loss in losses[0])
    timing = ("runtime", "per_second", "step_time")
    for plain_entry, hardened_entry in zip(*logs, strict=True):  # every metric TRL logs, bit for bit
        keys = {k for k in plain_entry if not any(t in k for t in timing)}
        assert {k: plain_entry[k] for k in keys} == {k: hardened_entry[k] for k in keys}
        layer_keys = {"pacs/skipped_steps", "pacs/real_token_frac", *OUTCOME_KEYS}  # the layer's own
        assert set(hardened_entry) - set(plain_entry) <= layer_keys
        if "frac_reward_zero_std" in hardened_entry:  # binary rewards: a uniform group is all wrong or all right
            shares = hardened_entry["pacs/frac_all_wrong_groups"] + hardened_entry["pacs/frac_all_right_groups"]
            assert shares == pytest.approx(hardened_entry["frac_reward_zero_std"], abs=1e-6)
    assert sum(OUTCOME_KEYS[0] in entry for entry in logs[1]) == 2  # one per generation batch (3 steps, 2 per batch)
    initial = GRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=parity_reward,
        args=GRPOConfig(**grpo_settings(tmp_path / "initial")),
        train_dataset=prompts(),
    )
    moved = [not torch.equal(a, b) for a, b in zip(initial.model.parameters(), plain.model.parameters(), strict=True)]
    assert any(moved)
    for (name, a), b in zip(plain.model.named_parameters(), hardened.model.parameters(), strict=True):
        assert torch.equal(a, b), name
    # the gradient guard sits on the hardened trainer's optimizer, and counted no skipped step
    assert any(isinstance(c, NonFiniteGradientGuard) for c in hardened.callback_handler.callbacks)
    assert not any(isinstance(c, NonFiniteGradientGuard) for c in plain.callback_handler.callbacks)
    assert [e["pacs/skipped_steps"] for e in logs[1] if "pacs/skipped_steps" in e][-1] == 0


def test_checks_run_before_the_model_loads(tiny_model_dir, tmp_path, monkeypatch):
    def load(*args, **kwargs):
        raise AssertionError("GRPOTrainer.__init__ ran: the model loads before the checks")

    monkeypatch.setattr(GRPOTrainer, "__init__", load)
    args = HardenedGRPOConfig(**grpo_settings(tmp_path))
    with pytest.raises(ValueError, match="no 'prompt' column"):
        HardenedGRPOTrainer(
            model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts(column="question")
        )
    with pytest.raises(ValueError, match="No such model directory"):
        HardenedGRPOTrainer(model=str(tmp_path / "missing"), reward_funcs=parity_reward, args=args)
    grpo_args = GRPOConfig(**grpo_settings(tmp_path))
    with pytest.raises(TypeError, match=r"HardenedGRPOTrainer needs args=HardenedGRPOConfig\(...\), got GRPOConfig"):
        HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=grpo_args)
    with pytest.raises(AssertionError, match="the model loads"):  # valid input reaches TRL's __init__
        HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())


def test_a_nan_reward_is_an_error_naming_the_function(tiny_model_dir, tmp_path):
    def nan_reward(completions, **kwargs):
        return [math.nan] * len(completions)

    args = HardenedGRPOConfig(**grpo_settings(tmp_path, max_steps=1))
    trainer = HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=nan_reward, args=args, train_dataset=prompts())
    with pytest.raises(ValueError, match="nan_reward returned nan for completion 0 of"):
        trainer.train()


def test_resume_in_the_middle_of_a_generation_is_exact(tiny_model_dir, tmp_path):
    # 2 optimizer steps per generation, a checkpoint after each: checkpoint-1 falls inside the first generation
    settings = dict(
        max_steps=3, gradient_accumulation_steps=1, steps_per_generation=2, optim="sgd", learning_rate=0.1,
        lr_scheduler_type="linear", seed=3, save_strategy="steps", save_steps=1,
    )  # fmt: skip
    full = _train(HardenedGRPOTrainer, HardenedGRPOConfig, tiny_model_dir, tmp_path / "full", **settings)
    assert (tmp_path / "full" / "checkpoint-1" / ROLLOUT_DIR).is_dir()
    assert not (tmp_path / "full" / "checkpoint-2" / ROLLOUT_DIR).exists()  # a generation boundary
    args = HardenedGRPOConfig(**grpo_settings(tmp_path / "full", **settings))
    resumed = HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-1"))
    initial = HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())
    flat = [torch.cat([p.detach().flatten() for p in t.model.parameters()]) for t in (initial, full, resumed)]
    update = (flat[1] - flat[0]).norm()
    assert update > 0 and (flat[2] - flat[1]).norm() / update <= 1e-6


def test_a_tied_lm_head_missing_from_a_checkpoint_is_tied_without_a_warning(tiny_model_dir, tmp_path, monkeypatch):
    # transformers warns "There were missing keys in the checkpoint model loaded: ['lm_head.weight']" on every load
    # of a tied model's checkpoint (e.g. a finished run's final weights); the layer ties it instead
    import transformers.trainer
    from torch.nn.modules.module import _IncompatibleKeys

    warnings = []
    monkeypatch.setattr(transformers.trainer.logger, "warning", lambda msg, *a, **k: warnings.append(msg))
    args = HardenedGRPOConfig(**grpo_settings(tmp_path))
    trainer = HardenedGRPOTrainer(model=tiny_model_dir, reward_funcs=parity_reward, args=args, train_dataset=prompts())
    assert trainer.model.config.tie_word_embeddings
    trainer._issue_warnings_after_load(_IncompatibleKeys(["lm_head.weight"], []))
    assert warnings == []
    trainer._issue_warnings_after_load(_IncompatibleKeys(["model.norm.weight"], []))  # a real missing weight: warned
    assert len(warnings) == 1 and "model.norm.weight" in warnings[0]
