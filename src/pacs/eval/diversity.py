r"""The paper's diversity score (Appendix E): how different a problem's sampled responses are from each other.

Each response is embedded with a sentence-embedding model (the paper uses Qwen3-Embedding-0.6B); a problem's score is
the mean cosine distance over all pairs of its $n$ responses, and a benchmark's score is the mean over its problems:

$$
D = \frac{1}{|P|} \sum_{p \in P} \frac{2}{n_p (n_p - 1)} \sum_{i < j} \left(1 - \cos(e_{p,i}, e_{p,j})\right)
$$

0 means every response of a problem embeds to the same direction; the paper reports 0.0392 for PACS against 0.0249 for
GRPO. Problems with fewer than two responses have no pair and are left out.

>>> import torch
>>> round(pairwise_cosine_distance(torch.tensor([[1.0, 0.0], [0.0, 1.0]])), 6)  # orthogonal: distance 1
1.0
>>> round(pairwise_cosine_distance(torch.tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])), 12)  # same direction: 0
0.0
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any


logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_DIVERSITY_MODEL",
    "check_embedding_model",
    "diversity_score",
    "load_embedding_model",
    "pairwise_cosine_distance",
]

DEFAULT_DIVERSITY_MODEL = "Qwen/Qwen3-Embedding-0.6B"
"""The paper's embedding model (Appendix E); any sentence-transformers model, by hub id or local path, works."""


def pairwise_cosine_distance(embeddings) -> float:
    r"""Mean of $1 - \cos(e_i, e_j)$ over the pairs $i < j$ of the rows of `embeddings`.

    Args:
        embeddings (`torch.Tensor` or array of shape `(n, d)`):
            One embedding per response, `n >= 2`; rows need not be normalised (a zero row is an error).

    Returns:
        `float` in [0, 2].
    """
    import torch

    e = torch.as_tensor(embeddings, dtype=torch.float64)  # (n, d)
    if e.dim() != 2 or e.shape[0] < 2:
        raise ValueError(f"pairwise_cosine_distance needs an (n, d) array with n >= 2, got shape {tuple(e.shape)}.")
    norms = e.norm(dim=-1, keepdim=True)  # (n, 1)
    if bool((norms == 0).any()):
        raise ValueError("An embedding is the zero vector: its cosine with anything is undefined.")
    unit = e / norms  # (n, d)
    cos = unit @ unit.T  # (n, n)
    n = e.shape[0]
    mean_cos = (cos.sum() - cos.diagonal().sum()) / (n * (n - 1))  # off-diagonal mean = mean over pairs i < j
    return min(2.0, max(0.0, float(1.0 - mean_cos)))  # rounding can step past the bounds by ~1e-16


_INSTALL_HINT = "pip install 'trl-pacs[eval]' (or pip install 'sentence-transformers>=3')"
_CONFIG_FILES = ("modules.json", "config_sentence_transformers.json", "config.json")  # any one: a model's folder


def _import_sentence_transformers():
    try:
        import sentence_transformers
    except ImportError as e:
        raise ImportError(
            f"The diversity score embeds responses with sentence-transformers, which is not installed: {_INSTALL_HINT}."
        ) from e
    return sentence_transformers


def _offline() -> bool:
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def check_embedding_model(name_or_path: str = DEFAULT_DIVERSITY_MODEL) -> None:
    """Fail before any work when the diversity score could not be computed at the end: sentence-transformers is not
    importable, or the embedding model's files are not there. Loads no model.

    A local directory must hold one of `modules.json`, `config_sentence_transformers.json` or `config.json`. A hub id
    must be in the Hugging Face cache (looked up with `huggingface_hub.try_to_load_from_cache`) or, online, have a
    `config.json` on the hub (downloaded now: a few kB, and a wrong id or a gated model fails here).

    Raises:
        `ImportError` (with the install command) or `ValueError` / `OSError` saying how to get the model.
    """
    _import_sentence_transformers()
    text = os.path.expanduser(str(name_or_path))
    if os.path.isdir(text):
        if not any(os.path.isfile(os.path.join(text, f)) for f in _CONFIG_FILES):
            raise ValueError(
                f"The diversity model {name_or_path!r} is a directory without a model: none of {', '.join(_CONFIG_FILES)}"
                " in it. Pass a sentence-transformers model directory (SentenceTransformer.save) or a hub id."
            )
        return
    from ..grpo.checks import check_model_path

    check_model_path(text)  # a path that does not exist, rather than a hub id: the error says which
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    if any(isinstance(try_to_load_from_cache(text, f), str) for f in _CONFIG_FILES):
        return
    fix = (
        f"download it where there is a network (hf download {text}) and copy the Hugging Face cache "
        f"(~/.cache/huggingface/hub), or save it to a directory and pass that path as --diversity_model"
    )
    if _offline():
        raise OSError(
            f"The diversity model {text!r} is not in the Hugging Face cache and HF_HUB_OFFLINE is set: {fix}."
        )
    try:
        hf_hub_download(text, "config.json")
    except Exception as e:  # network, unknown repository, gated model: all end the same way, later
        raise OSError(f"Cannot fetch the diversity model {text!r} from the Hugging Face hub ({e}): {fix}.") from e


def load_embedding_model(name_or_path: str = DEFAULT_DIVERSITY_MODEL, device: str | None = None):
    """A `sentence_transformers.SentenceTransformer` from a hub id or a local directory.

    Args:
        name_or_path (`str`, *optional*, defaults to `"Qwen/Qwen3-Embedding-0.6B"`):
            Any sentence-transformers model (with `HF_HUB_OFFLINE=1`, a local directory or a cached hub id).
        device (`str` or `None`, *optional*, defaults to `None`):
            `"cuda"`, `"cpu"`, ...; `None` lets sentence-transformers choose (a GPU when there is one).
    """
    return _import_sentence_transformers().SentenceTransformer(str(name_or_path), device=device)


def diversity_score(
    responses: Mapping[str, Sequence[str]], model: Any, batch_size: int = 16, progress: bool = False
) -> dict[str, float | int]:
    """The paper's diversity score of one benchmark: per-problem mean pairwise cosine distance, averaged.

    Args:
        responses (`Mapping[str, Sequence[str]]`):
            `{problem_id: [response, ...]}`, the sampled completions of each problem.
        model (`sentence_transformers.SentenceTransformer` or any object with `encode(list[str]) -> (n, d)`):
            The embedding model (see [`load_embedding_model`]).
        batch_size (`int`, *optional*, defaults to `16`):
            Responses per `encode` call.
        progress (`bool`, *optional*, defaults to `False`):
            Show sentence-transformers' progress bar.

    Returns:
        `dict`: `{"diversity": float, "diversity_problems": int}`, the mean over the problems with at least two
        responses and their number; `diversity` is `None` when no problem has two.
    """
    scores = []
    for texts in responses.values():
        if len(texts) < 2:
            continue
        embeddings = model.encode(
            list(texts), batch_size=batch_size, convert_to_tensor=True, show_progress_bar=progress
        )  # (n, d)
        scores.append(pairwise_cosine_distance(embeddings.cpu()))
    skipped = len(responses) - len(scores)
    if skipped:
        logger.warning("Diversity: %d problem(s) with fewer than 2 responses left out", skipped)
    return {"diversity": sum(scores) / len(scores) if scores else None, "diversity_problems": len(scores)}
