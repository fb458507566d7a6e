"""The markdown reports of `step_cost.py`, rendered from the JSON it writes (see that script for what is measured).

    python -m benchmarks.step_cost.step_cost --report-only [--split | --ab | --loss-only]  # redo a report from JSON

Each render function takes the JSON object `step_cost.py` saved (`info`, `args`, `argv`, the results) and returns
the markdown. Goals are judged here from the numbers, with the threshold printed beside each.
"""

from __future__ import annotations

import math
import statistics

from benchmarks import harness, report


TRAINERS = ["GRPO", "PACS", "RLOO"]
SPLIT_TRAINERS = ["PACS", "GRPO"]

# Goals of the split path (issue 9): time per optimizer step against the whole-group path, and peak memory.
SPLIT_TIME_GOAL = 1.35  # split path / whole-group path, median CPU time of the average step
SPLIT_MEMORY_GOAL = 0.95  # peak memory at the smallest batch / at the whole-group batch, every repetition
SPLIT_VS_GRPO_MEMORY_GOAL = 1.10  # peak memory of PACS / GRPO at the smallest batch, median

# How "generation" and the split path's extra forward were timed. Results from before 2026-12-04 timed them by
# overriding private trainer methods; later ones with public hooks only (`step_cost.worker`).
GEN_TEXT = {
    "override": "`_generate_and_score_completions` (sampling, reward, old log-probs)",
    "pre_loss": "the time from the start of an optimizer step that generates to its first `compute_loss` (TRL's "
    "`_prepare_inputs`: sampling, reward, old log-probs)",
}
EXTRA_FWD_TEXT = {
    "override": "the extra no-grad forward of `_split_step_coefficients`",
    "pre_loss": "its extra no-grad forward, timed by a forward hook on the model: every forward without grad "
    "outside generation",
}


def command(out: dict) -> str:
    return f"- command: `{report.command(out['argv'], 'benchmarks/step_cost/step_cost.py')}`"


def header(title: str, out: dict, model_line: bool = True) -> str:
    """Title, machine block, command and (optionally) the model line of the --ab and --loss-only reports."""
    a = out["args"]
    text = f"# {title} ({a['device']})\n\n{report.machine_markdown(out['info'])}\n{command(out)}\n"
    if model_line:
        text += (
            f"- model: random Qwen3 `{a['model_config']}`, {a['prompts_per_step']} prompts x "
            f"{a['num_generations']} completions, prompt {a['prompt_length']} + completion "
            f"{a['completion_length']} tokens, {a['threads']} torch thread(s)\n"
        )
    return text + "\n"


def model_line(out: dict, results: list[dict]) -> str:
    a = out["args"]
    return (
        f"- model: random Qwen3 `{a['model_config']}` ({results[0]['num_parameters'] / 1e6:.1f}M parameters, "
        f"{'bf16' if a['device'] == 'cuda' else 'float32'}), {a['threads']} torch thread(s) per worker"
    )


# 1. Step cost of the three trainers -------------------------------------------------------------------------------


def ratio_table(results: list[dict], cpu: bool) -> str:
    metrics = []
    if cpu:  # CPU seconds first: on a shared machine they are far less noisy than wall time
        metrics += [
            ("opt_cpu_s", "optimization per optimizer step, CPU s"),
            ("step_cpu_s", "whole optimizer step (incl. its share of generation), CPU s"),
            ("gen_cpu_s", "generation + scoring per generation, CPU s"),
            ("loss_fwd_cpu_s", "compute_loss (forward + loss), CPU s"),
        ]
    metrics += [
        ("opt_s", "optimization per optimizer step, wall s"),
        ("step_s", "whole optimizer step (incl. its share of generation), wall s"),
        ("gen_s", "generation + scoring per generation, wall s"),
        ("loss_fwd_s", "compute_loss (forward + loss), wall s"),
        ("peak_mem_mib", f"peak memory, MiB ({results[0]['mem_kind']})"),
    ]
    reps = sorted({r["rep"] for r in results})
    by = {(r["trainer"], r["rep"]): r for r in results}
    head = ["metric", "GRPO median", "PACS median", "RLOO median"]
    head += ["PACS / GRPO min / median / max", "RLOO / GRPO min / median / max"]
    rows = []
    for key, label in metrics:
        med = {t: statistics.median(by[t, r][key] for r in reps) for t in TRAINERS}
        cells = [label] + [f"{med[t]:.4g}" for t in ("GRPO", "PACS", "RLOO")]
        for t in ("PACS", "RLOO"):  # paired within a repetition
            cells.append(report.ratio_cell(harness.min_med_max(by[t, r][key] / by["GRPO", r][key] for r in reps)))
        rows.append(cells)
    return report.table(head, rows)


def step_cost_markdown(out: dict) -> str:
    a, results = out["args"], out["results"]
    timer = results[0].get("gen_timer", "override")
    per_rep = []
    for r in results:
        per_rep.append(
            [r["rep"], r["trainer"], *(f"{r[k]:.4f}" for k in ("step_s", "opt_s", "opt_cpu_s", "gen_s", "gen_cpu_s")),
             f"{r['loss_fwd_s']:.4f}", f"{r['peak_mem_mib']:.0f}", r["load"]]
        )  # fmt: skip
    head = ["rep", "trainer", "step s", "opt s", "opt CPU s", "gen s", "gen CPU s", "compute_loss s", "peak MiB"]
    return "\n".join(
        [
            f"# Step cost: PACS vs GRPO vs RLOO ({a['device']})",
            "",
            report.machine_markdown(out["info"]),
            command(out),
            model_line(out, results),
            f"- batch: {a['prompts_per_step']} prompts x {a['num_generations']} completions per optimizer step, "
            f"prompt {a['prompt_length']} tokens, completion fixed at {a['completion_length']} tokens, "
            f"{a['steps_per_generation']} optimizer steps per generation (gradient accumulation 1), beta 0 everywhere",
            f"- per worker: {a['warmup_steps']} warm-up optimizer steps, then {a['steps']} timed; {a['reps']} "
            "repetitions, trainers interleaved with rotating order; each (trainer, repetition) in a fresh process",
            "- opt = wall time of an optimizer step minus the generation inside it (forward, loss, backward, clip, "
            f"AdamW); gen = {GEN_TEXT[timer]}; per-worker medians; "
            "ratios are paired within a repetition, then min / median / max over repetitions",
            "",
            ratio_table(results, cpu=a["device"] == "cpu"),
            "",
            "Per repetition (worker medians):",
            "",
            report.table([*head, "load (1/5/15)"], per_rep),
            "",
        ]
    )


# 2. --ab and --loss-only ------------------------------------------------------------------------------------------


def ab_markdown(out: dict) -> str:
    r = out["ab_backward"]
    t = r["times"]
    rows = []
    for clock in ("cpu", "wall"):
        cells = [clock] + [f"{statistics.median(t[n][clock]):.4f}" for n in ("GRPO", "PACS", "RLOO")]
        for n in ("PACS", "RLOO"):
            cells.append(report.ratio_cell(harness.min_med_max(a / b for a, b in zip(t[n][clock], t["GRPO"][clock]))))
        rows.append(cells)
    head = ["clock", "GRPO median s", "PACS median s", "RLOO median s", "PACS / GRPO", "RLOO / GRPO"]
    body = "\n".join(
        [
            f"compute_loss + backward on the same micro-batch shape, the three trainers in one process, {r['rounds']} "
            "interleaved rounds (rotating order) after a warm-up; paired ratios per round, min / median / max:",
            "",
            report.table(head, rows),
        ]
    )
    return header("loss + backward, the three trainers in one process", out) + body + "\n"


def loss_only_markdown(out: dict) -> str:
    r = out["loss_only"]
    pacs_med = statistics.median(r["times_s"]["pacs_loss"])
    grpo_med = statistics.median(r["times_s"]["GRPO dapo loss (TRL default)"])
    worst = max(pacs_med / m["fwd_bwd_s_at_measured_matmul_rate"] for m in r["models"].values())
    times = [[k, *(f"{x:.3f}" for x in (statistics.median(v), min(v), max(v)))] for k, v in r["times_s"].items()]
    models = []
    for name, m in r["models"].items():
        fb = m["fwd_bwd_s_at_measured_matmul_rate"]
        models.append(
            [name, f"{m['params'] / 1e9:.2f}B", f"6 x {m['params'] / 1e9:.2f}e9 x {r['tokens'] / 1e6:.1f}e6 = "
             f"{m['fwd_bwd_flops']:.2e}", f"{fb:.3g} s", f"{pacs_med / fb:.1e}"]
        )  # fmt: skip
    head = ["model it would serve", "params", "fwd+bwd FLOPs = 6 x params x tokens", "fwd+bwd time at that rate"]
    body = [
        f"Tensors: B = {r['B']} completions x T = {r['T']} tokens = {r['tokens'] / 1e6:.1f}M tokens; one float32 "
        f"(B, T) tensor is {r['bytes_per_BT_tensor_fp32'] / 1e6:.0f} MB. Inputs: `per_token_logps` (grad), "
        f"`old_per_token_logps`, `completion_mask` (int64, as TRL makes it), `labels` (B,). Device {r['device']}, "
        f"{r['threads']} thread(s), {len(r['times_s']['pacs_loss'])} interleaved repetitions after a warm-up.",
        "",
        report.table(["loss, forward + backward", "median s", "min s", "max s"], times),
        "",
        f"Measured matmul throughput on this device ({r['matmul_dtype']}): {r['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s.",
        "",
        report.table([*head, "pacs_loss / model fwd+bwd"], models),
        "",
        "Arithmetic: `pacs_loss` does O(10) elementwise FLOPs per token (subtract, mask, sum; the rest is per "
        f"sequence), i.e. ~{10 * r['tokens']:.1e} FLOPs, against 6 x params FLOPs per token for the model: a ratio "
        "of ~10 / (6 x 1.7e9) ≈ 1e-9 in FLOPs. The loss is memory-bound: it reads and writes a handful of (B, T) "
        "tensors (~1-2 GB at this size), milliseconds at GPU memory bandwidth. Its cost next to the model is "
        f"{'nil' if worst < 1e-3 else f'{worst:.1e} of a forward+backward'} (at most {worst:.1e} of the model's "
        f"forward+backward above), and it is {grpo_med / pacs_med:.1f}x "
        f"{'cheaper' if grpo_med > pacs_med else 'dearer'} than TRL's GRPO per-token loss on the same tensors "
        "(which computes exp, clamp and min on every token).",
    ]
    return header("pacs_loss alone at scale", out, model_line=False) + "\n".join(body) + "\n"


# 3. The split path ------------------------------------------------------------------------------------------------


def split_average(r: dict, clock: str, spg: int) -> float:
    """Optimization time per optimizer step averaged over a generation cycle: one on-policy step, spg - 1 off-policy."""
    return (r[f"opt_on{clock}_s"] + (spg - 1) * r[f"opt_off{clock}_s"]) / spg


class _Split:
    """Lookups over the split section's results: per-repetition values, medians and paired ratios."""

    def __init__(self, a: dict, results: list[dict]):
        self.spg, self.batches = a["steps_per_generation"], a["split_batches"]
        self.whole = max(self.batches)  # the whole-group path: every micro-batch holds whole groups
        self.reps = sorted({r["rep"] for r in results})
        self.by = {(r["trainer"], r["per_device"], r["rep"]): r for r in results}
        ga = {b: self.by["PACS", b, self.reps[0]]["grad_accum"] for b in self.batches}
        self.label = {
            b: f"{b} x {ga[b]}" + (" (whole groups)" if b == self.whole else " (split)") for b in self.batches
        }

    def value(self, t, b, rep, key):
        r = self.by[t, b, rep]
        if key.startswith("avg"):
            return split_average(r, key[3:], self.spg)
        if key == "peak_above_start":  # what training added to the process's memory before the first step
            return r["peak_mem_mib"] - r["rss_before_train_mib"]
        if key == "extra_share":  # the extra forward against the rest of the off-policy step
            return r["extra_fwd_off_cpu_s"] / (r["opt_off_cpu_s"] - r["extra_fwd_off_cpu_s"])
        return r[key]

    def med(self, t, b, key):
        return statistics.median(self.value(t, b, rep, key) for rep in self.reps)

    def ratio(self, num, den, key):  # paired within a repetition, then min / median / max over repetitions
        pairs = ((self.value(*num, rep, key), self.value(*den, rep, key)) for rep in self.reps)
        return harness.min_med_max(a / b if b else math.nan for a, b in pairs)  # 0: --smoke, one process's RSS

    def ratio_rows(self, clock: str) -> str:
        c, w = ("_cpu" if clock == "CPU" else ""), self.whole
        head = [f"{clock} time, per-device batch x accumulation", f"PACS / PACS batch {w}, off-policy step",
                f"PACS / PACS batch {w}, average step", "PACS / GRPO same batch, on-policy",
                "PACS / GRPO same batch, off-policy", "PACS / GRPO same batch, average",
                f"GRPO / GRPO batch {w}, average"]  # fmt: skip
        rows = []
        for b in self.batches:
            pacs, grpo = ("PACS", b), ("GRPO", b)
            pairs = [(pacs, ("PACS", w), f"opt_off{c}_s"), (pacs, ("PACS", w), f"avg{c}")]
            pairs += [(pacs, grpo, f"opt_on{c}_s"), (pacs, grpo, f"opt_off{c}_s"), (pacs, grpo, f"avg{c}")]
            pairs += [(grpo, ("GRPO", w), f"avg{c}")]
            rows.append([self.label[b], *(report.ratio_cell(self.ratio(n, d, k)) for n, d, k in pairs)])
        return report.table(head, rows)


def split_markdown(out: dict) -> str:
    a, results, notes = out["args"], out["results"], out.get("notes", [])
    s = _Split(a, results)
    spg, batches, whole, label = s.spg, s.batches, s.whole, s.label
    split = [b for b in batches if b != whole]
    if not split:
        raise ValueError(f"--split-batches {batches}: give at least one batch below {whole} (the split path)")
    timer = results[0].get("gen_timer", "override")

    medians = []
    for b in batches:
        cells = [label[b]]
        cells += [f"{s.med('PACS', b, k):.3f}" for k in ("opt_on_cpu_s", "opt_off_cpu_s", "extra_fwd_off_cpu_s")]
        cells += [f"{s.med('PACS', b, 'avg_cpu'):.3f}"]
        cells += [f"{s.med('GRPO', b, k):.3f}" for k in ("opt_on_cpu_s", "opt_off_cpu_s", "avg_cpu")]
        medians.append(cells + [f"{s.med(t, b, 'peak_mem_mib'):.0f}" for t in SPLIT_TRAINERS])
    medians_head = ["per-device batch x accumulation", "PACS on-policy", "PACS off-policy", "of which extra forward",
                    "PACS average", "GRPO on-policy", "GRPO off-policy", "GRPO average", "peak MiB PACS",
                    "peak MiB GRPO"]  # fmt: skip

    memory = []
    for b in batches:
        pairs = ((("PACS", b), ("PACS", whole)), (("PACS", b), ("GRPO", b)))
        cells = [label[b]] + [report.ratio_cell(s.ratio(num, den, "peak_mem_mib")) for num, den in pairs]
        cells += [report.ratio_cell(s.ratio(("GRPO", b), ("GRPO", whole), "peak_mem_mib"))]
        cells += [f"{s.med(t, b, 'peak_above_start'):.0f}" for t in SPLIT_TRAINERS]
        memory.append(cells + [report.ratio_cell(s.ratio(num, den, "peak_above_start")) for num, den in pairs])
    memory_head = ["memory, per-device batch x accumulation", f"PACS / PACS batch {whole}", "PACS / GRPO same batch",
                   f"GRPO / GRPO batch {whole}", "above start, MiB: PACS", "GRPO", f"PACS / PACS batch {whole}",
                   "PACS / GRPO same batch"]  # fmt: skip

    per_run = []
    for r in results:
        per_run.append(
            [r["rep"], r["trainer"], f"{r['per_device']} x {r['grad_accum']}",
             *(f"{r[k]:.3f}" for k in ("opt_on_cpu_s", "opt_off_cpu_s", "extra_fwd_off_cpu_s", "opt_on_s",
                                       "opt_off_s", "gen_cpu_s")), f"{r['peak_mem_mib']:.0f}", r["load"]]
        )  # fmt: skip
    per_run_head = ["rep", "trainer", "batch x acc", "opt on CPU s", "opt off CPU s", "extra fwd off CPU s",
                    "opt on s", "opt off s", "gen CPU s", "peak MiB", "load (1/5/15)"]  # fmt: skip

    smallest = min(batches)
    goals = []
    for b in sorted(batches, reverse=True)[1:]:
        _, m, hi = s.ratio(("PACS", b), ("PACS", whole), "avg_cpu")
        claim = "split-path time per optimizer step <= {threshold}x the whole-group path, batch " + label[b]
        goals.append(
            report.goal(claim, m, "<=", SPLIT_TIME_GOAL, f"median {m:.3f}x (max {hi:.3f}x), CPU time, average step")
        )
    lo, m, hi = s.ratio(("PACS", smallest), ("PACS", whole), "peak_mem_mib")
    goals.append(
        report.goal(
            f"peak memory at batch {smallest} clearly below batch {whole} (every repetition's ratio < {{threshold}})",
            hi, "<", SPLIT_MEMORY_GOAL, f"PACS {s.med('PACS', smallest, 'peak_mem_mib'):.0f} vs "
            f"{s.med('PACS', whole, 'peak_mem_mib'):.0f} MiB, ratio {lo:.3f} / {m:.3f} / {hi:.3f}",
        )
    )  # fmt: skip
    lo, m, hi = s.ratio(("PACS", smallest), ("GRPO", smallest), "peak_mem_mib")
    goals.append(
        report.goal(
            f"peak memory at batch {smallest} within {{threshold}}x of GRPO at batch {smallest} (median)",
            m, "<=", SPLIT_VS_GRPO_MEMORY_GOAL, f"ratio {lo:.3f} / {m:.3f} / {hi:.3f}",
        )
    )  # fmt: skip

    share = statistics.median(s.value("PACS", b, rep, "extra_share") for b in split for rep in s.reps)
    on = [s.ratio(("PACS", b), ("GRPO", b), "opt_on_cpu_s")[1] for b in split]
    off = [s.ratio(("PACS", b), ("GRPO", b), "opt_off_cpu_s")[1] for b in split]
    grpo_small = s.ratio(("GRPO", smallest), ("GRPO", whole), "avg_cpu")[1]
    pacs_above, grpo_above = (s.med(t, smallest, "peak_above_start") for t in ("PACS", "GRPO"))
    reading = [
        f"- On the split path the off-policy steps pay one extra no-grad forward over the step's micro-batches: "
        f"{share:.2f}x the rest of the off-policy step (median over the split settings and repetitions). The "
        "trainers run with TRL's default `gradient_checkpointing=True`, so a training micro-batch costs about four "
        "forwards (forward, recomputed forward, backward ~ 2 forwards) and the extra one adds ~1/4; without "
        "checkpointing it would add ~1/3. PACS / GRPO at the same batch, off-policy: median "
        f"{min(off):.2f}-{max(off):.2f}x; on-policy (no extra forward, r = 0): {min(on):.2f}-{max(on):.2f}x.",
        f"- Averaged over a generation cycle (1 on-policy + {spg - 1} off-policy steps) that is the 'average step' "
        f"ratio above. More optimizer steps per generation means more off-policy steps and an average closer to "
        f"the off-policy ratio; `steps_per_generation` = accumulation (one optimizer step per generation) never pays "
        "the extra forward.",
        f"- Smaller micro-batches alone (GRPO batch {smallest} / batch {whole}: median {grpo_small:.2f}x, CPU) cost "
        f"{'little' if grpo_small < 1.1 else 'more'} on one CPU thread (a micro-batch of one row is still "
        f"{a['prompt_length'] + a['completion_length']} tokens, enough for efficient matmuls there). On a GPU a "
        "small micro-batch leaves the device underused, so every trainer's batch-1 step is slower than batch 8 there "
        "and 'PACS / PACS batch 8' includes that; 'PACS / GRPO same batch' isolates the split path.",
        "- Peak RSS includes what the process holds before the first step (python, torch, transformers, TRL, the "
        f"model, the trainer); 'above start' subtracts it. What remains at batch {smallest} "
        f"({pacs_above:.0f} MiB PACS, {grpo_above:.0f} MiB GRPO) is more than one row's activations and is "
        f"{'about the same' if abs(pacs_above / max(grpo_above, 1e-9) - 1) < 0.1 else 'not the same'} for both "
        "trainers; it is not broken down here.",
        *notes,
    ]

    rows = a["prompts_per_step"] * a["num_generations"]
    return "\n".join(
        [
            f"# Split path: groups cut over micro-batches, PACS vs GRPO ({a['device']})",
            "",
            report.machine_markdown(out["info"]),
            command(out),
            model_line(out, results),
            f"- batch: {rows} rows ({a['prompts_per_step']} prompt(s) x {a['num_generations']} completions) per "
            f"optimizer step in every setting, as per-device batch x gradient accumulation; prompt "
            f"{a['prompt_length']} tokens, completion fixed at {a['completion_length']} tokens; {spg} optimizer steps "
            f"per generation (`steps_per_generation` = {spg} x accumulation); beta 0 everywhere",
            f"- per worker: {a['warmup_steps']} warm-up optimizer step(s), then {a['steps']} timed; optimizer step k "
            f"is on-policy when k is a multiple of {spg} (it holds the generation, which is subtracted); "
            f"{a['reps']} repetitions, the {len(batches) * 2} (trainer, batch) settings interleaved with a rotating "
            "order, each in a fresh process (peak memory is its own)",
            "- opt = optimizer step minus the generation inside it (forward, loss, backward, clip, AdamW, and for PACS "
            f"on the split path {EXTRA_FWD_TEXT[timer]}); per-worker medians of the "
            f"on- and off-policy steps; average = (on + {spg - 1} x off) / {spg}, the mean over a generation cycle",
            "",
            "## Goals",
            "",
            *goals,
            "",
            "## Reading",
            "",
            *reading,
            "",
            "## Median time per optimizer step (CPU s) and peak memory",
            "",
            report.table(medians_head, medians),
            "",
            "## Ratios, paired within a repetition: min / **median** / max",
            "",
            s.ratio_rows("CPU"),
            "",
            s.ratio_rows("wall"),
            "",
            f"Peak memory ({results[0]['mem_kind']}; 'above start': minus its value just before the first step):",
            "",
            report.table(memory_head, memory),
            "",
            "## Per worker",
            "",
            report.table(per_run_head, per_run),
            "",
        ]
    )
