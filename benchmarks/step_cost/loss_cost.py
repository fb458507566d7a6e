"""`pacs_loss` forward+backward alone at scale (8192 completions x 4096 tokens by default), next to TRL's GRPO
per-token loss on the same tensors and to one forward+backward of the model it would serve (6 x params x tokens
FLOPs, converted to time with the matmul throughput measured on this machine).

Run through `python -m benchmarks.step_cost.step_cost --loss-only`; `step_cost_report.loss_only_markdown` renders it.
"""

from __future__ import annotations

import time

from benchmarks import harness
from benchmarks.step_cost.step_cost_setup import count_params


def grpo_dapo_loss(per_token_logps, old_per_token_logps, completion_mask, advantages, eps=0.2):
    """TRL GRPOTrainer's default per-token loss (loss_type="dapo", beta 0), on the same tensors, for comparison."""
    import torch

    coef_1 = torch.exp(per_token_logps - old_per_token_logps)  # (B, T)
    coef_2 = torch.clamp(coef_1, 1 - eps, 1 + eps)
    per_token_loss = -torch.min(coef_1 * advantages.unsqueeze(1), coef_2 * advantages.unsqueeze(1))  # (B, T)
    return (per_token_loss * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)


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
        "load": harness.load_average(),
    }
