"""The prompt and completion lengths of a real run here: `pacs demo`'s first generation batches (SmolLM2-135M-Instruct
on the demo's arithmetic prompts, its chat template, temperature 0.8, 4 completions per prompt, at most 32 completion
tokens), written to `demo_lengths.json` for the padding-free benchmark's distribution (b).

    python -m benchmarks.padding_free.demo_lengths                 # ~1 min on 2 CPU cores; needs the demo's model
    python -m benchmarks.padding_free.demo_lengths --prompts 4     # fewer (default 16 prompts x 4)

Sampled with `generate` as TRL's transformers path samples (`do_sample`, the demo's temperature, no top-p / top-k),
seeded; a completion's length counts its tokens up to and including EOS, as TRL's `completion_mask` does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from benchmarks import harness


HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(HERE / "demo_lengths.json"))
    args = parser.parse_args(argv)

    import torch

    from pacs import demo

    torch.set_num_threads(1)
    from pacs.tasks import make_arithmetic_dataset

    demo_args = demo.parse_args([])
    model_path, tokenizer, model, _ = demo.load_model(demo_args)
    settings = demo.TRAINING_DEFAULTS
    G, max_new = settings["num_generations"], settings["max_completion_length"]
    problems = make_arithmetic_dataset(args.prompts, seed=args.seed)
    prompt_lengths, completion_lengths = [], []
    torch.manual_seed(args.seed)
    for k, conversation in enumerate(problems["prompt"]):
        ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_tensors="pt")
        ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
        out = model.generate(
            ids.repeat(G, 1), do_sample=True, temperature=settings["temperature"], top_p=1.0, top_k=0,
            max_new_tokens=max_new, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
        for row in out[:, ids.size(1) :].tolist():
            n = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
            prompt_lengths.append(ids.size(1))
            completion_lengths.append(n)
        print(f"prompt {k + 1}/{len(problems)}: {completion_lengths[-G:]}", flush=True)
    weights = Path(model_path) / "model.safetensors"
    result = {
        "source": "pacs demo's generation: SmolLM2-135M-Instruct (converted GGUF), make_arithmetic_dataset(seed="
        f"{args.seed}), chat template, temperature {settings['temperature']}, {G} completions per prompt, "
        f"max_completion_length {max_new}",
        "model_sha256": hashlib.sha256(weights.read_bytes()).hexdigest() if weights.exists() else None,
        "max_completion_length": max_new,
        "prompt_lengths": prompt_lengths,
        "completion_lengths": completion_lengths,
        "machine": harness.machine_info(),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    clipped = sum(n >= max_new for n in completion_lengths) / len(completion_lengths)
    print(f"{len(completion_lengths)} completions, mean {sum(completion_lengths) / len(completion_lengths):.1f}, "
          f"clipped {clipped:.0%}; prompts {min(prompt_lengths)}-{max(prompt_lengths)} -> {args.out}")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
