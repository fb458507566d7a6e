"""Helpers of `benchmarks/gpu_check.py`: model shapes, trainers that time their steps and replay one generation,
summary statistics, the markdown report, and two of its sections (learning_sanity, dynamic_sampling). Not run on its
own."""

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


def section_learning_sanity(s, tmp, deadline):
    import torch

    from pacs.testing import build_tiny_tokenizer

    tokenizer, result = build_tiny_tokenizer(), {}
    for name, dtype in (("float32_weights", torch.float32), ("bfloat16_weights", torch.bfloat16)):
        args = trainer_config("pacs", f"{tmp}/lr-{name}", per_device_train_batch_size=4, num_generations=4,
                              steps_per_generation=2, max_steps=4, max_completion_length=64)  # fmt: skip
        model = build_model(s["small"], tokenizer, dtype=dtype)
        before = {n: p.detach().clone() for n, p in model.named_parameters() if ".layers." in n and p.dim() == 2}
        trainer = make_trainer("pacs", model, tokenizer, args, parity_reward, {}, synthetic=64)
        trainer.train()
        changed = sum((p.detach() != before[n]).sum().item() for n, p in model.named_parameters() if n in before)
        step = torch.cat([(p.detach().float() - before[n].float()).abs().flatten()
                          for n, p in model.named_parameters() if n in before])  # fmt: skip
        result[name] = {
            "changed_fraction": changed / step.numel(),
            "median_abs_change_over_4_lr": step.median().item() / 4e-6,
        }
        del trainer, model, before, step
        free()
    args = trainer_config("pacs", f"{tmp}/learn", per_device_train_batch_size=8, num_generations=8,
                          steps_per_generation=2, max_steps=24, max_completion_length=8,
                          learning_rate=3e-2)  # fmt: skip
    model = build_model("tiny", tokenizer)
    trainer = make_trainer("pacs", model, tokenizer, args, multiple_of_4_reward, None)  # a real generation each time
    trainer.train()
    rewards = [e["reward"] for e in trainer.state.log_history if "reward" in e]  # one per generation
    result["learnable_task"] = {"reward_first_quarter": statistics.mean(rewards[: len(rewards) // 4]),
                                "reward_last_quarter": statistics.mean(rewards[-(len(rewards) // 4) :]),
                                "rewards": rewards,
                                "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e]}  # fmt: skip
    del trainer, model
    free()
    fp32, bf16, task = result["float32_weights"], result["bfloat16_weights"], result["learnable_task"]
    problems = (
        [] if fp32["changed_fraction"] > 0.9 else [f"float32 weights: only {fp32['changed_fraction']:.1%} moved"]
    )
    problems += (
        []
        if bf16["changed_fraction"] < 0.2
        else [f"bfloat16 weights: {bf16['changed_fraction']:.1%} moved (expected few)"]
    )
    if not task["reward_last_quarter"] > task["reward_first_quarter"] + 0.2:
        first, last = task["reward_first_quarter"], task["reward_last_quarter"]
        problems.append(f"the learnable task's reward went {first:.2f} -> {last:.2f} (first -> last quarter)")
    summary = (f"moved at lr 1e-6: float32 weights {fp32['changed_fraction']:.1%}, bfloat16 weights "
               f"{bf16['changed_fraction']:.1%}; learnable reward {task['reward_first_quarter']:.2f} -> "
               f"{task['reward_last_quarter']:.2f}")  # fmt: skip
    return {"status": "failed: " + "; ".join(problems) if problems else "ok", "summary": summary, **result}


def section_dynamic_sampling(s, tmp, deadline):
    import torch

    from pacs.grpo.dynamic_sampling import uniform_signal
    from pacs.testing import build_tiny_tokenizer

    tokenizer, runs, G, L = build_tiny_tokenizer(), {}, s["group"], s["ds_completion"]
    cases = {"off": (sparse_parity_reward, False), "on": (sparse_parity_reward, True),
             "off_never_uniform": (alternating_reward, False), "on_never_uniform": (alternating_reward, True)}  # fmt: skip
    for name, (reward, on) in cases.items():
        # 2 groups per generation batch, 2 optimizer steps each, 3 generation batches; real generation every round
        args = trainer_config("hardened_grpo", f"{tmp}/{name}", per_device_train_batch_size=G, num_generations=G,
                              steps_per_generation=2, max_steps=6, max_completion_length=L, dynamic_sampling=on,
                              generation_kwargs={"min_new_tokens": L})  # fmt: skip
        model = build_model(s["small"], tokenizer)
        trainer = make_trainer("hardened_grpo", model, tokenizer, args, reward, None)
        trained, after_monitors = [], trainer._after_monitors

        def record(output, mode, after_monitors=after_monitors, trained=trained, reward=reward):
            output = after_monitors(output, mode)
            if mode == "train":  # the assembled batch's rewards, recomputed from its own tokens
                prompts = tokenizer.batch_decode(output["prompt_ids"], skip_special_tokens=True)
                ids = [
                    row[mask.bool()].tolist() for row, mask in zip(output["completion_ids"], output["completion_mask"])
                ]
                values = torch.tensor(reward(prompts=prompts, completion_ids=ids))
                trained.append(int(uniform_signal(values, torch.ones_like(values, dtype=torch.bool), G).sum()))
            return output

        trainer._after_monitors = record
        run = train_run(trainer)
        logs = [e for e in trainer.state.log_history if "loss" in e]
        ds = {k.removeprefix("pacs/ds/"): [e[k] for e in logs if k in e] for k in {k for e in logs for k in e}
              if k.startswith("pacs/ds/")}  # fmt: skip
        batch_s = [sum(run["step_s"][i : i + 2]) for i in range(0, len(run["step_s"]), 2)]  # per generation batch
        runs[name] = {**run, "ds": ds, "uniform_trained": trained, "batch_s": batch_s,
                      "batch_s_after_first": statistics.median(batch_s[1:])}  # fmt: skip
        del trainer, model
        free()
    on, off, on_all, off_all = runs["on"], runs["off"], runs["on_never_uniform"], runs["off_never_uniform"]
    problems = [f"{k}: non-finite loss" for k, r in runs.items() if not all_finite(r["losses"])]
    problems += [
        f"{k}: logs pacs/ds/* with dynamic sampling off" for k in ("off", "off_never_uniform") if runs[k]["ds"]
    ]
    if not on["ds"].get("rounds") or max(on["ds"]["rounds"]) <= 1:
        problems.append(f"the sparse reward needed no top-up round: rounds {on['ds'].get('rounds')}")
    if on["uniform_trained"] != on["ds"].get("fallback_groups"):  # both once per generation batch
        problems.append(f"uniform groups trained {on['uniform_trained']}, fallback {on['ds'].get('fallback_groups')}")
    if set(on_all["ds"].get("rounds", [])) != {1}:
        problems.append(f"the never-uniform reward took rounds {on_all['ds'].get('rounds')}")
    result = {
        "runs": runs,
        "rounds": on["ds"].get("rounds"),
        "generated_per_trained": on["ds"].get("generated_per_trained"),
        "on/off batch time (sparse)": on["batch_s_after_first"] / off["batch_s_after_first"],
        "on/off batch time (never uniform)": on_all["batch_s_after_first"] / off_all["batch_s_after_first"],
    }
    summary = (f"sparse reward: rounds {result['rounds']}, generated/trained {result['generated_per_trained']}, "
               f"generation batch time on/off {result['on/off batch time (sparse)']:.2f}; never uniform: on/off "
               f"{result['on/off batch time (never uniform)']:.3f}")  # fmt: skip
    return {"status": "failed: " + "; ".join(problems) if problems else "ok", "summary": summary, **result}


def section_padding_free(s, tmp, deadline):
    """Padded (TRL's layout) against `padding_free` through HardenedGRPOTrainer, on one long-tail batch replayed."""
    import importlib.util
    import random

    from pacs.testing import build_tiny_tokenizer

    tokenizer, G, L, rng = build_tiny_tokenizer(), s["group"], s["completion"], random.Random(0)
    # 4 groups per generation: completions log-normal, mean 20% of L before the cap (the long tail)
    lengths = [min(L, max(1, round(rng.lognormvariate(math.log(0.2 * L) - 0.5, 1.0)))) for _ in range(4 * G)]
    ids = [[rng.randrange(8, len(tokenizer)) for _ in range(n - (n < L))] + [tokenizer.eos_token_id] * (n < L)
           for n in lengths]  # fmt: skip
    arms = {"padded": {}, "packed_sdpa": {"padding_free": True}}
    if cuda() and importlib.util.find_spec("flash_attn"):  # varlen: cu_seq_lens, no mask
        arms["packed_varlen"] = {"padding_free": True, "attn": "flash_attention_2"}
    runs, prompt_len = {}, statistics.mean(len(tokenizer(p)["input_ids"]) for p in dataset()["prompt"])
    for name, opts in arms.items():
        args = trainer_config("hardened_grpo", f"{tmp}/{name}", per_device_train_batch_size=G, num_generations=G,
                              steps_per_generation=4, max_steps=s["pf_steps"], max_completion_length=L,
                              **{k: v for k, v in opts.items() if k != "attn"})  # fmt: skip
        model = build_model(s["main"], tokenizer)
        if "attn" in opts:
            model.set_attn_implementation(opts["attn"])
        trainer = make_trainer("hardened_grpo", model, tokenizer, args, parity_reward, {"ids": (ids, None)})
        run = train_run(trainer)
        logs = [e for e in trainer.state.log_history if "loss" in e]
        run["entropy"] = [e.get("entropy") for e in logs]
        run["real_token_frac"] = [e.get("pacs/real_token_frac") for e in logs]
        run["opt_step_ms"] = 1000 * statistics.median(run["step_s"][1:])
        run["real_tokens_per_s"] = G * (prompt_len + statistics.mean(lengths)) / run["opt_step_ms"] * 1000
        runs[name] = run
        del trainer, model
        free()
    base, tol = runs["padded"], 2e-2 if cuda() else 1e-4  # bf16 autocast on a GPU, float32 in the rehearsal
    problems = [f"{k}: non-finite loss" for k, r in runs.items() if not all_finite(r["losses"])]
    result = {"runs": runs, "completion_lengths": lengths}
    for name in [n for n in runs if n != "padded"]:
        run = runs[name]
        loss_gap = max(abs(a - b) for a, b in zip(run["losses"], base["losses"], strict=True))
        entropy_gap = max(abs(a - b) / abs(b) for a, b in zip(run["entropy"], base["entropy"], strict=True))
        result[f"{name}/padded"] = {"opt_step": run["opt_step_ms"] / base["opt_step_ms"], "max_abs_loss_gap": loss_gap,
                                    "max_rel_entropy_gap": entropy_gap, "peak_mem": run["peak_mem_gib"]
                                    and run["peak_mem_gib"] / base["peak_mem_gib"]}  # fmt: skip
        problems += [f"{name}: loss differs from padded by {loss_gap:.3g} (> {tol})"] if loss_gap > tol else []
        problems += [f"{name}: entropy differs by {entropy_gap:.3g} relative"] if entropy_gap > tol else []
        if min(run["real_token_frac"]) < 0.9:
            problems.append(f"{name}: computes {1 / min(run['real_token_frac']):.2f}x its real tokens (> 1.1x)")
    packed = result["packed_sdpa/padded"]
    summary = (f"{len(base['losses'])} steps; packed sdpa / padded: optimizer step {packed['opt_step']:.3f}, peak "
               f"memory {fmt(spread([packed['peak_mem']]))}, loss gap {packed['max_abs_loss_gap']:.2g}; padded "
               f"{base['opt_step_ms']:.0f} ms, {base['real_tokens_per_s']:.0f} real tokens/s, real tokens "
               f"{statistics.mean(base['real_token_frac']):.0%} of its positions"
               + ("" if "packed_varlen" in runs else "; varlen not run (no flash_attn)"))  # fmt: skip
    return {"status": "failed: " + "; ".join(problems) if problems else "ok", "summary": summary, **result}
