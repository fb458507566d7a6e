"""The model argument of a run, checked before anything loads: a local directory that does not exist
([`check_model_path`]; hub ids by `huggingface_hub`'s own rules), or a folder that is not a model
([`check_model_folder`]). Shared by `pacs train`, `pacs plan` and `pacs eval` through `pacs.grpo.checks`."""

from __future__ import annotations

import os


def _is_hub_id(text: str) -> bool:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(text)  # "name" or "owner/name", the hub's own rules
    except HFValidationError:
        return False
    return True


def check_model_path(name_or_path: str | os.PathLike) -> str:
    """Fail clearly when a model argument meant as a local directory does not exist; pass hub ids through untouched.

    An existing path is returned as given. A string that cannot be a hub id (`"name"` or `"owner/name"`) is an error:
    it starts with `.`, `/` or `~`, holds a backslash or more than one `/`, or its first segment is an existing local
    directory (`outputs/run-1` when `outputs/` exists). Nothing is looked up on the hub.

    >>> check_model_path("Qwen/Qwen3-4B-Base")
    'Qwen/Qwen3-4B-Base'
    >>> check_model_path("/no/such/checkpoint")
    Traceback (most recent call last):
    ...
    ValueError: No such model directory or hub id: '/no/such/checkpoint' (no directory /no/such/checkpoint). Pass an existing local model directory (with config.json) or a hub id such as 'Qwen/Qwen3-4B-Base'.

    Args:
        name_or_path (`str` or `os.PathLike`):
            A local directory or a hub model id.

    Returns:
        `str`: `name_or_path`, unchanged.

    Raises:
        `ValueError`: "No such model directory or hub id: ...", with what was looked for.
    """
    text = os.fspath(name_or_path)
    if os.path.exists(os.path.expanduser(text)):
        return text
    first = text.split("/", 1)[0]
    looks_local = (
        isinstance(name_or_path, os.PathLike)
        or text.startswith((".", "/", "~"))
        or "\\" in text
        or text.count("/") > 1
        or text.endswith("/")
        or ("/" in text and os.path.isdir(first))
        or not _is_hub_id(text)
    )
    if not looks_local:
        return text
    raise ValueError(
        f"No such model directory or hub id: {text!r} (no directory {os.path.abspath(os.path.expanduser(text))}). "
        "Pass an existing local model directory (with config.json) or a hub id such as 'Qwen/Qwen3-4B-Base'."
    )


def check_model_folder(name_or_path: str | os.PathLike) -> None:
    """Fail in one line when a local model folder is not a model: no `config.json` (and no PEFT adapter's
    `adapter_config.json`), or a `config.json` without `model_type` (transformers would guess the class from the
    folder's name, or stop with a traceback). Hub ids and paths that do not exist pass (see [`check_model_path`]).

    Raises:
        `ValueError`: naming the folder, what it lacks and what to pass instead.
    """
    import json

    path = os.path.expanduser(os.fspath(name_or_path))
    if not os.path.isdir(path):
        return
    config = os.path.join(path, "config.json")
    fix = (
        'Pass the folder that `save_pretrained` wrote (its config.json names the `model_type`, e.g. "qwen3"), or a '
        "hub id such as 'Qwen/Qwen3-4B-Base'."
    )
    if not os.path.isfile(config):
        if os.path.isfile(os.path.join(path, "adapter_config.json")):
            return  # a PEFT adapter: transformers loads its base model
        raise ValueError(f"{path} is not a model folder: it has no config.json. {fix}")
    try:
        with open(config) as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError) as error:
        raise ValueError(
            f"{path} is not a model folder: its config.json does not read as a JSON object ({error}). {fix}"
        ) from error
    if not model_type:
        raise ValueError(f"{path} is not a model folder: its config.json has no `model_type`. {fix}")
