"""`benchmarks/gpu_check.py`: the pieces of the GPU check that run fast on CPU (the whole rehearsal, installed from the
wheel bundle into a virtualenv with the GPU image's versions, is `make gpu-rehearsal`, in CI).

    python -m pytest tests/test_gpu_check.py -q
"""

import ast
import importlib
import json
from pathlib import Path

import pytest


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def gpu_check():
    return importlib.import_module("benchmarks.gpu_check")


def _result(tmp_path) -> dict:
    return json.loads((tmp_path / "gpu_check.json").read_text())


def test_the_gpu_check_imports_no_vllm():
    # the H200's image has no vLLM and it cannot be carried there: neither file may import it, even lazily
    for name in ("gpu_check.py", "gpu_harness.py"):
        tree = ast.parse((BENCHMARKS / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(m.split(".")[0] == "vllm" for m in imported), (name, sorted(imported))


def test_verify_accepts_only_passing_sections(gpu_check, tmp_path):
    path = tmp_path / "gpu_check.json"

    def verify(sections):
        path.write_text(json.dumps({"sections": sections}))
        return gpu_check.verify(str(path))

    ok = {name: {"status": "ok"} for name in gpu_check.SECTIONS}
    assert verify(ok) == []
    assert verify({k: v for k, v in ok.items() if k != "zero3"}) == ["zero3: missing"]
    assert verify({**ok, "split_lora": {"status": "failed: batch 1 peaks higher"}}) == [
        "split_lora: failed: batch 1 peaks higher"
    ]
    assert verify({**ok, "zero3": {"status": "skipped: time budget (3 s left, needs ~60 s)"}})
    assert verify({**ok, "reference_anchor": {"status": "error: RuntimeError: pacs_anchor='reference' had no effect"}})


def test_split_lora_rehearsal_writes_a_passing_section(gpu_check, tmp_path):
    code = gpu_check.main(["--rehearse", "--sections", "split_lora", "--out-dir", str(tmp_path)])
    section = _result(tmp_path)["sections"]["split_lora"]
    assert code == 0 and section["status"] == "ok", section
    runs = section["runs"]
    assert set(runs) == {"batch_1", "batch_4"}  # the rehearsal's groups of 4: batch 1 splits them
    assert runs["batch_1"]["split_path"] is True and runs["batch_4"]["split_path"] is False
    assert all(r["adapter_moved"] and len(r["losses"]) == 2 for r in runs.values())
    assert runs["batch_1"]["peak_mem_gib"] is None  # no GPU: no memory figure rather than a CPU one
    assert "| split_lora | ok |" in (tmp_path / "gpu_check.md").read_text()


def test_dynamic_sampling_rehearsal_writes_a_passing_section(gpu_check, tmp_path):
    code = gpu_check.main(["--rehearse", "--sections", "dynamic_sampling", "--out-dir", str(tmp_path)])
    section = _result(tmp_path)["sections"]["dynamic_sampling"]
    assert code == 0 and section["status"] == "ok", section
    runs = section["runs"]
    assert set(runs) == {"off", "on", "off_never_uniform", "on_never_uniform"}
    assert max(section["rounds"]) > 1 and section["generated_per_trained"] == section["rounds"]
    assert runs["on"]["uniform_trained"] == runs["on"]["ds"]["fallback_groups"]  # only the logged fallback
    assert runs["off"]["ds"] == {} and set(runs["on_never_uniform"]["ds"]["rounds"]) == {1}
    assert section["on/off batch time (sparse)"] > 0 and section["on/off batch time (never uniform)"] > 0
    assert "| dynamic_sampling | ok |" in (tmp_path / "gpu_check.md").read_text()


def test_padding_free_rehearsal_writes_a_passing_section(gpu_check, tmp_path, monkeypatch):
    code = gpu_check.main(["--rehearse", "--sections", "padding_free", "--out-dir", str(tmp_path)])
    section = _result(tmp_path)["sections"]["padding_free"]
    assert code == 0 and section["status"] == "ok", section
    runs = section["runs"]
    assert set(runs) == {"padded", "packed_sdpa"}  # no flash_attn on CPU: no varlen run
    packed, padded = runs["packed_sdpa"]["real_token_frac"], runs["padded"]["real_token_frac"]
    assert sum(packed) / len(packed) > sum(padded) / len(padded) and max(padded) < 0.9  # fewer positions, on sdpa
    assert section["packed_sdpa/padded"]["max_abs_loss_gap"] < 1e-4 and len(runs["padded"]["losses"]) == 3
    # a packed forward that computed the padding anyway (the option ignored) fails visibly
    config = gpu_check.trainer_config
    monkeypatch.setattr(gpu_check, "trainer_config", lambda *a, **kw: config(*a, **{**kw, "padding_free": False}))
    code = gpu_check.main(["--rehearse", "--sections", "padding_free", "--out-dir", str(tmp_path)])
    status = _result(tmp_path)["sections"]["padding_free"]["status"]
    assert code == 1 and "packed_sdpa: computes" in status, status


def test_a_check_that_does_not_hold_fails_visibly(gpu_check, tmp_path, monkeypatch):
    # learning silently stopped (lr 0): the adapter does not move, and the section says so
    config = gpu_check.trainer_config
    monkeypatch.setattr(gpu_check, "trainer_config", lambda *a, **kw: config(*a, **{**kw, "learning_rate": 0.0}))
    code = gpu_check.main(["--rehearse", "--sections", "split_lora", "--out-dir", str(tmp_path)])
    status = _result(tmp_path)["sections"]["split_lora"]["status"]
    assert code == 1 and status.startswith("failed: ") and "the LoRA adapter did not move" in status


def test_reference_anchor_fails_when_the_anchor_has_no_effect(gpu_check, tmp_path, monkeypatch):
    # a trainer that ignored pacs_anchor="reference" would time the default anchor twice: the section must say so
    config = gpu_check.trainer_config
    monkeypatch.setattr(gpu_check, "trainer_config", lambda alg, *a, **kw: config(alg.replace("_ref", ""), *a, **kw))
    code = gpu_check.main(["--rehearse", "--sections", "reference_anchor", "--out-dir", str(tmp_path)])
    status = _result(tmp_path)["sections"]["reference_anchor"]["status"]
    assert code == 1 and status.startswith("error: RuntimeError: pacs_anchor='reference' had no effect"), status


def test_an_exception_is_a_section_status_not_a_crash(gpu_check, tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(gpu_check, "section_zero3", broken)
    code = gpu_check.main(["--rehearse", "--sections", "zero3", "--out-dir", str(tmp_path)])
    section = _result(tmp_path)["sections"]["zero3"]
    assert code == 1 and section["status"] == "error: RuntimeError: CUDA out of memory (simulated)"
    assert "broken" in section["traceback"]


def test_time_budget_skips_rather_than_overruns(gpu_check, tmp_path):
    code = gpu_check.main(
        ["--rehearse", "--sections", "zero3,split_lora", "--time-budget", "1e-9", "--out-dir", str(tmp_path)]
    )
    result = _result(tmp_path)
    assert code == 1 and list(result["sections"]) == ["split_lora", "zero3"]  # the order, not the run order
    assert all(s["status"].startswith("skipped: time budget") for s in result["sections"].values())
    assert result["meta"]["rehearse"] and result["meta"]["time_budget_s"] == 1e-9


def test_bad_arguments_say_how_to_fix_them(gpu_check, capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--rehearse", "--sections", "zero4"])
    assert "unknown sections ['zero4']" in capsys.readouterr().err
    import torch

    if not torch.cuda.is_available():  # without --rehearse the check needs a GPU, and says what to do instead
        with pytest.raises(SystemExit):
            gpu_check.main([])
        assert "--rehearse" in capsys.readouterr().err
