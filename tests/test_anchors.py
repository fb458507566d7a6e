"""Tests of `pacs.anchors`: one registry that every consumer reads (PACSConfig's choices and validation, `pacs demo`'s
choices, `pacs plan`'s memory, the trainer's construction), and an interface a new anchor implements."""

import dataclasses
import subprocess
import sys

import pytest

import pacs.anchors as anchors
from pacs import PACSConfig
from pacs.anchors import ANCHORS, AnchorInfo, anchor_class, anchor_description, anchor_names
from pacs.anchors.rollout import RolloutAnchor


class FakeAnchor(RolloutAnchor):
    """A new anchor: the rollout anchor under another name, holding (for the planner) a model copy."""

    built = []

    def __init__(self, args, model, accelerator, logps, kl_ref_model=None):
        super().__init__(args, model, accelerator, logps, kl_ref_model)
        FakeAnchor.built.append(args.pacs_anchor)


@pytest.fixture
def fake_anchor(monkeypatch):
    """`fake` registered as a new anchor is: one line in the registry."""
    registry = {**ANCHORS, "fake": AnchorInfo(f"{__name__}:FakeAnchor", "a test's anchor", model_copy=True)}
    monkeypatch.setattr(anchors, "ANCHORS", registry)
    for module in ("pacs.config", "pacs.plan.resolve", "pacs.plan.memory"):
        monkeypatch.setattr(f"{module}.ANCHORS", registry)
    FakeAnchor.built.clear()
    return "fake"


def test_the_registry_names_the_shipped_anchors_and_imports_them_lazily():
    assert anchor_names() == ("rollout", "reference")
    assert anchor_description().startswith("'rollout' (pi_old") and " or 'reference' (" in anchor_description()
    assert anchor_class("rollout") is RolloutAnchor
    assert anchor_class("reference").__name__ == "ReferenceAnchor"
    assert [name for name, info in ANCHORS.items() if info.model_copy] == ["reference"]
    code = "import sys, pacs.anchors, pacs.plan; print(any(m.split('.')[0] == 'trl' for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_config_reads_the_registry(tmp_path, fake_anchor):
    with pytest.raises(ValueError, match=r"use 'rollout' \(.*\), 'reference' \(.*\) or 'fake' \(a test's anchor\)"):
        PACSConfig(str(tmp_path), use_cpu=True, bf16=False, pacs_anchor="nope")
    assert PACSConfig(str(tmp_path), use_cpu=True, bf16=False, pacs_anchor=fake_anchor).pacs_anchor == "fake"
    field = {f.name: f for f in dataclasses.fields(PACSConfig)}["pacs_anchor"]
    assert list(field.metadata["choices"]) == ["rollout", "reference", "fake"]  # what TrlParser gives argparse


def test_demo_reads_the_registry(fake_anchor):
    from pacs.demo import parse_args, trainer_config

    args = parse_args(["--pacs-anchor", fake_anchor])
    assert args.pacs_anchor == "fake" and trainer_config(args, "unused").pacs_anchor == "fake"
    with pytest.raises(ValueError, match="invalid choice: 'nope'"):
        parse_args(["--pacs-anchor", "nope"])


def test_planner_reads_the_registry(fake_anchor):
    from pacs.plan import plan_recipe

    def reference_row(anchor):
        plan = plan_recipe("qwen3_4b_pacs", overrides=["--pacs_anchor", anchor], gpu_memory_gb=80)
        rows = dict(sum((rows for title, rows in plan.sections if title.startswith("Training memory")), []))
        return rows.get("reference model")

    assert reference_row("rollout") is None
    row = reference_row(fake_anchor)  # a new anchor that holds a model copy is counted, and named
    assert row is not None and "pacs_anchor reference or pacs_anchor fake" in row


def test_trainer_builds_the_anchor_the_registry_names(tiny_model_dir, tmp_path, fake_anchor):
    from datasets import Dataset

    from pacs import PACSTrainer
    from tests.tiny_config import tiny_pacs_config

    args = tiny_pacs_config(tmp_path / "out", max_steps=1, pacs_anchor=fake_anchor)
    dataset = Dataset.from_dict({"prompt": ["a", "b"]})
    trainer = PACSTrainer(
        model=tiny_model_dir,
        reward_funcs=lambda completions, **kw: [1.0] * len(completions),
        args=args,
        train_dataset=dataset,
    )
    assert isinstance(trainer._pacs_anchor, FakeAnchor) and FakeAnchor.built == ["fake"]


class Incomplete:
    """An anchor class that forgot two members of the protocol."""

    at_policy = False

    def logps(self, inputs):
        return None


def test_an_anchor_is_checked_against_the_protocol_when_it_registers(monkeypatch):
    from pacs.anchors import ANCHOR_METHODS, register_anchor

    monkeypatch.setattr(anchors, "ANCHORS", dict(ANCHORS))  # register into a copy
    with pytest.raises(TypeError, match=r"'incomplete' .*lacks \['proxy_is_zero', 'before_generation'.*'load'\]"):
        register_anchor("incomplete", AnchorInfo(f"{__name__}:Incomplete", "a test's anchor"))
    assert "incomplete" not in anchors.ANCHORS
    register_anchor("fake", AnchorInfo(f"{__name__}:FakeAnchor", "a test's anchor"))  # every member: registered
    assert anchors.ANCHORS["fake"].target.endswith(":FakeAnchor") and anchor_class("fake") is FakeAnchor
    with pytest.raises(ValueError, match="registered already"):
        register_anchor("fake", AnchorInfo(f"{__name__}:FakeAnchor", "again"))
    # put in the table by hand, it fails where a trainer builds it
    anchors.ANCHORS["by_hand"] = AnchorInfo(f"{__name__}:Incomplete", "a test's anchor")
    with pytest.raises(TypeError, match="lacks"):
        anchor_class("by_hand")
    assert set(ANCHOR_METHODS) >= {"logps", "save", "load"}
