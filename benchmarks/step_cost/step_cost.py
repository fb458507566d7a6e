"""Cost of a training step under PACSTrainer, GRPOTrainer (beta 0) and RLOOTrainer (beta 0): same model, data, batch, seed.

    python -m benchmarks.step_cost.step_cost                                          # CPU: random Qwen3, 4 reps
    python -m benchmarks.step_cost.step_cost --device cuda --model-config qwen3-1.7b  # GPU: Qwen3-1.7B's shape, bf16
    python -m benchmarks.step_cost.step_cost --loss-only                              # pacs_loss alone, 8192 x 4096
    python -m benchmarks.step_cost.step_cost --ab                                     # loss+backward A/B/C, 1 process
    python -m benchmarks.step_cost.step_cost --split                                  # split groups: batch 1/2/4 vs 8
    python -m benchmarks.step_cost.step_cost --smoke                                  # one tiny iteration (smoke test)
    python -m benchmarks.step_cost.step_cost --report-only [--split|--ab|--loss-only]  # redo a report from its JSON

Steps:

1. Every (trainer, repetition) runs in a fresh worker process (`--worker`), so its peak memory is its own: peak RSS
   (`ru_maxrss`) on CPU, `torch.cuda.max_memory_allocated` on GPU. The trainers are interleaved within each
   repetition and their order rotates between repetitions, so a drift in machine load hits all three alike.
2. A worker builds a randomly initialised Qwen3 from a hard-coded config (no download; timing needs no trained
   weights), a synthetic word-level tokenizer of the same vocabulary size, random fixed-length prompts and a
   pseudo-random binary reward (CRC32 parity of the completion, so groups are mixed and PACS's class weights are
   exercised). Generation is forced to a fixed length (`min_new_tokens` = `max_completion_length`).
3. Timing uses public hooks only, identical for the three trainers: a callback marks the start and end of each
   optimizer step, a thin subclass times `compute_loss` (forward + loss, no backward), and a forward hook on the
   model times every forward run without grad. On a step that generates (global step a multiple of
   `steps_per_generation`), the time before its first `compute_loss` is "generation" (TRL's `_prepare_inputs`:
   sampling, reward, old log-probs); the rest of the step (forward, loss, backward, clipping, optimizer) is
   "optimization". The warm-up steps are dropped.
4. The parent prints the ratios to GRPO (min / median / max over repetitions) and writes
   `--out-dir/step_cost[_<mode>].json`; `step_cost_report.py` renders the markdown from it.

`--split` measures PACS's split path (a micro-batch holding part of a group) against the whole-group path and
against GRPO at the same per-device batch: one group of `num_generations` = 8 completions per optimizer step, as
per-device batch 8 x accumulation 1, 4 x 2, 2 x 4 and 1 x 8, with 4 optimizer steps per generation, completions fixed
at 256 tokens so that activations dominate the step. The first optimizer step after a generation is on-policy
(PACS's reward proxy is 0: no extra forward); the others are off-policy (one extra no-grad forward over the step's
micro-batches for the whole-group coefficients: the no-grad forwards the hook sees outside generation); both are
reported. Results: `split_cost.{json,md}`.

`--loss-only` times `pacs_loss` forward+backward for 8192 completions x 4096 tokens (float32) next to TRL's GRPO
per-token loss on the same tensors, and compares it with one forward+backward of the model it would serve
(6 x params x tokens FLOPs), converted to time with the matmul throughput measured on this machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness
from benchmarks.step_cost import step_cost_report
from benchmarks.step_cost.loss_cost import loss_only

from .step_cost_setup import MODEL_CONFIGS, build_data, build_model, parity_reward, trainer_class_and_config


HERE = Path(__file__).resolve().parent
TRAINERS = step_cost_report.TRAINERS
SPLIT_TRAINERS = step_cost_report.SPLIT_TRAINERS


# 1. Worker: one trainer, one repetition ---------------------------------------------------------------------------


class _Clock:
    """(wall, CPU) seconds; CPU time of this process is what a shared machine cannot steal (threads: 1)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def now(self) -> tuple[float, float]:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        return time.perf_counter(), time.process_time()

    def since(self, t0: tuple[float, float]) -> tuple[float, float]:
        t1 = self.now()
        return t1[0] - t0[0], t1[1] - t0[1]


def _add(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return a[0] + b[0], a[1] + b[1]


def worker(args) -> dict:
    """Train one trainer for warm-up + timed steps; per-step timings from public hooks only (see the docstring)."""
    import torch
    from transformers import PrinterCallback, TrainerCallback

    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    clock = _Clock(cuda)
    Base, config = trainer_class_and_config(args, args.trainer)
    zero = (0.0, 0.0)
    # per optimizer step: (global step, step, time before the first compute_loss, no-grad forwards before it / after)
    steps: list[tuple] = []
    loss_fwd: list[tuple[float, float]] = []
    now = {"step": None, "pre_loss": None, "fwd": None, "nograd_pre": zero, "nograd_post": zero, "k": 0}

    class Timed(Base):
        """Times `compute_loss` (a public method); the algorithm is the parent's, untouched."""

        def compute_loss(self, *a, **kw):
            if now["pre_loss"] is None:  # the step's first micro-batch: its inputs are prepared (and generated)
                now["pre_loss"] = clock.since(now["step"])
            t0 = clock.now()
            out = super().compute_loss(*a, **kw)
            loss_fwd.append(clock.since(t0))
            return out

    class StepTimer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            now.update(step=clock.now(), pre_loss=None, nograd_pre=zero, nograd_post=zero, k=state.global_step)

        def on_step_end(self, a, state, control, **kw):
            steps.append((now["k"], clock.since(now["step"]), now["pre_loss"], now["nograd_pre"], now["nograd_post"]))

    def forward_begins(module, inputs):
        now["fwd"] = None if torch.is_grad_enabled() else clock.now()

    def forward_ends(module, inputs, output):
        if now["fwd"] is not None:
            key = "nograd_pre" if now["pre_loss"] is None else "nograd_post"
            now[key] = _add(now[key], clock.since(now["fwd"]))
            now["fwd"] = None

    tokenizer, dataset = build_data(args)
    model = build_model(args.model_config, args.device, args.seed)
    model.register_forward_pre_hook(forward_begins)
    model.register_forward_hook(forward_ends)
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

    w, spg = args.warmup_steps, args.steps_per_generation
    rows = []  # (global step, step wall, step CPU, generation wall, CPU, extra no-grad forward wall, CPU)
    for k, step, pre_loss, nograd_pre, nograd_post in steps[w:]:
        generated = k % spg == 0  # TRL generates at these optimizer steps (gradient accumulation is in spg's unit)
        gen = pre_loss if generated else zero
        extra = nograd_post if generated else _add(nograd_pre, nograd_post)  # generation's forwards are not extra
        rows.append((k, *step, *gen, *extra))
    generating = [x for x in rows if x[0] % spg == 0]
    result = {"trainer": args.trainer, "rep": args.rep, "gen_timer": "pre_loss"}
    if args.per_device:  # the split section: on-policy (first step after a generation) and off-policy steps apart
        result.update(per_device=config.per_device_train_batch_size, grad_accum=config.gradient_accumulation_steps)
        result["rss_before_train_mib"] = rss_start
        result["per_step"] = rows
        for policy, on in (("on", True), ("off", False)):
            mine = [x for x in rows if (x[0] % spg == 0) == on]
            for i, kind in ((0, ""), (1, "_cpu")):
                result[f"opt_{policy}{kind}_s"] = statistics.median(x[1 + i] - x[3 + i] for x in mine)
                result[f"extra_fwd_{policy}{kind}_s"] = statistics.median(x[5 + i] for x in mine)
    n_loss_warm = w * config.gradient_accumulation_steps  # one compute_loss per micro-batch
    for i, kind in ((0, ""), (1, "_cpu")):  # wall-clock seconds, then CPU seconds of this process
        result[f"step{kind}_s"] = statistics.median(x[1 + i] for x in rows)
        result[f"opt{kind}_s"] = statistics.median(x[1 + i] - x[3 + i] for x in rows)  # step minus generation
        result[f"gen{kind}_s"] = statistics.median(x[3 + i] for x in generating)  # per generation
        result[f"loss_fwd{kind}_s"] = statistics.median(t[i] for t in loss_fwd[n_loss_warm:])
    result.update(
        {
            "train_wall_s": wall,
            "peak_mem_mib": (
                torch.cuda.max_memory_allocated() / 2**20
                if cuda
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            ),
            "mem_kind": "torch.cuda.max_memory_allocated" if cuda else "peak RSS (ru_maxrss)",
            "load": harness.load_average(),
            "num_parameters": sum(p.numel() for p in model.parameters()),
        }
    )
    return result


# 2. In one process: compute_loss + backward of the three trainers, interleaved ------------------------------------


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
    return {"rounds": args.ab_rounds, "times": times, "load": harness.load_average()}


# 3. Parent: interleave workers, aggregate -------------------------------------------------------------------------


def worker_argv(args, trainer: str, rep: int) -> list[str]:
    argv = [sys.executable, "-m", __spec__.name, "--worker", "--trainer", trainer, "--rep", str(rep)]
    for k in ("device", "model_config", "threads", "seed", "prompt_length", "completion_length", "num_generations",
              "prompts_per_step", "steps_per_generation", "warmup_steps", "steps", "work_dir"):  # fmt: skip
        argv += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    return argv


def run_worker(args, argv: list[str]) -> dict:
    """One worker in a fresh process (its own peak memory), or in this one under --smoke (one import, not meaningful)."""
    if args.smoke:
        return worker(parse_args(argv[3:]))
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-5000:])
        raise RuntimeError(f"worker {' '.join(argv[2:])} failed with exit code {proc.returncode}")
    return json.loads(lines[-1][len("RESULT ") :])


def step_cost(args) -> list[dict]:
    """Workers for every trainer and repetition, in a fresh process each, in rotating order."""
    results = []
    for rep in range(args.reps):
        for trainer in TRAINERS[rep % 3 :] + TRAINERS[: rep % 3]:  # rotate who goes first
            r = run_worker(args, worker_argv(args, trainer, rep))
            results.append(r)
            print(
                f"rep {rep} {trainer}: step {r['step_s']:.3f}s opt {r['opt_s']:.3f}s (CPU {r['opt_cpu_s']:.3f}s) "
                f"gen {r['gen_s']:.3f}s loss_fwd {r['loss_fwd_s']:.4f}s peak {r['peak_mem_mib']:.0f} MiB "
                f"(load {r['load']})",
                flush=True,
            )
    return results


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


# 4. Main ----------------------------------------------------------------------------------------------------------


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
    p.add_argument("--out-dir", dest="out_dir", default=str(HERE))
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
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "_smoke" if args.smoke else ("" if args.device == "cpu" else f"_{args.device}")
    # (section, json/markdown stem, measure, render): --smoke runs them all, else the one asked for
    sections = [
        ("loss_only", "loss_cost", loss_only, step_cost_report.loss_only_markdown),
        ("ab_backward", "ab_backward", ab_backward, step_cost_report.ab_markdown),
        ("split", "split_cost", split_cost, step_cost_report.split_markdown),
        ("results", "step_cost", step_cost, step_cost_report.step_cost_markdown),
    ]
    wanted = {"loss_only": args.loss_only, "ab_backward": args.ab, "split": args.split}
    wanted["results"] = not any(wanted.values())
    if args.smoke and not args.split:
        wanted = {"loss_only": True, "ab_backward": True, "split": False, "results": True}
    everything = {}
    for key, stem, measure, render in (s for s in sections if wanted[s[0]]):
        path = out_dir / f"{stem}{suffix}.json"
        if args.report_only:  # redo the markdown from the json (with a split run's "notes": bullets added by hand)
            out = json.loads(path.read_text())
        else:
            out = {"info": harness.machine_info(), "args": vars(args), "argv": ["x", *argv] if argv else sys.argv}
            out["results" if key == "split" else key] = measure(args)
            if key == "results":
                out["table"] = step_cost_report.ratio_table(out["results"], cpu=args.device == "cpu")
            out["info"]["load_average_end"] = harness.load_average()
            path.write_text(json.dumps(out, indent=1))
        md = render(out)
        print(md)
        (out_dir / f"{stem}{suffix}.md").write_text(md)
        everything.update(out)
    return everything


if __name__ == "__main__":
    main()
