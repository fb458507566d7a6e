"""Does filtering help PACS? Dynamic sampling and the uniform-group term, against GRPO + dynamic sampling, per optimizer
step and per generated completion, on both pinned warm starts (issue 46; protocol: filtering_protocol.md).

    nice python -m benchmarks.filtering.filtering --phase spot tune seeds --jobs 2 --work-dir WORK   # DS arms
    nice python -m benchmarks.filtering.filtering --phase seeds-at-no-ds-picks --warm-starts sparse-s80 ...  # as run
    nice python -m benchmarks.filtering.filtering --phase uniform --jobs 2 --work-dir WORK           # uniform-out arms
    python -m benchmarks.filtering.filtering --collect --work-dir WORK     # filtering.json + report from the runs
    python -m benchmarks.filtering.filtering --report-only                 # redo filtering.{md,png} from the JSON
    python -m benchmarks.filtering.filtering --smoke                       # one tiny run per arm (tests)

The sparsity study's task, model, RL settings and measurements (benchmarks/sparsity/, anchor.py): three-digit
addition, a 0.49M-parameter Qwen3 from the pinned warm starts `dense-s105` and `sparse-s80`, 120 optimizer steps of
8 prompts x 8 completions, 4 optimizer steps per generation. Arms: GRPO and GRPO + DS (through the GRPO layer,
`pacs.grpo`: rl_runs.py's `hardened_grpo` family), PACS rollout +- DS, the paper's method (pi_ref reset every 8
generations) +- DS, and both PACS arms with uniform groups left out of the loss (`pacs_uniform_groups="drop"`, no
DS). Dynamic sampling:
`dynamic_sampling_max_rounds=10` (fixed by the protocol). Every run records, besides anchor.py's measurements, the
completions it generated (from its reward function, which every generation round calls) at each evaluation, each
generation batch's rounds and fallback groups (`pacs/ds/*`), and the CPU it ran on (`machine`: lscpu model, torch's
kernels, lscpu flags hash; the runs in the committed filtering.json predate it). The no-DS runs of GRPO, PACS rollout and the paper's
method are `sparsity.json`'s (their arms, picks and seeds), once the spot rerun here reproduces one bit for bit.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import _tasks, harness, rl_runs
from benchmarks.anchor import anchor
from benchmarks.sparsity import sparsity


HERE = Path(__file__).resolve().parent

WARM_STARTS = ("dense-s105", "sparse-s80")
PAPER = "PACS ref N=8 reset"  # the revised paper's method (sparsity.py's name)
DS = {"dynamic_sampling": True, "dynamic_sampling_max_rounds": 10}  # the round limit: fixed by the protocol
UNIFORM_OUT = {"pacs_uniform_groups": "drop"}
ARMS = {  # name: (the sparsity study's arm it extends, family, extra config)
    "GRPO": ("GRPO", "hardened_grpo", {}),
    "GRPO + DS": ("GRPO", "hardened_grpo", DS),
    "PACS rollout": ("PACS rollout", "pacs", anchor.ARMS["PACS rollout"][1]),
    "PACS rollout + DS": ("PACS rollout", "pacs", {**anchor.ARMS["PACS rollout"][1], **DS}),
    "PACS rollout, uniform out": ("PACS rollout", "pacs", {**anchor.ARMS["PACS rollout"][1], **UNIFORM_OUT}),
    PAPER: (PAPER, "pacs", anchor.ARMS[PAPER][1]),
    f"{PAPER} + DS": (PAPER, "pacs", {**anchor.ARMS[PAPER][1], **DS}),
    f"{PAPER}, uniform out": (PAPER, "pacs", {**anchor.ARMS[PAPER][1], **UNIFORM_OUT}),
}
DS_ARMS = [a for a in ARMS if a.endswith("+ DS")]
UNIFORM_ARMS = [a for a in ARMS if a.endswith("uniform out")]
REUSED_ARMS = ["GRPO", "PACS rollout", PAPER]  # from sparsity.json
SPOT = ("sparse-s80", "GRPO", None, 1e-05, 4)  # the spot rerun: sparsity.json's GRPO pick on sparse, seed 4
FIXED_STEPS = (20, 40, 60, 80, 100, 120)  # the sparsity study's evaluations (its tuning rule: the last 3)
DS_EVAL_EVERY = 8  # DS arms are also evaluated every 2 generations, for accuracy per generated completion


def tag(spec) -> str:
    ws, arm, beta, lr, seed = spec
    safe = arm.replace(" ", "_").replace("=", "").replace("+", "plus").replace(",", "")
    return f"{ws}__{safe}_b{beta:g}_lr{lr:g}_s{seed}" if beta is not None else f"{ws}__{safe}_lr{lr:g}_s{seed}"


def eval_steps(arm: str, max_steps: int) -> set[int]:
    steps = {s for s in FIXED_STEPS if s <= max_steps} | {max_steps}
    if arm in DS_ARMS:
        steps |= set(range(DS_EVAL_EVERY, max_steps + 1, DS_EVAL_EVERY))
    return steps


def run_one(spec, args) -> dict:
    """One run: its curve `(step, generated completions, validation acc, test acc)` at step 0 and at `eval_steps`,
    each generation round's group shares, each generation batch's `pacs/ds/*`, the KL of the final policy to the warm
    start, the wall and CPU time."""
    import torch  # noqa: F401
    from transformers import PrinterCallback, TrainerCallback

    ws, arm, beta, lr, seed = spec
    args = argparse.Namespace(**{**vars(args), "warm_start": ws})
    t = _tasks.task(args)
    path, record = _tasks.warm_start(args, t)
    base, family, extra = ARMS[arm]
    extra = dict(extra)
    if family == "pacs":
        extra["pacs_beta"] = beta
    name = f"filtering: {arm} b={beta}"
    rl_runs.CONFIGS[name] = (family, extra)
    rounds: list = []  # one entry per call of the reward function: a generation round
    G = args.num_generations
    curve: list = []
    steps = eval_steps(arm, args.max_steps)

    def generated() -> int:
        return sum(r["groups"] for r in rounds) * G

    def evaluate(model, step):  # validation (tuning only) at the fixed steps; test at every evaluation
        val = _tasks.greedy_accuracy(model, t["tokenizer"], t["val"]) if step in FIXED_STEPS or step == 0 else None
        curve.append((step, generated(), val, _tasks.greedy_accuracy(model, t["tokenizer"], t["test"])))

    class Eval(TrainerCallback):
        def on_train_begin(self, a, state, control, model=None, **kw):
            evaluate(model, 0)

        def on_step_end(self, a, state, control, model=None, **kw):
            if state.global_step in steps:
                evaluate(model, state.global_step)

    out = os.path.join(args.work_dir, "runs", tag(spec))
    trainer = rl_runs.make_trainer(
        name, lr, args, path, t["train"], seed, out, reward=sparsity.recording_reward(rounds, G)
    )
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(Eval())
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    ds = [
        {k.removeprefix("pacs/ds/"): e[k] for k in e if k.startswith("pacs/ds/")}
        for e in trainer.state.log_history
        if "pacs/ds/rounds" in e
    ]
    run = {
        "warm_start": ws, "arm": arm, "base_arm": base, "beta": beta, "lr": lr, "seed": seed, "curve": curve,
        "rounds": rounds, "ds": ds, "generated": generated(), "kl_to_sft": anchor.probe_kl(trainer.model, path, args),
        "seconds": seconds, "cpu_seconds": cpu, "load": harness.load_average(), "warm_start_sha256": record["sha256"],
        "pacs_git": args.pacs_git, "machine": run_machine(),
    }  # fmt: skip
    print(
        f"[filtering] {ws} {arm:28s} b {beta} lr {lr:g} seed {seed}: test {curve[0][3]:.3f} -> {curve[-1][3]:.3f}, "
        f"{run['generated']} completions generated, fallback {sum(d.get('fallback_groups', 0) for d in ds):g} "
        f"groups in {seconds:.0f}s (load {run['load']})",
        flush=True,
    )
    return run


def run_machine() -> dict:
    """The CPU this run ran on (lscpu's model name, the kernels torch picked, the lscpu flags hash) and its torch
    threads: runs of one study may come from several machines, and exact numbers hold within a CPU family only."""
    info = harness.machine_info()
    return {k: info[k] for k in ("cpu", "cpu_capability", "cpu_flags_sha256", "torch_threads", "date")}


def _store(spec, args, cache: Path) -> None:
    (cache / f"{tag(spec)}.json").write_text(json.dumps(run_one(spec, args)))


def sparsity_picks(raw: dict) -> dict:
    """The sparsity study's tuned (beta, lr) per (warm start, arm), by its own rule (sparsity_report.picks)."""
    from benchmarks.sparsity import sparsity_report

    grids = {tuple(k.split("|")): v for k, v in raw["args"]["grids"].items()}
    return sparsity_report.picks(raw["runs"], grids, raw["args"]["tune_seed"])


def ds_grid(pick_lr: float) -> list[float]:
    """3 learning rates around the sparsity study's pick: / 3, x 1, x 3 (the same rule for every DS arm)."""
    return [float(f"{pick_lr / 3:.6g}"), pick_lr, float(f"{pick_lr * 3:.6g}")]


def final_val(run: dict) -> float:
    """The tuning score: the mean validation accuracy at the last 3 fixed-step evaluations (sparsity's rule)."""
    fixed = [c for c in run["curve"] if c[0] in FIXED_STEPS]
    return sum(c[2] for c in fixed[-3:]) / len(fixed[-3:])


def ds_picks(runs: list[dict], sparse_picks: dict, tune_seed: int) -> dict:
    """Each DS arm's lr: the best tuning score over its grid on the tuning seed; ties to the smaller lr."""
    picks = {}
    for (ws, base), (beta, _) in sparse_picks.items():
        for arm in DS_ARMS:
            if ARMS[arm][0] != base:
                continue
            tried = [r for r in runs if r["warm_start"] == ws and r["arm"] == arm and r["seed"] == tune_seed]
            if len(tried) < 3:
                continue
            best = max(tried, key=lambda r: (final_val(r), -r["lr"]))
            picks[ws, arm] = (beta, best["lr"])
    return picks


def specs_for(phase: str, args, picks: dict, runs: list[dict]) -> list[tuple]:
    if phase == "spot":
        return [SPOT]
    if phase == "tune":
        return [(ws, arm, picks[ws, ARMS[arm][0]][0], lr, args.tune_seed) for ws in args.warm_starts
                for arm in DS_ARMS for lr in ds_grid(picks[ws, ARMS[arm][0]][1])]  # fmt: skip
    if phase == "seeds":
        tuned = ds_picks(runs, picks, args.tune_seed)
        missing = [(ws, a) for ws in args.warm_starts for a in DS_ARMS if (ws, a) not in tuned]
        if missing:
            raise SystemExit(f"tune first: no DS pick for {missing}")
        return [(ws, arm, *tuned[ws, arm], s) for s in args.seeds for ws in args.warm_starts for arm in DS_ARMS]
    if phase == "seeds-at-no-ds-picks":  # the protocol's deviation (filtering_protocol.md): no DS tuning
        return [(ws, arm, *picks[ws, ARMS[arm][0]], s) for s in args.seeds for ws in args.warm_starts
                for arm in DS_ARMS]  # fmt: skip
    if phase == "uniform":
        return [(ws, arm, *picks[ws, ARMS[arm][0]], s) for s in args.seeds for ws in args.warm_starts
                for arm in UNIFORM_ARMS]  # fmt: skip
    raise ValueError(phase)


def load_runs(cache: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(cache.glob("*.json"))]


def reused_runs(raw: dict, picks: dict, seeds: list[int]) -> list[dict]:
    """sparsity.json's runs of the no-DS arms at their picks, on the reported seeds, in this study's run format (its
    curve evaluated every 20 steps, when a no-DS run has generated 256 completions per 4 steps)."""
    G, per_step = raw["args"]["num_generations"], raw["args"]["prompts_per_step"] * raw["args"]["num_generations"]
    spg = raw["args"]["steps_per_generation"]  # generations at steps 0, spg, 2 spg, ...: after s steps, ceil(s / spg)
    out = []
    for r in raw["runs"]:
        key = (r["warm_start"], r["arm"])
        if r["arm"] not in REUSED_ARMS or r["seed"] not in seeds or key not in picks:
            continue
        if (r["beta"], r["lr"]) != tuple(picks[key]):
            continue
        curve = [(s, -(-s // spg) * spg * per_step, v, te) for s, v, te in r["curve"]]
        out.append({
            "warm_start": r["warm_start"], "arm": r["arm"], "base_arm": r["arm"], "beta": r["beta"], "lr": r["lr"],
            "seed": r["seed"], "curve": curve, "rounds": r["groups"], "ds": [],
            "generated": sum(g["groups"] for g in r["groups"]) * G, "kl_to_sft": r["kl_to_sft"],
            "seconds": r["seconds"], "cpu_seconds": r["cpu_seconds"], "load": r["load"],
            "warm_start_sha256": r["warm_start_sha256"], "pacs_git": raw["info"].get("pacs_git"),
            "from": "sparsity.json",
        })  # fmt: skip
    return out


def spot_check(spot: dict, raw: dict) -> dict:
    """The spot rerun (GRPO through the layer) against sparsity.json's run of the same spec (TRL's GRPOTrainer)."""
    ws, arm, beta, lr, seed = SPOT
    (old,) = [r for r in raw["runs"] if (r["warm_start"], r["arm"], r["beta"], r["lr"], r["seed"]) == SPOT]
    new_curve = [(s, v, te) for s, _, v, te in spot["curve"] if s in {c[0] for c in old["curve"]}]
    old_curve = [tuple(c) for c in old["curve"]]
    return {
        "spec": list(SPOT), "curve_here": new_curve, "curve_sparsity_json": old_curve,
        "kl_here": spot["kl_to_sft"], "kl_sparsity_json": old["kl_to_sft"],
        "bit_identical": new_curve == old_curve and spot["kl_to_sft"] == old["kl_to_sft"]
        and spot["rounds"] == old["groups"],
    }  # fmt: skip


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default=str(HERE))
    p.add_argument("--work-dir", default="/tmp/pacs-bench-filtering")
    p.add_argument("--warm-starts", dest="warm_starts", nargs="+", default=list(WARM_STARTS))
    p.add_argument(
        "--phase", nargs="+", default=[], choices=["spot", "tune", "seeds", "seeds-at-no-ds-picks", "uniform"]
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--tune-seed", dest="tune_seed", type=int, default=100)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--collect", action="store_true")
    p.add_argument("--report-only", dest="report_only", action="store_true")
    p.add_argument("--smoke", action="store_true")
    largs, args = rl_runs.parse_study_args(p, argv)
    largs.rewarmup, largs.sft_max_steps = 0, 25
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE)
    largs.pacs_git = git.stdout.strip() or None
    out = Path(args.out_dir)
    raw_path = out / ("filtering_smoke.json" if args.smoke else "filtering.json")
    from benchmarks.filtering import filtering_report

    if args.report_only:
        raw = json.loads(raw_path.read_text())
        filtering_report.report(raw, out, smoke=args.smoke)
        return raw
    if args.smoke:  # one tiny run per arm, from an unpinned warm start; nothing reused
        largs.warm_starts, largs.max_steps = ["smoke"], 4
        runs = [run_one(("smoke", arm, 1.0 if ARMS[arm][1] == "pacs" else None, 1e-4, 0), largs) for arm in ARMS]
        raw = {"info": harness.machine_info(), "args": vars(largs), "runs": runs, "spot": None, "warm_starts": {}}
        out.mkdir(parents=True, exist_ok=True)
        raw_path.write_text(json.dumps(raw, indent=1))
        filtering_report.report(raw, out, smoke=True)
        return raw
    sparsity_raw = json.loads((HERE.parent / "sparsity" / "sparsity.json").read_text())
    picks = sparsity_picks(sparsity_raw)
    cache = Path(args.work_dir) / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    store = functools.partial(_store, args=largs, cache=cache)
    for phase in args.phase:
        specs = [
            s for s in specs_for(phase, largs, picks, load_runs(cache)) if not (cache / f"{tag(s)}.json").exists()
        ]
        print(f"[filtering] phase {phase}: {len(specs)} runs to go", flush=True)
        harness.run_all(store, specs, args.jobs, lambda _: None)
    if not args.collect:
        return {}
    runs = load_runs(cache)
    spot = next(r for r in runs if (r["warm_start"], r["arm"], r["beta"], r["lr"], r["seed"]) == SPOT)
    runs = [r for r in runs if r is not spot] + reused_runs(sparsity_raw, picks, largs.seeds)
    warm = {
        ws: _tasks.warm_start(argparse.Namespace(**{**vars(largs), "warm_start": ws}), _tasks.task(largs))[1]
        for ws in largs.warm_starts
    }
    raw = {
        "info": harness.machine_info(), "args": {k: v for k, v in vars(largs).items() if _jsonable(v)},
        "argv": sys.argv, "warm_starts": warm, "sparsity_picks": {f"{k[0]}|{k[1]}": v for k, v in picks.items()},
        "ds_picks": {f"{k[0]}|{k[1]}": v for k, v in ds_picks(runs, picks, largs.tune_seed).items()},
        "spot": spot_check(spot, sparsity_raw), "runs": runs,
    }  # fmt: skip
    raw["info"]["load_average_end"] = harness.load_average()
    out.mkdir(parents=True, exist_ok=True)
    raw_path.write_text(json.dumps(raw, indent=1))
    filtering_report.report(raw, out)
    return raw


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True


if __name__ == "__main__":
    main()
