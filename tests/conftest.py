"""Shared fixtures: an offline tiny model (byte-level BPE + random Qwen3, hidden 64, 2 layers) built once per run."""

import os


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """Directory holding a tiny `Qwen3ForCausalLM` and its tokenizer, loadable with `from_pretrained`."""
    from pacs.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"))
