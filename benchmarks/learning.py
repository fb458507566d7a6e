"""Sample efficiency of PACS against TRL's GRPO and RLOO on a task a tiny model learns on a CPU in minutes.

    python benchmarks/learning.py                      # full run: 5 configs x 3 seeds, ~15-40 min on 2 shared CPU cores
    python benchmarks/learning.py --smoke              # one tiny iteration (what tests/test_benchmarks.py runs)
    python benchmarks/learning.py --report-only        # redo learning.md / learning.png from learning.json

The task is two-digit addition with fixed-width operands and answers ("07+45=" -> "052"), a character-level vocabulary
and an exact-match reward. Steps:

1. Split all 10,000 problems into a held-out test set (500), an SFT dev set (500), an SFT set and an RL prompt set.
2. Warm start: a randomly initialised Qwen3 (hidden 128, 2 layers) is trained by plain supervised learning until its
   greedy accuracy on the dev set first reaches `--sft-target` (checked every 25 steps), then saved once; every RL run
   starts from this one checkpoint.
3. RL: each config (PACS with beta 1 and 2 and with/without class weights, GRPO with beta 0, RLOO with beta 0) is
   trained with the same learning rate, batch, group size, optimizer steps per generation and, per seed, the same
   prompt order (TRL's `RepeatSampler` is seeded by `args.seed` in all three trainers). Greedy held-out accuracy is
   measured every `--eval-every` optimizer steps.
4. Results: raw JSON, a plot (mean and min-max over seeds) and a table of steps-to-threshold and final accuracy,
   written to `--out-dir` as learning.json / learning.png / learning.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import _common  # sets the offline environment before transformers is imported
import torch


HERE = Path(__file__).resolve().parent

CONFIGS = {
    # name: (trainer family, extra config kwargs)
    "PACS b=1 balanced": ("pacs", {"pacs_beta": 1.0, "pacs_class_weight": "balanced"}),
    "PACS b=2 balanced": ("pacs", {"pacs_beta": 2.0, "pacs_class_weight": "balanced"}),
    "PACS b=1 no weights": ("pacs", {"pacs_beta": 1.0, "pacs_class_weight": "none"}),
    "GRPO": ("grpo", {}),
    "RLOO": ("rloo", {}),
}


# 1. Task, tokenizer, model ----------------------------------------------------------------------------------------


def make_problems(seed: int = 1234):
    """All 10,000 fixed-width problems, split into (test, dev, sft, rl) lists of (prompt, answer)."""
    problems = [(f"{a:02d}+{b:02d}=", f"{a + b:03d}") for a in range(100) for b in range(100)]
    random.Random(seed).shuffle(problems)
    return problems[:500], problems[500:1000], problems[1000:3000], problems[3000:]


def build_char_tokenizer():
    """Character-level tokenizer over `0-9 + =` with eos `<|im_end|>` and pad `<|endoftext|>` (left padding)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<|endoftext|>", "<|im_end|>", *"0123456789+="])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="left"
    )


def build_model(tokenizer, hidden_size: int, num_layers: int, seed: int):
    from pacs.testing import build_qwen3

    return build_qwen3(
        tokenizer, hidden_size, num_layers, seed, intermediate_size=4 * hidden_size, max_position_embeddings=64
    )


@torch.no_grad()
def greedy_accuracy(model, tokenizer, problems, batch_size: int = 500) -> float:
    """Exact-match accuracy of greedy decoding (4 new tokens: 3 digits + eos) on `problems`."""
    was_training = model.training
    model.eval()
    correct = 0
    for i in range(0, len(problems), batch_size):
        chunk = problems[i : i + batch_size]
        enc = tokenizer([p for p, _ in chunk], return_tensors="pt", padding=True)
        out = model.generate(
            **enc,
            do_sample=False,
            max_new_tokens=4,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )  # (b, P + 4)
        texts = tokenizer.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
        correct += sum(t.strip() == a for t, (_, a) in zip(texts, chunk))
    model.train(was_training)
    return correct / len(problems)


def exact_match_reward(completions, answer, **kwargs) -> list[float]:
    """1.0 if the completion is exactly the fixed-width sum, else 0.0 (TRL reward signature)."""
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


# 2. Supervised warm start -----------------------------------------------------------------------------------------


def sft_warm_start(args, tokenizer, sft, dev, test) -> dict:
    """Train from scratch on `sft` until dev accuracy >= args.sft_target; save to args.work_dir/sft; return stats."""
    path = Path(args.work_dir) / "sft"
    meta_path = path / "sft_meta.json"
    key = {k: getattr(args, k) for k in ("hidden_size", "num_layers", "sft_lr", "sft_target", "sft_max_steps")}
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta["key"] == key:
            print(f"[sft] reusing {path} (dev acc {meta['dev_acc']:.3f}, test acc {meta['test_acc']:.3f})")
            return meta
    model = build_model(tokenizer, args.hidden_size, args.num_layers, seed=0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.sft_lr, weight_decay=0.0)
    texts = [p + a + tokenizer.eos_token for p, a in sft]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    ids, attn = enc.input_ids, enc.attention_mask  # (N, 10): all sequences have the same length
    labels = ids.clone()
    labels[:, :6] = -100  # supervise only the answer digits and eos
    gen = torch.Generator().manual_seed(0)
    t0, step, dev_acc = time.perf_counter(), 0, 0.0
    while step < args.sft_max_steps:
        idx = torch.randint(0, len(texts), (args.sft_batch_size,), generator=gen)
        loss = model(input_ids=ids[idx], attention_mask=attn[idx], labels=labels[idx]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % 25 == 0:
            dev_acc = greedy_accuracy(model, tokenizer, dev)
            print(f"[sft] step {step} loss {loss.item():.3f} dev acc {dev_acc:.3f} ({time.perf_counter() - t0:.0f}s)")
            if dev_acc >= args.sft_target:
                break
    test_acc = greedy_accuracy(model, tokenizer, test)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    meta = {
        "key": key,
        "steps": step,
        "dev_acc": dev_acc,
        "test_acc": test_acc,
        "seconds": time.perf_counter() - t0,
        "num_parameters": sum(p.numel() for p in model.parameters()),
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    print(f"[sft] saved {path}: {step} steps, dev acc {dev_acc:.3f}, test acc {test_acc:.3f}")
    return meta


# 3. RL runs -------------------------------------------------------------------------------------------------------


def make_trainer(family: str, extra: dict, args, model_path: str, tokenizer, train_dataset, seed: int, out: str):
    """The trainer exactly as a user would build it; all three share every setting except the algorithm."""
    common = dict(
        output_dir=out,
        seed=seed,
        use_cpu=True,
        bf16=False,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=args.max_steps,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        gradient_accumulation_steps=1,
        steps_per_generation=args.steps_per_generation,  # = optimizer steps per generation (GA is 1)
        max_completion_length=4,  # 3 digits + eos
        temperature=1.0,
        beta=0.0,  # no KL / reference model for any of the three
        shuffle_dataset=True,
        logging_steps=args.eval_every,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    if family == "pacs":
        from pacs import PACSConfig as Config
        from pacs import PACSTrainer as Trainer
    elif family == "grpo":
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer
    elif family == "rloo":
        from trl import RLOOConfig as Config
        from trl import RLOOTrainer as Trainer
    else:
        raise ValueError(f"unknown trainer family {family!r}")
    config = Config(**common, **extra)
    return Trainer(
        model=model_path,
        reward_funcs=exact_match_reward,
        args=config,
        train_dataset=train_dataset,
        processing_class=tokenizer,
    )


def run_one(name: str, seed: int, args, model_path: str, tokenizer, train_dataset, test) -> dict:
    from transformers import PrinterCallback, TrainerCallback

    family, extra = CONFIGS[name]
    curve: list[tuple[int, float]] = []
    train_log: list[dict] = []

    class EvalCallback(TrainerCallback):
        def on_train_begin(self, a, state, control, model=None, **kw):
            curve.append((0, greedy_accuracy(model, tokenizer, test)))

        def on_step_end(self, a, state, control, model=None, **kw):
            if state.global_step % args.eval_every == 0 or state.global_step == a.max_steps:
                curve.append((state.global_step, greedy_accuracy(model, tokenizer, test)))

        def on_log(self, a, state, control, logs=None, **kw):
            if logs:
                train_log.append(
                    {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, float)}}
                )

    out = os.path.join(args.work_dir, "runs", f"{name.replace(' ', '_').replace('=', '')}-s{seed}")
    trainer = make_trainer(family, extra, args, model_path, tokenizer, train_dataset, seed, out)
    trainer.remove_callback(PrinterCallback)  # keep stdout to one line per run
    trainer.add_callback(EvalCallback())
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    print(
        f"[rl] {name:20s} seed {seed}: acc {curve[0][1]:.3f} -> {curve[-1][1]:.3f} in {seconds:.0f}s "
        f"(load {_common.load_average()})",
        flush=True,
    )
    return {
        "config": name,
        "seed": seed,
        "curve": curve,
        "seconds": seconds,
        "load": _common.load_average(),
        "train_log": train_log,
    }


# 4. Report --------------------------------------------------------------------------------------------------------


def steps_to(curve, threshold: float):
    """First evaluated step whose held-out accuracy is >= threshold, or None."""
    return next((s for s, a in curve if a >= threshold), None)


def mean_std(xs) -> str:
    if not xs:
        return "n/a"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.3f} ± {sd:.3f}"


def final_acc(curve, last: int = 3) -> float:
    """Mean held-out accuracy of the last `last` evaluations (one 500-problem evaluation has a std of ~0.02)."""
    return statistics.mean(a for _, a in curve[-last:])


def summary_table(runs: list[dict], thresholds: list[float], max_steps: int) -> str:
    head = [
        "config",
        "seeds",
        "final acc: mean of last 3 evals (mean ± std over seeds)",
        "acc at last step",
        "best acc",
    ]
    head += [f"steps to {t:.0%} (mean; seeds reaching)" for t in thresholds]
    head += ["wall s/run (median)"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in CONFIGS:
        rs = [r for r in runs if r["config"] == name]
        if not rs:
            continue
        cells = [
            name,
            str(len(rs)),
            mean_std([final_acc(r["curve"]) for r in rs]),
            mean_std([r["curve"][-1][1] for r in rs]),
            mean_std([max(a for _, a in r["curve"]) for r in rs]),
        ]
        for t in thresholds:
            hits = [steps_to(r["curve"], t) for r in rs]
            reached = [h for h in hits if h is not None]
            # an unreached threshold counts as max_steps in the mean (a lower bound on the true mean), marked ">="
            filled = [h if h is not None else max_steps for h in hits]
            prefix = "" if len(reached) == len(rs) else ">="
            cells.append(f"{prefix}{statistics.mean(filled):.0f} ({len(reached)}/{len(rs)})")
        cells.append(f"{statistics.median(r['seconds'] for r in rs):.0f}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(runs: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in CONFIGS:
        rs = [r for r in runs if r["config"] == name]
        if not rs:
            continue
        steps = [s for s, _ in rs[0]["curve"]]
        accs = torch.tensor([[a for _, a in r["curve"]] for r in rs])  # (seeds, evals)
        (line,) = ax.plot(steps, accs.mean(0), label=f"{name} (n={len(rs)})")
        ax.fill_between(steps, accs.min(0).values, accs.max(0).values, color=line.get_color(), alpha=0.15)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# 5. Main ----------------------------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out-dir", default=str(HERE / "results"), help="where learning.{json,png,md} go")
    p.add_argument("--work-dir", default="/tmp/pacs-bench-learning", help="SFT checkpoint and trainer outputs")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--hidden-size", dest="hidden_size", type=int, default=128)
    p.add_argument("--num-layers", dest="num_layers", type=int, default=2)
    p.add_argument("--sft-lr", dest="sft_lr", type=float, default=2e-3)
    p.add_argument("--sft-target", dest="sft_target", type=float, default=0.25, help="stop SFT at this dev accuracy")
    p.add_argument("--sft-max-steps", dest="sft_max_steps", type=int, default=1000)
    p.add_argument("--sft-batch-size", dest="sft_batch_size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-4, help="RL learning rate, the same for every config")
    p.add_argument("--max-steps", dest="max_steps", type=int, default=300, help="RL optimizer steps per run")
    p.add_argument("--num-generations", dest="num_generations", type=int, default=8)
    p.add_argument("--prompts-per-step", dest="prompts_per_step", type=int, default=8)
    p.add_argument("--steps-per-generation", dest="steps_per_generation", type=int, default=4)
    p.add_argument("--eval-every", dest="eval_every", type=int, default=10)
    p.add_argument("--thresholds", nargs="+", type=float, default=[0.5, 0.55, 0.6])
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--smoke", action="store_true", help="one tiny iteration: 1 seed, 2 RL steps, 25 SFT steps")
    p.add_argument("--report-only", dest="report_only", action="store_true", help="redo table/plot from the json")
    args = p.parse_args(argv)
    if args.smoke:
        args.seeds, args.max_steps, args.eval_every, args.steps_per_generation = [0], 2, 1, 2
        args.sft_max_steps, args.sft_target, args.hidden_size = 25, 1.0, 32
    return args


def learning_markdown(raw: dict, table: str) -> str:
    a, sft = raw["args"], raw["sft"]
    return "\n".join(
        [
            "# Learning: PACS vs GRPO vs RLOO on two-digit addition (CPU)",
            "",
            _common.machine_markdown(raw["info"]),
            f"- command: `python {' '.join(['benchmarks/learning.py', *raw['argv'][1:]])}`",
            f"- model: Qwen3 hidden {a['hidden_size']}, {a['num_layers']} layers, character-level vocabulary "
            f"({sft['num_parameters'] / 1e6:.2f}M parameters), {a['threads']} torch thread(s)",
            f"- warm start: plain SFT (AdamW lr {a['sft_lr']:g}, batch {a['sft_batch_size']}) on 2,000 problems, "
            f"stopped at {sft['steps']} steps when dev accuracy first reached {a['sft_target']:.0%} "
            f"(dev {sft['dev_acc']:.3f}, held-out test {sft['test_acc']:.3f}); every RL run starts from it",
            f"- RL: {a['max_steps']} optimizer steps, {a['prompts_per_step']} prompts x {a['num_generations']} "
            f"completions per optimizer step, {a['steps_per_generation']} optimizer steps per generation "
            "(gradient accumulation 1, so the later steps of each rollout are off-policy), temperature 1, "
            f"AdamW lr {a['lr']:g} constant for every config, grad clip 1.0, beta (KL) 0, TRL defaults otherwise "
            "(GRPO: loss_type dapo, scale_rewards group, epsilon 0.2; RLOO: epsilon 0.2)",
            f"- seeds {a['seeds']}: the seed sets the prompt order (TRL's seeded RepeatSampler, identical in the "
            "three trainers) and the sampling; the SFT checkpoint is the same for all seeds",
            f"- evaluation: greedy exact-match accuracy on 500 held-out problems every {a['eval_every']} steps",
            "",
            table,
            "",
            "Steps to a threshold are the first evaluated step at or above it; '>=' marks configs where some seed "
            "never reached it (those seeds count as the last step, so the mean is a lower bound).",
            "",
            "![held-out accuracy vs step](learning.png)",
            "",
        ]
    )


def report(raw: dict, out_dir: Path, smoke: bool) -> str:
    """Table to stdout; markdown + plot to out_dir (not in smoke mode)."""
    a = raw["args"]
    table = summary_table(raw["runs"], a["thresholds"], a["max_steps"])
    print(table)
    if not smoke:
        title = (
            f"2-digit addition, Qwen3 h{a['hidden_size']}x{a['num_layers']}L from SFT; G={a['num_generations']}, "
            f"{a['prompts_per_step']} prompts/step,\n {a['steps_per_generation']} opt steps/generation, "
            f"lr {a['lr']:g}; mean and min-max over {len(a['seeds'])} seeds"
        )
        plot(raw["runs"], out_dir / "learning.png", title)
        (out_dir / "learning.md").write_text(learning_markdown(raw, table))
    return table


def main(argv=None) -> dict:
    args = parse_args(argv)
    out_dir, work_dir = Path(args.out_dir), Path(args.work_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw_path = out_dir / ("learning_smoke.json" if args.smoke else "learning.json")
    if args.report_only:
        raw = json.loads(raw_path.read_text())
        report(raw, out_dir, args.smoke)
        return raw
    torch.set_num_threads(args.threads)
    from datasets import Dataset

    info = _common.machine_info()
    work_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    test, dev, sft, rl = make_problems()
    sft_meta = sft_warm_start(args, tokenizer, sft, dev, test)
    model_path = str(work_dir / "sft")
    train_dataset = Dataset.from_dict({"prompt": [p for p, _ in rl], "answer": [a for _, a in rl]})

    runs: list[dict] = []
    raw = {"info": info, "args": vars(args), "argv": sys.argv, "sft": sft_meta, "runs": runs}
    for seed in args.seeds:  # seed-major: a partial run still covers every config
        for name in args.configs:
            runs.append(run_one(name, seed, args, model_path, tokenizer, train_dataset, test))
            info["load_average_end"] = _common.load_average()
            raw_path.write_text(json.dumps(raw, indent=1))
    report(raw, out_dir, args.smoke)
    return raw


if __name__ == "__main__":
    main()
