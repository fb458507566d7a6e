"""The reward proxy's anchor, each arm tuned before it is judged: pi_old of each rollout vs a fixed, periodically reset
pi_ref (with the optimizer kept, reset, or reset with a re-warmup), against GRPO and RLOO.

    nice python -m benchmarks.anchor.anchor --jobs 2 --out-dir OUT --work-dir WORK  # the study (~2 h, 2 shared CPUs)
    python -m benchmarks.anchor.anchor --smoke                                      # one tiny run per arm (tests)
    python -m benchmarks.anchor.anchor --report-only                       # redo anchor.{md,png} from anchor.json
    python -m benchmarks.anchor.anchor --only "PACS ref N=2 reset" 0.3 3e-05 0 --out-dir OUT  # one run, as JSON

The protocol (pre-registered in anchor_protocol.md before any run): learning.py's task, model, SFT warm start
and RL settings (three-digit addition, a 0.49M-parameter Qwen3, 120 optimizer steps of 8 prompts x 8 completions,
4 optimizer steps per generation). Arms (`ARMS`): the rollout anchor; the reference anchor never reset; reset every 8
and every 2 generations, each with the optimizer kept, reset, and reset with a re-warmup of `--rewarmup` steps; GRPO and
RLOO. Tuning: every arm picks its settings on `--tune-seed` (not a reported seed) by final validation accuracy, from
the same budget: PACS arms beta x lr over `--betas` x `--lrs`, GRPO/RLOO lr over `--baseline-lrs` (as many points); a
pick on an edge of its grid extends the grid one point past that edge (at most `--extend` times). Then every arm runs
`--seeds` at its pick. Per run: greedy validation/test accuracy every 20 steps, per step the critic's within-group
ranking (all steps; generations' first steps: fresh completions), its Brier score on mixed groups, entropy, |r|, KL
to pi_ref, the resets, the learning-rate factor and the parameter change ||dtheta|| of the step; at the end the KL of
the policy to the SFT policy on a fixed probe set. Runs are cached one JSON each under `--work-dir`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

from benchmarks import _tasks, harness, rl_runs
from benchmarks.anchor import anchor_report


HERE = Path(__file__).resolve().parent
REF = {"pacs_anchor": "reference", "pacs_class_weight": "balanced"}
RESET_MODES = {
    "keep": {"pacs_reset_optimizer": False},
    "reset": {"pacs_reset_optimizer": True},
    "reset+warmup": {"pacs_reset_optimizer": True},  # pacs_reset_warmup_steps from --rewarmup
}
ARMS = {
    "PACS rollout": ("pacs", {"pacs_anchor": "rollout", "pacs_class_weight": "balanced"}),
    "PACS ref never": ("pacs", {**REF, "pacs_reference_reset_generations": 0}),
    **{
        f"PACS ref N={n} {mode}": ("pacs", {**REF, "pacs_reference_reset_generations": n, **extra})
        for n in (8, 2)
        for mode, extra in RESET_MODES.items()
    },
    "GRPO": ("grpo", {}),
    "RLOO": ("rloo", {}),
}
STEP_KEYS = (
    "entropy", "pacs/proxy_abs_mean", "pacs/reference_kl", "pacs/reference_resets", "pacs/psi_std", "reward",
    "pacs/critic_ranking", "pacs/critic_ranking_fresh", "pacs/critic_brier_mixed", "pacs/lr_factor", "grad_norm",
)  # fmt: skip
PROBE = 200  # validation problems whose worked answers are the KL probe (teacher-forced)


def arm_config(arm: str, beta: float | None, rewarmup: int) -> tuple[str, dict]:
    family, extra = ARMS[arm]
    extra = dict(extra)
    if family == "pacs":
        extra["pacs_beta"] = beta
        if arm.endswith("reset+warmup"):
            extra["pacs_reset_warmup_steps"] = rewarmup
    return family, extra


def tag(arm: str, beta: float | None, lr: float, seed: int) -> str:
    safe = arm.replace(" ", "_").replace("=", "").replace("+", "_")
    return f"{safe}_b{beta:g}_lr{lr:g}_s{seed}" if beta is not None else f"{safe}_lr{lr:g}_s{seed}"


def probe_kl(model, sft_path: str, args) -> float:
    """Mean per-token KL(pi_theta || pi_SFT) over the full vocabulary on a fixed probe set: the first `PROBE`
    validation prompts followed by their worked answers (teacher-forced, so both policies see the same contexts)."""
    import torch
    from transformers import AutoModelForCausalLM

    t = _tasks.task(args)
    tok = t["tokenizer"]
    texts = [p + a + tok.eos_token for p, a in t["val"][:PROBE]]
    batch = tok(texts, return_tensors="pt", padding=True)
    sft = AutoModelForCausalLM.from_pretrained(sft_path, dtype=torch.float32).eval()
    model = model.float().eval()
    with torch.no_grad():
        logp = model(**batch).logits.float().log_softmax(-1)  # (B, T, V)
        logq = sft(**batch).logits.float().log_softmax(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)  # (B, T)
    mask = batch["attention_mask"].float()
    return float((kl * mask).sum() / mask.sum())


def run_one(spec: tuple[str, float | None, float, int], args, model_path: str, reward=None, save_to=None) -> dict:
    """One RL run from the SFT checkpoint: its validation/test curve, per-step logs and the final probe KL.
    `reward` replaces the task's reward function (see `rl_runs.make_trainer`); `save_to` keeps the final model."""
    import torch
    from transformers import PrinterCallback, TrainerCallback

    arm, beta, lr, seed = spec
    t = _tasks.task(args)
    curve, steps = [], []

    class Watch(TrainerCallback):
        def on_step_begin(self, a, state, control, model=None, **kw):
            self.before = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()

        def on_step_end(self, a, state, control, model=None, **kw):
            after = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
            self.delta = (after - self.before).norm().item()

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "grad_norm" in logs:
                entry = {"step": state.global_step, "update_norm": getattr(self, "delta", None)}
                steps.append({**entry, **{k: logs[k] for k in STEP_KEYS if k in logs}})

    name = f"{arm} b={beta:g}" if beta is not None else arm
    rl_runs.CONFIGS[name] = arm_config(arm, beta, args.rewarmup)
    out = os.path.join(args.work_dir, "runs", tag(arm, beta, lr, seed))
    trainer = rl_runs.make_trainer(name, lr, args, model_path, t["train"], seed, out, reward=reward)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(_tasks.eval_callback(args, curve))
    trainer.add_callback(Watch())
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    if save_to:
        trainer.save_model(save_to)
    run = {
        "arm": arm, "beta": beta, "lr": lr, "seed": seed, "curve": curve, "steps": steps,
        "kl_to_sft": probe_kl(trainer.model, model_path, args), "seconds": seconds, "cpu_seconds": cpu,
        "load": harness.load_average(),
    }  # fmt: skip
    print(
        f"[anchor] {name:32s} lr {lr:g} seed {seed}: val {curve[-1][1]:.3f} test {curve[0][2]:.3f} -> "
        f"{curve[-1][2]:.3f}, KL to SFT {run['kl_to_sft']:.4f} in {seconds:.0f}s (cpu {cpu:.0f}s, load {run['load']})",
        flush=True,
    )
    return run


def _store(spec, args, model_path: str, cache: Path) -> None:
    (cache / f"{tag(*spec)}.json").write_text(json.dumps(run_one(spec, args, model_path)))


def _grid(arm: str, args) -> tuple[list, list]:
    if ARMS[arm][0] == "pacs":
        return list(args.betas), list(args.lrs)
    return [None], list(args.baseline_lrs)


def _extend(values: list[float], picked: float, factor: float) -> list[float] | None:
    """The grid one point past the edge the pick sits on (x or / by `factor`), or None when the pick is inside."""
    values = sorted(values)
    if len(values) < 2 or picked not in (values[0], values[-1]):
        return None
    return values + [values[-1] * factor] if picked == values[-1] else [values[0] / factor, *values]


def run_all(args, model_path: str) -> list[dict]:
    """Tuning (each arm's grid on the tuning seed, extended where the pick is on an edge), then the reported seeds at
    each arm's pick; every run cached (`--jobs` at a time)."""
    cache = Path(args.work_dir) / "anchor_runs"
    cache.mkdir(parents=True, exist_ok=True)
    store = functools.partial(_store, args=args, model_path=model_path, cache=cache)

    def load() -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted(cache.glob("*.json"))]

    def run_batch(specs: list[tuple]) -> None:
        todo = [spec for spec in specs if not (cache / f"{tag(*spec)}.json").exists()]
        harness.run_all(store, todo, args.jobs, lambda _: None)

    grids = {arm: _grid(arm, args) for arm in args.arms}
    for extension in range(args.extend + 1):
        run_batch([(arm, b, lr, args.tune_seed) for arm, (bs, lrs) in grids.items() for b in bs for lr in lrs])
        if extension == args.extend:
            break  # the grids that ran are the grids recorded
        picks = anchor_report.picks(load(), args.arms, args.tune_seed, grids)
        grown = {}
        for arm, (beta, lr) in picks.items():
            bs, lrs = grids[arm]
            more_lrs = _extend(lrs, lr, 3.0)
            more_bs = _extend(bs, beta, 3.0) if beta is not None else None
            if more_lrs or more_bs:
                grown[arm] = (more_bs or bs, more_lrs or lrs)
        if not grown:
            break
        grids.update(grown)
    args.grids = grids
    picks = anchor_report.picks(load(), args.arms, args.tune_seed, grids)
    run_batch([(arm, *picks[arm], seed) for seed in args.seeds for arm in args.arms])
    return load()


def add_tuning_args(p: argparse.ArgumentParser) -> None:
    """The reported seeds, the tuning seed and the grids (PACS: beta x lr; GRPO/RLOO: lr), as anchor.py's protocol
    and the sparsity study's (which uses the same rule and budget) define them."""
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--tune-seed", dest="tune_seed", type=int, default=100)
    p.add_argument("--betas", nargs="+", type=float, default=[0.1, 0.3, 1.0])
    p.add_argument("--lrs", nargs="+", type=float, default=[1e-5, 3e-5, 1e-4])
    p.add_argument("--baseline-lrs", dest="baseline_lrs", nargs="+", type=float,
                   default=[3e-6, 6e-6, 1e-5, 2e-5, 3e-5, 6e-5, 1e-4, 2e-4, 3e-4])  # fmt: skip
    p.add_argument("--extend", type=int, default=1, help="grid extensions past an edge pick, at most")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default=str(HERE))
    p.add_argument("--work-dir", default="/tmp/pacs-bench-anchor")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    add_tuning_args(p)
    p.add_argument("--rewarmup", type=int, default=4, help="pacs_reset_warmup_steps of the reset+warmup arms")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--report-only", dest="report_only", action="store_true")
    p.add_argument("--only", nargs=4, metavar=("ARM", "BETA", "LR", "SEED"), help="one run, printed as JSON")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--sft-max-steps", dest="sft_max_steps", type=int, default=100, help="--smoke's unpinned SFT")
    largs, args = rl_runs.parse_study_args(p, argv)
    if args.smoke:
        largs.seeds, largs.betas, largs.lrs, largs.baseline_lrs, largs.sft_max_steps = [0], [1.0], [1e-4], [1e-4], 25
        largs.extend, largs.rewarmup = 0, 1
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw_path = out / ("anchor_smoke.json" if args.smoke else "anchor.json")
    if args.report_only:
        raw = json.loads(raw_path.read_text())
        anchor_report.report(raw, out, smoke=args.smoke)
        return raw
    info = harness.machine_info()
    t = _tasks.task(largs)
    sft_path, sft_meta = _tasks.warm_start(largs, t)  # pinned (benchmarks/warm_starts/), sha256 checked
    if args.only:
        arm, beta, lr, seed = args.only
        spec = (arm, None if beta == "-" else float(beta), float(lr), int(seed))
        run = run_one(spec, largs, sft_path)
        print(json.dumps({k: run[k] for k in ("arm", "beta", "lr", "seed", "curve", "kl_to_sft")}))
        return run
    runs = run_all(largs, sft_path)
    raw = {"info": info, "args": vars(largs), "argv": sys.argv, "sft": sft_meta, "warm_start": sft_meta, "runs": runs}
    raw["info"]["load_average_end"] = harness.load_average()
    raw_path.write_text(json.dumps(raw, indent=1))
    anchor_report.report(raw, out, smoke=args.smoke)
    return raw


if __name__ == "__main__":
    main()
