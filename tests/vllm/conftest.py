"""The vLLM tier: `PACSTrainer` and `pacs eval` with vLLM's CPU build (`vllm-cpu`), run by `make test-vllm` in its own
virtualenv (`.venv-vllm/`), and by CI after the main suite.

Collected only where vLLM is installed (the main suite's environment has none, and `make test` deselects the `vllm`
marker as well). Every test here runs with [`pacs.testing.vllm_cpu_weight_push`], which makes TRL's colocate weight
push work on vLLM's CPU build; nothing outside this tier uses it.
"""

import importlib.util
import os

import pytest


# vLLM's own switch for CPU CI: trace the model with dynamo and run it eagerly instead of compiling it with inductor
# (about a minute per engine on 2 cores); 1 GiB of KV cache is plenty for these models.
os.environ.setdefault("VLLM_CPU_CI_ENV", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory) -> str:
    """The tiny model at hidden size 128: head size 32, the smallest vLLM's CPU attention accepts (32-512)."""
    from pacs.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3-h128"), hidden_size=128)


@pytest.fixture(autouse=True)
def weight_push():
    from pacs.testing import vllm_cpu_weight_push

    with vllm_cpu_weight_push():
        yield


@pytest.fixture
def vllm_float32(monkeypatch):
    """vLLM in float32: TRL's colocate mode passes no dtype to `vllm.LLM`, and vLLM's "auto" downcasts a float32
    checkpoint to bfloat16 on CPU. Patched here, in the test only, to see the weight push at float32 precision."""
    import functools

    import trl.generation.vllm_generation as vg

    monkeypatch.setattr(vg, "LLM", functools.partial(vg.LLM, dtype="float32"))
