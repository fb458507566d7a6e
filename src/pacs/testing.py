"""Offline tiny model and tokenizer for tests, smoke runs (the CPU `pacs train` of the README) and CPU benchmarks.

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
