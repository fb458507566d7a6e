"""What padding-free training saves on CPU (issue 54): one optimizer step's forward + backward, padded as TRL pads it,
trimmed per micro-batch, packed, and packed with rows balanced by tokens.

    nice python -m benchmarks.padding_free.padding_free                # ~12 min on 2 CPU cores lightly loaded
    python -m benchmarks.padding_free.padding_free --smoke             # seconds (tests/test_padding_free_bench.py)
    python -m benchmarks.padding_free.padding_free_report              # redo padding_free.md from padding_free.json

The model: a randomly initialised Qwen3 (transformers' `Qwen3Config`, `MODEL` below: 4 layers, hidden 128, 4 query /
2 key-value heads of 32, MLP 384, vocabulary 4,096, tied embeddings; sdpa attention), float32, one torch thread, with
TRL's fused LM head (`trl.trainer.utils.add_fused_lm_head`, log-probs and entropies, as GRPOTrainer's training forward).
An optimizer step is `GA` micro-batches of `P` rows (one step per generation batch: TRL pads the `GA * P` rows once).

Arms, each the step's forward + backward of a token-mean policy-gradient loss with a global normaliser:

- `padded`: TRL 1.16's layout: the generation batch padded once (prompts left, completions right, as wide as its
  longest prompt plus its longest completion), micro-batches sliced from it, each forwarded with its attention mask
  (`GRPOTrainer._get_per_token_logps_and_entropies`' call);
- `trimmed`: each micro-batch cut to its own longest prompt and completion, then as `padded`;
- `packed`: what the layer's `padding_free=True` runs on sdpa (`pacs.grpo.padding_free.packed_logps_and_entropies`
  with its default row budget, `row_budget`): each micro-batch's real tokens in rows no longer than its longest
  sequence (first fit decreasing), positions restarting per sequence, no mask;
- `packed_one_row`: each micro-batch's real tokens in one row (the default on flash-attention, which attends within
  each sequence; on sdpa / eager transformers builds a dense mask, and computes attention, over the whole row's
  length squared, which is what this arm shows);
- `balanced`: `packed` after the step's rows are regrouped by tokens (`pacs.grpo.balance.balance_micro_batches`).

Distributions of (prompt, completion) lengths, groups of `G` rows sharing a prompt:

- `long_tail`: completions log-normal with sigma 1 and mean 20% of `max_completion_length` before the cap (the issue's
  model: mean 10-30% of the maximum), capped at it (those are the truncated ones); prompts uniform in [32, 128];
- `long_tail_4_steps`: the same, but the generation batch holds 4 optimizer steps (the recipes' setting) and TRL pads
  it once, so the timed step (its first) is as wide as the longest of 4x the rows;
- `demo`: the lengths of a real run here, `demo_lengths.json` (`pacs demo`'s SmolLM2-135M-Instruct generations at the
  demo's settings; `python -m benchmarks.padding_free.demo_lengths` makes it), the first `GA * P` rows;
- `equal`: every prompt 64 and every completion 128 tokens: nothing to gain, the overhead shows.

Per distribution: tokens (real / computed positions per arm), interleaved repetitions (the arm order rotates), each
arm's process CPU time and wall time per step, paired per repetition with `padded`'s (min / median / max of the ratio),
the backbone alone (`model.model`, forward without grad, no LM head) likewise; against `padded` in fp32 the largest
|Δ log p| on completion tokens and the step's gradient difference (max |Δ| / max |g|); real tokens per micro-batch,
largest / mean, fixed and balanced; peak RSS of one step per arm, each in a fresh process (`--rss`, the long tail
by default).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness


HERE = Path(__file__).resolve().parent
ARMS = ("padded", "trimmed", "packed", "packed_one_row", "balanced")
PACKED = ("packed", "packed_one_row", "balanced")
DISTRIBUTIONS = ("long_tail", "long_tail_4_steps", "demo", "equal")
STEPS_PER_GENERATION = {"long_tail_4_steps": 4}  # optimizer steps per generation batch (TRL pads them together)
MODEL = dict(
    vocab_size=4096, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, max_position_embeddings=4096, tie_word_embeddings=True,
)  # fmt: skip
SMOKE_MODEL = dict(MODEL, hidden_size=32, intermediate_size=64, num_hidden_layers=1, head_dim=8, vocab_size=256)


def build_model(shape: dict, seed: int = 0):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(seed)
    config = Qwen3Config(**shape, attn_implementation="sdpa")
    model = Qwen3ForCausalLM(config).float()
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    return model


def lengths(dist: str, rows: int, group: int, max_completion: int, seed: int) -> tuple[list[int], list[int]]:
    """(prompt lengths, completion lengths) of `rows` rows, `group` consecutive rows sharing a prompt."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if dist == "equal":
        return [64] * rows, [min(128, max_completion)] * rows
    if dist == "demo":
        saved = json.loads((HERE / "demo_lengths.json").read_text())
        prompts, completions = saved["prompt_lengths"], saved["completion_lengths"]
        take = [i % len(prompts) for i in range(rows)]
        return [prompts[i] for i in take], [completions[i] for i in take]
    sigma, mean = 1.0, 0.2 * max_completion
    completion = np.minimum(rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, rows), max_completion)
    prompt = np.repeat(rng.integers(32, 129, rows // group + 1), group)[:rows]
    return prompt.tolist(), np.maximum(completion.round(), 1).astype(int).tolist()


def padded_batch(prompts: list[int], completions: list[int], vocab: int, seed: int) -> dict:
    """The generation batch as TRL pads it: `prompt_ids` / `prompt_mask` left-padded, `completion_*` right-padded."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    B, Tp, Tc = len(prompts), max(prompts), max(completions)
    prompt_mask = (torch.arange(Tp)[None] >= Tp - torch.tensor(prompts)[:, None]).long()  # (B, Tp)
    completion_mask = (torch.arange(Tc)[None] < torch.tensor(completions)[:, None]).long()  # (B, Tc)
    prompt_ids = torch.randint(1, vocab, (B, Tp), generator=gen) * prompt_mask
    completion_ids = torch.randint(1, vocab, (B, Tc), generator=gen) * completion_mask
    advantages = torch.randn(B, generator=gen)
    return dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                completion_mask=completion_mask, advantages=advantages, row=torch.arange(B))  # fmt: skip


def trim(batch: dict) -> dict:
    """A micro-batch cut to its own longest prompt (left) and completion (right)."""
    keep_p = batch["prompt_mask"].any(0).nonzero()
    start = int(keep_p[0]) if keep_p.numel() else batch["prompt_mask"].size(1)
    width = int(batch["completion_mask"].sum(1).max())
    return {**batch, "prompt_ids": batch["prompt_ids"][:, start:], "prompt_mask": batch["prompt_mask"][:, start:],
            "completion_ids": batch["completion_ids"][:, :width], "completion_mask": batch["completion_mask"][:, :width]}  # fmt: skip


def micro_batches(batch: dict, arm: str, num: int) -> list[dict]:
    from trl.trainer.utils import split_tensor_dict

    from pacs.grpo.balance import balance_micro_batches

    batches = split_tensor_dict(batch, num)
    if arm == "trimmed":
        return [trim(b) for b in batches]
    if arm == "balanced":
        return balance_micro_batches(batches, unit=1)
    return batches


def _row_budget(arm: str, mask) -> int | None:
    """The packed arm's token budget per row: the layer's default on sdpa, or one row per micro-batch."""
    from pacs.grpo.padding_free import row_budget

    return int(mask.numel()) if arm == "packed_one_row" else row_budget(mask, None, varlen=False, aux_loss=False)


def logps(model, batch: dict, arm: str):
    """Per-token log-probs `(B, Tc)` of the completion tokens, and the positions the backbone computed."""
    import torch

    from pacs.grpo.padding_free import packed_logps_and_entropies

    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    keep = batch["completion_ids"].size(1)
    if arm in PACKED:
        out, _, _, positions = packed_logps_and_entropies(
            model, ids, mask, keep, compute_entropy=True, max_tokens_per_row=_row_budget(arm, mask)
        )
        return out, positions
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    return model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True).log_probs[
        :, -keep:
    ], ids.numel()


def step(model, batches: list[dict], arm: str, total_tokens: int) -> dict:
    """One optimizer step's forward + backward (gradients accumulated into `.grad`)."""
    positions, per_row = 0, {}
    for batch in batches:
        out, n = logps(model, batch, arm)
        positions += n
        mask = batch["completion_mask"].to(out.dtype)
        loss = -(out * batch["advantages"][:, None] * mask).sum() / total_tokens  # the step's global normaliser
        loss.backward()
        for k, row, m in zip(batch["row"].tolist(), out.detach(), batch["completion_mask"].bool(), strict=True):
            per_row[k] = row[m]
    return {"positions": positions, "per_row": per_row}


def backbone(model, batches: list[dict], arm: str) -> None:
    """The model body's forward alone (no LM head), without grad."""
    import torch

    from pacs.grpo.packing import pack

    with torch.no_grad():
        for batch in batches:
            ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
            mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
            if arm in PACKED:
                packed = pack(ids, mask, _row_budget(arm, mask))
                model.model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False)
            else:
                model.model(input_ids=ids, attention_mask=mask, use_cache=False)


def timed(fn) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def use_head(head: str) -> None:
    """`compact`: TRL's fused LM head scores only the labelled positions (completion tokens), as it does on a GPU
    (`trl.trainer.utils`: `compact = _use_triton(device)`, false on CPU); `full`: every position, as on a CPU."""
    import trl.trainer.utils as trl_utils

    from pacs.grpo import padding_free  # noqa: F401  (the layer's module imports trl's utils first)

    if not hasattr(use_head, "cpu_default"):
        use_head.cpu_default = trl_utils._use_triton
    trl_utils._use_triton = (lambda device: True) if head == "compact" else use_head.cpu_default


def setup(args, dist: str):
    shape = SMOKE_MODEL if args.smoke else MODEL
    rows, steps = args.micro_batch * args.accumulation, STEPS_PER_GENERATION.get(dist, 1)
    kind = "long_tail" if dist.startswith("long_tail") else dist
    prompts, completions = lengths(kind, rows * steps, args.group, args.max_completion_length, args.seed)
    batch = padded_batch(prompts, completions, shape["vocab_size"], args.seed)  # the generation batch, padded once
    batch = {key: value[:rows] for key, value in batch.items()}  # its first optimizer step, as wide as all of it
    return build_model(shape, args.seed), batch, prompts[:rows], completions[:rows]


def rss_child(args) -> dict:
    """One step of one arm in this (fresh) process: its peak RSS and the RSS before the step."""
    dist, arm = args.rss_child
    model, batch, _, completions = setup(args, dist)
    batches = micro_batches(batch, arm, args.accumulation)
    base = _status_mib("VmRSS")
    step(model, batches, arm, sum(completions))
    # VmHWM: this process's own peak (getrusage's ru_maxrss is inherited from the parent across fork + exec)
    return {"baseline_mib": round(base, 1), "peak_mib": round(_status_mib("VmHWM"), 1)}


def _status_mib(key: str) -> float:
    """A `/proc/self/status` memory figure of this process, in MiB."""
    with open("/proc/self/status") as f:
        return int(next(ln for ln in f if ln.startswith(key + ":")).split()[1]) / 1024


def measure(args, dist: str) -> dict:
    import torch

    model, batch, prompts, completions = setup(args, dist)
    total = sum(completions)
    arms = {arm: micro_batches(batch, arm, args.accumulation) for arm in ARMS}
    real = [int(b["prompt_mask"].sum() + b["completion_mask"].sum()) for b in arms["padded"]]
    balanced = [int(b["prompt_mask"].sum() + b["completion_mask"].sum()) for b in arms["balanced"]]
    result = {"prompt_lengths": prompts, "completion_lengths": completions, "real_tokens": sum(real),
              "tokens_per_micro_batch": {"fixed": real, "balanced": balanced},
              "largest_over_mean": {"fixed": max(real) / (sum(real) / len(real)),
                                    "balanced": max(balanced) / (sum(balanced) / len(balanced))}}  # fmt: skip
    # 1. fp32 agreement with the padded step: log-probs per row, the step's gradient
    reference, grads = None, {}
    for arm in ARMS:
        model.zero_grad(set_to_none=True)
        out = step(model, arms[arm], arm, total)
        grads[arm] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        result.setdefault("positions", {})[arm] = out["positions"]
        if reference is None:
            reference = out["per_row"]
        result.setdefault("max_abs_dlogp", {})[arm] = max(
            (out["per_row"][k] - reference[k]).abs().max().item() for k in reference if reference[k].numel()
        )
        result.setdefault("grad_max_rel_diff", {})[arm] = (
            (grads[arm] - grads["padded"]).abs().max() / grads["padded"].abs().max()
        ).item()
    # 2. time, interleaved: each repetition runs every arm (a rotating order), step and backbone alone
    times = {arm: {"cpu": [], "wall": [], "backbone_cpu": [], "backbone_wall": []} for arm in ARMS}
    for rep in range(args.warmup + args.repeats):
        order = ARMS[rep % len(ARMS) :] + ARMS[: rep % len(ARMS)]
        for arm in order:
            model.zero_grad(set_to_none=True)
            cpu, wall = timed(lambda arm=arm: step(model, arms[arm], arm, total))
            b_cpu, b_wall = timed(lambda arm=arm: backbone(model, arms[arm], arm))
            if rep >= args.warmup:
                for key, value in zip(times[arm], (cpu, wall, b_cpu, b_wall), strict=True):
                    times[arm][key].append(value)
    result["times"] = times
    result["load_average"] = harness.load_average()
    # 3. peak RSS of one step per arm, each in a fresh process
    if dist in args.rss and getattr(args, "head", "full") == "full":  # the child runs the CPU's full head
        result["rss"] = {}
        for arm in ARMS:
            cmd = [sys.executable, "-m", "benchmarks.padding_free.padding_free", *args.passthrough,
                   "--rss-child", dist, arm]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=HERE.parents[1]).stdout
            result["rss"][arm] = json.loads(out.strip().splitlines()[-1])
    return result


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny model and batch, 1 repetition, no RSS")
    parser.add_argument("--distributions", nargs="+", default=list(DISTRIBUTIONS), choices=DISTRIBUTIONS)
    parser.add_argument("--micro-batch", type=int, default=8, help="rows per micro-batch (P)")
    parser.add_argument("--accumulation", type=int, default=4, help="micro-batches per optimizer step (GA)")
    parser.add_argument("--group", type=int, default=4, help="rows sharing a prompt (num_generations)")
    parser.add_argument("--max-completion-length", type=int, default=256)
    parser.add_argument("--heads", nargs="+", default=["full", "compact"], choices=("full", "compact"),
                        help="the fused LM head scoring every position (CPU) and/or only the completion tokens (as on a "
                        "GPU); compact results are stored as DIST/compact_head")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rss",
        nargs="*",
        default=["long_tail"],
        choices=DISTRIBUTIONS,
        help="the distributions whose peak RSS per arm is measured (a fresh process per arm)",
    )
    parser.add_argument("--add", action="store_true", help="add these distributions to the existing JSON")
    parser.add_argument("--rss-child", nargs=2, metavar=("DIST", "ARM"), help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", default=str(HERE))
    args = parser.parse_args(argv)
    if args.smoke:
        args.micro_batch, args.accumulation, args.max_completion_length = 4, 2, 48
        args.repeats, args.warmup, args.rss = 1, 0, []
    args.passthrough = [f"--micro-batch={args.micro_batch}", f"--accumulation={args.accumulation}",
                        f"--group={args.group}", f"--max-completion-length={args.max_completion_length}",
                        f"--seed={args.seed}", f"--threads={args.threads}"] + (["--smoke"] if args.smoke else [])  # fmt: skip
    return args


def main(argv: list[str] | None = None) -> dict:
    import torch

    args = parse(argv)
    torch.set_num_threads(args.threads)
    if args.rss_child:
        print(json.dumps(rss_child(args)))
        return {}
    info = harness.machine_info()
    settings = {
        k: v for k, v in vars(args).items() if k not in ("passthrough", "rss_child", "out_dir", "add", "rss", "heads")
    }
    raw = {"info": info, "settings": settings, "model": SMOKE_MODEL if args.smoke else MODEL,
           "command": "python -m benchmarks.padding_free.padding_free " + " ".join(argv or sys.argv[1:]),
           "results": {}}  # fmt: skip
    if (HERE / "demo_lengths.json").exists():
        raw["demo_source"] = json.loads((HERE / "demo_lengths.json").read_text())["source"]
    name = "padding_free_smoke" if args.smoke else "padding_free"
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    out = Path(args.out_dir) / f"{name}.json"
    if args.add:  # the same settings, other distributions: keep the JSON's results
        kept = json.loads(out.read_text())
        if kept["settings"] | {"distributions": None} != settings | {"distributions": None}:
            raise SystemExit(f"--add: {out} was measured with other settings: {kept['settings']}")
        raw["results"], raw["info"] = kept["results"], kept["info"] | {"added": info}
        raw["command"] = f"{kept['command']}; then {raw['command']}"
    for head in args.heads:
        use_head(head)
        args.head = head
        for dist in args.distributions:
            started, key = time.perf_counter(), dist if head == "full" else f"{dist}/compact_head"
            raw["results"][key] = measure(args, dist)
            print(f"{key}: {time.perf_counter() - started:.0f} s", flush=True)
            out.write_text(
                json.dumps(raw, indent=1) + "\n"
            )  # after each distribution: a partial run keeps its results
    use_head("full")
    raw["info"]["load_average_end"] = harness.load_average()
    out.write_text(json.dumps(raw, indent=1) + "\n")
    from benchmarks.padding_free import padding_free_report

    padding_free_report.write(raw, Path(args.out_dir) / f"{name}.md")
    return raw


if __name__ == "__main__":
    main()
