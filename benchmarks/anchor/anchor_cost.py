"""What does the reference anchor cost? Step time and peak memory of `pacs_anchor="reference"` vs `"rollout"` vs GRPO.

    nice -n 5 python -m benchmarks.anchor.anchor_cost --repeats 5        # ~10 min on 2 shared CPU cores
    python -m benchmarks.anchor.anchor_cost --smoke                      # seconds (tests/test_benchmarks.py)

Each run is a fresh process (so its peak RSS is its own) that trains a randomly initialised Qwen3 (no hub) for
`--generations` generations of `--prompts` prompts x 8 completions of `--completion-tokens` sampled tokens, with 4
optimizer steps per generation, and reports the time per optimizer step (TRL's logged `step_time`, which includes
the generation and every forward over it) and its peak RSS. Configs, run in interleaved order, `--repeats` rounds:

- `PACS rollout`: the proxy against pi_old (TRL computes pi_old's log-probs once per generation: 1 no-grad forward);
- `PACS reference`: against a frozen pi_ref, never reset (one more model in memory, one more no-grad forward per
  generation);
- `PACS reference, reset every generation`: the same plus a weight copy and an optimizer-state reset per generation;
- `GRPO beta=0.04`: TRL's GRPO with its KL term, which pays the same extra model and forward (the fair comparison).

Ratios are per round (each config against `PACS rollout` of the same round), then min / median / max over rounds.
Writes anchor_cost.json and anchor_cost.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness, report


HERE = Path(__file__).resolve().parent
CONFIGS = {
    "PACS rollout": ("pacs", {"pacs_anchor": "rollout"}),
    "PACS reference": ("pacs", {"pacs_anchor": "reference"}),
    "PACS reference, reset every generation": (
        "pacs",
        {"pacs_anchor": "reference", "pacs_reference_reset_generations": 1},
    ),
    "GRPO beta=0.04": ("grpo", {"beta": 0.04}),
}


def child(name: str, args) -> dict:
    """One run in this process: returns mean step time and peak RSS."""
    import torch
    from datasets import Dataset

    from pacs.testing import build_qwen3, build_tiny_tokenizer

    torch.set_num_threads(1)
    family, extra = CONFIGS[name]
    work = tempfile.mkdtemp(prefix="anchor-cost-")
    tokenizer = build_tiny_tokenizer()
    build_qwen3(tokenizer, args.hidden_size, args.num_layers, seed=0).save_pretrained(work + "/model")
    tokenizer.save_pretrained(work + "/model")
    common = dict(
        output_dir=work + "/out", use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, per_device_train_batch_size=args.prompts * 2, num_generations=8, steps_per_generation=4,
        gradient_accumulation_steps=1, max_steps=4 * args.generations, max_completion_length=args.completion_tokens,
        learning_rate=1e-5, seed=0,
    )  # fmt: skip
    if family == "pacs":
        from pacs import PACSConfig as Config
        from pacs import PACSTrainer as Trainer
    else:
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer
    config = Config(**common, **extra)
    dataset = Dataset.from_dict({"prompt": [f"What is {i} + {3 * i}?" for i in range(512)]})

    def reward(completions, **kwargs):
        return [float(len(c) % 2) for c in completions]

    trainer = Trainer(model=work + "/model", reward_funcs=reward, args=config, train_dataset=dataset)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    steps = [e["step_time"] for e in trainer.state.log_history if "step_time" in e]
    return {
        "config": name,
        "step_time_mean": statistics.mean(steps),
        "generation_step_time": statistics.mean(steps[::4]),
        "wall": wall,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--generations", type=int, default=3)
    p.add_argument("--prompts", type=int, default=8, help="prompts per generation (x 8 completions)")
    p.add_argument("--completion-tokens", dest="completion_tokens", type=int, default=64)
    p.add_argument("--hidden-size", dest="hidden_size", type=int, default=256)
    p.add_argument("--num-layers", dest="num_layers", type=int, default=4)
    p.add_argument("--out-dir", default=str(HERE))
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--report-only", dest="report_only", action="store_true", help="redo anchor_cost.md from the JSON")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.repeats, args.generations, args.prompts, args.completion_tokens = 1, 1, 4, 8
        args.hidden_size, args.num_layers = 64, 2
    if args.prompts % 4:
        raise ValueError(
            f"--prompts must be a multiple of 4 (a generation is 4 micro-batches of whole groups), got {args.prompts}"
        )
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args)), flush=True)
        return {}
    if args.report_only:
        raw = json.loads((Path(args.out_dir) / "anchor_cost.json").read_text())
        return render(raw, Path(args.out_dir))
    info = harness.machine_info()
    runs = []
    forward = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--smoke"]
    for round_ in range(args.repeats):
        for name in CONFIGS:
            cmd = [sys.executable, "-m", __spec__.name, "--child", name, *forward] + (
                ["--smoke"] if args.smoke else []
            )
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                raise RuntimeError(f"{name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
            runs.append({"round": round_, **json.loads(line[7:])})
            print(f"[anchor_cost] round {round_} {name}: {runs[-1]}", flush=True)
    raw = {"info": info, "args": vars(args), "argv": sys.argv, "runs": runs}
    if args.smoke:
        raw["table"] = table(raw)
        print(raw["table"])
        return raw
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.out_dir) / "anchor_cost.json").write_text(json.dumps(raw, indent=1))
    return render(raw, Path(args.out_dir))


def table(raw: dict) -> str:
    runs, repeats = raw["runs"], raw["args"]["repeats"]
    rows = [
        "| config | step time / PACS rollout | generation step / PACS rollout | peak RSS / PACS rollout | step time / GRPO beta=0.04 | peak RSS / GRPO beta=0.04 |",
        "|---|---|---|---|---|---|",
    ]

    def ratios(name, base, key):
        by = {(r["round"], r["config"]): r[key] for r in runs}
        return report.ratio_cell(harness.min_med_max([by[(k, name)] / by[(k, base)] for k in range(repeats)]))

    for name in CONFIGS:
        rows.append(
            f"| {name} | {ratios(name, 'PACS rollout', 'step_time_mean')} | "
            f"{ratios(name, 'PACS rollout', 'generation_step_time')} | {ratios(name, 'PACS rollout', 'peak_rss_mib')} | "
            f"{ratios(name, 'GRPO beta=0.04', 'step_time_mean')} | {ratios(name, 'GRPO beta=0.04', 'peak_rss_mib')} |"
        )
    return "\n".join(rows)


def render(raw: dict, out: Path) -> dict:
    """anchor_cost.md from the measured runs."""
    a = raw["args"]
    raw["table"] = table(raw)
    print(raw["table"])
    md = [
        "# Cost of the reference anchor (CPU)",
        "",
        report.machine_markdown(raw["info"]),
        f"- command: `{' '.join(raw['argv'])}`",
        f"- model: random Qwen3 hidden {a['hidden_size']}, {a['num_layers']} layers; {a['prompts']} prompts x 8 "
        f"completions of {a['completion_tokens']} sampled tokens per generation, 4 optimizer steps per generation, "
        f"{a['generations']} generations per run; one fresh process per run, {a['repeats']} interleaved rounds",
        "- cells: min / **median** / max over rounds of the per-round ratio; step time is TRL's logged `step_time` "
        "(the generation step includes generating and every no-grad forward over the batch)",
        "",
        raw["table"],
        "",
    ]
    (out / "anchor_cost.md").write_text("\n".join(md))
    return raw


if __name__ == "__main__":
    main()
