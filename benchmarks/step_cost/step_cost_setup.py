"""The setup every `step_cost.py` worker shares: a random Qwen3 of a public checkpoint's shape (no download), a
word-level tokenizer of its vocabulary, random fixed-length prompts, a pseudo-random binary reward, and each trainer
built with the same settings (only the algorithm differs).

Not run on its own; `step_cost.py` imports it.
"""

from __future__ import annotations

import os
import zlib


# Shapes of the public Qwen3 checkpoints (config.json of Qwen/Qwen3-*), so that a GPU run has real cost without a download.
MODEL_CONFIGS = {
    "cpu-small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, vocab_size=4096),
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16, vocab_size=512),
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936),
}  # fmt: skip


def build_tokenizer(vocab_size: int):
    """Word-level tokenizer with tokens "<pad>", "<eos>", "t2" ... "t{V-1}" (every model id decodes)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", padding_side="left")


def parity_reward(completions, **kwargs) -> list[float]:
    """Pseudo-random binary reward: CRC32 parity of the completion text (mixed groups, deterministic)."""
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]


def build_model(name: str, device: str, seed: int):
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        **MODEL_CONFIGS[name],
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        eos_token_id=1,
        pad_token_id=0,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(dtype)
    model.generation_config = GenerationConfig(eos_token_id=1, pad_token_id=0, do_sample=True)
    return model


def trainer_class_and_config(args, name: str):
    """(trainer class, config) with every setting shared by the three trainers; only the algorithm differs."""
    cuda = args.device == "cuda"
    rows = args.prompts_per_step * args.num_generations  # rows per optimizer step, on each process
    per_device = args.per_device or rows
    grad_accum = rows // per_device
    common = dict(
        output_dir=os.path.join(args.work_dir, name),
        seed=args.seed,
        use_cpu=not cuda,
        bf16=cuda,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        max_steps=args.warmup_steps + args.steps,
        num_generations=args.num_generations,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=grad_accum,
        steps_per_generation=args.steps_per_generation * grad_accum,  # TRL counts micro-batches
        max_completion_length=args.completion_length,
        generation_kwargs={"min_new_tokens": args.completion_length},  # fixed length: EOS is suppressed
        beta=0.0,
        logging_steps=10_000,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    if name == "PACS":
        from pacs import PACSConfig as Config
        from pacs import PACSTrainer as Base
    elif name == "GRPO":
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Base
    else:
        from trl import RLOOConfig as Config
        from trl import RLOOTrainer as Base
    return Base, Config(**common)


def build_data(args):
    """Tokenizer and a dataset of random fixed-length prompts (enough for every step of a worker)."""
    import torch
    from datasets import Dataset

    vocab = MODEL_CONFIGS[args.model_config]["vocab_size"]
    g = torch.Generator().manual_seed(1234)
    n_prompts = args.prompts_per_step * args.steps_per_generation * (args.warmup_steps + args.steps)
    prompt_ids = torch.randint(2, vocab, (n_prompts, args.prompt_length), generator=g)
    dataset = Dataset.from_dict({"prompt": [" ".join(f"t{i}" for i in row) for row in prompt_ids.tolist()]})
    return build_tokenizer(vocab), dataset


def count_params(name: str) -> int:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**MODEL_CONFIGS[name], tie_word_embeddings=True))
    return sum(p.numel() for p in model.parameters())
