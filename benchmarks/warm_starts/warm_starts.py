"""Pinned SFT warm starts: the task studies (anchor, learning, reuse, gradient_term, sparsity) start RL from these files.

    python -m benchmarks.warm_starts.warm_starts --sweep 80 85 90 95 100 105 110 115 120  # stats along one SFT run
    python -m benchmarks.warm_starts.warm_starts --build dense-s105 --steps 105           # writes dense-s105/, once
    python -m benchmarks.warm_starts.warm_starts --verify                                  # every committed hash

Why files: the SFT warm start is trained from scratch by `_tasks`' SFT loop, and the same code, seed and command give
a different model on another CPU family (kernels differ): 100 SFT steps reached dev 0.500 / test 0.426 on an Intel
Xeon and dev 0.195 / test 0.262 on an AMD EPYC. So every study loads a committed warm start by name, and the loader
refuses one whose files do not hash to the registry (`warm_starts.json`, name -> sha256 of every file, the build
command, the SFT steps, the accuracy and the group statistics it was built with, and the machine it was built on).
A rebuild writes a new name; a committed name is never replaced (`--build` refuses an existing one).

Each warm start is `_tasks`' model (a 0.49M-parameter Qwen3, hidden 128, 2 layers) after `--steps` SFT steps of
`_tasks.sft_loop` (AdamW lr 2e-3, batch 128, seed 0), with its character tokenizer. Its reward sparsity is measured as
the studies see it at step 0: `--group-prompts` RL prompts (the first of the RL pool), G = 8 completions each at
temperature 1 (top-k/top-p off), the shares of groups with no correct completion (all wrong) and with only correct
ones (all right).
"""

from __future__ import annotations

import argparse
import json
import shlex
import time

import torch

from benchmarks import _tasks, harness
from benchmarks.warm_starts.registry import HERE, REGISTRY, WarmStartError, load, registry, sha256


@torch.no_grad()
def group_stats(model, tokenizer, prompts: list[str], answers: list[str], G: int = 8, seed: int = 1234) -> dict:
    """Shares of all-wrong / all-right / mixed groups and the mean reward of G sampled completions per prompt."""
    was_training = model.training
    model.eval()
    torch.manual_seed(seed)
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(
        **enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=G,
        max_new_tokens=_tasks.COMPLETION_TOKENS, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip  # (P * G, prompt + completion)
    texts = tokenizer.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    rewards = torch.tensor(_tasks.answer_reward(texts, [a for a in answers for _ in range(G)])).view(-1, G)
    model.train(was_training)
    correct = rewards.sum(dim=1)  # (P,)
    return {
        "prompts": len(prompts), "G": G, "temperature": 1.0, "seed": seed,
        "all_wrong": float((correct == 0).float().mean()), "all_right": float((correct == G).float().mean()),
        "mixed": float(((correct > 0) & (correct < G)).float().mean()), "reward_mean": float(rewards.mean()),
    }  # fmt: skip


def snapshots(steps: list[int], group_prompts: int):
    """One SFT run from scratch; yields (step, model, stats) at each of `steps` (sorted)."""
    t = _tasks.task(argparse.Namespace(threads=1))
    tok, train = t["tokenizer"], t["train"]
    prompts, answers = train["prompt"][:group_prompts], train["answer"][:group_prompts]
    for step, model in _tasks.sft_loop(tok, t["sft"], max(steps), at=set(steps)):
        stats = {
            "dev_acc": _tasks.greedy_accuracy(model, tok, t["dev"]),
            "test_acc": _tasks.greedy_accuracy(model, tok, t["test"]),
            "groups": group_stats(model, tok, prompts, answers),
        }
        yield step, model, stats


def build(name: str, steps: int, group_prompts: int) -> dict:
    folder = HERE / name
    if name in registry() or folder.exists():
        raise WarmStartError(f"warm start {name!r} exists; a committed warm start is never replaced: pick a new name.")
    t0 = time.perf_counter()
    [(_, model, stats)] = list(snapshots([steps], group_prompts))
    model.save_pretrained(folder)
    _tasks.task(argparse.Namespace(threads=1))["tokenizer"].save_pretrained(folder)
    info = harness.machine_info()
    entry = {
        "steps": steps, **stats,
        "build": f"python -m benchmarks.warm_starts.warm_starts --build {shlex.quote(name)} --steps {steps} "
        f"--group-prompts {group_prompts}",
        "sft": {"lr": _tasks.SFT_LR, "batch_size": _tasks.SFT_BATCH, "seed": 0, "hidden_size": 128, "num_layers": 2},
        "built_on": {k: info[k] for k in ("date", "cpu", "cpu_capability", "cpu_flags_sha256", "torch", "transformers")},
        "seconds": round(time.perf_counter() - t0, 1),
        "files": {p.name: sha256(p) for p in sorted(folder.iterdir()) if p.is_file()},
    }  # fmt: skip
    entries = registry()
    entries[name] = entry
    REGISTRY.write_text(json.dumps(entries, indent=1) + "\n")
    return entry


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweep", nargs="+", type=int, help="SFT steps at which to print the statistics (writes nothing)")
    p.add_argument("--build", metavar="NAME", help="build and register a new warm start")
    p.add_argument("--steps", type=int, help="SFT steps of --build")
    p.add_argument("--group-prompts", dest="group_prompts", type=int, default=256)
    p.add_argument("--verify", action="store_true", help="check every registered warm start's files")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.sweep:
        for step, _, stats in snapshots(sorted(args.sweep), args.group_prompts):
            print(json.dumps({"step": step, **stats}), flush=True)
    if args.build:
        if args.steps is None:
            p.error("--build needs --steps")
        print(json.dumps(build(args.build, args.steps, args.group_prompts), indent=1))
    if args.verify:
        for name in registry():
            load(name)
            print(f"{name}: ok")


if __name__ == "__main__":
    main()
