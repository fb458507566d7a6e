"""The vLLM tier: `PACSTrainer` and `pacs eval` with vLLM's CPU build (`vllm-cpu`), run by `make test-vllm` in its own
virtualenv (`.venv-vllm/`), and by CI after the main suite.

Collected only where vLLM is installed (the main suite's environment has none, and `make test` deselects the `vllm`
marker as well). Every test here runs with `vllm_cpu_weight_push` (`_push.py`, next to this file), which makes TRL's
colocate weight push work on vLLM's CPU build; outside this tier only benchmarks/vllm_gpu_check.py --smoke uses it.
"""

import contextlib
import importlib.util
import os
import sys

import pytest


# vLLM's own switch for CPU CI: trace the model with dynamo and run it eagerly instead of compiling it with inductor
# (about a minute per engine on 2 cores); 1 GiB of KV cache is plenty for these models; the engine runs in the calling
# process (one vLLM import per server, none per `pacs eval`).
os.environ.setdefault("VLLM_CPU_CI_ENV", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

HEALTH_TIMEOUT = 300  # seconds for the server to load on a busy 2-core machine

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory) -> str:
    """The tiny model at hidden size 128: head size 32, the smallest vLLM's CPU attention accepts (32-512)."""
    from pacs.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3-h128"), hidden_size=128)


@pytest.fixture(scope="session")
def vllm_moe_model_dir(tmp_path_factory) -> str:
    """A tiny Qwen3-MoE (4 experts, 2 per token) at hidden size 128, head size 32, with the tiny tokenizer."""
    from pacs.testing import build_qwen3_moe, build_tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny-qwen3-moe-h128")
    tokenizer = build_tiny_tokenizer()
    build_qwen3_moe(tokenizer, hidden_size=128).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(autouse=True)
def weight_push():
    from tests.vllm_tier._push import vllm_cpu_weight_push

    with vllm_cpu_weight_push():
        yield


@pytest.fixture
def vllm_float32(monkeypatch):
    """vLLM in float32: TRL's colocate mode passes no dtype to `vllm.LLM`, and vLLM's "auto" downcasts a float32
    checkpoint to bfloat16 on CPU. Patched here, in the test only, to see the weight push at float32 precision."""
    import functools

    import trl.generation.vllm_generation as vg

    monkeypatch.setattr(vg, "LLM", functools.partial(vg.LLM, dtype="float32"))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a launcher's rendezvous)."""
    return _free_port()


@pytest.fixture(scope="module")
def vllm_server(vllm_model_dir, tmp_path_factory):
    """A vLLM server on 127.0.0.1 for TRL's server mode, with the flags `trl vllm-serve` would give it; its URL.

    `trl vllm-serve` runs `python -m vllm.entrypoints.cli.main serve`, whose entry point looks up a package named
    `vllm` and fails under `vllm-cpu`; the same server and flags run as `python -m vllm.entrypoints.openai.api_server`.
    Started in its own process group, waited for at most `HEALTH_TIMEOUT` seconds, killed by its id at the end.
    """
    import signal
    import subprocess
    import time

    import requests
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    port = _free_port()
    command = build_command(ScriptArguments(model=vllm_model_dir, host="127.0.0.1", port=port, max_model_len=512))
    serve = command.index("serve")
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", *command[serve + 1 :]]
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}  # TRL's endpoints (reset_prefix_cache, ...) need dev mode
    log_path = tmp_path_factory.mktemp("vllm-server") / "server.log"
    log = open(log_path, "w")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + HEALTH_TIMEOUT
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {server.returncode}:\n{log_path.read_text()[-4000:]}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"vLLM server not healthy after {HEALTH_TIMEOUT} s:\n{log_path.read_text()[-4000:]}"
                )
            time.sleep(1)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)  # the server and any engine process it started
        server.wait(timeout=30)
        log.close()
