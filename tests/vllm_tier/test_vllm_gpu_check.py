"""`python -m benchmarks.vllm_gpu_check --smoke`: the GPU check starts and reports, on CPU with vLLM's CPU build.

make test-vllm PYTEST_ARGS="-k gpu_check"
"""

import importlib
import math

import pytest


pytestmark = pytest.mark.vllm


def test_vllm_gpu_check_smoke(tmp_path):
    module = importlib.import_module("benchmarks.vllm_gpu_check")  # its workers: python -m benchmarks.vllm_gpu_check
    runs = module.main(["--smoke", "--out-dir", str(tmp_path)])
    assert [r["algorithm"] for r in runs] == ["pacs", "grpo"]
    for run in runs:
        assert run["step_s"] and run["generation_s"] and run["peak_mem_gib"] > 0
        assert run["logp_diff_mean"] and all(0 <= v < 0.02 for v in run["logp_diff_mean"])  # bf16 floor on CPU
    (pacs,) = [r for r in runs if r["algorithm"] == "pacs"]
    assert pacs["is_ratio_mean"] and all(math.isfinite(v) and 0.5 < v < 2 for v in pacs["is_ratio_mean"])
    table = (tmp_path / "vllm_cpu.md").read_text()
    assert "| pacs |" in table and "| grpo |" in table and "say nothing about speed on a GPU" in table
    assert (tmp_path / "vllm_cpu.json").exists()
