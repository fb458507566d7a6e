"""Smoke tests: each benchmark script runs one tiny iteration end to end, so that the scripts cannot rot.

    python -m pytest tests/test_benchmarks.py -q

The real runs (minutes to tens of minutes) are not part of CI; see benchmarks/README.md.
"""

import importlib.util
import math
import sys
from pathlib import Path


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str):
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # the scripts import their sibling `_common`
    spec = importlib.util.spec_from_file_location(f"pacs_benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_step_cost_smoke(tmp_path):
    step_cost = _load("step_cost")
    out = step_cost.main(["--smoke", "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")])
    assert {r["trainer"] for r in out["results"]} == {"PACS", "GRPO", "RLOO"}
    for r in out["results"]:
        assert r["opt_s"] > 0 and r["gen_s"] > 0 and r["peak_mem_mib"] > 0
    assert all(math.isfinite(t) for ts in out["loss_only"]["times_s"].values() for t in ts)
    assert "PACS / GRPO" in (tmp_path / "step_cost_smoke.md").read_text()
    assert "pacs_loss" in (tmp_path / "loss_cost_smoke.md").read_text()


def test_learning_smoke(tmp_path):
    learning = _load("learning")
    raw = learning.main(["--smoke", "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")])
    assert {r["config"] for r in raw["runs"]} == set(learning.CONFIGS)
    for r in raw["runs"]:
        steps = [s for s, _ in r["curve"]]
        assert steps[0] == 0 and steps[-1] == 2  # evaluated before training and at the last step
        assert all(0.0 <= a <= 1.0 for _, a in r["curve"])
    assert (tmp_path / "learning_smoke.json").exists()


def test_learning_task_pieces():
    learning = _load("learning")
    test, dev, sft, rl = learning.make_problems()
    assert len(test) == len(dev) == 500 and len(sft) + len(rl) == 9000
    assert not {p for p, _ in test} & {p for p, _ in rl}  # held-out prompts never trained on
    tok = learning.build_char_tokenizer()
    ids = tok("07+45=052" + tok.eos_token).input_ids
    assert len(ids) == 10 and tok.decode(ids, skip_special_tokens=True) == "07+45=052"
    assert learning.exact_match_reward(["052", "52", " 052"], ["052"] * 3) == [1.0, 0.0, 1.0]
