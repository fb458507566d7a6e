"""The GPU check: what only a GPU can show about PACSTrainer, in one command of a few minutes, with no vLLM and no hub.

    bash benchmarks/gpu_run.sh                                 # the H200 (installs .gpu-bundle/ first): README.md
    python -m benchmarks.gpu_check                             # any CUDA machine with pacs[deepspeed] installed
    python -m benchmarks.gpu_check --rehearse --out-dir /tmp/g  # CPU, tiny shapes, same code paths
    python -m benchmarks.gpu_check --sections zero3,split_lora --time-budget 120

Writes gpu_check.json and gpu_check.md to --out-dir (benchmarks/results/gpu/ on a GPU). Every section has a `status`:
"ok", "failed: <what did not hold>", "error: <exception>" or "skipped: time budget"; the exit code is 1 unless all
are "ok". Models are randomly initialised from Qwen3 configs written here (real shapes, 151,936-token vocabulary) with
`pacs.testing`'s small offline tokenizer; ids it does not know decode to "", so rewards read token ids.

1. pacs_vs_grpo: Qwen3-4B's shape, float32 weights under bf16 autocast, groups of 8, 4 optimizer steps per generation,
   1,024-token completions (EOS suppressed). The first run generates them with transformers (timed: generation
   tokens/s); every later run replays those completions, so the runs differ only in the algorithm. PACS and GRPO
   (beta 0) alternate over repetitions with a rotating order, a fresh model and trainer per run; per run, the median
   optimizer step after the first (the first scores and takes the old log-probs) and `torch.cuda.max_memory_allocated`
   of training (reset after the real generation); PACS/GRPO ratios paired by repetition, min / median / max.
   Fails if a completion is not 1,024 tokens or a loss is not finite.
2. reference_anchor: the same for PACS with `pacs_anchor="reference"` against PACS with the default anchor: the cost
   of the frozen pi_ref and its forward pass per generation. Fails if pi_ref's log-probs never reach the loss.
3. split_lora: Qwen3-8B's shape, bf16 base weights with a LoRA adapter (r 32, all linear layers), fixed synthetic
   1,024-token completions; PACS at per-device batch 1 (the split path, 8 accumulation steps) against batch 8 (whole
   groups), 2 optimizer steps each. Fails unless both train (finite losses, the adapter moves) and batch 1 peaks lower.
4. zero3: one process under `accelerate launch` with DeepSpeed ZeRO-3 (Qwen3-0.6B's shape, bf16): initialises, trains
   2 optimizer steps, saves checkpoint-2, and `from_pretrained` of it equals the gathered trained weights.
6. dynamic_sampling: Qwen3-0.6B's shape, groups of 8, 128-token completions generated for real (EOS suppressed), GRPO
   through pacs's layer (the `hardened_grpo` family), 3 generation batches of 2 groups: with `dynamic_sampling` off and on,
   on a reward that leaves two thirds of the groups all wrong (`sparse_parity_reward`) and on one that never makes a
   uniform group (`alternating_reward`). Per run: rounds and completions generated per completion trained per generation
   batch, and the median time of a generation batch (its optimizer steps, generation included) after the first; the
   on/off ratios of that time (sparse: what the top-ups cost per trained completion; never uniform: the filter's own cost,
   expected ~1). Fails if a loss is not finite, the sparse reward needs no top-up round, a trained group is uniform
   beyond the logged fallback, the never-uniform reward takes more than one round, or a run with it off logs
   `pacs/ds/*`.
5. learning_sanity: (a) 4 AdamW steps at the recipes' lr 1e-6 through PACSTrainer (Qwen3-0.6B's shape): with float32
   weights nearly every element of the decoder's weight matrices moves, with bfloat16 weights almost none does
   (issue 27: the updates fall below bf16's resolution); (b) a tiny model learns a learnable reward (the share of
   completion tokens whose id is a multiple of 4) within 24 steps at lr 3e-2. The reward is checked rather than the
   loss: PACS's loss is ln 2 on the first step of every generation by construction (psi = 0 against pi_old).

7. padding_free: Qwen3-4B's shape as pacs_vs_grpo, one long-tail generation batch (4 groups of 8, completions
   log-normal with a mean of 20% of 1,024 tokens before the cap, EOS where shorter) replayed for 20 optimizer steps,
   GRPO through pacs's layer padded (TRL's layout) and with `padding_free` (packed, sdpa), and packed varlen
   (flash_attention_2, `cu_seq_lens`) where `flash_attn` is importable: the median optimizer step, peak memory, real
   tokens/s, and the 20 logged losses and entropies against padded's. Fails if a loss is not finite, a loss differs
   from padded's by more than 2e-2 (1e-4 rehearsing, float32), an entropy by more than 2e-2 relative, a packed sdpa
   run computes no fewer positions than padded on average (its rows, no longer than the longest sequence, leave
   filler), or the varlen run more than 1.01x its real tokens (`pacs/real_token_frac` < 0.99: one row, no filler).

Each section is in a try/except and a global --time-budget (480 s on a GPU) skips a section that would overrun it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks.gpu_harness import (
    all_finite,
    alternating_reward,
    build_model,
    cuda,
    dataset,
    fmt,
    free,
    make_trainer,
    markdown,
    multiple_of_4_reward,
    parity_reward,
    sparse_parity_reward,
    spread,
    train_run,
    trainer_config,
)
from benchmarks.harness import machine_info


SECTIONS = ("pacs_vs_grpo", "reference_anchor", "split_lora", "zero3", "learning_sanity", "dynamic_sampling",
            "padding_free")  # fmt: skip
RUN_ORDER = ("learning_sanity", "zero3", "pacs_vs_grpo", "split_lora", "dynamic_sampling", "padding_free",
             "reference_anchor")  # fmt: skip
# cheap and vital first. Seconds each section is planned to take on one H200 (450 s of the 480 s budget): one that
# would not fit in what is left of the budget is skipped; the repetitions of pacs_vs_grpo and reference_anchor stop at
# 1.25 times their share
GPU_COST_S = {"pacs_vs_grpo": 120, "reference_anchor": 60, "split_lora": 50, "zero3": 60, "learning_sanity": 30,
              "dynamic_sampling": 60, "padding_free": 70}  # fmt: skip


REPLAY: dict = {}  # (shape, completion length, group) -> the one real generation, replayed by every later run


def settings(rehearse: bool) -> dict:
    """Shapes and sizes: the real ones on a GPU, tiny ones for the CPU rehearsal (same code paths)."""
    if rehearse:
        return dict(main="tiny", lora="tiny", small="tiny", completion=16, group=4, reps=2, steps=3, split_steps=2,
                    ds_completion=16, pf_steps=3)  # fmt: skip
    return dict(main="qwen3-4b", lora="qwen3-8b", small="qwen3-0.6b", completion=1024, group=8, reps=3, steps=4,
                split_steps=2, ds_completion=128, pf_steps=20)  # fmt: skip


def compare(algorithms, s, tmp, deadline, check_reference=False) -> dict:
    """Interleaved repetitions of `algorithms` on the main shape; ratios of the others to the first, per repetition."""
    from pacs.testing import build_tiny_tokenizer

    tokenizer, runs, section_start = build_tiny_tokenizer(), [], time.monotonic()
    L, G = s["completion"], s["group"]
    completions = REPLAY.setdefault((s["main"], L, G), {})  # reference_anchor replays pacs_vs_grpo's generation
    if check_reference:  # pi_ref is loaded from the policy's path (as TRL's reference model): save the same weights
        build_model(s["main"], tokenizer).save_pretrained(f"{tmp}/model")  # no reference cycle: freed right away
        free()
    for rep in range(s["reps"]):
        if rep and time.monotonic() + (time.monotonic() - section_start) / rep > deadline["section_end"]:
            break  # another repetition would overrun the section's share of the time budget
        for algorithm in algorithms[rep % len(algorithms) :] + algorithms[: rep % len(algorithms)]:
            args = trainer_config(algorithm, f"{tmp}/{algorithm}", per_device_train_batch_size=G, num_generations=G,
                                  steps_per_generation=4, max_steps=s["steps"], max_completion_length=L,
                                  generation_kwargs={"min_new_tokens": L})  # fmt: skip
            model = build_model(s["main"], tokenizer)  # seeded: the same weights in every run
            if check_reference:
                model.config._name_or_path = f"{tmp}/model"
            trainer = make_trainer(algorithm, model, tokenizer, args, parity_reward, completions)
            run = {"algorithm": algorithm, "rep": rep, **train_run(trainer), "saw_reference": trainer.saw_reference}
            run["opt_step_s"] = statistics.median(run["step_s"][1:])  # after the step that scores the generation
            runs.append(run)
            del trainer, model
            free()
            if check_reference and algorithm == "pacs_ref" and not run["saw_reference"]:
                raise RuntimeError("pacs_anchor='reference' had no effect: no pacs_ref_per_token_logps in the loss")
    lengths = sorted({len(c) for c in completions["ids"][0]})
    prompt_len = statistics.mean(len(tokenizer(p)["input_ids"]) for p in dataset()["prompt"])
    result = {"runs": runs, "completion_lengths": lengths, "generation_s": completions.get("generation_s"),
              "generation_tokens_per_s": 4 * G * L / completions["generation_s"] if "generation_s" in completions
              else None}  # fmt: skip
    first = [r for r in runs if r["algorithm"] == algorithms[0]]
    for other in algorithms[1:]:
        pairs = [(a, b) for a in first for b in runs if b["algorithm"] == other and b["rep"] == a["rep"]]
        result[f"{other}/{algorithms[0]}"] = {
            "opt_step_s": spread(b["opt_step_s"] / a["opt_step_s"] for a, b in pairs),
            "peak_mem": spread(b["peak_mem_gib"] / a["peak_mem_gib"] for a, b in pairs if a["peak_mem_gib"]),
        }
    for algorithm in algorithms:
        mine = [r for r in runs if r["algorithm"] == algorithm]
        result[algorithm] = {"opt_step_s": spread(r["opt_step_s"] for r in mine),
                             "train_tokens_per_s": spread(G * (prompt_len + L) / r["opt_step_s"] for r in mine),
                             "peak_mem_gib": spread(r["peak_mem_gib"] for r in mine)}  # fmt: skip
    problems = [f"completions of {lengths} tokens, not {L}"] if lengths != [L] else []
    problems += [f"{r['algorithm']} rep {r['rep']}: non-finite loss" for r in runs if not all_finite(r["losses"])]
    base, other = algorithms[0], algorithms[-1]
    summary = (f"{other}/{base}: optimizer step {fmt(result[f'{other}/{base}']['opt_step_s'])}, peak memory "
               f"{fmt(result[f'{other}/{base}']['peak_mem'])}; {base}: {fmt(result[base]['opt_step_s'])} s per "
               f"optimizer step, {fmt(result[base]['train_tokens_per_s'], '.0f')} training tokens/s; generation "
               f"{fmt(spread([result['generation_tokens_per_s']]), '.0f')} tokens/s")  # fmt: skip
    return {"status": "failed: " + "; ".join(problems) if problems else "ok", "summary": summary, **result}


def section_pacs_vs_grpo(s, tmp, deadline):
    return compare(["grpo", "pacs"], s, tmp, deadline)


def section_reference_anchor(s, tmp, deadline):
    return compare(["pacs", "pacs_ref"], {**s, "reps": 2}, tmp, deadline, check_reference=True)


def section_split_lora(s, tmp, deadline):
    import torch
    from peft import LoraConfig

    from pacs.testing import build_tiny_tokenizer

    tokenizer, runs, G, L = build_tiny_tokenizer(), {}, s["group"], s["completion"]
    lora = LoraConfig(r=32, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                      "down_proj"])  # fmt: skip
    for per_device in (1, G):
        # 2 optimizer steps per generation: the second is off-policy (the split path's extra no-grad forward)
        ga = G // per_device
        args = trainer_config("pacs", f"{tmp}/lora{per_device}", per_device_train_batch_size=per_device,
                              gradient_accumulation_steps=ga, steps_per_generation=2 * ga, num_generations=G,
                              max_steps=s["split_steps"], max_completion_length=L, learning_rate=1e-5)  # fmt: skip
        model = build_model(s["lora"], tokenizer, dtype=torch.bfloat16 if cuda() else torch.float32)
        trainer = make_trainer("pacs", model, tokenizer, args, parity_reward, {}, synthetic=L, peft_config=lora)
        adapter = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        run = train_run(trainer)
        params = dict(trainer.model.named_parameters())
        run["adapter_moved"] = any(not torch.equal(params[n].detach(), p) for n, p in adapter.items())
        run["split_path"] = getattr(
            trainer, "_pacs_split", None
        )  # PACSTrainer's flag: a micro-batch holds part of a group
        runs[f"batch_{per_device}"] = run
        del trainer, model, adapter, params
        free()
    one, whole = runs["batch_1"], runs[f"batch_{G}"]
    problems = [f"{k}: non-finite loss" for k, r in runs.items() if not all_finite(r["losses"])]
    problems += [f"{k}: the LoRA adapter did not move" for k, r in runs.items() if not r["adapter_moved"]]
    if one["peak_mem_gib"] and not one["peak_mem_gib"] < whole["peak_mem_gib"]:
        problems.append(f"batch 1 peaks at {one['peak_mem_gib']:.1f} GiB, batch {G} at {whole['peak_mem_gib']:.1f}")
    ratio = one["peak_mem_gib"] / whole["peak_mem_gib"] if one["peak_mem_gib"] else None
    summary = (f"peak memory batch 1 / batch {G}: {ratio:.2f} ({one['peak_mem_gib']:.1f} vs "
               f"{whole['peak_mem_gib']:.1f} GiB)" if ratio else "both ran (no GPU: no memory figure)")  # fmt: skip
    return {"status": "failed: " + "; ".join(problems) if problems else "ok", "summary": summary, "runs": runs,
            "peak_mem_b1/b8": ratio}  # fmt: skip


def section_zero3(s, tmp, deadline):
    from tests.launching import ZERO3_CPU_ACCELERATE_CONFIG, accelerate_launch

    config = ZERO3_CPU_ACCELERATE_CONFIG.replace(
        "zero3_init_flag: true", "zero3_init_flag: true\n  zero3_save_16bit_model: true"
    )
    if cuda():
        config = config.replace("mixed_precision: 'no'", "mixed_precision: bf16").replace("use_cpu: true\n", "")
    Path(f"{tmp}/zero3.yaml").write_text(config)
    out = f"{tmp}/zero3.json"
    cmd = [*accelerate_launch(), "--config_file", f"{tmp}/zero3.yaml", "--main_process_port", "29561", "--module", __spec__.name,
           "--zero3-worker", out] + (["--rehearse"] if s["main"] == "tiny" else [])  # fmt: skip
    timeout = max(30, deadline["end"] - time.monotonic())
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    if proc.returncode != 0:
        return {
            "status": f"failed: accelerate launch exited {proc.returncode}",
            "log_tail": (proc.stdout + proc.stderr)[-3000:],
        }
    import torch
    from transformers import AutoModelForCausalLM

    record = json.loads(Path(out).read_text())
    trained = torch.load(f"{tmp}/trained.pt")  # the worker's gathered weights after training
    # loaded here, outside DeepSpeed (in the worker, from_pretrained would partition the weights under ZeRO-3)
    loaded = AutoModelForCausalLM.from_pretrained(f"{tmp}/zero3-run/checkpoint-2", dtype=torch.float32)
    diff = max((loaded.get_parameter(n) - p).abs().max().item() for n, p in trained.items())
    problems = [] if record["zero_stage"] == 3 else [f"ZeRO stage {record['zero_stage']}, not 3"]
    problems += [] if len(record["losses"]) == 2 and all_finite(record["losses"]) else [f"losses {record['losses']}"]
    problems += (
        [] if record["moved_fraction"] > 0.5 else [f"training moved {record['moved_fraction']:.1%} of the weights"]
    )
    problems += [] if diff == 0.0 else [f"checkpoint-2 differs from the trained weights: max abs diff {diff:.3g}"]
    summary = f"2 steps, {record['moved_fraction']:.0%} of the weights moved, checkpoint-2 max abs diff {diff:.3g}"
    status = "failed: " + "; ".join(problems) if problems else "ok"
    return {"status": status, "summary": summary, "checkpoint_max_abs_diff": diff, **record}


def zero3_worker(out: str, rehearse: bool) -> None:
    """Runs under `accelerate launch` (one process, ZeRO-3): build and save a model, train 2 steps, save checkpoint-2
    (16-bit weights gathered), write the gathered trained weights for the parent to compare."""
    import glob

    import deepspeed
    import torch
    from safetensors.torch import load_file

    from pacs.testing import build_tiny_tokenizer

    s, tokenizer, tmp = settings(rehearse), build_tiny_tokenizer(), os.path.dirname(out)
    build_model(s["small"], tokenizer).save_pretrained(f"{tmp}/zero3-model")
    tokenizer.save_pretrained(f"{tmp}/zero3-model")
    args = trainer_config("pacs", f"{tmp}/zero3-run", per_device_train_batch_size=4, num_generations=4,
                          steps_per_generation=2, max_steps=2, max_completion_length=32, save_strategy="steps",
                          save_steps=2, learning_rate=1e-3)  # fmt: skip
    trainer = make_trainer("pacs", f"{tmp}/zero3-model", tokenizer, args, parity_reward, {})
    trainer.train()
    params = dict(trainer.model.named_parameters())
    initial = {}
    for f in glob.glob(f"{tmp}/zero3-model/*.safetensors"):
        initial.update(load_file(f))
    with deepspeed.zero.GatheredParameters(list(params.values())):
        trained = {n: p.detach().cpu().clone() for n, p in params.items()}
    # the share of weights that training moved (in the dtype DeepSpeed trains: bf16 on a GPU), so that the parent's
    # comparison with checkpoint-2 can tell the trained weights from the initial ones
    moved = sum((p != initial[n].to(p.dtype)).sum().item() for n, p in trained.items())
    torch.save({n: p.float() for n, p in trained.items()}, f"{tmp}/trained.pt")
    record = {"zero_stage": trainer.accelerator.state.deepspeed_plugin.zero_stage, "step_s": trainer.step_s,
              "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
              "moved_fraction": moved / sum(p.numel() for p in trained.values())}  # fmt: skip
    Path(out).write_text(json.dumps(record))


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


def verify(path: str) -> list[str]:
    """What is wrong with a gpu_check.json for the rehearsal: a missing section or status, or a section not "ok"."""
    if not Path(path).is_file():
        return [f"{path} is missing: the check did not run (see the install log above)"]
    sections = json.loads(Path(path).read_text()).get("sections", {})
    problems = [f"{name}: missing" for name in SECTIONS if "status" not in sections.get(name, {})]
    for name, section in sections.items():
        status = section.get("status", "")
        if status != "ok":
            problems.append(f"{name}: {status}")
    return problems


def section_padding_free(s, tmp, deadline):
    """Padded (TRL's layout) against `padding_free` through HardenedGRPOTrainer, on one long-tail batch replayed."""
    import importlib.util
    import random

    from pacs.testing import build_tiny_tokenizer

    tokenizer, G, L, rng = build_tiny_tokenizer(), s["group"], s["completion"], random.Random(0)
    # 4 groups per generation: completions log-normal, mean 20% of L before the cap (the issue's long tail)
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
        # varlen packs one row per micro-batch (no filler); sdpa rows no longer than the longest sequence (filler at
        # their ends), which must still compute fewer positions than padded on average
        fracs, padded_fracs = run["real_token_frac"], base["real_token_frac"]
        least, mean, padded_mean = min(fracs), statistics.mean(fracs), statistics.mean(padded_fracs)
        if name == "packed_varlen" and least < 0.99:
            problems.append(f"{name}: computes {1 / least:.2f}x its real tokens (> 1.01x: one row per micro-batch)")
        elif mean <= padded_mean:
            problems.append(
                f"{name}: computes {1 / mean:.2f}x its real tokens on average, not fewer positions than padded "
                f"({1 / padded_mean:.2f}x)"
            )
    packed = result["packed_sdpa/padded"]
    summary = (f"{len(base['losses'])} steps; packed sdpa / padded: optimizer step {packed['opt_step']:.3f}, peak "
               f"memory {fmt(spread([packed['peak_mem']]))}, loss gap {packed['max_abs_loss_gap']:.2g}; padded "
               f"{base['opt_step_ms']:.0f} ms, {base['real_tokens_per_s']:.0f} real tokens/s, real tokens "
               f"{statistics.mean(base['real_token_frac']):.0%} of its positions"
               + ("" if "packed_varlen" in runs else "; varlen not run (no flash_attn)"))  # fmt: skip
    return {"status": "failed: " + "; ".join(problems) if problems else "ok", "summary": summary, **result}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rehearse", action="store_true", help="CPU, tiny shapes, the same code paths")
    parser.add_argument("--out-dir", default=None, help="default: benchmarks/results/gpu (GPU), outputs/gpu_check")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated, of " + ", ".join(SECTIONS))
    parser.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="seconds (default: 480 GPU, 1500 rehearsing: a loaded 2-core CI machine)",
    )
    parser.add_argument("--verify", metavar="JSON", help="check a gpu_check.json as make gpu-rehearsal does")
    parser.add_argument("--zero3-worker", metavar="OUT_JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.verify:
        problems, text = verify(args.verify), Path(args.verify).read_text() if Path(args.verify).is_file() else "{}"
        for name, section in json.loads(text).get("sections", {}).items():
            print(f"{name}: {section.get('status')}"[:300])
        print("\n".join(["FAILED:", *problems]) if problems else f"{args.verify}: the {len(SECTIONS)} sections pass")
        return 1 if problems else 0
    if args.zero3_worker:
        zero3_worker(args.zero3_worker, args.rehearse)
        return 0
    wanted = [x for x in args.sections.split(",") if x]
    if unknown := sorted(set(wanted) - set(SECTIONS)):
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    if not cuda() and not args.rehearse:
        parser.error("no CUDA device here: run on a GPU, or rehearse the check on CPU with --rehearse")
    budget = args.time_budget or (1500.0 if args.rehearse else 480.0)
    out_dir = Path(args.out_dir or ("benchmarks/results/gpu" if cuda() else "outputs/gpu_check"))
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    deadline = {"start": start, "end": start + budget}
    s, sections = settings(args.rehearse), {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in [n for n in RUN_ORDER if n in wanted]:
            left = deadline["end"] - time.monotonic()
            need = 0 if args.rehearse else GPU_COST_S[name]  # the rehearsal's sections take seconds
            if left <= need:
                sections[name] = {"status": f"skipped: time budget ({left:.0f} s left, needs ~{need} s)"}
                continue
            t0 = time.monotonic()
            deadline["section_end"] = min(deadline["end"], t0 + 1.25 * need) if need else deadline["end"]
            os.makedirs(f"{tmp}/{name}")
            try:
                sections[name] = globals()[f"section_{name}"](s, f"{tmp}/{name}", deadline)
            except Exception as e:  # noqa: BLE001 - a section's failure is its result
                status, trace = f"error: {type(e).__name__}: {e}"[:2000], traceback.format_exc()[-4000:]
                sections[name] = {"status": status, "traceback": trace}
                free()
            sections[name]["seconds"] = time.monotonic() - t0
            print(f"[gpu_check] {name}: {sections[name]['status']} ({sections[name]['seconds']:.0f} s)", flush=True)
    meta = machine_info()
    import accelerate, datasets, peft, torch  # noqa: E401, I001

    try:
        import deepspeed

        meta["deepspeed"] = deepspeed.__version__
    except ImportError as e:
        meta["deepspeed"] = f"not importable: {e}"
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda() else None
    meta.update(accelerate=accelerate.__version__, datasets=datasets.__version__, peft=peft.__version__,
                cuda=torch.version.cuda, gpu_memory_gib=gpu_gib, rehearse=args.rehearse, settings=s,
                time_budget_s=budget, elapsed_s=time.monotonic() - start,
                command="python -m benchmarks.gpu_check " + " ".join(argv or sys.argv[1:]))  # fmt: skip
    result = {"meta": meta, "sections": {n: sections[n] for n in SECTIONS if n in sections}}
    (out_dir / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out_dir / "gpu_check.md").write_text(markdown(result))
    print(markdown(result).split("\n## ")[0])
    print(f"[gpu_check] wrote {out_dir}/gpu_check.json and .md")
    return 0 if all(sec["status"] == "ok" for sec in result["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
