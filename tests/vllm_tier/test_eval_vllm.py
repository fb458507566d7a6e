"""`pacs eval` with vLLM's CPU build: the same problems, the same files and greedy pass@1 as with `transformers`.

make test-vllm PYTEST_ARGS="-k eval"
"""

import json

import pytest

from pacs.eval import evaluate
from pacs.eval.backends import _resolve_backend
from pacs.eval.output import METRICS_FILE, OUTPUT_FILES, ROLLOUTS_FILE


pytestmark = pytest.mark.vllm


def test_auto_backend_picks_vllm_cpu_without_gpu(vllm_model_dir):
    assert _resolve_backend("auto", vllm_model_dir) == "vllm"


def test_eval_vllm_matches_transformers(vllm_model_dir, tmp_path):
    from datasets import Dataset

    # a random tiny model solves none of these: pass@1 is 0 either way, so the completions themselves are compared
    problems = [f"What is {i} + {i + 1}?" for i in range(8)]
    dataset = Dataset.from_dict({"prompt": problems, "solution": [str(2 * i + 1) for i in range(8)]})
    common = dict(datasets={"tiny": dataset}, n=2, max_new_tokens=16, temperature=0.0, progress=False, plot=False)
    metrics = {}
    rollouts = {}
    for backend in ("transformers", "vllm"):
        out = tmp_path / backend
        metrics[backend] = evaluate(vllm_model_dir, output_dir=out, backend=backend, **common)
        assert {f.name for f in out.iterdir()} == set(OUTPUT_FILES) - {"eval_passk.png"}
        assert json.loads((out / METRICS_FILE).read_text()) == metrics[backend]
        lines = [json.loads(line) for line in (out / ROLLOUTS_FILE).read_text().splitlines()]
        rollouts[backend] = {(r["benchmark"], r["problem_id"], r["sample_index"]): r for r in lines}
    assert set(rollouts["vllm"]) == set(rollouts["transformers"]) and len(rollouts["vllm"]) == 16
    assert all(set(r) == set(rollouts["transformers"][k]) for k, r in rollouts["vllm"].items())
    assert metrics["vllm"]["tiny"]["pass@1"] == metrics["transformers"]["tiny"]["pass@1"]
    assert metrics["vllm"]["tiny"].keys() == metrics["transformers"]["tiny"].keys()
    # greedy decoding in float32 on both sides: the same completions
    same = sum(r["completion"] == rollouts["transformers"][k]["completion"] for k, r in rollouts["vllm"].items())
    assert same == 16, f"{same}/16 greedy completions agree"
