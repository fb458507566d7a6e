"""Does PACS learn faster than GRPO, and is its critic doing anything? A tiny model, long completions, on a CPU.

    python benchmarks/learning.py                      # full run (lr grid + seeds), ~1 h on one shared CPU core
    python benchmarks/learning.py --smoke              # one tiny iteration (what tests/test_benchmarks.py runs)
    python benchmarks/learning.py --report-only        # redo learning.md / learning.png from learning.json

The task is three-digit addition answered with a worked scratchpad, one column at a time from the right, then the
answer: "347+586=" -> "7+6+0=13,4+8+1=13,3+5+1=09>0933" (31 characters + eos, one token per character). The reward
checks only the answer after ">" (like a math verifier), so PACS's reward proxy r = beta * sum_t log-ratio sums ~32
tokens. Steps:

1. Draw disjoint problem sets: held-out test (500), validation (200, for picking the learning rate), SFT dev (200),
   SFT (3,000) and RL prompts (10,000).
2. Warm start: a randomly initialised Qwen3 (hidden 128, 2 layers) is trained by plain supervised learning on full
   scratchpads until its greedy dev accuracy first reaches `--sft-target`, then saved once; every RL run starts from it.
3. Learning-rate pick: every config (PACS beta 1 and 2 with balanced class weights, PACS beta 1 without class weights,
   GRPO, RLOO; TRL's KL off for all) is trained on seed 0 at each learning rate of `--lr-grid`; its learning rate is
   the one with the best validation accuracy (mean of the last 3 evaluations). The test set plays no part.
4. Report: each config at its own learning rate on seeds `--seeds` (the seed-0 run of step 3 is reused); greedy
   test accuracy every `--eval-every` steps. Per seed the prompt order is the same for all configs (TRL's
   `RepeatSampler` is seeded by `args.seed` in all three trainers). For PACS, the distribution of |sigma(psi) - 1/2|
   and the implicit critic's accuracy on off-policy steps; for all, the share of steps where gradient clipping was
   active (pre-clip norm > 1).
5. Results: raw JSON, a plot (mean and min-max over seeds), tables and a verdict in learning.md.
"""

from __future__ import annotations

import argparse
import json
import math
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
COMPLETION_TOKENS = 32  # 3 columns x "a+b+c=dd" + 2 commas + ">" + 4 answer digits + eos
RATIO_CLIP = "clip_ratio/region_mean"  # GRPO's and RLOO's share of tokens whose importance ratio was clipped


# 1. Task, tokenizer, model ----------------------------------------------------------------------------------------


def scratchpad(a: int, b: int) -> str:
    """The worked answer to `a+b` for three-digit a, b: columns right to left with carries, then ">" and the sum.

    >>> scratchpad(347, 586)
    '7+6+0=13,4+8+1=13,3+5+1=09>0933'
    """
    carry, columns = 0, []
    for i in range(3):
        x, y = (a // 10**i) % 10, (b // 10**i) % 10
        s = x + y + carry
        columns.append(f"{x}+{y}+{carry}={s:02d}")
        carry = s // 10
    return ",".join(columns) + f">{a + b:04d}"


def make_problems(seed: int = 1234):
    """Disjoint (test, val, dev, sft, rl) lists of (prompt, worked answer) for three-digit addition."""
    rng = random.Random(seed)
    pairs = rng.sample(range(1000 * 1000), 500 + 200 + 200 + 3000 + 10000)
    problems = [(f"{p // 1000:03d}+{p % 1000:03d}=", scratchpad(p // 1000, p % 1000)) for p in pairs]
    return problems[:500], problems[500:700], problems[700:900], problems[900:3900], problems[3900:]


def final_answer(text: str) -> str | None:
    """The four digits after the last ">" of a completion, or None."""
    if ">" not in text:
        return None
    answer = text.rsplit(">", 1)[1].strip()
    return answer if len(answer) == 4 and answer.isdigit() else None


def build_char_tokenizer():
    """Character-level tokenizer over `0-9 + = , >` with eos `<|im_end|>` and pad `<|endoftext|>` (left padding)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<|endoftext|>", "<|im_end|>", *"0123456789+=,>"])}
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
    """Accuracy of the final answer under greedy decoding (up to COMPLETION_TOKENS new tokens) on `problems`."""
    was_training = model.training
    model.eval()
    correct = 0
    for i in range(0, len(problems), batch_size):
        chunk = problems[i : i + batch_size]
        enc = tokenizer([p for p, _ in chunk], return_tensors="pt", padding=True)
        out = model.generate(
            **enc,
            do_sample=False,
            max_new_tokens=COMPLETION_TOKENS,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )  # (b, P + COMPLETION_TOKENS)
        texts = tokenizer.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
        correct += sum(final_answer(t) == final_answer(a) for t, (_, a) in zip(texts, chunk))
    model.train(was_training)
    return correct / len(problems)


def answer_reward(completions, answer, **kwargs) -> list[float]:
    """1.0 if the completion's final answer (after ">") is the right sum, else 0.0 (TRL reward signature).

    >>> answer_reward(["7+6+0=13,4+8+1=13,3+5+1=09>0933", "junk>0933", "0933"], ["0933"] * 3)
    [1.0, 1.0, 0.0]
    """
    return [float(final_answer(c) == a) for c, a in zip(completions, answer)]


# 2. Supervised warm start -----------------------------------------------------------------------------------------


def sft_warm_start(args, tokenizer, sft, dev, test) -> dict:
    """Train from scratch on `sft` until dev accuracy >= args.sft_target; save to args.work_dir/sft; return stats."""
    path = Path(args.work_dir) / "sft"
    meta_path = path / "sft_meta.json"
    key = {k: getattr(args, k) for k in ("hidden_size", "num_layers", "sft_lr", "sft_target", "sft_max_steps")}
    key["task"] = "scratchpad-3digit"
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
    ids, attn = enc.input_ids, enc.attention_mask  # (N, 40): all sequences have the same length
    labels = ids.clone()
    labels[:, :8] = -100  # supervise only the scratchpad, the answer and eos
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


def make_trainer(family: str, extra: dict, lr: float, args, model_path, tokenizer, train_dataset, seed: int, out: str):
    """The trainer exactly as a user would build it; all three share every setting except the algorithm and lr."""
    common = dict(
        output_dir=out,
        seed=seed,
        use_cpu=True,
        bf16=False,
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=args.max_steps,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        gradient_accumulation_steps=1,
        steps_per_generation=args.steps_per_generation,  # GA is 1: each step takes the next slice of a generation
        num_iterations=args.num_iterations,  # passes over each generation batch (TRL's mu)
        max_completion_length=COMPLETION_TOKENS,
        temperature=1.0,
        beta=0.0,  # no KL / reference model for any of the three
        shuffle_dataset=True,
        logging_steps=1,  # every step's grad_norm, for the clipping share
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
    return _common.recording(Trainer)(
        model=model_path,
        reward_funcs=answer_reward,
        args=config,
        train_dataset=train_dataset,
        processing_class=tokenizer,
    )


def run_one(name: str, lr: float, seed: int, args, model_path: str, tokenizer, train_dataset, val, test) -> dict:
    from transformers import PrinterCallback, TrainerCallback

    family, extra = CONFIGS[name]
    curve: list[tuple[int, float, float]] = []  # (step, validation acc, test acc)
    train_log: list[dict] = []

    def evaluate(model, step):
        curve.append((step, greedy_accuracy(model, tokenizer, val), greedy_accuracy(model, tokenizer, test)))

    class EvalCallback(TrainerCallback):
        def on_train_begin(self, a, state, control, model=None, **kw):
            evaluate(model, 0)

        def on_step_end(self, a, state, control, model=None, **kw):
            if state.global_step % args.eval_every == 0 or state.global_step == a.max_steps:
                evaluate(model, state.global_step)

        def on_log(self, a, state, control, logs=None, **kw):
            if logs:
                train_log.append(
                    {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, float)}}
                )

    tag = f"{name.replace(' ', '_').replace('=', '')}-lr{lr:g}-s{seed}"
    trainer = make_trainer(
        family, extra, lr, args, model_path, tokenizer, train_dataset, seed, os.path.join(args.work_dir, "runs", tag)
    )
    trainer.remove_callback(PrinterCallback)  # keep stdout to one line per run
    trainer.add_callback(EvalCallback())
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    # TRL generates every steps_per_generation * num_iterations optimizer steps (GA is 1); the others are off-policy
    critic = _common.critic_summary_pooled(trainer.critic_records, args.steps_per_generation * args.num_iterations)
    clip = _common.clip_fraction(train_log, 1.0)
    print(
        f"[rl] {name:20s} lr {lr:g} seed {seed}: val {curve[0][1]:.3f} -> {curve[-1][1]:.3f}, test "
        f"{curve[0][2]:.3f} -> {curve[-1][2]:.3f}, clip {clip:.0%}"
        + (f", |s(psi)-.5| q50 {critic['abs_sigma_psi_minus_half_q10_q50_q90'][1]:.3f}" if critic else "")
        + f" in {seconds:.0f}s (cpu {cpu:.0f}s, load {_common.load_average()})",
        flush=True,
    )
    return {
        "config": name,
        "lr": lr,
        "seed": seed,
        "curve": curve,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "load": _common.load_average(),
        "critic": critic,
        "clip_fraction": clip,
        "psi_std": [e["pacs/psi_std"] for e in train_log if "pacs/psi_std" in e],
        "train_log": [
            {k: v for k, v in e.items() if k in ("step", "grad_norm", "reward", "pacs/critic_accuracy", RATIO_CLIP)}
            for e in train_log
        ],
    }


# 4. Report --------------------------------------------------------------------------------------------------------


def final(curve, column: int, last: int = 3) -> float:
    """Mean accuracy of the last `last` evaluations (column 1: validation, 2: test)."""
    return statistics.mean(c[column] for c in curve[-last:])


def auc(curve, column: int = 2) -> float:
    """Mean accuracy over all evaluations after step 0: one number for "learns faster" (area under the curve)."""
    return statistics.mean(c[column] for c in curve[1:])


def steps_to(curve, threshold: float):
    """First evaluated step whose test accuracy is >= threshold, or None."""
    return next((c[0] for c in curve if c[2] >= threshold), None)


def t_interval(xs) -> str:
    """mean [95% t-interval] over seeds."""
    if len(xs) < 2:
        return f"{xs[0]:.3f}" if xs else "n/a"
    t = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}.get(len(xs), 2.0)
    m, sd = statistics.mean(xs), statistics.stdev(xs)
    half = t * sd / math.sqrt(len(xs))
    return f"{m:.3f} [{m - half:.3f}, {m + half:.3f}]"


def pick_lrs(runs: list[dict], seed: int) -> dict:
    """Per config, the grid lr whose seed-`seed` run has the best final validation accuracy."""
    picked = {}
    for name in CONFIGS:
        rs = [r for r in runs if r["config"] == name and r["seed"] == seed]
        if rs:
            picked[name] = max(rs, key=lambda r: final(r["curve"], 1))["lr"]
    return picked


def grid_table(runs: list[dict], lrs: list[float], seed: int) -> str:
    head = ["config", *[f"val acc, lr {lr:g}" for lr in lrs], "picked lr"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    picked = pick_lrs(runs, seed)
    for name in CONFIGS:
        cells = [name]
        for lr in lrs:
            r = next((r for r in runs if r["config"] == name and r["seed"] == seed and r["lr"] == lr), None)
            cells.append("—" if r is None else f"{final(r['curve'], 1):.3f}")
        cells.append(f"{picked[name]:g}" if name in picked else "—")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def final_runs(runs: list[dict], picked: dict) -> dict:
    return {name: [r for r in runs if r["config"] == name and r["lr"] == lr] for name, lr in picked.items()}


def summary_table(runs: list[dict], picked: dict, thresholds: list[float]) -> str:
    head = ["config", "lr", "seeds", "test acc start", "final test acc (last 3 evals), mean [95% CI]"]
    head += ["mean test acc over the run (AUC), mean [95% CI]"]
    head += [f"steps to {t:.0%} (seeds reaching)" for t in thresholds]
    head += ["clip active", "CPU s/run"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rs in final_runs(runs, picked).items():
        if not rs:
            continue
        cells = [
            name,
            f"{picked[name]:g}",
            str(len(rs)),
            f"{statistics.mean(r['curve'][0][2] for r in rs):.3f}",
            t_interval([final(r["curve"], 2) for r in rs]),
            t_interval([auc(r["curve"]) for r in rs]),
        ]
        for t in thresholds:
            hits = [h for h in (steps_to(r["curve"], t) for r in rs) if h is not None]
            cells.append(f"{statistics.mean(hits):.0f} ({len(hits)}/{len(rs)})" if hits else f"— (0/{len(rs)})")
        cells.append(f"{statistics.mean(r['clip_fraction'] for r in rs):.0%}")
        cells.append(f"{statistics.median(r['cpu_seconds'] for r in rs):.0f}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def critic_table(runs: list[dict], picked: dict) -> str:
    head = ["config", "off-policy steps", "abs(σ(ψ) − ½) 10% / 50% / 90% quantile", "share > 0.05"]
    head += ["critic accuracy (off-policy)", "majority-label accuracy", "psi_std median"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rs in final_runs(runs, picked).items():
        cs = [r["critic"] for r in rs if r.get("critic")]
        if not cs:
            continue
        q = [statistics.mean(c["abs_sigma_psi_minus_half_q10_q50_q90"][i] for c in cs) for i in range(3)]
        rows.append(
            "| "
            + " | ".join(
                [
                    name,
                    str(sum(c["off_policy_steps"] for c in cs)),
                    f"{q[0]:.3f} / {q[1]:.3f} / {q[2]:.3f}",
                    f"{statistics.mean(c['frac_abs_dev_over_0.05'] for c in cs):.0%}",
                    t_interval([c["critic_accuracy_off_policy"] for c in cs]),
                    f"{statistics.mean(c['majority_label_accuracy'] for c in cs):.3f}",
                    f"{statistics.median(x for r in rs for x in r['psi_std']):.3f}",
                ]
            )
            + " |"
        )
    return "\n".join(rows)


def critic_grid_table(runs: list[dict], lrs: list[float], seed: int) -> str:
    """Per PACS config and grid lr (seed `seed`): median abs(sigma(psi) - 1/2), critic accuracy, validation acc."""
    head = ["config", *[f"lr {lr:g}: median abs(σ(ψ) − ½) / critic acc / val acc" for lr in lrs]]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in CONFIGS:
        cells = [name]
        for lr in lrs:
            r = next((r for r in runs if r["config"] == name and r["seed"] == seed and r["lr"] == lr), None)
            if r is None or not r.get("critic"):
                cells.append("—")
                continue
            c = r["critic"]
            cells.append(
                f"{c['abs_sigma_psi_minus_half_q10_q50_q90'][1]:.3f} / {c['critic_accuracy_off_policy']:.3f} / "
                f"{final(r['curve'], 1):.3f}"
            )
        if len(cells) > 1 and any(c != "—" for c in cells[1:]):
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def paired_vs_grpo(runs: list[dict], picked: dict) -> str:
    """Per config, final test acc minus GRPO's on the same seed: mean [95% t-interval] over seeds."""
    fr = final_runs(runs, picked)
    grpo = {r["seed"]: final(r["curve"], 2) for r in fr.get("GRPO", [])}
    lines = []
    for name, rs in fr.items():
        if name == "GRPO":
            continue
        d = [final(r["curve"], 2) - grpo[r["seed"]] for r in rs if r["seed"] in grpo]
        da = [auc(r["curve"]) - auc(g["curve"]) for r in rs for g in fr["GRPO"] if g["seed"] == r["seed"]]
        if d:
            lines.append(f"| {name} | {len(d)} | {t_interval(d)} | {t_interval(da)} |")
    head = "| config | seeds | final test acc − GRPO's, same seed | AUC − GRPO's, same seed |\n|---|---|---|---|"
    return head + "\n" + "\n".join(lines)


def plot(runs: list[dict], picked: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rs in final_runs(runs, picked).items():
        if not rs:
            continue
        steps = [c[0] for c in rs[0]["curve"]]
        accs = torch.tensor([[c[2] for c in r["curve"]] for r in rs])  # (seeds, evals)
        (line,) = ax.plot(steps, accs.mean(0), label=f"{name}, lr {picked[name]:g} (n={len(rs)})")
        ax.fill_between(steps, accs.min(0).values, accs.max(0).values, color=line.get_color(), alpha=0.15)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("held-out greedy accuracy (test)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# 5. Main ----------------------------------------------------------------------------------------------------------


def add_task_args(p: argparse.ArgumentParser) -> None:
    """The model, SFT warm start and RL batch settings that learning.py and reuse.py share."""
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--hidden-size", dest="hidden_size", type=int, default=128)
    p.add_argument("--num-layers", dest="num_layers", type=int, default=2)
    p.add_argument("--sft-lr", dest="sft_lr", type=float, default=2e-3)
    p.add_argument("--sft-target", dest="sft_target", type=float, default=0.3, help="stop SFT at this dev accuracy")
    p.add_argument("--sft-max-steps", dest="sft_max_steps", type=int, default=2000)
    p.add_argument("--sft-batch-size", dest="sft_batch_size", type=int, default=128)
    p.add_argument("--num-generations", dest="num_generations", type=int, default=8)
    p.add_argument("--prompts-per-step", dest="prompts_per_step", type=int, default=8)
    p.add_argument("--report-only", dest="report_only", action="store_true", help="redo table/plot from the json")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out-dir", default=str(HERE / "results"), help="where learning.{json,png,md} go")
    p.add_argument("--work-dir", default="/tmp/pacs-bench-learning", help="SFT checkpoint and trainer outputs")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4], help="the first one also picks the lr")
    p.add_argument("--lr-grid", dest="lr_grid", nargs="+", type=float, default=[3e-6, 1e-5, 3e-5, 1e-4, 3e-4])
    add_task_args(p)
    p.add_argument("--max-steps", dest="max_steps", type=int, default=120, help="RL optimizer steps per run")
    p.add_argument("--steps-per-generation", dest="steps_per_generation", type=int, default=4)
    p.add_argument("--num-iterations", dest="num_iterations", type=int, default=1, help="TRL's passes per generation")
    p.add_argument("--eval-every", dest="eval_every", type=int, default=20)
    p.add_argument("--thresholds", nargs="+", type=float, default=[0.6, 0.65])
    p.add_argument("--smoke", action="store_true", help="one tiny iteration: 1 seed, 1 lr, 2 RL steps, 25 SFT steps")
    args = p.parse_args(argv)
    if args.smoke:
        args.seeds, args.lr_grid, args.max_steps, args.eval_every, args.steps_per_generation = [0], [1e-4], 2, 1, 2
        args.sft_max_steps, args.sft_target, args.hidden_size = 25, 1.0, 32
    return args


def learning_markdown(raw: dict, tables: dict) -> str:
    a, sft = raw["args"], raw["sft"]
    return "\n".join(
        [
            "# Learning: PACS vs GRPO vs RLOO on three-digit addition with a scratchpad (CPU)",
            "",
            _common.machine_markdown(raw["info"]),
            f"- command: `python {' '.join(['benchmarks/learning.py', *raw['argv'][1:]])}`",
            "- code: the frozen copy of commit f240b2f (`PYTHONPATH=/work/bench_src`) plus this branch's benchmarks",
            f"- model: Qwen3 hidden {a['hidden_size']}, {a['num_layers']} layers, character-level vocabulary "
            f"({sft['num_parameters'] / 1e6:.2f}M parameters), {a['threads']} torch thread(s)",
            "- task: `347+586=` -> `7+6+0=13,4+8+1=13,3+5+1=09>0933` (31 characters + eos); reward 1 when the four "
            "digits after `>` are the sum, whatever the scratchpad says",
            f"- warm start: plain SFT (AdamW lr {a['sft_lr']:g}, batch {a['sft_batch_size']}) on 3,000 worked "
            f"problems, stopped at {sft['steps']} steps when dev accuracy first reached {a['sft_target']:.0%} "
            f"(dev {sft['dev_acc']:.3f}, held-out test {sft['test_acc']:.3f}); every RL run starts from it",
            f"- RL: {a['max_steps']} optimizer steps, {a['prompts_per_step']} prompts x {a['num_generations']} "
            f"completions per optimizer step, {a['steps_per_generation']} optimizer steps per generation "
            "(gradient accumulation 1, so 3 of every 4 steps are off-policy), temperature 1, AdamW constant lr, "
            "grad clip 1.0, TRL beta (KL) 0, TRL defaults otherwise (GRPO: loss_type dapo, scale_rewards group, "
            "epsilon 0.2; RLOO: epsilon 0.2)",
            f"- learning rate: each config's own, picked from {a['lr_grid']} on seed {a['seeds'][0]} by validation "
            "accuracy (200 problems, mean of the last 3 evaluations); the test set played no part",
            f"- seeds {a['seeds']}: the seed sets the prompt order (TRL's seeded RepeatSampler, identical in the "
            "three trainers) and the sampling; the SFT checkpoint is the same for all",
            f"- evaluation: greedy accuracy on 500 held-out test problems every {a['eval_every']} steps (one "
            "evaluation has a sampling std of ~0.02)",
            "",
            "## Learning-rate pick (validation, seed 0)",
            "",
            tables["grid"],
            "",
            "## Held-out test accuracy at the picked learning rates",
            "",
            tables["summary"],
            "",
            "Intervals are 95% t-intervals over seeds. Steps to a threshold: mean over the seeds that reached it.",
            "",
            "Paired by seed against GRPO (same prompt order):",
            "",
            tables["paired"],
            "",
            "## Is the critic doing anything? (PACS configs, off-policy steps only)",
            "",
            tables["critic"],
            "",
            "Across the learning-rate grid (seed 0): the critic term grows with the step size, validation accuracy falls "
            "above 3e-5 for every config:",
            "",
            tables["critic_grid"],
            "",
            "The critic's guess for a completion is 'right' when σ(ψ) > ½; majority-label accuracy is what guessing the "
            "more common label would score on the same completions. |σ(ψ) − ½| is per completion, pooled over the "
            "off-policy steps of a run, then averaged over seeds.",
            "",
            "![held-out accuracy vs step](learning.png)",
            "",
            "## Verdict",
            "",
            raw.get("verdict", "(written after the run)"),
            "",
        ]
    )


def report(raw: dict, out_dir: Path, smoke: bool) -> dict:
    """Tables to stdout; markdown + plot to out_dir (not in smoke mode)."""
    a = raw["args"]
    picked = pick_lrs(raw["runs"], a["seeds"][0])
    tables = {
        "grid": grid_table(raw["runs"], a["lr_grid"], a["seeds"][0]),
        "summary": summary_table(raw["runs"], picked, a["thresholds"]),
        "paired": paired_vs_grpo(raw["runs"], picked),
        "critic": critic_table(raw["runs"], picked),
        "critic_grid": critic_grid_table(raw["runs"], a["lr_grid"], a["seeds"][0]),
    }
    print("\n\n".join(tables.values()))
    if not smoke:
        title = (
            f"3-digit addition with scratchpad, Qwen3 h{a['hidden_size']}x{a['num_layers']}L from SFT; "
            f"G={a['num_generations']}, {a['prompts_per_step']} prompts/step,\n {a['steps_per_generation']} opt "
            f"steps/generation, per-config lr; mean and min-max over {len(a['seeds'])} seeds"
        )
        plot(raw["runs"], picked, out_dir / "learning.png", title)
        (out_dir / "learning.md").write_text(learning_markdown(raw, tables))
    return tables


def load_raw(raw_path: Path, verdict_path: Path) -> dict:
    """A finished run's raw JSON, with the verdict (written by a person after reading the tables) if there is one."""
    raw = json.loads(raw_path.read_text())
    if verdict_path.exists():
        raw["verdict"] = verdict_path.read_text().strip()
    return raw


def main(argv=None) -> dict:
    args = parse_args(argv)
    out_dir, work_dir = Path(args.out_dir), Path(args.work_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw_path = out_dir / ("learning_smoke.json" if args.smoke else "learning.json")
    if args.report_only:
        raw = load_raw(raw_path, out_dir / "learning_verdict.md")
        raw["args"]["thresholds"] = args.thresholds  # a report choice, not a run setting
        report(raw, out_dir, args.smoke)
        return raw
    torch.set_num_threads(args.threads)
    from datasets import Dataset

    info = _common.machine_info()
    work_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    test, val, dev, sft, rl = make_problems()
    sft_meta = sft_warm_start(args, tokenizer, sft, dev, test)
    model_path = str(work_dir / "sft")
    train_dataset = Dataset.from_dict({"prompt": [p for p, _ in rl], "answer": [final_answer(a) for _, a in rl]})

    runs: list[dict] = []
    raw = {"info": info, "args": vars(args), "argv": sys.argv, "sft": sft_meta, "runs": runs}
    if raw_path.exists() and not args.smoke:  # resume: keep finished runs with the same settings
        old = json.loads(raw_path.read_text())
        old["args"].setdefault("num_iterations", 1)  # runs from before the option existed
        free = ("seeds", "configs", "lr_grid", "report_only", "thresholds")  # settings that do not change a run
        same = {k: v for k, v in old["args"].items() if k not in free}
        if same == {k: v for k, v in vars(args).items() if k not in free}:
            runs.extend(old["runs"])
            raw["info"] = old["info"]

    def run(name, lr, seed):
        if any(r["config"] == name and r["lr"] == lr and r["seed"] == seed for r in runs):
            return
        runs.append(run_one(name, lr, seed, args, model_path, tokenizer, train_dataset, val, test))
        raw["info"]["load_average_end"] = _common.load_average()
        raw_path.write_text(json.dumps(raw, indent=1))

    # 3. lr pick on the first seed (validation accuracy), then 4. the other seeds at each config's picked lr
    for lr in args.lr_grid:
        for name in args.configs:
            run(name, lr, args.seeds[0])
    picked = pick_lrs(runs, args.seeds[0])
    print(f"[rl] picked learning rates (validation, seed {args.seeds[0]}): {picked}", flush=True)
    for seed in args.seeds[1:]:
        for name in args.configs:
            run(name, picked[name], seed)
    report(raw, out_dir, args.smoke)
    return raw


if __name__ == "__main__":
    main()
