"""The markdown report of `smollm_compare.py`, rendered from the JSON it writes (see that script for the runs).

    python -m benchmarks.smollm_compare.smollm_compare --report-only   # redo smollm_compare.md from its JSON

The verdict is a person's reading, kept in smollm_compare_verdict.md and appended as it is.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import harness, report


NAMES = {"pacs": "PACS (β=1, balanced)", "grpo": "GRPO", "rloo": "RLOO"}
ALGORITHMS = list(NAMES)
# smollm_compare.json of 2026-12-02 predates info["code"]; this is what that run used
LEGACY_CODE = (
    "the frozen copy of commit f240b2f (`PYTHONPATH=/work/bench_src`) plus this branch's `pacs/demo.py` and "
    "`pacs/tasks.py`"
)


def pct_interval(xs) -> str:
    """mean [95% t-interval] of per-seed differences, in percentage points."""
    return report.interval(xs, spec="+.1%", none="—")


def summarize(runs: list[dict]) -> str:
    """Per-run table, per-algorithm pooled table, and the critic/clipping table."""
    lines = [
        "| algorithm | seed | before (95% CI) | after (95% CI) | change, paired 95% CI | fixed / broken | "
        "clip active | train CPU s | wall s | load avg at end |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        b, a, c = r["before"], r["after"], r["change"]
        lines.append(
            f"| {NAMES[r['algorithm']]} | {r['seed']} | {b['accuracy']:.1%} [{b['ci95'][0]:.1%}, {b['ci95'][1]:.1%}] "
            f"| {a['accuracy']:.1%} [{a['ci95'][0]:.1%}, {a['ci95'][1]:.1%}] | {c['change']:+.1%} "
            f"[{c['ci95'][0]:+.1%}, {c['ci95'][1]:+.1%}] | {c['fixed']} / {c['broken']} | "
            f"{r['clip_fraction']:.0%} | {r['train_cpu_s']:.0f} | {r['wall_time_s']:.0f} | {r['load_average_end']} |"
        )
    lines += [
        "",
        "Pooled over seeds (all held-out problems of all seeds; the change's interval pools the paired differences):",
        "",
        "| algorithm | seeds | before | after | change, paired 95% CI | after − GRPO's after, paired over problems "
        "| after − GRPO's after, per-seed mean [95% t-interval over seeds] |",
        "|---|---|---|---|---|---|---|",
    ]
    by_alg = {alg: sorted((r for r in runs if r["algorithm"] == alg), key=lambda r: r["seed"]) for alg in ALGORITHMS}
    pooled = {}
    for alg, rs in by_alg.items():
        if not rs:
            continue
        before = {"per_problem": [x for r in rs for x in r["before"]["per_problem"]]}
        after = {"per_problem": [x for r in rs for x in r["after"]["per_problem"]]}
        pooled[alg] = (rs, before, after)
    from pacs.demo import paired_change

    wider = []
    for alg, (rs, before, after) in pooled.items():
        c = paired_change(before, after)
        n = c["n"]
        vs = by_seed = "—"
        if alg != "grpo" and "grpo" in pooled:
            seeds = {r["seed"] for r in rs} & {r["seed"] for r in pooled["grpo"][0]}
            mine = [x for r in rs if r["seed"] in seeds for x in r["after"]["per_problem"]]
            grpo = [x for r in pooled["grpo"][0] if r["seed"] in seeds for x in r["after"]["per_problem"]]
            d = paired_change({"per_problem": grpo}, {"per_problem": mine})
            vs = f"{d['change']:+.1%} [{d['ci95'][0]:+.1%}, {d['ci95'][1]:+.1%}] (seeds {sorted(seeds)})"
            grpo_after = {r["seed"]: r["after"]["accuracy"] for r in pooled["grpo"][0]}
            diffs = [r["after"]["accuracy"] - grpo_after[r["seed"]] for r in rs if r["seed"] in seeds]
            by_seed = pct_interval(diffs)
            if len(diffs) > 1:  # is the per-seed interval wider than the paired-over-problems one?
                _, lo, hi = harness.t_interval(diffs)
                wider.append(hi - lo > d["ci95"][1] - d["ci95"][0])
        lines.append(
            f"| {NAMES[alg]} | {len(rs)} | {sum(before['per_problem']) / n:.1%} | {sum(after['per_problem']) / n:.1%} "
            f"| {c['change']:+.1%} [{c['ci95'][0]:+.1%}, {c['ci95'][1]:+.1%}] | {vs} | {by_seed} |"
        )
    lines += [
        "",
        "The paired-over-problems interval counts only the evaluation noise of each run; the per-seed interval also "
        "counts how much a training run varies with its seed"
        + (", which dominates here." if wider and all(wider) else "."),
        "",
    ]
    lines += critic_lines(by_alg["pacs"])
    return "\n".join(lines)


def markdown(raw: dict, table: str) -> str:
    s = raw["runs"][0]["settings"] if raw["runs"] else {}
    return "\n".join(
        [
            "# PACS vs GRPO vs RLOO on SmolLM2-135M-Instruct (CPU, LoRA, the demo's arithmetic)",
            "",
            report.machine_markdown(raw["info"]),
            f"- command: `{report.command(raw['argv'], 'benchmarks/smollm_compare/smollm_compare.py')}`",
            f"- code: {raw['info'].get('code', LEGACY_CODE)}",
            f"- every run is `pacs demo --algorithm <a> --seed <s>`: {s.get('max_steps')} optimizer steps, "
            f"{s.get('prompts_per_step')} prompts x {s.get('num_generations')} completions per step, "
            f"{s.get('steps_per_generation')} optimizer steps per generation, temperature {s.get('temperature')}, "
            f"LoRA r={s.get('lora_r')} on all linear layers, AdamW lr {s.get('learning_rate')} constant (the demo's; "
            "not tuned per algorithm), grad clip 1.0, TRL beta (KL) 0, reward = boxed and right; GRPO and RLOO keep "
            "TRL's other defaults (GRPO: loss_type dapo, scale_rewards group, epsilon 0.2; RLOO: epsilon 0.2)",
            f"- held-out: {s.get('num_eval')} problems per seed (drawn from seed + 1000003, never trained on), greedy, "
            f"at most {s.get('max_completion_length')} new tokens; the 'before' figure is measured once per seed",
            f"- {s.get('threads')} torch thread(s) per run; the machine was shared with other developers' test runs",
            "",
            table,
            "",
        ]
    )


def critic_lines(runs: list[dict]) -> list[str]:
    """PACS's implicit critic per seed (pooled or per-step summaries, see report.py)."""
    critics = [r.get("critic") for r in runs]
    kind = report.critic_kind(critics)
    legacy = report.critic_legacy(kind)
    heads = report.CRITIC_HEADS[kind]
    spg = runs[0]["settings"]["steps_per_generation"] if runs else 0
    head = ["seed", "off-policy steps", *(["completions"] if kind == "pooled" else []), heads["margins"]]
    head += [heads["spread"], *([] if legacy else [heads["ranking"], heads["fresh"], heads["brier"]])]
    rows = []
    for r, c in zip(runs, critics):
        if c:
            q = report.critic_margins(c)
            rows.append(
                [r["seed"], c["off_policy_steps"], *([c["completions"]] if kind == "pooled" else []),
                 f"{q[0]:.3f} / {q[1]:.3f} / {q[2]:.3f}", f"{report.critic_spread(c):.0%}"]
                + ([] if legacy else [report.num(c["critic_ranking_off_policy"]),
                                      f"{report.num(c['critic_ranking_fresh'])} ({c['fresh_steps']})",
                                      report.num(c["critic_brier_mixed"])])
            )  # fmt: skip
    missing = any(c is None for c in critics)
    return [
        f"PACS's implicit critic on off-policy steps (steps 2-{spg} of each generation round"
        + ("" if legacy else "; the fresh ranking: step 1")
        + "), per seed"
        + (
            " (runs made through the `pacs demo` command itself have no per-completion record):"
            if kind == "pooled"
            else f" ({report.CRITIC_NOTES[kind]}"
            + ("; runs without PACS's per-step metrics are left out):" if missing else "):")
        ),
        "",
        report.table(head, rows),
        *(["", report.CRITIC_WITHDRAWN] if legacy else []),
    ]


def write(raw: dict, out_dir: Path, smoke: bool) -> str:
    """The tables to stdout; smollm_compare.md (not in smoke mode) with the verdict if one was written."""
    table = summarize(raw["runs"])
    print(table)
    if not smoke:
        verdict = out_dir / "smollm_compare_verdict.md"  # the reading, written by a person after looking at the tables
        text = markdown(raw, table) + (
            "\n## Verdict\n\n" + verdict.read_text().strip() + "\n" if verdict.exists() else ""
        )
        (out_dir / "smollm_compare.md").write_text(text)
    return table
