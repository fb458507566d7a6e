"""The task `learning.py` and `reuse.py` train on: three-digit addition answered with a worked scratchpad, a
character-level tokenizer, a tiny Qwen3, greedy held-out accuracy, the answer reward and the SFT warm start.

"347+586=" -> "7+6+0=13,4+8+1=13,3+5+1=09>0933" (31 characters + eos, one token per character); the reward checks
only the four digits after ">" (like a math verifier). Not run on its own.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from benchmarks.warm_starts import registry


DEFAULT_WARM_START = "dense-s105"  # benchmarks/warm_starts/: pinned, with its sha256
COMPLETION_TOKENS = 32  # 3 columns x "a+b+c=dd" + 2 commas + ">" + 4 answer digits + eos


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


SFT_LR, SFT_BATCH = 2e-3, 128  # the warm starts' SFT (`--sft-lr`, `--sft-batch-size` defaults)


def sft_loop(tokenizer, sft, max_steps: int, at=(), lr: float = SFT_LR, batch_size: int = SFT_BATCH,
             hidden_size: int = 128, num_layers: int = 2):  # fmt: skip
    """Supervised training from scratch (seed 0) on the worked answers of `sft`: yields `(step, model)` after each
    step in `at` (the model in training mode, trained further after the caller resumes the generator)."""
    model = build_model(tokenizer, hidden_size, num_layers, seed=0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    texts = [p + a + tokenizer.eos_token for p, a in sft]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    ids, attn = enc.input_ids, enc.attention_mask  # (N, 40): all sequences have the same length
    labels = ids.clone()
    labels[:, :8] = -100  # supervise only the scratchpad, the answer and eos
    gen = torch.Generator().manual_seed(0)
    for step in range(1, max_steps + 1):
        idx = torch.randint(0, len(texts), (batch_size,), generator=gen)
        loss = model(input_ids=ids[idx], attention_mask=attn[idx], labels=labels[idx]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step in at:
            yield step, model


def sft_warm_start(args, tokenizer, sft, dev, test) -> dict:
    """An UNPINNED warm start (the `--smoke` runs only; studies load a pinned one, `warm_start`): SFT from scratch
    until dev accuracy >= args.sft_target (checked every 25 steps), saved to args.work_dir/sft; returns its stats."""
    path = Path(args.work_dir) / "sft"
    meta_path = path / "sft_meta.json"
    key = {k: getattr(args, k) for k in ("hidden_size", "num_layers", "sft_lr", "sft_target", "sft_max_steps")}
    key["task"] = "scratchpad-3digit"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta["key"] == key:
            print(f"[sft] reusing {path} (dev acc {meta['dev_acc']:.3f}, test acc {meta['test_acc']:.3f})")
            return meta
    t0, step, dev_acc, model = time.perf_counter(), 0, 0.0, None
    checks = range(25, args.sft_max_steps + 1, 25)
    loop = sft_loop(tokenizer, sft, args.sft_max_steps, set(checks) | {args.sft_max_steps}, args.sft_lr,
                    args.sft_batch_size, args.hidden_size, args.num_layers)  # fmt: skip
    for step, model in loop:
        if step % 25 == 0:
            dev_acc = greedy_accuracy(model, tokenizer, dev)
            print(f"[sft] step {step} dev acc {dev_acc:.3f} ({time.perf_counter() - t0:.0f}s)")
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
        "pinned": False,
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    print(f"[sft] saved {path}: {step} steps, dev acc {dev_acc:.3f}, test acc {test_acc:.3f}")
    return meta


def warm_start(args, t) -> tuple[str, dict]:
    """The warm start a study runs from: `(path, record)`. `args.warm_start` names a pinned one
    (benchmarks/warm_starts/, its sha256 checked); the `--smoke` runs build an unpinned one in `args.work_dir`."""
    if getattr(args, "smoke", False):
        meta = sft_warm_start(args, t["tokenizer"], t["sft"], t["dev"], t["test"])
        return str(Path(args.work_dir) / "sft"), {"name": "smoke (unpinned)", "sha256": None, **meta}
    path, entry = registry.load(args.warm_start)
    return path, registry.record(args.warm_start, entry)


def add_task_args(p: argparse.ArgumentParser) -> None:
    """The model, SFT warm start and RL batch settings that learning.py and reuse.py share."""
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--warm-start", dest="warm_start", default=DEFAULT_WARM_START,
                   help="the pinned SFT warm start to start from (benchmarks/warm_starts/warm_starts.json)")  # fmt: skip
    p.add_argument("--hidden-size", dest="hidden_size", type=int, default=128)
    p.add_argument("--num-layers", dest="num_layers", type=int, default=2)
    p.add_argument("--sft-lr", dest="sft_lr", type=float, default=2e-3)
    p.add_argument("--sft-target", dest="sft_target", type=float, default=0.3, help="stop SFT at this dev accuracy")
    p.add_argument("--sft-max-steps", dest="sft_max_steps", type=int, default=2000)
    p.add_argument("--sft-batch-size", dest="sft_batch_size", type=int, default=128)
    p.add_argument("--num-generations", dest="num_generations", type=int, default=8)
    p.add_argument("--prompts-per-step", dest="prompts_per_step", type=int, default=8)


def eval_callback(args, curve: list):
    """A TrainerCallback that appends (step, validation acc, test acc) to `curve` before training, every
    `args.eval_every` optimizer steps and at the last one (greedy decoding on the task's splits)."""
    from transformers import TrainerCallback

    t = task(args)

    def evaluate(model, step):
        curve.append((step, *(greedy_accuracy(model, t["tokenizer"], t[split]) for split in ("val", "test"))))

    class EvalCallback(TrainerCallback):
        def on_train_begin(self, a, state, control, model=None, **kw):
            evaluate(model, 0)

        def on_step_end(self, a, state, control, model=None, **kw):
            if state.global_step % args.eval_every == 0 or state.global_step == a.max_steps:
                evaluate(model, state.global_step)

    return EvalCallback()


_TASK: dict = {}


def task(args) -> dict:
    """Tokenizer, problem splits and the RL training set, built once per process (workers of a pool each build it)."""
    if not _TASK:
        from datasets import Dataset

        torch.set_num_threads(args.threads)
        test, val, dev, sft, rl = make_problems()
        _TASK.update(
            tokenizer=build_char_tokenizer(), test=test, val=val, dev=dev, sft=sft,
            train=Dataset.from_dict({"prompt": [p for p, _ in rl], "answer": [final_answer(a) for _, a in rl]}),
        )  # fmt: skip
    return _TASK
