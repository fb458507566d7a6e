"""Does the verdict hold on a sparser warm start, and do the paper's two claims (sparse rewards, stable updates) hold?

    nice python -m benchmarks.sparsity.sparsity --jobs 2 --out-dir OUT --work-dir WORK   # the study (~1 h 40 min, 2 cores)
    python -m benchmarks.sparsity.sparsity --smoke                    # one tiny run per arm (tests)
    python -m benchmarks.sparsity.sparsity --report-only              # redo sparsity.{md,png} from sparsity.json
    python -m benchmarks.sparsity.sparsity --only sparse-s80 "PACS ref N=8 reset" 0.3 1e-05 0   # one run, as JSON

The protocol (committed before any run: sparsity_protocol.md). anchor.py's task, model, RL settings and measurements
(three-digit addition, a 0.49M-parameter Qwen3, 120 optimizer steps of 8 prompts x 8 completions, 4 optimizer steps
per generation), from two pinned warm starts (benchmarks/warm_starts/): `dense-s105` and `sparse-s80`, whose share of
all-wrong groups at step 0 differs by more than 2x. On each: the rollout anchor, the paper's method (a fixed pi_ref
reset every 8 generations with the optimizer states), GRPO and RLOO, each tuned on `--tune-seed` with the same rule
and budget as anchor.py (PACS beta x lr, 3 x 3; GRPO/RLOO 9 lrs; an edge pick extends its grid once), then
`--seeds` at each pick; the recipes' setting (the paper's method at beta 1) at the paper's method's tuned lr on the
same seeds; a stability sweep (each arm at `--stability-factor` x its tuned lr, tuned beta, `--stability-seeds`).
Every run also records each generation batch's all-wrong / all-right group shares (from its reward function, the same
for every trainer). Last, on fixed batches, how much of PACS's gradient comes from uniform groups (`uniform_share`).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from benchmarks import _tasks, harness, rl_runs
from benchmarks.anchor import anchor
from benchmarks.sparsity import sparsity_report


HERE = Path(__file__).resolve().parent

WARM_STARTS = ("dense-s105", "sparse-s80")
ARMS = ("PACS rollout", "PACS ref N=8 reset", "GRPO", "RLOO")
PAPER = "PACS ref N=8 reset"  # the revised paper's method at the recipes' interval
RECIPE_BETA = 1.0  # the recipes' beta


def recording_reward(log: list, G: int):
    """The task's reward, appending each call's (one generation batch's) all-wrong / all-right group shares to `log`."""

    def answer_reward(completions, answer, **kwargs):  # the same name: TRL logs rewards/answer_reward/*
        rewards = _tasks.answer_reward(completions, answer)
        groups = [sum(rewards[i : i + G]) for i in range(0, len(rewards), G)]
        log.append({"groups": len(groups), "all_wrong": sum(g == 0 for g in groups) / len(groups),
                    "all_right": sum(g == G for g in groups) / len(groups)})  # fmt: skip
        return rewards

    return answer_reward


def tag(spec) -> str:
    ws, *rest = spec
    return f"{ws}__{anchor.tag(*rest)}"


def run_one(spec, args) -> dict:
    """One run (warm start, arm, beta, lr, seed) with each generation's group shares; PACS runs of the first reported
    seed keep their final model (for `uniform_share`)."""
    ws, arm, beta, lr, seed = spec
    args = argparse.Namespace(**{**vars(args), "warm_start": ws})
    path, record = _tasks.warm_start(args, _tasks.task(args))
    log: list = []
    save_to = None
    if arm in ("PACS rollout", PAPER) and seed == args.seeds[0]:  # for `uniform_share`
        save_to = str(Path(args.work_dir) / "final" / tag(spec))
    run = anchor.run_one((arm, beta, lr, seed), args, path, reward=recording_reward(log, args.num_generations),
                         save_to=save_to)  # fmt: skip
    return {**run, "warm_start": ws, "warm_start_sha256": record["sha256"], "groups": log, "saved": save_to}


def _store(spec, args, cache: Path) -> None:
    (cache / f"{tag(spec)}.json").write_text(json.dumps(run_one(spec, args)))


def _grid(arm: str, args) -> tuple[list, list]:
    return ([None], list(args.baseline_lrs)) if arm in ("GRPO", "RLOO") else (list(args.betas), list(args.lrs))


def run_all(args) -> tuple[list[dict], dict]:
    """1. tuning on every warm start, 2. one edge extension, 3. the reported seeds (+ the recipes' setting),
    4. the stability sweep; every run cached under `--work-dir`, `--jobs` at a time."""
    cache = Path(args.work_dir) / "runs"
    cache.mkdir(parents=True, exist_ok=True)
    store = functools.partial(_store, args=args, cache=cache)

    def load() -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted(cache.glob("*.json"))]

    def run_batch(specs) -> None:
        todo = list(dict.fromkeys(s for s in specs if not (cache / f"{tag(s)}.json").exists()))
        print(f"[sparsity] {len(todo)} runs to go", flush=True)
        harness.run_all(store, todo, args.jobs, lambda _: None)

    grids = {(ws, arm): _grid(arm, args) for ws in args.warm_starts for arm in args.arms}

    def tune() -> list[tuple]:
        return [(ws, arm, b, lr, args.tune_seed) for (ws, arm), (bs, lrs) in grids.items() for b in bs for lr in lrs]

    run_batch(tune())
    for _ in range(args.extend):
        picks = sparsity_report.picks(load(), grids, args.tune_seed)
        grown = {}
        for key, (beta, lr) in picks.items():
            bs, lrs = grids[key]
            more_lrs = anchor._extend(lrs, lr, 3.0)
            more_bs = anchor._extend(bs, beta, 3.0) if beta is not None else None
            if more_lrs or more_bs:
                grown[key] = (more_bs or bs, more_lrs or lrs)
        if not grown:
            break
        grids.update(grown)
        run_batch(tune())
    picks = sparsity_report.picks(load(), grids, args.tune_seed)
    reported = [(ws, arm, *picks[ws, arm], s) for s in args.seeds for ws in args.warm_starts for arm in args.arms]
    recipes = [(ws, PAPER, RECIPE_BETA, picks[ws, PAPER][1], s) for s in args.seeds for ws in args.warm_starts
               if PAPER in args.arms]  # fmt: skip
    run_batch(reported + recipes)
    stability = [(ws, arm, picks[ws, arm][0], float(f"{picks[ws, arm][1] * args.stability_factor:.6g}"), s)
                 for s in args.stability_seeds for ws in args.warm_starts for arm in args.arms]  # fmt: skip
    run_batch(stability)
    return load(), {f"{ws}|{arm}": grid for (ws, arm), grid in grids.items()}


def _completion_logps(model, seq, attn, P: int, completion):
    logits = model(input_ids=seq, attention_mask=attn).logits[:, P - 1 : -1].float()  # (B, C, V)
    return logits.log_softmax(-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)  # (B, C)


def uniform_share(run: dict, args, batches: int = 4) -> dict:
    """How much of PACS's gradient comes from uniform (all-wrong / all-right) groups, on fixed batches.

    The saved final policy of `run` (a PACS arm, seed 0) samples `batches` x 8 prompts x G completions at temperature
    1 (RL prompts 9000 on, seed 0); the PACS loss (RLOO score, balanced class weights, the run's beta) is scored
    against the warm start as anchor (what a fixed pi_ref sees 120 steps after its last reset: more drift than any
    anchor of the study sees, so an upper end for the uniform groups' term, which grows with |psi|). Returns, per
    batch, the share of uniform groups and the theta-gradient norms of the loss over all groups, over mixed groups only
    and over uniform groups only (the last two add up to the first, as vectors).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from pacs.loss import pacs_loss

    t = _tasks.task(args)
    tok, G = t["tokenizer"], args.num_generations
    policy = AutoModelForCausalLM.from_pretrained(run["saved"], dtype=torch.float32)
    ws_path, _ = _tasks.warm_start(argparse.Namespace(**{**vars(args), "warm_start": run["warm_start"]}), t)
    ref = AutoModelForCausalLM.from_pretrained(ws_path, dtype=torch.float32).eval()
    prompts, answers = t["train"]["prompt"][9000:], t["train"]["answer"][9000:]
    out = []
    torch.manual_seed(0)
    for b in range(batches):
        ps, ans = prompts[b * 8 : (b + 1) * 8], answers[b * 8 : (b + 1) * 8]
        enc = tok(ps, return_tensors="pt", padding=True)
        policy.eval()
        with torch.no_grad():
            seq = policy.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=G,
                                  max_new_tokens=_tasks.COMPLETION_TOKENS, pad_token_id=tok.pad_token_id,
                                  eos_token_id=tok.eos_token_id)  # fmt: skip  # (8G, P + C)
        P = enc.input_ids.shape[1]
        completion = seq[:, P:]
        texts = tok.batch_decode(completion, skip_special_tokens=True)
        labels = torch.tensor(_tasks.answer_reward(texts, [a for a in ans for _ in range(G)]))  # (8G,)
        # tokens after the first eos are padding: the completion mask
        is_eos = completion == tok.eos_token_id
        first = torch.where(is_eos.any(1), is_eos.float().argmax(1), torch.full((len(seq),), completion.shape[1]))
        mask = (torch.arange(completion.shape[1])[None] <= first[:, None]).float()  # (8G, C)
        attn = torch.cat([enc.attention_mask.repeat_interleave(G, 0), mask.long()], dim=1)

        logps = functools.partial(_completion_logps, seq=seq, attn=attn, P=P, completion=completion)
        with torch.no_grad():
            ref_logps = logps(ref)
        group_sum = labels.view(-1, G).sum(1)
        mixed = ((group_sum > 0) & (group_sum < G)).repeat_interleave(G).float()  # (8G,)
        norms = {}
        policy.train()
        for part, weight in (("all", None), ("mixed", mixed), ("uniform", 1 - mixed)):
            policy.zero_grad(set_to_none=True)
            loss, _ = pacs_loss(logps(policy), ref_logps, mask, labels, G, beta=run["beta"], sample_weight=weight)
            loss.backward()
            grads = [p.grad.flatten() for p in policy.parameters() if p.grad is not None]
            norms[part] = float(torch.cat(grads).norm()) if grads else 0.0
        out.append({"uniform_groups": float(1 - mixed.view(-1, G)[:, 0].mean()), **norms})
    return {"warm_start": run["warm_start"], "arm": run["arm"], "beta": run["beta"], "lr": run["lr"], "batches": out}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default=str(HERE))
    p.add_argument("--work-dir", default="/tmp/pacs-bench-sparsity")
    p.add_argument("--warm-starts", dest="warm_starts", nargs="+", default=list(WARM_STARTS))
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    anchor.add_tuning_args(p)
    p.add_argument("--stability-factor", dest="stability_factor", type=float, default=10.0)
    p.add_argument("--stability-seeds", dest="stability_seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--report-only", dest="report_only", action="store_true")
    p.add_argument("--only", nargs=5, metavar=("WARM_START", "ARM", "BETA", "LR", "SEED"), help="one run, as JSON")
    p.add_argument("--smoke", action="store_true")
    largs, args = rl_runs.parse_study_args(p, argv)
    largs.rewarmup, largs.sft_max_steps = 0, 25
    if args.smoke:
        largs.seeds, largs.stability_seeds, largs.betas, largs.lrs, largs.baseline_lrs = (
            [0],
            [0],
            [1.0],
            [1e-4],
            [1e-4],
        )
        largs.extend, largs.warm_starts = 0, ["smoke"]
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw_path = out / ("sparsity_smoke.json" if args.smoke else "sparsity.json")
    if args.report_only:
        raw = json.loads(raw_path.read_text())
        sparsity_report.report(raw, out, smoke=args.smoke)
        return raw
    info = harness.machine_info()
    if args.only:
        ws, arm, beta, lr, seed = args.only
        run = run_one((ws, arm, None if beta == "-" else float(beta), float(lr), int(seed)), largs)
        print(json.dumps({k: run[k] for k in ("warm_start", "arm", "beta", "lr", "seed", "curve", "kl_to_sft")}))
        return run
    runs, grids = run_all(largs)
    warm = {}
    for ws in largs.warm_starts:
        warm[ws] = _tasks.warm_start(argparse.Namespace(**{**vars(largs), "warm_start": ws}), _tasks.task(largs))[1]
    shares = [uniform_share(r, largs, batches=1 if args.smoke else 4) for r in runs if r.get("saved")]
    raw = {"info": info, "args": {**vars(largs), "grids": grids}, "argv": sys.argv, "warm_starts": warm,
           "runs": runs, "uniform_share": shares}  # fmt: skip
    raw["info"]["load_average_end"] = harness.load_average()
    raw_path.write_text(json.dumps(raw, indent=1))
    sparsity_report.report(raw, out, smoke=args.smoke)
    return raw


if __name__ == "__main__":
    main()
