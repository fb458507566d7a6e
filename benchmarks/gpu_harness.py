"""What the GPU check's sections are built from (`benchmarks/gpu_check.py` holds the sections and runs them): models at
the hub configs' shapes with random weights, the rewards, the trainers (TRL's GRPO, PACS, GRPO through pacs's layer)
configured alike, timing their optimizer steps and replaying one generation, summary statistics and the markdown
report. Not run on its own."""

from __future__ import annotations

import gc
import json
import math
import statistics
import time


_QWEN3 = dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151_936, num_hidden_layers=36)
SHAPES = {  # the hub configs' shapes; weights are random
    "qwen3-0.6b": {**_QWEN3, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "tie_word_embeddings": True},
    "qwen3-4b": {**_QWEN3, "hidden_size": 2560, "intermediate_size": 9728, "tie_word_embeddings": True},
    "qwen3-8b": {**_QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "tie_word_embeddings": False},
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=1024, tie_word_embeddings=True),
}  # fmt: skip


def cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def build_model(shape: str, tokenizer, dtype=None, seed: int = 0):
    """A randomly initialised Qwen3 of `shape`, made on the GPU when there is one."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**SHAPES[shape], max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)  # fmt: skip
    torch.manual_seed(seed)
    with torch.device("cuda" if cuda() else "cpu"):
        model = Qwen3ForCausalLM(config).to(dtype or torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=True)  # fmt: skip
    return model


def parity_reward(completion_ids, **kwargs):
    """1 when the completion's ids sum to an odd number: mixed groups whatever the model (PACS's class weights act)."""
    return [float(sum(ids) % 2) for ids in completion_ids]


def alternating_reward(completion_ids, **kwargs):
    """0, 1, 0, 1, ... down the batch: groups of an even size are never uniform (dynamic sampling keeps round 1)."""
    return [float(i % 2) for i in range(len(completion_ids))]


def sparse_parity_reward(prompts, completion_ids, **kwargs):
    """`parity_reward` on the prompts whose number is a multiple of 3 (`dataset()`'s "What is i + 2i?"), 0 on the
    others: a third of the groups mixed, the rest all wrong (uniform), for dynamic sampling to filter."""
    return [float(int(p.split()[2]) % 3 == 0 and sum(ids) % 2 == 1) for p, ids in zip(prompts, completion_ids)]


def multiple_of_4_reward(completion_ids, **kwargs):
    """The share of completion tokens whose id is a multiple of 4: learnable, ~1/4 for a random model."""
    return [sum(i % 4 == 0 for i in ids) / max(len(ids), 1) for ids in completion_ids]


def dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"What is {i} + {2 * i}? Put the answer in \\boxed{{}}." for i in range(64)]})


def trainer_config(algorithm: str, out: str, **overrides):
    """PACSConfig, GRPOConfig (beta 0) or, for "hardened_grpo", pacs's HardenedGRPOConfig with the settings the
    sections share; `overrides` replace them."""
    from trl import GRPOConfig

    from pacs import PACSConfig
    from pacs.grpo import HardenedGRPOConfig

    base = dict(output_dir=out, bf16=cuda(), use_cpu=not cuda(), learning_rate=1e-6, lr_scheduler_type="constant",
                optim="adamw_torch", max_grad_norm=0.0, beta=0.0, logging_steps=1, save_strategy="no",
                report_to="none", seed=0, disable_tqdm=True)  # fmt: skip
    config = {**base, **overrides}
    if "pacs" in algorithm:
        return PACSConfig(**config, **({"pacs_anchor": "reference"} if algorithm == "pacs_ref" else {}))
    return (HardenedGRPOConfig if algorithm == "hardened_grpo" else GRPOConfig)(**config)


def make_trainer(algorithm, model, tokenizer, args, reward, completions: dict, synthetic: int = 0, **kwargs):
    """A PACSTrainer, GRPOTrainer or ("hardened_grpo") HardenedGRPOTrainer that records its step times and, unless `completions` is None, generates once (for
    real, or random ids of length `synthetic` if > 0) and replays that generation afterwards (`completions` is shared
    between trainers)."""
    import torch
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from pacs import PACSTrainer
    from pacs.grpo import HardenedGRPOTrainer

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **kw):
            torch.cuda.synchronize() if cuda() else None
            trainer.step_s.append(time.perf_counter() - self.start)

    trainer_cls = PACSTrainer if "pacs" in algorithm else GRPOTrainer
    trainer_cls = HardenedGRPOTrainer if algorithm == "hardened_grpo" else trainer_cls
    trainer = trainer_cls(model=model, reward_funcs=reward, args=args, train_dataset=dataset(),
                          processing_class=tokenizer, callbacks=[StepTimer()], **kwargs)  # fmt: skip
    trainer.remove_callback(PrinterCallback)  # the log dicts, printed by Trainer when tqdm is off
    trainer.step_s, trainer.saw_reference = [], False
    generate, compute_loss = trainer._generate_single_turn, trainer._compute_loss  # wrapped on the instance

    def generate_once(prompt_ids, *a, **kw):
        if "ids" not in completions:
            start = time.perf_counter()
            if synthetic:
                gen = torch.Generator().manual_seed(0)
                ids = torch.randint(8, trainer.model.config.vocab_size, (len(prompt_ids), synthetic), generator=gen)
                completions["ids"] = (ids.tolist(), None)
            else:
                completions["ids"] = generate(prompt_ids, *a, **kw)  # lists of ids: already synchronised
                completions["generation_s"] = time.perf_counter() - start
                if cuda():  # peak memory then compares training alone in every run, the generating one too
                    torch.cuda.reset_peak_memory_stats()
        return completions["ids"]

    def spy_loss(model, inputs):
        trainer.saw_reference |= "pacs_ref_per_token_logps" in inputs
        return compute_loss(model, inputs)

    trainer._compute_loss = spy_loss
    if completions is not None:
        trainer._generate_single_turn = generate_once
    return trainer


def train_run(trainer) -> dict:
    """Train; the run's step times, peak GPU memory (None on CPU) and logged losses."""
    import torch

    free()
    if cuda():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {"step_s": trainer.step_s, "losses": losses,
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda() else None}  # fmt: skip


def free() -> None:
    """Return what the callers have `del`-eted (trainers hold reference cycles) to the GPU."""
    import torch

    gc.collect()
    torch.cuda.empty_cache() if cuda() else None


def spread(values) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def fmt(sp: dict | None, spec: str = ".3g") -> str:
    """ "median (min-max, n=...)" of a `spread`, or "n/a"."""
    if not sp:
        return "n/a"
    return f"{sp['median']:{spec}} ({sp['min']:{spec}}-{sp['max']:{spec}}, n={sp['n']})"


def all_finite(values) -> bool:
    return bool(values) and all(math.isfinite(v) for v in values)


def markdown(result: dict) -> str:
    meta = result["meta"]
    where = "CPU rehearsal, tiny shapes: no figure here says anything about a GPU" if meta["rehearse"] else meta["gpu"]
    budget = f"{meta['elapsed_s']:.0f} s of a {meta['time_budget_s']:.0f} s budget"
    lines = [f"# GPU check ({where})", "", f"`{meta['command']}`, {meta['date']}, {budget}", "",
             "| section | status | summary |", "|---|---|---|"]  # fmt: skip
    cell = lambda text: str(text).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines += [
        f"| {n} | {cell(sec['status'])} | {cell(sec.get('summary', ''))} |" for n, sec in result["sections"].items()
    ]
    lines += ["", "- versions: " + ", ".join(f"{k} {meta.get(k)}" for k in ("python", "torch", "cuda", "transformers",
              "accelerate", "trl", "datasets", "deepspeed", "peft", "pacs"))]  # fmt: skip
    for name, section in result["sections"].items():
        lines += [
            "",
            f"## {name}: {section['status']}",
            "",
            "```json",
            json.dumps(section, indent=1, default=str)[:6000],
            "```",
        ]
    return "\n".join(lines) + "\n"
