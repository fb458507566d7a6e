"""Cost of a training step under PACSTrainer, GRPOTrainer (beta 0) and RLOOTrainer (beta 0): same model, data, batch, seed.

    python benchmarks/step_cost.py                                          # CPU: random Qwen3 h256x4L, 4 reps
    python benchmarks/step_cost.py --device cuda --model-config qwen3-1.7b  # GPU: random Qwen3-1.7B in bf16
    python benchmarks/step_cost.py --loss-only                              # pacs_loss alone at 8192 x 4096
    python benchmarks/step_cost.py --ab                                     # loss+backward A/B/C in one process
    python benchmarks/step_cost.py --split                                  # split groups: batch 1/2/4 vs 8
    python benchmarks/step_cost.py --smoke                                  # one tiny iteration (the smoke test)
    python benchmarks/step_cost.py --report-only                            # redo step_cost.md from step_cost.json

Steps:

1. Every (trainer, repetition) runs in a fresh worker process (`--worker`), so its peak memory is its own: peak RSS
   (`ru_maxrss`) on CPU, `torch.cuda.max_memory_allocated` on GPU. The trainers are interleaved within each
   repetition and their order rotates between repetitions, so a drift in machine load hits all three alike.
2. A worker builds a randomly initialised Qwen3 from a hard-coded config (no download; timing needs no trained
   weights), a synthetic word-level tokenizer of the same vocabulary size, random fixed-length prompts and a
   pseudo-random binary reward (CRC32 parity of the completion, so groups are mixed and PACS's class weights are
   exercised). Generation is forced to a fixed length (`min_new_tokens` = `max_completion_length`).
3. Timing comes from a thin subclass that works identically for the three trainers: the time spent in
   `_generate_and_score_completions` (generation + reward + old log-probs) is "generation"; the rest of the optimizer
   step (forward, loss, backward, clipping, optimizer) is "optimization". The first generation cycle is warm-up and
   is dropped. `compute_loss` (forward + loss, no backward) is also timed on its own.
4. The parent prints and writes a table of ratios to GRPO (min / median / max over repetitions) to
   `--out-dir/step_cost[_<mode>].{json,md}`.

`--split` measures PACS's split path (a micro-batch holding part of a group) against the whole-group path and
against GRPO at the same per-device batch: one group of `num_generations` = 8 completions per optimizer step, as
per-device batch 8 x accumulation 1, 4 x 2, 2 x 4 and 1 x 8, with 4 optimizer steps per generation, completions fixed
at 256 tokens so that activations dominate the step. The first optimizer step after a generation is on-policy
(PACS's reward proxy is 0: no extra forward); the others are off-policy (one extra no-grad forward over the step's
micro-batches for the whole-group coefficients); both are reported. Results: `split_cost.{json,md}`.

`--loss-only` times `pacs_loss` forward+backward for 8192 completions x 4096 tokens (float32) next to TRL's GRPO
per-token loss on the same tensors, and compares it with one forward+backward of the model it would serve
(6 x params x tokens FLOPs), converted to time with the matmul throughput measured on this machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

import _common  # sets the offline environment before transformers is imported


HERE = Path(__file__).resolve().parent
TRAINERS = ["GRPO", "PACS", "RLOO"]

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


# 1. Worker: one trainer, one repetition ---------------------------------------------------------------------------


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


def ab_backward(args) -> dict:
    """In one process: the three trainers' compute_loss + backward on their own first micro-batch, interleaved.

    Isolates the only part where the algorithms differ (loss and its backward through the model), without process
    start-up, generation or machine-load drift between processes: each round runs the three back to back.
    """
    import torch

    torch.set_num_threads(args.threads)
    tokenizer, dataset = build_data(args)
    setups = {}
    for name in TRAINERS:
        Base, config = trainer_class_and_config(args, name)
        model = build_model(args.model_config, args.device, args.seed)
        trainer = Base(
            model=model, reward_funcs=parity_reward, args=config, train_dataset=dataset, processing_class=tokenizer
        )
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop, which is not running
        batch = next(iter(trainer.get_train_dataloader()))
        trainer._prepare_inputs(batch)  # generates the rollout for steps_per_generation optimizer steps
        setups[name] = (trainer, trainer._buffered_inputs[-1])  # a later, off-policy micro-batch (old logps set)
    times = {name: {"wall": [], "cpu": []} for name in TRAINERS}
    for rnd in range(args.ab_rounds + 1):  # round 0 is warm-up
        order = TRAINERS[rnd % 3 :] + TRAINERS[: rnd % 3]
        for name in order:
            trainer, inputs = setups[name]
            if args.device == "cuda":
                torch.cuda.synchronize()
            w0, c0 = time.perf_counter(), time.process_time()
            loss = trainer.compute_loss(trainer.model, inputs)
            trainer.accelerator.backward(loss)
            if args.device == "cuda":
                torch.cuda.synchronize()
            w1, c1 = time.perf_counter(), time.process_time()
            trainer.model.zero_grad(set_to_none=True)
            if rnd > 0:
                times[name]["wall"].append(w1 - w0)
                times[name]["cpu"].append(c1 - c0)
    return {"rounds": args.ab_rounds, "times": times, "load": _common.load_average()}


def ab_markdown(r: dict) -> str:
    lines = [
        f"compute_loss + backward on the same micro-batch shape, the three trainers in one process, {r['rounds']} "
        "interleaved rounds (rotating order) after a warm-up; paired ratios per round, min / median / max:",
        "",
        "| clock | GRPO median s | PACS median s | RLOO median s | PACS / GRPO | RLOO / GRPO |",
        "|---|---|---|---|---|---|",
    ]
    t = r["times"]
    for clock in ("cpu", "wall"):
        med = {n: statistics.median(t[n][clock]) for n in TRAINERS}
        cells = [clock] + [f"{med[n]:.4f}" for n in ("GRPO", "PACS", "RLOO")]
        for n in ("PACS", "RLOO"):
            lo, m, hi = _common.min_med_max(a / b for a, b in zip(t[n][clock], t["GRPO"][clock]))
            cells.append(f"{lo:.3f} / **{m:.3f}** / {hi:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def worker(args) -> dict:
    import torch
    from transformers import PrinterCallback, TrainerCallback

    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"

    def now() -> tuple[float, float]:
        """(wall, CPU) seconds; CPU time of this process is what a shared machine cannot steal (threads: 1)."""
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter(), time.process_time()

    def since(t0: tuple[float, float]) -> tuple[float, float]:
        t1 = now()
        return t1[0] - t0[0], t1[1] - t0[1]

    Base, config = trainer_class_and_config(args, args.trainer)

    timings = {"gen": [], "loss_fwd": [], "step": [], "gen_in_step": [], "coef_in_step": []}

    class Timed(Base):
        """Adds timers around generation and the loss; the algorithm is the parent's, untouched."""

        _pending_gen = (0.0, 0.0)
        _pending_coef = (0.0, 0.0)

        def _generate_and_score_completions(self, *a, **kw):
            t0 = now()
            out = super()._generate_and_score_completions(*a, **kw)
            dt = since(t0)
            timings["gen"].append(dt)
            self._pending_gen = (self._pending_gen[0] + dt[0], self._pending_gen[1] + dt[1])
            return out

        def compute_loss(self, *a, **kw):
            t0 = now()
            out = super().compute_loss(*a, **kw)
            timings["loss_fwd"].append(since(t0))
            return out

    if hasattr(Base, "_split_step_coefficients"):  # PACS's split path: its extra no-grad forward, timed on its own

        def _split_step_coefficients(self, *a, **kw):
            t0 = now()
            out = Base._split_step_coefficients(self, *a, **kw)
            dt = since(t0)
            self._pending_coef = (self._pending_coef[0] + dt[0], self._pending_coef[1] + dt[1])
            return out

        Timed._split_step_coefficients = _split_step_coefficients

    class StepTimer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t0 = now()
            trainer._pending_gen = trainer._pending_coef = (0.0, 0.0)

        def on_step_end(self, a, state, control, **kw):
            timings["step"].append(since(self.t0))
            timings["gen_in_step"].append(trainer._pending_gen)
            timings["coef_in_step"].append(trainer._pending_coef)

    tokenizer, dataset = build_data(args)
    model = build_model(args.model_config, args.device, args.seed)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = Timed(
        model=model, reward_funcs=parity_reward, args=config, train_dataset=dataset, processing_class=tokenizer
    )
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(StepTimer())
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # imports, model, trainer: before any step
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0

    w = args.warmup_steps
    steps, gens = timings["step"][w:], timings["gen_in_step"][w:]
    n_gen_warm = -(-w // args.steps_per_generation)  # generations during warm-up
    n_loss_warm = w * config.gradient_accumulation_steps  # one compute_loss per micro-batch
    result = {"trainer": args.trainer, "rep": args.rep}
    if args.per_device:  # the split section: on-policy (first step after a generation) and off-policy steps apart
        result.update(per_device=config.per_device_train_batch_size, grad_accum=config.gradient_accumulation_steps)
        result["rss_before_train_mib"] = rss_start
        result["per_step"] = [  # (global step, step wall, step CPU, generation wall, CPU, extra forward wall, CPU)
            (k, *s, *g, *c) for k, s, g, c in zip(range(w, w + len(steps)), steps, gens, timings["coef_in_step"][w:])
        ]
        for policy, on in (("on", True), ("off", False)):
            rows = [x for x in result["per_step"] if (x[0] % args.steps_per_generation == 0) == on]
            for i, kind in ((0, ""), (1, "_cpu")):
                result[f"opt_{policy}{kind}_s"] = statistics.median(x[1 + i] - x[3 + i] for x in rows)
                result[f"extra_fwd_{policy}{kind}_s"] = statistics.median(x[5 + i] for x in rows)
    for i, kind in ((0, ""), (1, "_cpu")):  # wall-clock seconds, then CPU seconds of this process
        result[f"step{kind}_s"] = statistics.median(s[i] for s in steps)
        result[f"opt{kind}_s"] = statistics.median(s[i] - g[i] for s, g in zip(steps, gens))  # step minus generation
        result[f"gen{kind}_s"] = statistics.median(g[i] for g in timings["gen"][n_gen_warm:])  # per generation
        result[f"loss_fwd{kind}_s"] = statistics.median(t[i] for t in timings["loss_fwd"][n_loss_warm:])
    result.update(
        {
            "train_wall_s": wall,
            "peak_mem_mib": (
                torch.cuda.max_memory_allocated() / 2**20
                if cuda
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            ),
            "mem_kind": "torch.cuda.max_memory_allocated" if cuda else "peak RSS (ru_maxrss)",
            "load": _common.load_average(),
            "num_parameters": sum(p.numel() for p in model.parameters()),
        }
    )
    return result


# 2. pacs_loss alone at scale --------------------------------------------------------------------------------------


def grpo_dapo_loss(per_token_logps, old_per_token_logps, completion_mask, advantages, eps=0.2):
    """TRL GRPOTrainer's default per-token loss (loss_type="dapo", beta 0), on the same tensors, for comparison."""
    import torch

    coef_1 = torch.exp(per_token_logps - old_per_token_logps)  # (B, T)
    coef_2 = torch.clamp(coef_1, 1 - eps, 1 + eps)
    per_token_loss = -torch.min(coef_1 * advantages.unsqueeze(1), coef_2 * advantages.unsqueeze(1))  # (B, T)
    return (per_token_loss * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)


def count_params(name: str) -> int:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**MODEL_CONFIGS[name], tie_word_embeddings=True))
    return sum(p.numel() for p in model.parameters())


def loss_only(args) -> dict:
    """Time pacs_loss forward+backward at B x T next to GRPO's loss and one model forward+backward (estimated)."""
    import torch

    from pacs import pacs_loss

    torch.set_num_threads(args.threads)
    dev = args.device
    B, T, G = args.loss_batch, args.loss_tokens, 8

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    g = torch.Generator(device=dev).manual_seed(0)
    old = -torch.rand(B, T, generator=g, device=dev) * 3  # (B, T) float32
    logps = (old + 0.01 * torch.randn(B, T, generator=g, device=dev)).requires_grad_()  # (B, T)
    lengths = torch.randint(T // 4, T + 1, (B,), generator=g, device=dev)  # (B,)
    mask = (torch.arange(T, device=dev).unsqueeze(0) < lengths.unsqueeze(1)).long()  # (B, T) int64 as in TRL
    labels = torch.randint(0, 2, (B,), generator=g, device=dev).float()  # (B,)
    adv = labels.view(-1, G) - labels.view(-1, G).mean(-1, keepdim=True)
    adv = adv.view(-1)  # (B,)

    fns = {
        "pacs_loss": lambda: pacs_loss(logps, old, mask, labels, num_generations=G, beta=1.0)[0],
        "GRPO dapo loss (TRL default)": lambda: grpo_dapo_loss(logps, old, mask, adv),
    }
    times = {k: [] for k in fns}
    for rep in range(args.reps + 1):  # rep 0 is warm-up
        for name, fn in fns.items() if rep % 2 == 0 else reversed(list(fns.items())):
            logps.grad = None
            sync()
            t0 = time.perf_counter()
            fn().backward()
            sync()
            if rep > 0:
                times[name].append(time.perf_counter() - t0)

    # Matmul throughput of this machine, to turn 6*N*tokens FLOPs into seconds on the same hardware.
    n = 2048 if dev == "cpu" else 8192
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    a @ b
    sync()
    t0 = time.perf_counter()
    reps = 5 if dev == "cpu" else 50
    for _ in range(reps):
        a @ b
    sync()
    flops_per_s = 2 * n**3 * reps / (time.perf_counter() - t0)

    tokens = B * T
    models = {}
    for name in ("qwen3-1.7b", "qwen3-4b"):
        p = count_params(name)
        fb_flops = 6 * p * tokens
        models[name] = {
            "params": p,
            "fwd_bwd_flops": fb_flops,
            "fwd_bwd_s_at_measured_matmul_rate": fb_flops / flops_per_s,
        }
    return {
        "B": B,
        "T": T,
        "tokens": tokens,
        "bytes_per_BT_tensor_fp32": tokens * 4,
        "device": dev,
        "threads": args.threads,
        "times_s": times,
        "matmul_flops_per_s": flops_per_s,
        "matmul_dtype": str(dtype),
        "models": models,
        "load": _common.load_average(),
    }


def loss_only_markdown(r: dict) -> str:
    pacs_med = statistics.median(r["times_s"]["pacs_loss"])
    grpo_med = statistics.median(r["times_s"]["GRPO dapo loss (TRL default)"])
    lines = [
        f"Tensors: B = {r['B']} completions x T = {r['T']} tokens = {r['tokens'] / 1e6:.1f}M tokens; one float32 "
        f"(B, T) tensor is {r['bytes_per_BT_tensor_fp32'] / 1e6:.0f} MB. Inputs: `per_token_logps` (grad), "
        f"`old_per_token_logps`, `completion_mask` (int64, as TRL makes it), `labels` (B,). Device {r['device']}, "
        f"{r['threads']} thread(s), {len(r['times_s']['pacs_loss'])} interleaved repetitions after a warm-up.",
        "",
        "| loss, forward + backward | median s | min s | max s |",
        "|---|---|---|---|",
    ]
    for k, v in r["times_s"].items():
        lo, med, hi = _common.min_med_max(v)
        lines.append(f"| {k} | {med:.3f} | {lo:.3f} | {hi:.3f} |")
    lines += [
        "",
        f"Measured matmul throughput on this device ({r['matmul_dtype']}): {r['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s.",
        "",
        "| model it would serve | params | fwd+bwd FLOPs = 6 x params x tokens | fwd+bwd time at that rate | "
        "pacs_loss / model fwd+bwd |",
        "|---|---|---|---|---|",
    ]
    for name, m in r["models"].items():
        lines.append(
            f"| {name} | {m['params'] / 1e9:.2f}B | 6 x {m['params'] / 1e9:.2f}e9 x {r['tokens'] / 1e6:.1f}e6 = "
            f"{m['fwd_bwd_flops']:.2e} | {m['fwd_bwd_s_at_measured_matmul_rate']:.3g} s | "
            f"{pacs_med / m['fwd_bwd_s_at_measured_matmul_rate']:.1e} |"
        )
    lines += [
        "",
        "Arithmetic: `pacs_loss` does O(10) elementwise FLOPs per token (subtract, mask, sum; the rest is per "
        f"sequence), i.e. ~{10 * r['tokens']:.1e} FLOPs, against 6 x params FLOPs per token for the model: a ratio "
        "of ~10 / (6 x 1.7e9) ≈ 1e-9 in FLOPs. The loss is memory-bound: it reads and writes a handful of (B, T) "
        "tensors (~1-2 GB at this size), milliseconds at GPU memory bandwidth. Its cost next to the model is nil, "
        f"and it is {grpo_med / pacs_med:.1f}x cheaper than TRL's GRPO per-token loss on the same tensors (which "
        "computes exp, clamp and min on every token).",
    ]
    return "\n".join(lines)


# 3. Parent: interleave workers, aggregate -------------------------------------------------------------------------


def worker_argv(args, trainer: str, rep: int) -> list[str]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--trainer", trainer, "--rep", str(rep)]
    for k in ("device", "model_config", "threads", "seed", "prompt_length", "completion_length", "num_generations",
              "prompts_per_step", "steps_per_generation", "warmup_steps", "steps", "work_dir"):  # fmt: skip
        argv += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    return argv


def run_worker(args, argv: list[str]) -> dict:
    """One worker in a fresh process (its own peak memory), or in this one under --smoke (one import, not meaningful)."""
    if args.smoke:
        return worker(parse_args(argv[2:]))
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-5000:])
        raise RuntimeError(f"worker {' '.join(argv[2:])} failed with exit code {proc.returncode}")
    return json.loads(lines[-1][len("RESULT ") :])


def ratio_table(results: list[dict], cpu: bool) -> str:
    metrics = []
    if cpu:  # CPU seconds first: on a shared machine they are far less noisy than wall time
        metrics += [
            ("opt_cpu_s", "optimization per optimizer step, CPU s"),
            ("step_cpu_s", "whole optimizer step (incl. its share of generation), CPU s"),
            ("gen_cpu_s", "generation + scoring per generation, CPU s"),
            ("loss_fwd_cpu_s", "compute_loss (forward + loss), CPU s"),
        ]
    metrics += [
        ("opt_s", "optimization per optimizer step, wall s"),
        ("step_s", "whole optimizer step (incl. its share of generation), wall s"),
        ("gen_s", "generation + scoring per generation, wall s"),
        ("loss_fwd_s", "compute_loss (forward + loss), wall s"),
        ("peak_mem_mib", f"peak memory, MiB ({results[0]['mem_kind']})"),
    ]
    reps = sorted({r["rep"] for r in results})
    by = {(r["trainer"], r["rep"]): r for r in results}
    head = "| metric | GRPO median | PACS median | RLOO median | PACS / GRPO min / median / max | RLOO / GRPO min / median / max |"
    rows = [head, "|---|---|---|---|---|---|"]
    for key, label in metrics:
        med = {t: statistics.median(by[t, r][key] for r in reps) for t in TRAINERS}
        cells = [label] + [f"{med[t]:.4g}" for t in ("GRPO", "PACS", "RLOO")]
        for t in ("PACS", "RLOO"):
            ratios = [by[t, r][key] / by["GRPO", r][key] for r in reps]  # paired within a repetition
            lo, m, hi = _common.min_med_max(ratios)
            cells.append(f"{lo:.3f} / **{m:.3f}** / {hi:.3f}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


# 4. The split path: groups cut over micro-batches ----------------------------------------------------------------

SPLIT_TRAINERS = ["PACS", "GRPO"]


def split_cost(args) -> list[dict]:
    """Workers for every (trainer, per-device batch) and repetition, in a fresh process each, in rotating order."""
    rows = args.prompts_per_step * args.num_generations
    bad = [b for b in args.split_batches if rows % b]
    if bad:
        raise ValueError(f"--split-batches {bad} do not divide the {rows} rows of an optimizer step")
    configs = [(t, b) for b in args.split_batches for t in SPLIT_TRAINERS]
    results = []
    for rep in range(args.reps):
        k = (3 * rep) % len(configs)  # rotate who goes first (3 is coprime with the 8 default configs)
        for trainer, batch in configs[k:] + configs[:k]:
            r = run_worker(args, worker_argv(args, trainer, rep) + ["--per-device", str(batch)])
            results.append(r)
            print(
                f"rep {rep} {trainer} batch {batch} x {r['grad_accum']}: opt CPU on {r['opt_on_cpu_s']:.3f}s off "
                f"{r['opt_off_cpu_s']:.3f}s (extra fwd {r['extra_fwd_off_cpu_s']:.3f}s), wall on {r['opt_on_s']:.3f}s "
                f"off {r['opt_off_s']:.3f}s, peak {r['peak_mem_mib']:.0f} MiB (load {r['load']})",
                flush=True,
            )
    return results


def split_average(r: dict, clock: str, spg: int) -> float:
    """Optimization time per optimizer step averaged over a generation cycle: one on-policy step, spg - 1 off-policy."""
    return (r[f"opt_on{clock}_s"] + (spg - 1) * r[f"opt_off{clock}_s"]) / spg


def split_markdown(args, info: dict, results: list[dict], notes: list[str] = ()) -> str:
    spg, batches = args.steps_per_generation, args.split_batches
    whole = max(batches)  # the whole-group path: every micro-batch holds whole groups
    reps = sorted({r["rep"] for r in results})
    by = {(r["trainer"], r["per_device"], r["rep"]): r for r in results}

    def value(t, b, rep, key):
        r = by[t, b, rep]
        if key.startswith("avg"):
            return split_average(r, key[3:], spg)
        if key == "peak_above_start":  # what training added to the process's memory before the first step
            return r["peak_mem_mib"] - r["rss_before_train_mib"]
        if key == "extra_share":  # the extra forward against the rest of the off-policy step
            return r["extra_fwd_off_cpu_s"] / (r["opt_off_cpu_s"] - r["extra_fwd_off_cpu_s"])
        return r[key]

    def med(t, b, key):
        return statistics.median(value(t, b, rep, key) for rep in reps)

    def ratio(num, den, key):  # paired within a repetition, then min / median / max over repetitions
        pairs = ((value(*num, rep, key), value(*den, rep, key)) for rep in reps)
        return _common.min_med_max(a / b if b else math.nan for a, b in pairs)  # 0: --smoke, one process's RSS

    def cell(lo_med_hi):
        lo, m, hi = lo_med_hi
        return f"{lo:.3f} / **{m:.3f}** / {hi:.3f}"

    ga = {b: by["PACS", b, reps[0]]["grad_accum"] for b in batches}
    label = {b: f"{b} x {ga[b]}" + (" (whole groups)" if b == whole else " (split)") for b in batches}
    medians = [
        "| per-device batch x accumulation | PACS on-policy | PACS off-policy | of which extra forward | PACS average "
        "| GRPO on-policy | GRPO off-policy | GRPO average | peak MiB PACS | peak MiB GRPO |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b in batches:
        cells = [label[b]]
        cells += [f"{med('PACS', b, k):.3f}" for k in ("opt_on_cpu_s", "opt_off_cpu_s", "extra_fwd_off_cpu_s")]
        cells += [f"{med('PACS', b, 'avg_cpu'):.3f}"]
        cells += [f"{med('GRPO', b, k):.3f}" for k in ("opt_on_cpu_s", "opt_off_cpu_s", "avg_cpu")]
        cells += [f"{med(t, b, 'peak_mem_mib'):.0f}" for t in SPLIT_TRAINERS]
        medians.append("| " + " | ".join(cells) + " |")

    def ratio_table(clock: str) -> list[str]:
        c = "_cpu" if clock == "CPU" else ""
        lines = [
            f"| {clock} time, per-device batch x accumulation | PACS / PACS batch {whole}, off-policy step | PACS / "
            f"PACS batch {whole}, average step | PACS / GRPO same batch, on-policy | PACS / GRPO same batch, "
            f"off-policy | PACS / GRPO same batch, average | GRPO / GRPO batch {whole}, average |",
            "|---|---|---|---|---|---|---|",
        ]
        for b in batches:
            cells = [label[b]]
            cells.append(cell(ratio(("PACS", b), ("PACS", whole), f"opt_off{c}_s")))
            cells.append(cell(ratio(("PACS", b), ("PACS", whole), f"avg{c}")))
            cells.append(cell(ratio(("PACS", b), ("GRPO", b), f"opt_on{c}_s")))
            cells.append(cell(ratio(("PACS", b), ("GRPO", b), f"opt_off{c}_s")))
            cells.append(cell(ratio(("PACS", b), ("GRPO", b), f"avg{c}")))
            cells.append(cell(ratio(("GRPO", b), ("GRPO", whole), f"avg{c}")))
            lines.append("| " + " | ".join(cells) + " |")
        return lines

    memory = [
        f"| memory, per-device batch x accumulation | PACS / PACS batch {whole} | PACS / GRPO same batch | GRPO / "
        f"GRPO batch {whole} | above start, MiB: PACS | GRPO | PACS / PACS batch {whole} | PACS / GRPO same batch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    pairs = lambda b: ((("PACS", b), ("PACS", whole)), (("PACS", b), ("GRPO", b)))  # noqa: E731
    for b in batches:
        cells = [label[b]] + [cell(ratio(num, den, "peak_mem_mib")) for num, den in pairs(b)]
        cells += [cell(ratio(("GRPO", b), ("GRPO", whole), "peak_mem_mib"))]
        cells += [f"{med(t, b, 'peak_above_start'):.0f}" for t in SPLIT_TRAINERS]
        cells += [cell(ratio(num, den, "peak_above_start")) for num, den in pairs(b)]
        memory.append("| " + " | ".join(cells) + " |")

    per_run = [
        "| rep | trainer | batch x acc | opt on CPU s | opt off CPU s | extra fwd off CPU s | opt on s | opt off s | "
        "gen CPU s | peak MiB | load (1/5/15) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        per_run.append(
            f"| {r['rep']} | {r['trainer']} | {r['per_device']} x {r['grad_accum']} | {r['opt_on_cpu_s']:.3f} | "
            f"{r['opt_off_cpu_s']:.3f} | {r['extra_fwd_off_cpu_s']:.3f} | {r['opt_on_s']:.3f} | {r['opt_off_s']:.3f} | "
            f"{r['gen_cpu_s']:.3f} | {r['peak_mem_mib']:.0f} | {r['load']} |"
        )

    smallest = min(batches)
    goals = []
    for b in sorted(batches, reverse=True)[1:]:
        _, m, hi = ratio(("PACS", b), ("PACS", whole), "avg_cpu")
        goals.append(
            f"- split-path time per optimizer step <= 1.35x the whole-group path, batch {label[b]}: median "
            f"{m:.3f}x (max {hi:.3f}x), CPU time, average step: **{'met' if m <= 1.35 else 'missed'}**"
        )
    lo, m, hi = ratio(("PACS", smallest), ("PACS", whole), "peak_mem_mib")
    goals.append(
        f"- peak memory at batch {smallest} clearly below batch {whole}: PACS {med('PACS', smallest, 'peak_mem_mib'):.0f}"
        f" vs {med('PACS', whole, 'peak_mem_mib'):.0f} MiB, ratio {lo:.3f} / {m:.3f} / {hi:.3f}: "
        f"**{'met' if hi < 0.95 else 'missed'}**"
    )
    lo, m, hi = ratio(("PACS", smallest), ("GRPO", smallest), "peak_mem_mib")
    goals.append(
        f"- peak memory at batch {smallest} within 10% of GRPO at batch {smallest}: ratio {lo:.3f} / {m:.3f} / "
        f"{hi:.3f}: **{'met' if m <= 1.10 else 'missed'}**"
    )

    split = [b for b in batches if b != whole]
    if not split:
        raise ValueError(f"--split-batches {batches}: give at least one batch below {whole} (the split path)")
    share = statistics.median(value("PACS", b, rep, "extra_share") for b in split for rep in reps)
    on = [ratio(("PACS", b), ("GRPO", b), "opt_on_cpu_s")[1] for b in split]
    off = [ratio(("PACS", b), ("GRPO", b), "opt_off_cpu_s")[1] for b in split]
    grpo_small = ratio(("GRPO", smallest), ("GRPO", whole), "avg_cpu")[1]
    reading = [
        f"- On the split path the off-policy steps pay one extra no-grad forward over the step's micro-batches: "
        f"{share:.2f}x the rest of the off-policy step (median over the split settings and repetitions). The "
        "trainers run with TRL's default `gradient_checkpointing=True`, so a training micro-batch costs about four "
        "forwards (forward, recomputed forward, backward ~ 2 forwards) and the extra one adds ~1/4; without "
        "checkpointing it would add ~1/3. PACS / GRPO at the same batch, off-policy: median "
        f"{min(off):.2f}-{max(off):.2f}x; on-policy (no extra forward, r = 0): {min(on):.2f}-{max(on):.2f}x.",
        f"- Averaged over a generation cycle (1 on-policy + {spg - 1} off-policy steps) that is the 'average step' "
        f"ratio above. More optimizer steps per generation means more off-policy steps and an average closer to "
        f"the off-policy ratio; `steps_per_generation` = accumulation (one optimizer step per generation) never pays "
        "the extra forward.",
        f"- Smaller micro-batches alone (GRPO batch {smallest} / batch {whole}: median {grpo_small:.2f}x, CPU) cost "
        f"little on one CPU thread (a micro-batch of one row is still {args.prompt_length + args.completion_length} "
        "tokens, enough for efficient matmuls there). On a GPU a "
        "small micro-batch leaves the device underused, so every trainer's batch-1 step is slower than batch 8 there "
        "and 'PACS / PACS batch 8' includes that; 'PACS / GRPO same batch' isolates the split path.",
        "- Peak RSS includes what the process holds before the first step (python, torch, transformers, TRL, the "
        f"model, the trainer); 'above start' subtracts it. What remains at batch {smallest} "
        f"({med('PACS', smallest, 'peak_above_start'):.0f} MiB PACS, {med('GRPO', smallest, 'peak_above_start'):.0f}"
        " MiB GRPO) is more than one row's activations and is about the same for both trainers; it is not broken "
        "down here.",
        *notes,
    ]

    params = results[0]["num_parameters"]
    rows = args.prompts_per_step * args.num_generations
    return "\n".join(
        [
            f"# Split path: groups cut over micro-batches, PACS vs GRPO ({args.device})",
            "",
            _common.machine_markdown(info),
            f"- command: `python {' '.join(['benchmarks/step_cost.py', *sys.argv[1:]])}`",
            f"- model: random Qwen3 `{args.model_config}` ({params / 1e6:.1f}M parameters, "
            f"{'bf16' if args.device == 'cuda' else 'float32'}), {args.threads} torch thread(s) per worker",
            f"- batch: {rows} rows ({args.prompts_per_step} prompt(s) x {args.num_generations} completions) per "
            f"optimizer step in every setting, as per-device batch x gradient accumulation; prompt "
            f"{args.prompt_length} tokens, completion fixed at {args.completion_length} tokens; {spg} optimizer steps "
            f"per generation (`steps_per_generation` = {spg} x accumulation); beta 0 everywhere",
            f"- per worker: {args.warmup_steps} warm-up optimizer step(s), then {args.steps} timed; optimizer step k "
            f"is on-policy when k is a multiple of {spg} (it holds the generation, which is subtracted); "
            f"{args.reps} repetitions, the {len(batches) * 2} (trainer, batch) settings interleaved with a rotating "
            "order, each in a fresh process (peak memory is its own)",
            "- opt = optimizer step minus the generation inside it (forward, loss, backward, clip, AdamW, and for PACS "
            "on the split path the extra no-grad forward of `_split_step_coefficients`); per-worker medians of the "
            f"on- and off-policy steps; average = (on + {spg - 1} x off) / {spg}, the mean over a generation cycle",
            "",
            "## Goals",
            "",
            *goals,
            "",
            "## Reading",
            "",
            *reading,
            "",
            "## Median time per optimizer step (CPU s) and peak memory",
            "",
            *medians,
            "",
            "## Ratios, paired within a repetition: min / **median** / max",
            "",
            *ratio_table("CPU"),
            "",
            *ratio_table("wall"),
            "",
            f"Peak memory ({results[0]['mem_kind']}; 'above start': minus its value just before the first step):",
            "",
            *memory,
            "",
            "## Per worker",
            "",
            *per_run,
            "",
        ]
    )


def split_main(args) -> dict:
    out_dir = Path(args.out_dir)
    suffix = "_smoke" if args.smoke else ("" if args.device == "cpu" else f"_{args.device}")
    if args.report_only:  # redo split_cost.md from split_cost.json (with its "notes": bullets added by hand)
        out = json.loads((out_dir / f"split_cost{suffix}.json").read_text())
        sys.argv = out["argv"]
        (out_dir / f"split_cost{suffix}.md").write_text(
            split_markdown(argparse.Namespace(**out["args"]), out["info"], out["results"], out.get("notes", []))
        )
        return out
    info = _common.machine_info()
    out_dir.mkdir(parents=True, exist_ok=True)
    out = {"info": info, "args": vars(args), "argv": sys.argv}
    out["results"] = split_cost(args)
    info["load_average_end"] = _common.load_average()
    md = split_markdown(args, info, out["results"])
    print(md)
    (out_dir / f"split_cost{suffix}.json").write_text(json.dumps(out, indent=1))
    (out_dir / f"split_cost{suffix}.md").write_text(md)
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--model-config", dest="model_config", default=None, choices=list(MODEL_CONFIGS),
                   help="defaults: cpu-small on CPU, qwen3-1.7b on CUDA")  # fmt: skip
    p.add_argument("--reps", type=int, default=None, help="repetitions per trainer (default 4 CPU, 3 CUDA)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-length", dest="prompt_length", type=int, default=None)
    p.add_argument("--completion-length", dest="completion_length", type=int, default=None)
    p.add_argument("--num-generations", dest="num_generations", type=int, default=8)
    p.add_argument("--prompts-per-step", dest="prompts_per_step", type=int, default=None)
    p.add_argument("--steps-per-generation", dest="steps_per_generation", type=int, default=None,
                   help="optimizer steps per generation (default 2; --split: 4)")  # fmt: skip
    p.add_argument("--warmup-steps", dest="warmup_steps", type=int, default=None,
                   help="optimizer steps not timed (default 2; --split: 1)")  # fmt: skip
    p.add_argument("--steps", type=int, default=None, help="timed optimizer steps per worker (default 4; --split: 7)")
    p.add_argument("--split", action="store_true", help="only the split path: per-device batch 1/2/4 vs 8, vs GRPO")
    p.add_argument("--split-batches", dest="split_batches", type=int, nargs="+", default=None,
                   help="per-device batches of the --split section (default 8 4 2 1; rows per step stay fixed)")  # fmt: skip
    p.add_argument("--loss-only", dest="loss_only", action="store_true", help="time pacs_loss alone at B x T")
    p.add_argument("--ab", action="store_true", help="only the in-process compute_loss+backward A/B/C")
    p.add_argument("--ab-rounds", dest="ab_rounds", type=int, default=30)
    p.add_argument("--loss-batch", dest="loss_batch", type=int, default=8192)
    p.add_argument("--loss-tokens", dest="loss_tokens", type=int, default=4096)
    p.add_argument("--out-dir", dest="out_dir", default=str(HERE / "results"))
    p.add_argument("--work-dir", dest="work_dir", default="/tmp/pacs-bench-step-cost")
    p.add_argument("--smoke", action="store_true", help="one tiny iteration of everything")
    p.add_argument("--report-only", dest="report_only", action="store_true", help="redo step_cost.md from its json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--trainer", choices=TRAINERS, help=argparse.SUPPRESS)
    p.add_argument("--rep", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--per-device", dest="per_device", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    defaults = dict(
        model_config="qwen3-1.7b" if cuda else "cpu-small",
        reps=3 if cuda else 4,
        prompt_length=128 if cuda else 16,
        completion_length=512 if cuda else 32,
        prompts_per_step=8 if cuda else 4,
        steps_per_generation=2,
        warmup_steps=2,
        steps=4,
    )
    if args.split:  # one group per optimizer step, completions long enough for activations to dominate
        defaults.update(reps=4, completion_length=512 if cuda else 256, prompts_per_step=1, steps_per_generation=4)
        defaults.update(warmup_steps=1, steps=7, split_batches=[8, 4, 2, 1])  # steps 1-3, 5-7 off-policy; 4 on
    if args.smoke:
        defaults = dict(model_config="tiny", reps=1, prompt_length=4, completion_length=4, prompts_per_step=2)
        defaults.update(steps_per_generation=2, warmup_steps=2, steps=2)
        args.num_generations, args.ab_rounds = 2, 2
        args.loss_batch, args.loss_tokens = 64, 128
        if args.split:  # rows per step 2: batch 2 whole, batch 1 split; timed: step 1 off-policy, step 2 on-policy
            defaults.update(prompts_per_step=1, warmup_steps=1, split_batches=[2, 1])
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        return {}
    if args.split:
        return split_main(args)
    if args.report_only:  # redo step_cost.md from step_cost.json
        out = json.loads((Path(args.out_dir) / "step_cost.json").read_text())
        sys.argv = out["argv"]
        saved = argparse.Namespace(**out["args"])
        md = step_cost_markdown(saved, out["info"], out["results"], ratio_table(out["results"], saved.device == "cpu"))
        (Path(args.out_dir) / "step_cost.md").write_text(md)
        return out
    info = _common.machine_info()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "_smoke" if args.smoke else ("" if args.device == "cpu" else f"_{args.device}")
    out = {"info": info, "args": vars(args), "argv": sys.argv}

    # The two stand-alone sections: (run it?, stop after it?, measure, render, key in out, file stem, title, model line?).
    sections = (
        (
            args.loss_only or args.smoke,
            args.loss_only,
            loss_only,
            loss_only_markdown,
            "loss_only",
            "loss_cost",
            "pacs_loss alone at scale",
            False,
        ),
        (
            args.ab or args.smoke,
            args.ab,
            ab_backward,
            ab_markdown,
            "ab_backward",
            "ab_backward",
            "loss + backward, the three trainers in one process",
            True,
        ),
    )
    for wanted, only, measure, render, key, stem, title, model_line in sections:
        if not wanted:
            continue
        out[key] = r = measure(args)
        md = render(r)
        print(md)
        info["load_average_end"] = _common.load_average()
        md = _header(title, args, info, model_line=model_line) + md
        (out_dir / f"{stem}{suffix}.md").write_text(md + "\n")
        if only:
            (out_dir / f"{stem}{suffix}.json").write_text(json.dumps(out, indent=1))
            return out

    results = []
    for rep in range(args.reps):
        order = TRAINERS[rep % 3 :] + TRAINERS[: rep % 3]  # rotate who goes first
        for trainer in order:
            r = run_worker(args, worker_argv(args, trainer, rep))
            results.append(r)
            print(
                f"rep {rep} {trainer}: step {r['step_s']:.3f}s opt {r['opt_s']:.3f}s (CPU {r['opt_cpu_s']:.3f}s) "
                f"gen {r['gen_s']:.3f}s "
                f"loss_fwd {r['loss_fwd_s']:.4f}s peak {r['peak_mem_mib']:.0f} MiB (load {r['load']})",
                flush=True,
            )
    table = ratio_table(results, cpu=args.device == "cpu")
    print(table)
    info["load_average_end"] = _common.load_average()
    out["results"] = results
    out["table"] = table
    (out_dir / f"step_cost{suffix}.json").write_text(json.dumps(out, indent=1))
    (out_dir / f"step_cost{suffix}.md").write_text(step_cost_markdown(args, info, results, table))
    return out


def _header(title: str, args, info: dict, model_line: bool = True) -> str:
    text = (
        f"# {title} ({args.device})\n\n{_common.machine_markdown(info)}\n"
        f"- command: `python {' '.join(['benchmarks/step_cost.py', *sys.argv[1:]])}`\n"
    )
    if model_line:
        text += (
            f"- model: random Qwen3 `{args.model_config}`, {args.prompts_per_step} prompts x "
            f"{args.num_generations} completions, prompt {args.prompt_length} + completion "
            f"{args.completion_length} tokens, {args.threads} torch thread(s)\n"
        )
    return text + "\n"


def step_cost_markdown(args, info: dict, results: list[dict], table: str) -> str:
    params = results[0]["num_parameters"]
    per_rep = [
        "| rep | trainer | step s | opt s | opt CPU s | gen s | gen CPU s | compute_loss s | peak MiB | load (1/5/15) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        per_rep.append(
            f"| {r['rep']} | {r['trainer']} | {r['step_s']:.4f} | {r['opt_s']:.4f} | {r['opt_cpu_s']:.4f} | "
            f"{r['gen_s']:.4f} | {r['gen_cpu_s']:.4f} | "
            f"{r['loss_fwd_s']:.4f} | {r['peak_mem_mib']:.0f} | {r['load']} |"
        )
    return "\n".join(
        [
            f"# Step cost: PACS vs GRPO vs RLOO ({args.device})",
            "",
            _common.machine_markdown(info),
            f"- command: `python {' '.join(['benchmarks/step_cost.py', *sys.argv[1:]])}`",
            f"- model: random Qwen3 `{args.model_config}` ({params / 1e6:.1f}M parameters, "
            f"{'bf16' if args.device == 'cuda' else 'float32'}), {args.threads} torch thread(s) per worker",
            f"- batch: {args.prompts_per_step} prompts x {args.num_generations} completions per optimizer step, "
            f"prompt {args.prompt_length} tokens, completion fixed at {args.completion_length} tokens, "
            f"{args.steps_per_generation} optimizer steps per generation (gradient accumulation 1), beta 0 everywhere",
            f"- per worker: {args.warmup_steps} warm-up optimizer steps, then {args.steps} timed; {args.reps} "
            "repetitions, trainers interleaved with rotating order; each (trainer, repetition) in a fresh process",
            "- opt = wall time of an optimizer step minus the generation inside it (forward, loss, backward, clip, "
            "AdamW); gen = `_generate_and_score_completions` (sampling, reward, old log-probs); per-worker medians; "
            "ratios are paired within a repetition, then min / median / max over repetitions",
            "",
            table,
            "",
            "Per repetition (worker medians):",
            "",
            *per_rep,
            "",
        ]
    )


if __name__ == "__main__":
    main()
