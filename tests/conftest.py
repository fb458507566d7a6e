"""Shared fixtures: an offline tiny model (byte-level BPE + random Qwen3, hidden 64, 2 layers) built once per run.
Shared helpers are modules of the `tests` package: `launching` (accelerate launch on a free port), `tiny_config` (the
tiny runs' PACSConfig), `recording` (the trainers that record each generation batch), `hostile_completions`."""

import os


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
# every process a test starts (accelerate launch of tests/scripts/, a subprocess) imports `tests` (its helpers) and
# `benchmarks` from the repository root, as this process does (`pythonpath` in pyproject.toml)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """Directory holding a tiny `Qwen3ForCausalLM` and its tokenizer, loadable with `from_pretrained`."""
    from pacs.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory) -> str:
    """The tiny Qwen3 with TRL's Qwen3 chat template, whose tool calls TRL can parse (the tool-calling tests)."""
    from pacs.testing import build_qwen3, build_tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny-qwen3-tools")
    tokenizer = build_tiny_tokenizer(tool_calling=True)
    build_qwen3(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
