"""The markdown report and plot of `learning.py`, rendered from the JSON it writes (see that script for the runs).

    python -m benchmarks.learning.learning --report-only   # redo learning.md / learning.png from learning.json

The verdict is a person's reading, kept in learning_verdict.md and appended as it is; everything else here is
computed from the runs.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from benchmarks import report


# learning.json of 2026-12-02 predates info["code"]; this is what that run used
LEGACY_CODE = "the frozen copy of commit f240b2f (`PYTHONPATH=/work/bench_src`) plus this branch's benchmarks"


def final(curve, column: int, last: int = 3) -> float:
    """Mean accuracy of the last `last` evaluations (column 1: validation, 2: test)."""
    return statistics.mean(c[column] for c in curve[-last:])


def auc(curve, column: int = 2) -> float:
    """Mean accuracy over all evaluations after step 0: one number for "learns faster" (area under the curve)."""
    return statistics.mean(c[column] for c in curve[1:])


def steps_to(curve, threshold: float):
    """First evaluated step whose test accuracy is >= threshold, or None."""
    return next((c[0] for c in curve if c[2] >= threshold), None)


def config_names(raw: dict) -> list[str]:
    """The configs of the runs, in the order of the run's --configs (then any other config found in the runs)."""
    names = list(raw["args"].get("configs", []))
    return [n for n in names if any(r["config"] == n for r in raw["runs"])] + sorted(
        {r["config"] for r in raw["runs"]} - set(names)
    )


def pick_lrs(runs: list[dict], seed: int, names: list[str]) -> dict:
    """Per config, the grid lr whose seed-`seed` run has the best final validation accuracy."""
    picked = {}
    for name in names:
        rs = [r for r in runs if r["config"] == name and r["seed"] == seed]
        if rs:
            picked[name] = max(rs, key=lambda r: final(r["curve"], 1))["lr"]
    return picked


def final_runs(runs: list[dict], picked: dict) -> dict:
    return {name: [r for r in runs if r["config"] == name and r["lr"] == lr] for name, lr in picked.items()}


def grid_run(runs, name, seed, lr):
    return next((r for r in runs if r["config"] == name and r["seed"] == seed and r["lr"] == lr), None)


def grid_table(runs: list[dict], lrs: list[float], seed: int, names: list[str]) -> str:
    head = ["config", *[f"val acc, lr {lr:g}" for lr in lrs], "picked lr"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    picked = pick_lrs(runs, seed, names)
    for name in names:
        cells = [name]
        for lr in lrs:
            r = next((r for r in runs if r["config"] == name and r["seed"] == seed and r["lr"] == lr), None)
            cells.append("—" if r is None else f"{final(r['curve'], 1):.3f}")
        cells.append(f"{picked[name]:g}" if name in picked else "—")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


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
            report.interval([final(r["curve"], 2) for r in rs]),
            report.interval([auc(r["curve"]) for r in rs]),
        ]
        for t in thresholds:
            hits = [h for h in (steps_to(r["curve"], t) for r in rs) if h is not None]
            cells.append(f"{statistics.mean(hits):.0f} ({len(hits)}/{len(rs)})" if hits else f"— (0/{len(rs)})")
        cells.append(f"{statistics.mean(r['clip_fraction'] for r in rs):.0%}")
        cells.append(f"{statistics.median(r['cpu_seconds'] for r in rs):.0f}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def critic_table(runs: list[dict], picked: dict) -> str:
    fr = {name: [r["critic"] for r in rs if r.get("critic")] for name, rs in final_runs(runs, picked).items()}
    kind = report.critic_kind(c for cs in fr.values() for c in cs)
    heads = report.CRITIC_HEADS[kind]
    head = ["config", "off-policy steps", heads["margins"], heads["spread"]]
    if not report.critic_legacy(kind):
        head += [heads["ranking"], heads["fresh"], heads["brier"]]
    rows = []
    for name, cs in fr.items():
        if not cs:
            continue
        q = [statistics.mean(report.critic_margins(c)[i] for c in cs) for i in range(3)]
        psi_std = [x for r in final_runs(runs, picked)[name] for x in r["psi_std"]]
        row = [name, str(sum(c["off_policy_steps"] for c in cs)), f"{q[0]:.3f} / {q[1]:.3f} / {q[2]:.3f}",
               f"{statistics.mean(report.critic_spread(c) for c in cs):.0%}"]  # fmt: skip
        if not report.critic_legacy(kind):
            fresh = [c["critic_ranking_fresh"] for c in cs if c["critic_ranking_fresh"] is not None]
            row += [report.interval([c["critic_ranking_off_policy"] for c in cs if c["critic_ranking_off_policy"]
                                     is not None], none="—"),
                    f"{report.interval(fresh, none='—')} ({sum(c['fresh_steps'] for c in cs)})",
                    report.interval([c["critic_brier_mixed"] for c in cs if c["critic_brier_mixed"] is not None],
                                    none="—")]  # fmt: skip
        rows.append([*row, f"{statistics.median(psi_std):.3f}" if psi_std else "—"])
    return report.table([*head, "psi_std median"], rows)


def critic_grid_table(runs: list[dict], lrs: list[float], seed: int, names: list[str]) -> str:
    """Per PACS config and grid lr (seed `seed`): median abs(sigma(psi) - 1/2), the fresh-sample ranking (runs that
    have it), validation acc."""
    kind = report.critic_kind(r.get("critic") for r in runs)
    median = report.CRITIC_HEADS[kind]["median"]
    ranking = "" if report.critic_legacy(kind) else " / fresh ranking"
    head = ["config", *[f"lr {lr:g}: {median}{ranking} / val acc" for lr in lrs]]
    rows = []
    for name in names:
        cells = [name]
        for lr in lrs:
            r = grid_run(runs, name, seed, lr)
            if r is None or not r.get("critic"):
                cells.append("—")
                continue
            c = r["critic"]
            fresh = "" if report.critic_legacy(kind) else f" / {report.num(c['critic_ranking_fresh'])}"
            cells.append(f"{report.critic_margins(c)[1]:.3f}{fresh} / {final(r['curve'], 1):.3f}")
        if any(c != "—" for c in cells[1:]):
            rows.append(cells)
    return report.table(head, rows)


def grid_reading(runs: list[dict], lrs: list[float], seed: int, names: list[str]) -> str:
    """What the grid shows, from its numbers: does the critic term grow with the lr, above which lr does every config's
    validation accuracy fall below its best at or below that lr."""
    margins = {}
    for name in names:
        rs = [grid_run(runs, name, seed, lr) for lr in lrs]
        if all(r is not None and r.get("critic") for r in rs):
            margins[name] = [report.critic_margins(r["critic"])[1] for r in rs]
    grows = margins and all(all(a < b for a, b in zip(m, m[1:])) for m in margins.values())
    val = {n: {lr: final(r["curve"], 1) for lr in lrs if (r := grid_run(runs, n, seed, lr))} for n in names}
    val = {n: v for n, v in val.items() if v}
    best = max((max(v, key=v.get) for v in val.values()), default=None)  # the largest lr any config is best at
    falls = best is not None and all(
        all(acc < max(a for lr, a in v.items() if lr <= best) for lr, acc in v.items() if lr > best)
        for v in val.values()
    )
    parts = []
    if margins and len(lrs) > 1:
        parts.append(f"the critic term {'grows' if grows else 'does not grow steadily'} with the step size")
    if best is not None and best < max(lrs):
        parts.append(f"validation accuracy {'falls' if falls else 'does not fall'} above {best:g} for every config")
    elif best is not None and len(lrs) > 1:
        parts.append(f"some config is best at the largest rate tried ({best:g}): the grid may stop too early")
    return f"Across the learning-rate grid (seed {seed}): " + ", ".join(parts) + ":" if parts else ""


def entropy_table(runs: list[dict], picked: dict) -> str | None:
    """Mean token entropy (TRL's `entropy`) over the first and the last tenth of the steps, per config; None without."""
    rows = []
    for name, rs in final_runs(runs, picked).items():
        curves = [[e["entropy"] for e in r.get("train_log", []) if "entropy" in e] for r in rs]
        curves = [c for c in curves if c]
        if curves:
            tenth = max(1, len(curves[0]) // 10)
            start = [statistics.mean(c[:tenth]) for c in curves]
            end = [statistics.mean(c[-tenth:]) for c in curves]
            rows.append([name, len(curves), report.interval(start), report.interval(end)])
    if not rows:
        return None
    return report.table(["config", "seeds", "entropy, first tenth of the steps", "entropy, last tenth"], rows)


def paired_vs_grpo(runs: list[dict], picked: dict) -> str:
    """Per config, final test acc minus GRPO's on the same seed: mean [95% t-interval] over seeds."""
    fr = final_runs(runs, picked)
    grpo = {r["seed"]: final(r["curve"], 2) for r in fr.get("GRPO", [])}
    lines = []
    for name, rs in fr.items():
        if name == "GRPO":
            continue
        d = [final(r["curve"], 2) - grpo[r["seed"]] for r in rs if r["seed"] in grpo]
        da = [auc(r["curve"]) - auc(g["curve"]) for r in rs for g in fr.get("GRPO", []) if g["seed"] == r["seed"]]
        if d:
            lines.append(f"| {name} | {len(d)} | {report.interval(d)} | {report.interval(da)} |")
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


def learning_markdown(raw: dict, tables: dict) -> str:
    a, sft = raw["args"], raw["sft"]
    cycle = a["steps_per_generation"] * a.get("num_iterations", 1)  # optimizer steps per generation, GA 1
    kind = report.critic_kind(r.get("critic") for r in raw["runs"])
    entropy = [] if tables.get("entropy") is None else ["## Token entropy over training", "", tables["entropy"], ""]
    return "\n".join(
        [
            "# Learning: PACS vs GRPO vs RLOO on three-digit addition with a scratchpad (CPU)",
            "",
            report.machine_markdown(raw["info"]),
            f"- command: `{report.command(raw['argv'], 'benchmarks/learning/learning.py')}`",
            f"- code: {raw['info'].get('code', LEGACY_CODE)}",
            f"- model: Qwen3 hidden {a['hidden_size']}, {a['num_layers']} layers, character-level vocabulary "
            f"({sft['num_parameters'] / 1e6:.2f}M parameters), {a['threads']} torch thread(s)",
            "- task: `347+586=` -> `7+6+0=13,4+8+1=13,3+5+1=09>0933` (31 characters + eos); reward 1 when the four "
            "digits after `>` are the sum, whatever the scratchpad says",
            f"- warm start: plain SFT (AdamW lr {a['sft_lr']:g}, batch {a['sft_batch_size']}) on 3,000 worked "
            f"problems, stopped at {sft['steps']} steps when dev accuracy first reached {a['sft_target']:.0%} "
            f"(dev {sft['dev_acc']:.3f}, held-out test {sft['test_acc']:.3f}); every RL run starts from it",
            f"- RL: {a['max_steps']} optimizer steps, {a['prompts_per_step']} prompts x {a['num_generations']} "
            f"completions per optimizer step, {a['steps_per_generation']} optimizer steps per generation "
            f"(gradient accumulation 1, so {cycle - 1} of every {cycle} steps are off-policy), temperature 1, AdamW "
            "constant lr, "
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
            tables["grid_reading"],
            "",
            tables["critic_grid"],
            "",
            f"{report.CRITIC_NOTES[kind]}, then averaged over seeds"
            + (
                f". {report.CRITIC_WITHDRAWN}"
                if report.critic_legacy(kind)
                else " (95% t-intervals over seeds; in parentheses after the fresh ranking, its number of steps)."
            ),
            "",
            *entropy,
            "![held-out accuracy vs step](learning.png)",
            "",
            "## Verdict",
            "",
            raw.get("verdict", "(written after the run)"),
            "",
        ]
    )


def write(raw: dict, out_dir: Path, smoke: bool) -> dict:
    """Tables to stdout; markdown + plot to out_dir (not in smoke mode)."""
    a = raw["args"]
    runs, names, seed = raw["runs"], config_names(raw), a["seeds"][0]
    picked = pick_lrs(runs, seed, names)
    tables = {
        "grid": grid_table(runs, a["lr_grid"], seed, names),
        "summary": summary_table(runs, picked, a["thresholds"]),
        "paired": paired_vs_grpo(runs, picked),
        "critic": critic_table(runs, picked),
        "grid_reading": grid_reading(runs, a["lr_grid"], seed, names),
        "critic_grid": critic_grid_table(runs, a["lr_grid"], seed, names),
        "entropy": entropy_table(runs, picked),
    }
    print("\n\n".join(t for t in tables.values() if t))
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
