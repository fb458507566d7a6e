"""How far does TRL's LoRA weight push move the frozen base weights in bf16? Drift after N merge/unmerge round trips.

    nice -n 5 python -m benchmarks.lora_push_drift.lora_push_drift    # ~8 min on 2 shared CPU cores
    python -m benchmarks.lora_push_drift.lora_push_drift --smoke      # seconds: 10 pushes on a 64 x 128 layer

At every weight push to vLLM, TRL 1.16 (`VLLMGeneration._iter_named_params`) merges the adapters into the base
weights in place and unmerges them after reading (peft: `W += ΔW`, then `W -= ΔW`, ΔW = scaling * B @ A); in bf16
the round trip is not exact (TRL issue #6688). This reproduces it on one real-shape LoRA layer (default: Qwen3-8B's
k_proj / v_proj, 1024 x 4096, r 32, alpha 32 as the LoRA recipes), W drawn at std 0.02, A at peft's init, B from 0
and moved between pushes as training moves it (`--step`: 4 Adam steps at lr 1e-5 per generation move each entry by
about 4e-5; 4e-4 for lr 1e-4), for adapters in bf16 (ZeRO-3, where TRL keeps them in the base dtype) and in float32
(peft's default upcast elsewhere). Each push computes ΔW once with peft's `get_delta_weight` and applies peft's merge
and unmerge operations to W; the first `--check` pushes are checked bit for bit against peft's own
`merge()` / `unmerge()` on a twin layer, and against `pacs.grpo.vllm_sync.merged_tensor` (the out-of-place push), which
must give the same merged weight and leave W untouched. Printed after 1, 10, 100, ... pushes: the drift D = W_N - W_0
(max |D|; over max |W_0|; rms over std(W_0); share of entries moved) and D against the LoRA update itself
(||D|| / ||ΔW_N||, max |D| / max |ΔW_N|).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
from peft import LoraConfig, get_peft_model

from pacs.grpo.vllm_sync import merged_tensor


def lora_layer(shape: tuple[int, int], r: int, alpha: int, adapter_dtype: torch.dtype, seed: int):
    """A peft LoRA Linear on a bf16 base weight of `shape` (out, in), std 0.02, bias-free; adapters in `adapter_dtype`."""
    torch.manual_seed(seed)
    net = torch.nn.Module()
    net.proj = torch.nn.Linear(shape[1], shape[0], bias=False, dtype=torch.bfloat16)
    torch.nn.init.normal_(net.proj.weight, std=0.02)
    upcast = adapter_dtype == torch.float32  # peft's autocast_adapter_dtype: bf16 adapters upcast to float32
    model = get_peft_model(
        net, LoraConfig(r=r, lora_alpha=alpha, target_modules=["proj"]), autocast_adapter_dtype=upcast
    )
    return model.base_model.model.proj


def train_step(layers, step: float, gen: torch.Generator) -> None:
    """Move every layer's B by the same `step * N(0, 1)` (what one generation's optimizer steps do to it)."""
    b = layers[0].lora_B["default"].weight
    move = (torch.randn(b.shape, generator=gen) * step).to(b.dtype)
    for layer in layers:
        layer.lora_B["default"].weight.data += move


def stats(w: torch.Tensor, w0: torch.Tensor, delta: torch.Tensor) -> dict[str, float]:
    d, w0, delta = (w.float() - w0.float()), w0.float(), delta.float()
    return {
        "max_abs": d.abs().max().item(),
        "max_over_max_w": d.abs().max().item() / w0.abs().max().item(),
        "rms_over_std_w": d.pow(2).mean().sqrt().item() / w0.std().item(),
        "frac_moved": (d != 0).float().mean().item(),
        "norm_over_norm_dw": d.norm().item() / max(delta.norm().item(), 1e-30),
        "max_over_max_dw": d.abs().max().item() / max(delta.abs().max().item(), 1e-30),
    }


@torch.no_grad()  # the adapters require grad: without this every push would keep its graph
def run(shape, r, alpha, adapter_dtype, step, pushes, check, seed=0) -> list[dict]:
    layer, twin = (lora_layer(shape, r, alpha, adapter_dtype, seed) for _ in range(2))
    weight = layer.get_base_layer().weight.data  # TRL's push writes into this one, in place
    w0 = weight.clone()
    gen = torch.Generator().manual_seed(seed + 1)
    rows, report_at = [], {10**k for k in range(int(math.log10(pushes)) + 1)} | {pushes}
    for n in range(1, pushes + 1):
        train_step([layer, twin] if n <= check else [layer], step, gen)
        delta = layer.get_delta_weight("default")  # peft's ΔW, in the adapters' dtype
        if n <= check:  # the twin goes through peft's own merge / unmerge; pacs's push reads W only
            before = twin.get_base_layer().weight.data.clone()
            ours = merged_tensor(twin)
            assert torch.equal(twin.get_base_layer().weight.data, before), "merged_tensor wrote into W"
            twin.merge()
            assert torch.equal(ours, twin.get_base_layer().weight.data), "merged_tensor != peft's merge"
            twin.unmerge()
        weight += delta  # peft's Linear.merge (unsafe, as `merge_adapter` calls it)
        weight -= delta.to(weight.dtype)  # peft's Linear.unmerge
        if n <= check:
            assert torch.equal(weight, twin.get_base_layer().weight.data), f"simulation != peft at push {n}"
        if n in report_at:
            rows.append({"pushes": n, **stats(weight, w0, delta)})
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=int, nargs=2, default=[1024, 4096], metavar=("OUT", "IN"))
    parser.add_argument("--r", type=int, default=32)
    parser.add_argument("--alpha", type=int, default=32)
    parser.add_argument("--pushes", type=int, default=1000)
    parser.add_argument("--step", type=float, nargs="+", default=[4e-5, 4e-4], help="B's move per push (std)")
    parser.add_argument("--check", type=int, default=5, help="pushes checked against peft's merge / unmerge")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--smoke", action="store_true", help="10 pushes on a 64 x 128 layer, r 4 (tests)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.shape, args.r, args.alpha, args.pushes = [64, 128], 4, 4, 10
    results = {"args": vars(args), "runs": []}
    print(f"LoRA layer {args.shape[0]} x {args.shape[1]}, r {args.r}, alpha {args.alpha}, base weight bf16 std 0.02")
    header = "max|D|  max|D|/max|W|  rms(D)/std(W)  moved  ||D||/||dW||  max|D|/max|dW|"
    for adapter_dtype in (torch.bfloat16, torch.float32):
        for step in args.step:
            start = time.perf_counter()
            rows = run(tuple(args.shape), args.r, args.alpha, adapter_dtype, step, args.pushes, args.check)
            name = f"adapters {str(adapter_dtype).removeprefix('torch.')}, B step {step:g} per push"
            print(f"\n{name} ({time.perf_counter() - start:.0f} s; first {args.check} pushes match peft bit for bit)")
            print(f"{'pushes':>7}  {header}")
            for row in rows:
                print(
                    f"{row['pushes']:>7}  {row['max_abs']:.2e}  {row['max_over_max_w']:.2e}       "
                    f"{row['rms_over_std_w']:.2e}       {row['frac_moved']:6.2%}  {row['norm_over_norm_dw']:.2e}"
                    f"      {row['max_over_max_dw']:.2e}"
                )
            results["runs"].append({"adapter_dtype": str(adapter_dtype), "step": step, "rows": rows})
    print("\npacs.grpo.vllm_sync (out-of-place push): W untouched, drift 0 (checked at every checked push above)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
