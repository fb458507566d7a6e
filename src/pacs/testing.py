"""Offline tiny model and tokenizer for tests, smoke runs and CPU benchmarks.

Nothing here touches the network: a byte-level BPE tokenizer is trained on a small built-in corpus, wrapped as a
`PreTrainedTokenizerFast` with a ChatML template, and paired with a randomly initialised `Qwen3ForCausalLM`
(hidden size 64, 2 layers). The result is saved to a directory that loads with `from_pretrained` exactly like a
hub checkpoint, so the real loading code paths are exercised.

>>> import tempfile
>>> from transformers import AutoModelForCausalLM, AutoTokenizer
>>> path = build_tiny_model(tempfile.mkdtemp())
>>> AutoModelForCausalLM.from_pretrained(path).config.hidden_size
64
"""

from __future__ import annotations

import os


CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Completions that must score 0.0 within a few seconds, in any thread (tests/test_rewards.py,
# benchmarks/reward_throughput/reward_throughput.py): huge numbers, deep or broken nesting, sheer length, random
# unicode.
HOSTILE_COMPLETIONS = {
    "power tower": "\\boxed{9^{9^{9^{9}}}}",
    "huge power": "\\boxed{2^{2^{40}}}",
    "factorial": "\\boxed{10000!}",
    "huge factorial": "\\boxed{(10^{10})!}",
    "nested braces": "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",
    "unclosed braces": "\\boxed{" + "{\\frac{" * 3000,
    "200k characters": "x + y = " * 25_000,
    "random unicode": "".join(chr(c) for c in range(0x20, 0x20 + 60_000) if not 0xD800 <= c < 0xE000) * 3,
}


_CORPUS = [
    "What is 12 + 35? Please reason step by step, and put your final answer within \\boxed{}.",
    "The answer is \\boxed{47}. We add the tens and then the ones.",
    "Let x be a real number such that 2x + 3 = 11. Then x = 4, so the answer is \\boxed{4}.",
    "Compute \\frac{1}{2} + \\frac{1}{3} = \\frac{5}{6}. The final answer is \\boxed{\\frac{5}{6}}.",
    "A train travels 60 miles in 2 hours. Its speed is 30 miles per hour.",
    "system user assistant You are a helpful assistant. Solve the problem.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 + - * / = ( ) [ ] { } ^ _ . , ; : ! ?",
    "Therefore, the sum of the roots is 7 and the product is 12. So the answer is \\boxed{7}.",
    "Find the area of a circle of radius 3. The area is 9\\pi, so \\boxed{9\\pi}.",
]


def build_tiny_tokenizer(vocab_size: int = 512, tool_calling: bool = False):
    """Train a byte-level BPE tokenizer on the built-in corpus and wrap it as a fast tokenizer with a chat template.

    Args:
        vocab_size (`int`, *optional*, defaults to `512`):
            Target vocabulary size (the byte alphabet and the special tokens always fit).
        tool_calling (`bool`, *optional*, defaults to `False`):
            Use TRL's Qwen3 chat template (tool schemas, `<tool_call>` blocks, tool responses) instead of plain ChatML:
            `GRPOTrainer` needs a template it can parse tool calls from for `tools` and `environment_factory`.

    Returns:
        `transformers.PreTrainedTokenizerFast` with `eos_token="<|im_end|>"` and `pad_token="<|endoftext|>"`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        chat_template=_trl_qwen3_chat_template() if tool_calling else CHAT_TEMPLATE,
        padding_side="left",
    )


def _trl_qwen3_chat_template() -> str:
    from trl.chat_template_utils import qwen3_chat_template

    return qwen3_chat_template


def build_tiny_model(output_dir: str | os.PathLike, seed: int = 0, hidden_size: int = 64, num_layers: int = 2) -> str:
    """Save a randomly initialised `Qwen3ForCausalLM` and its tokenizer to `output_dir`.

    Args:
        output_dir (`str` or `os.PathLike`):
            Directory to write `config.json`, the weights and the tokenizer files to (created if missing).
        seed (`int`, *optional*, defaults to `0`):
            Seed of the random initialisation.
        hidden_size (`int`, *optional*, defaults to `64`):
            Hidden size of the model.
        num_layers (`int`, *optional*, defaults to `2`):
            Number of decoder layers.

    Returns:
        `str`: the directory, ready for `AutoModelForCausalLM.from_pretrained`.
    """
    tokenizer = build_tiny_tokenizer()
    model = build_qwen3(tokenizer, hidden_size=hidden_size, num_layers=num_layers, seed=seed)
    model.save_pretrained(str(output_dir))
    tokenizer.save_pretrained(str(output_dir))
    return str(output_dir)


def build_qwen3(
    tokenizer,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 1024,
):
    """A randomly initialised small `Qwen3ForCausalLM` sized for `tokenizer` (4 heads, 2 KV heads, tied embeddings).

    Args:
        tokenizer (`PreTrainedTokenizerFast`):
            Supplies the vocabulary size and the eos / pad ids (also set in the generation config).
        hidden_size (`int`, *optional*, defaults to `64`):
            Hidden size.
        num_layers (`int`, *optional*, defaults to `2`):
            Number of decoder layers.
        seed (`int`, *optional*, defaults to `0`):
            Seed of the random initialisation.
        intermediate_size (`int`, *optional*):
            MLP width; defaults to `2 * hidden_size`.
        max_position_embeddings (`int`, *optional*, defaults to `1024`):
            Longest sequence the model is configured for.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        **_small_decoder_fields(tokenizer, hidden_size, num_layers),
        intermediate_size=intermediate_size or 2 * hidden_size,
        max_position_embeddings=max_position_embeddings,
    )
    return _seeded_model(Qwen3ForCausalLM, config, tokenizer, seed)


def _small_decoder_fields(tokenizer, hidden_size: int, num_layers: int) -> dict:
    """The config fields `build_qwen3` and `build_qwen3_moe` share: 4 heads, 2 KV heads, tied embeddings, the
    tokenizer's vocabulary and special ids."""
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


def _seeded_model(model_cls, config, tokenizer, seed: int):
    """`model_cls(config)` initialised under `seed`, with a sampling generation config on the tokenizer's ids."""
    import torch
    from transformers import GenerationConfig

    torch.manual_seed(seed)
    model = model_cls(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    return model


def build_qwen3_moe(
    tokenizer,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_experts: int = 4,
    num_experts_per_tok: int = 2,
    seed: int = 0,
    output_router_logits: bool = True,
):
    """A randomly initialised small `Qwen3MoeForCausalLM` (mixture of experts in every layer) sized for `tokenizer`.

    Args:
        tokenizer (`PreTrainedTokenizerFast`):
            Supplies the vocabulary size and the eos / pad ids (also set in the generation config).
        hidden_size (`int`, *optional*, defaults to `64`):
            Hidden size; each expert's MLP width is `hidden_size // 2`.
        num_layers (`int`, *optional*, defaults to `2`):
            Number of decoder layers.
        num_experts (`int`, *optional*, defaults to `4`):
            Experts per layer.
        num_experts_per_tok (`int`, *optional*, defaults to `2`):
            Experts each token is routed to.
        seed (`int`, *optional*, defaults to `0`):
            Seed of the random initialisation.
        output_router_logits (`bool`, *optional*, defaults to `True`):
            The config flag that makes every forward, `generate`'s included, return router logits and the
            load-balancing loss; `True` as in a checkpoint saved by TRL's `SFTTrainer` with the auxiliary loss on.
    """
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        **_small_decoder_fields(tokenizer, hidden_size, num_layers),
        intermediate_size=2 * hidden_size,
        moe_intermediate_size=hidden_size // 2,
        num_experts=num_experts,
        num_experts_per_tok=num_experts_per_tok,
        decoder_sparse_step=1,
        output_router_logits=output_router_logits,
        router_aux_loss_coef=0.01,
    )
    return _seeded_model(Qwen3MoeForCausalLM, config, tokenizer, seed)


def tiny_pacs_config(output_dir: str | os.PathLike, **overrides):
    """A `PACSConfig` for a few seconds of CPU training on the tiny model: groups of 4, one group per micro-batch,
    8-token completions, 3 steps, a large learning rate so that parameters visibly move, no saving, no reporting.

    Args:
        output_dir (`str` or `os.PathLike`):
            The trainer's output directory.
        **overrides:
            Any `PACSConfig` field, replacing the defaults above.
    """
    from .config import PACSConfig

    base = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
    )
    return PACSConfig(**{**base, **overrides})


ZERO3_CPU_ACCELERATE_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  zero_stage: 3
  zero3_init_flag: true
  offload_optimizer_device: none
  offload_param_device: none
mixed_precision: 'no'
num_machines: 1
num_processes: 1
use_cpu: true
"""
"""An `accelerate launch --config_file` for DeepSpeed ZeRO-3 on one CPU process, for tests and smoke runs."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a launch's rendezvous: tests never rely on accelerate's default 29500,
    which another job on the machine may hold."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_launch() -> list[str]:
    """The command that starts `accelerate launch` (the console script, or the module where it is not on PATH) on a
    free port (`free_port`), so that a launch never fails on a port another process holds."""
    import shutil
    import sys

    exe = shutil.which("accelerate")
    command = [exe, "launch"] if exe else [sys.executable, "-m", "accelerate.commands.launch"]
    return [*command, "--main_process_port", str(free_port())]


def run_launched(cmd: list[str], cwd, timeout: int = 900):
    """Run a launch command (`accelerate_launch()` + its arguments) offline, one OpenMP thread per process, and return
    the `subprocess.CompletedProcess`; a failure is an AssertionError carrying the tail of its output."""
    import subprocess

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result
