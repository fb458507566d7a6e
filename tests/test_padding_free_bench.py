"""The padding-free benchmark (`benchmarks/padding_free/`): it runs at a tiny size, its arms agree with the padded one in
float32, and its report renders from the JSON (the committed one re-renders identically), run as `python -m` from the
repository root."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "benchmarks" / "padding_free"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))  # `python -m` from the root puts it first: the same imports
    from benchmarks.padding_free import padding_free, padding_free_report

    return padding_free, padding_free_report


def test_smoke_run_measures_every_arm_and_renders(bench, tmp_path):
    padding_free, report = bench
    raw = padding_free.main(["--smoke", "--distributions", "long_tail", "equal", "--out-dir", str(tmp_path)])
    saved = json.loads((tmp_path / "padding_free_smoke.json").read_text())
    heads = {"long_tail", "equal", "long_tail/compact_head", "equal/compact_head"}  # both LM heads by default
    assert saved["results"].keys() == heads == raw["results"].keys()
    tail, equal = saved["results"]["long_tail"], saved["results"]["equal"]
    for res in saved["results"].values():
        assert set(res["positions"]) == set(padding_free.ARMS)
        assert res["max_abs_dlogp"]["padded"] == 0.0 and max(res["max_abs_dlogp"].values()) < 1e-4  # fp32
        assert max(res["grad_max_rel_diff"].values()) < 1e-4
        assert all(len(t["cpu"]) == 1 and len(t["backbone_cpu"]) == 1 for t in res["times"].values())
    # packed computes the real tokens only; padded the generation batch's width; equal lengths: the same
    assert tail["positions"]["packed_one_row"] == tail["real_tokens"] <= tail["positions"]["packed"]
    assert tail["positions"]["packed"] <= tail["positions"]["trimmed"] < tail["positions"]["padded"]
    # equal lengths: one sequence per packed row (the sdpa default), one row of all of them, or padded: the same
    assert equal["positions"]["packed"] == equal["positions"]["packed_one_row"] == equal["positions"]["padded"]
    assert tail["largest_over_mean"]["balanced"] <= tail["largest_over_mean"]["fixed"]
    md = (tmp_path / "padding_free_smoke.md").read_text()
    assert "## Targets (issue 54), judged from this run" in md and "| packed_one_row |" in md
    # 2 LM heads x 3 arms (packed, balanced, packed_one_row) x 3 targets (two at the long tail, one equal), the balance
    assert md.count("**PASS**") + md.count("**FAIL**") == 19
    assert "AMD" in md or "Intel" in md or saved["info"]["cpu"] in md  # the CPU is named
    assert saved["info"]["cpu_flags_sha256"] in md and saved["info"]["torch"] in md


def test_report_renders_from_the_json_with_python_m(tmp_path):
    committed = HERE / "padding_free.json"
    if not committed.exists():  # before the first full run: render a hand-made one
        pytest.fail("benchmarks/padding_free/padding_free.json is missing: run the benchmark")
    out = tmp_path / "padding_free.md"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "benchmarks.padding_free.padding_free_report", "--json", str(committed), "--out",
           str(out)]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=300)
    assert out.read_text() == (HERE / "padding_free.md").read_text()  # the committed report is this JSON's
    raw = json.loads(committed.read_text())
    assert {"long_tail", "demo", "equal"} <= raw["results"].keys()
    assert all("rss" in raw["results"][d] for d in ("long_tail",))
