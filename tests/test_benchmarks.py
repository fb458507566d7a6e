"""Smoke tests: each benchmark script runs one tiny iteration end to end, so that the scripts cannot rot; every study's
documented command runs as written (its `--help`), and the studies are a package with no `sys.path` edits.

    python -m pytest tests/test_benchmarks.py -q

The real runs (minutes to tens of minutes) are not part of CI; see benchmarks/README.md. Each study has its folder
(benchmarks/<study>/: its scripts, report module and results); the modules they share sit in benchmarks/ itself.
"""

import ast
import importlib
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import harness, report, rl_runs


ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def _load(name: str):
    """A benchmark module by its path under benchmarks/, e.g. "anchor/anchor": `benchmarks.anchor.anchor`."""
    return importlib.import_module("benchmarks." + name.replace("/", "."))


def test_step_cost_smoke(tmp_path):
    step_cost = _load("step_cost/step_cost")
    out = step_cost.main(["--smoke", "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")])
    assert {r["trainer"] for r in out["results"]} == {"PACS", "GRPO", "RLOO"}
    for r in out["results"]:
        assert r["opt_s"] > 0 and r["gen_s"] > 0 and r["peak_mem_mib"] > 0
    assert all(math.isfinite(t) for ts in out["loss_only"]["times_s"].values() for t in ts)
    assert "PACS / GRPO" in (tmp_path / "step_cost_smoke.md").read_text()
    assert "pacs_loss" in (tmp_path / "loss_cost_smoke.md").read_text()


def test_learning_smoke(tmp_path, capsys):
    learning = _load("learning/learning")
    argv = ["--smoke", "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")]
    raw = learning.main(argv)
    tables = capsys.readouterr().out  # the report's tables (smoke mode writes no markdown)
    assert "within-group ranking" in tables and "majority" not in tables.lower()  # issue 31: ill-posed, retired
    assert {r["config"] for r in raw["runs"]} == set(rl_runs.COMPARED)
    for r in raw["runs"]:
        steps = [c[0] for c in r["curve"]]
        assert steps[0] == 0 and steps[-1] == 2  # evaluated before training and at the last step
        assert all(0.0 <= c[1] <= 1.0 and 0.0 <= c[2] <= 1.0 for c in r["curve"])  # validation, test
        assert 0.0 <= r["clip_fraction"] <= 1.0
        assert [e["step"] for e in r["train_log"] if "entropy" in e] == [1, 2]  # TRL's token entropy, every step
        assert (r["critic"] is not None) == r["config"].startswith("PACS")  # PACS: the off-policy step's critic
        if r["critic"]:
            assert r["critic"]["off_policy_steps"] == 1  # 2 steps per generation: step 2 is off-policy
    assert (tmp_path / "learning_smoke.json").exists()
    # one JSON per run: a second invocation with one config reruns nothing and reports that config alone
    cached = {p: p.stat().st_mtime_ns for p in (tmp_path / "work" / "learning_runs").glob("*.json")}
    assert len(cached) == len(rl_runs.COMPARED)
    again = learning.main([*argv, "--configs", "GRPO"])
    assert again["runs"] == [r for r in json.loads(json.dumps(raw["runs"])) if r["config"] == "GRPO"]
    assert {p: p.stat().st_mtime_ns for p in cached} == cached


def test_learning_task_pieces():
    tasks = _load("_tasks")
    test, val, dev, sft, rl = tasks.make_problems()
    assert (len(test), len(val), len(dev)) == (500, 200, 200)
    prompts = [{p for p, _ in split} for split in (test, val, dev, sft, rl)]
    assert sum(map(len, prompts)) == len(set().union(*prompts))  # disjoint: held-out prompts never trained on
    assert tasks.scratchpad(347, 586) == "7+6+0=13,4+8+1=13,3+5+1=09>0933"
    for prompt, worked in test[:50]:
        a, b = map(int, prompt[:-1].split("+"))
        assert int(tasks.final_answer(worked)) == a + b
    tok = tasks.build_char_tokenizer()
    text = test[0][0] + test[0][1] + tok.eos_token
    ids = tok(text).input_ids
    assert len(ids) == 8 + tasks.COMPLETION_TOKENS and tok.decode(ids, skip_special_tokens=True) == text[:-10]
    assert tasks.answer_reward(["1+2+0=03>0933", "0933", ">933"], ["0933"] * 3) == [1.0, 0.0, 0.0]


def test_critic_summary_and_clip_fraction():
    def entry(step, margin, ranking, fresh, brier, close):
        e = {"step": step, "pacs/critic_margin": margin, "pacs/critic_close_frac": close, "pacs/psi_std": 0.1}
        for key, value in (("ranking", ranking), ("ranking_fresh", fresh), ("brier_mixed", brier)):
            if value is not None:  # logged only on steps with a mixed group (the fresh ranking: first steps)
                e[f"pacs/critic_{key}"] = value
        return e

    # transformers logs optimizer step k (1-based) as "step": k; with 2 optimizer steps per generation steps 1 and 3
    # generated (the fresh ranking), steps 2 and 4 are off-policy
    log = [entry(1, 0.0, 0.5, 0.5, 0.25, 0.0), entry(2, 0.1, 0.6, None, 0.2, 0.25), entry(3, 0.0, 0.7, 0.7, 0.3, 0.0)]
    log += [{"step": 3, "grad_norm": 2.0}, entry(4, 0.3, None, None, None, 0.75), {"step": 4, "train_runtime": 1.0}]
    c = harness.critic_summary(log, steps_per_cycle=2)
    assert c["off_policy_steps"] == 2 and c["summary"] == "per_step_ranking"
    assert c["critic_margin_step_q10_q50_q90"] == [0.1, 0.3, 0.3]  # nearest rank over the two steps' medians
    assert c["critic_ranking_off_policy"] == 0.6  # step 4 had no mixed group: not counted
    assert c["critic_ranking_fresh"] == pytest.approx(0.6) and c["fresh_steps"] == 2
    assert c["critic_brier_mixed"] == pytest.approx(0.25)
    assert c["critic_close_frac"] == 0.5 and c["proxy_abs_mean"] is None
    assert harness.critic_summary(log, steps_per_cycle=1) is None  # every step generated: nothing off-policy
    assert harness.critic_summary([{"step": 2, "loss": 0.1}], steps_per_cycle=4) is None  # GRPO: no critic metrics
    log = [{"grad_norm": 0.5}, {"grad_norm": 1.5}, {"loss": 0.1}, {"grad_norm": 2.0}]
    assert harness.clip_fraction(log, 1.0) == 2 / 3


def test_critic_summary_leaves_out_exactly_the_generating_steps(tmp_path):
    import argparse

    setup = _load(
        "step_cost/step_cost_setup"
    )  # a tiny random Qwen3 and a parity reward: mixed groups, a moving policy
    args = argparse.Namespace(device="cpu", prompts_per_step=2, num_generations=4, per_device=None, seed=0, steps=6,
                              work_dir=str(tmp_path), warmup_steps=0, steps_per_generation=3, completion_length=8,
                              model_config="tiny", prompt_length=4)  # fmt: skip
    Trainer, config = setup.trainer_class_and_config(args, "PACS")
    config.logging_steps, config.learning_rate = 1, 1e-2
    tokenizer, dataset = setup.build_data(args)
    model = setup.build_model("tiny", "cpu", 0)
    trainer = Trainer(model=model, reward_funcs=setup.parity_reward, args=config, train_dataset=dataset,
                      processing_class=tokenizer)  # fmt: skip
    trainer.train()
    log = [e for e in trainer.state.log_history if "pacs/critic_margin" in e]
    generated = [e["step"] for e in log if "reward" in e]  # TRL logs rewards on the steps that generated
    assert generated == [1, 4] and all(e["pacs/critic_margin"] == 0.0 for e in log if e["step"] in generated)
    assert all(e["pacs/critic_margin"] > 0.0 for e in log if e["step"] not in generated)  # the policy moved
    c = harness.critic_summary(trainer.state.log_history, steps_per_cycle=3)
    assert c["off_policy_steps"] == 4 and c["critic_margin_step_q10_q50_q90"][0] > 0.0


def test_report_goal_and_interval():
    assert report.goal("ratio <= {threshold}x", 1.2, "<=", 1.35, "median 1.200x").endswith("**met**")
    assert report.goal("ratio <= {threshold}x", 1.4, "<=", 1.35, "median 1.400x") == (
        "- ratio <= 1.35x: median 1.400x: **missed**"
    )
    assert report.interval([0.5, 0.7]) == "0.600 [-0.671, 1.871]"  # t = 12.706 for 2 values
    assert report.interval([0.25]) == "0.250" and report.interval([]) == "n/a"


@pytest.mark.parametrize("name", sorted(str(p.relative_to(BENCHMARKS)) for p in BENCHMARKS.rglob("*.py")))
def test_benchmark_at_most_400_lines_and_overrides_no_private_method(name):
    text = (BENCHMARKS / name).read_text()
    if name != "gpu_check.py":  # every section of the GPU check in the one file a GPU session reads
        assert len(text.splitlines()) <= 400, f"{name}: {len(text.splitlines())} lines; is it one concern?"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.bases:  # a subclass, e.g. of a trainer: public hooks only
            private = [f.name for f in node.body if isinstance(f, ast.FunctionDef) and f.name.startswith("_")
                       and not f.name.startswith("__")]  # fmt: skip
            assert not private, f"{name}: {node.name} overrides {private}"


def test_smollm_compare_smoke(tmp_path, capsys):
    compare = _load("smollm_compare/smollm_compare")
    raw = compare.main(["--smoke", "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")])
    tables = capsys.readouterr().out
    assert "within-group ranking" in tables and "majority" not in tables.lower()  # issue 31: ill-posed, retired
    assert [r["algorithm"] for r in raw["runs"]] == ["pacs", "grpo", "rloo"]
    assert len({json.dumps(r["before"]["per_problem"]) for r in raw["runs"]}) == 1  # measured once, shared
    for r in raw["runs"]:
        assert r["after"]["n"] == 6 and r["change"]["n"] == 6
        assert 0.0 <= r["clip_fraction"] <= 1.0
    assert raw["runs"][0]["critic"]["off_policy_steps"] == 1 and raw["runs"][1]["critic"] is None
    assert (tmp_path / "smollm_compare_smoke.json").exists()


def test_step_cost_split_smoke(tmp_path):
    step_cost = _load("step_cost/step_cost")
    out = step_cost.main(["--split", "--smoke", "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")])
    runs = {(r["trainer"], r["per_device"]): r for r in out["results"]}
    assert set(runs) == {("PACS", 2), ("GRPO", 2), ("PACS", 1), ("GRPO", 1)}  # whole groups of 2, and split
    for r in runs.values():
        assert r["opt_on_s"] > 0 and r["opt_off_s"] > 0 and r["peak_mem_mib"] > 0
        assert [s[0] for s in r["per_step"]] == [1, 2]  # timed: step 1 off-policy, step 2 on-policy (generates)
        assert r["per_step"][0][3] == 0 and r["per_step"][1][3] > 0
    assert runs["PACS", 1]["grad_accum"] == 2 and runs["PACS", 1]["extra_fwd_off_s"] > 0  # the split path's forward
    assert runs["PACS", 2]["extra_fwd_off_s"] == 0 and runs["GRPO", 1]["extra_fwd_off_s"] == 0
    md = (tmp_path / "split_cost_smoke.md").read_text()
    assert "## Goals" in md and "PACS / GRPO same batch" in md
    saved = json.loads((tmp_path / "split_cost_smoke.json").read_text())
    assert saved["results"] == json.loads(json.dumps(out["results"]))


def test_reuse_smoke(tmp_path):
    reuse = _load("reuse/reuse")
    argv = ["--smoke", "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")]
    raw = reuse.main(argv)
    cells = {(r["config"], r["steps_per_generation"], r["num_iterations"]) for r in raw["runs"]}
    assert cells == {(name, k, mu) for name in reuse.ALGORITHMS for k, mu in [(1, 1), (2, 1), (1, 2)]}
    for r in raw["runs"]:
        mu = r["num_iterations"]
        # equal generated completions (16 = 2 steps of 2 prompts x 4): mu passes take mu x the optimizer steps,
        # evaluated at the same completion counts (0, 8, 16) for every cell
        assert [c[0] for c in r["curve"]] == [0, mu, 2 * mu]
        assert [n for n, _, _ in reuse.reuse_report.completions_curve(r, 8)] == [0, 8, 16]
        assert 0.0 <= r["clip_fraction"] <= 1.0
        off_policy = r["steps_per_generation"] * mu > 1
        assert (r["critic"] is not None) == (r["config"].startswith("PACS") and off_policy)
        if r["critic"]:
            assert r["critic"]["off_policy_steps"] == (1 if mu == 1 else 2)  # k=2: step 1; mu=2: steps 1 and 3
    md = (tmp_path / "reuse_smoke.md").read_text()
    assert "num_iterations 2" in md and "PACS b=1 balanced − GRPO, k=2" in md
    assert "within-group ranking" in md and "majority" not in md.lower()  # issue 31: ill-posed, retired
    # a second invocation reuses the 9 cached runs, and the report can be redone from the json alone
    again = reuse.main(argv)
    curves = {(r["config"], r["steps_per_generation"], r["num_iterations"]): r["curve"] for r in raw["runs"]}
    assert {(r["config"], r["steps_per_generation"], r["num_iterations"]): r["curve"] for r in again["runs"]} == curves
    assert len(list((tmp_path / "work" / "reuse_runs").glob("*.json"))) == 9
    md = (tmp_path / "reuse_smoke.md").read_text()
    (tmp_path / "reuse_smoke.md").unlink()
    reuse.main([*argv, "--report-only"])
    assert (tmp_path / "reuse_smoke.md").read_text() == md


def test_anchor_smoke(tmp_path):
    anchor = _load("anchor/anchor")
    raw = anchor.main(["--smoke", "--jobs", "1", "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")])
    assert {r["arm"] for r in raw["runs"]} == set(anchor.ARMS)
    assert {r["seed"] for r in raw["runs"]} == {0, 100}  # the reported seed and the tuning seed
    for r in raw["runs"]:
        assert [c[0] for c in r["curve"]] == [0, 1, 2] and [s["step"] for s in r["steps"]] == [1, 2]
        # the smoke warm start solves nothing: uniform groups, no gradient, so the norm is only there (and >= 0)
        assert all(s["update_norm"] is not None and s["update_norm"] >= 0 for s in r["steps"]) and r["kl_to_sft"] >= 0
        assert (r["beta"] is not None) == r["arm"].startswith("PACS")
        if r["arm"].startswith("PACS ref"):
            assert all("pacs/reference_kl" in s and "pacs/reference_resets" in s for s in r["steps"])
    assert (tmp_path / "anchor_smoke.json").exists() and "What the rule says" in (
        tmp_path / "anchor_smoke.md"
    ).read_text()


def test_anchor_demo_smoke(tiny_model_dir, tmp_path):
    raw = _load("anchor/anchor_demo").main(
        ["--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "work"), "--seeds", "1", "2", "--num-eval", "4",
         "--reference-beta", "0.3", "--reference-reset", "1", "--reference-mode", "reset+warmup", "--rewarmup", "1",
         "--demo-args", "--model", tiny_model_dir, "--max-steps", "4", "--steps-per-generation", "2",
         "--num-generations", "2", "--num-train", "8", "--eval-batch-size", "4", "--max-completion-length", "6"]
    )  # fmt: skip
    runs = raw["runs"]
    assert sorted((r["arm"], r["split"], r["seed"]) for r in runs if r["split"] == "val") == [
        ("reference b=0.3 N=1 reset+warmup", "val", 0), ("reference b=0.3 N=1 reset+warmup", "val", 0),
        ("rollout b=1", "val", 0), ("rollout b=1", "val", 0),
    ]  # fmt: skip
    assert {r["eval_seed"] for r in runs if r["split"] == "val"} == {4242}  # the validation set, not a test set
    assert {(r["seed"], r["eval_seed"]) for r in runs if r["split"] == "test"} == {(1, 1_000_004), (2, 1_000_005)}
    md = (tmp_path / "anchor_demo.md").read_text()
    assert "difference of changes" in md and "over 2 seeds" in md


def test_anchor_cost_smoke(tmp_path):
    raw = _load("anchor/anchor_cost").main(["--smoke", "--out-dir", str(tmp_path)])
    assert [r["config"] for r in raw["runs"]] == list(_load("anchor/anchor_cost").CONFIGS)
    assert all(r["step_time_mean"] > 0 and r["peak_rss_mib"] > 0 for r in raw["runs"])
    assert "PACS reference" in raw["table"]


def test_gradient_term_smoke(tmp_path):
    raw = _load("gradient_term/gradient_term").main(
        ["--smoke", "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")]
    )
    assert [p["step"] for p in raw["points"]] == [0, 2]
    assert all(p["extra_norm"] > 0 for p in raw["points"])  # the score-function term is never 0 on samples
    # the machine it ran on, as every study records it (issue 46)
    info = raw["info"]
    assert info["cpu_capability"] and len(info["cpu_flags_sha256"]) == 16 and info["torch_threads"] == 1
    assert {"cpu", "torch", "trl", "pacs", "load_average_start", "load_average_end", "code"} <= set(info)
    saved = json.loads((tmp_path / "gradient_term_smoke.json").read_text())
    assert saved["info"]["cpu_flags_sha256"] == info["cpu_flags_sha256"] and saved["argv"][1:3] == [
        "--smoke",
        "--out-dir",
    ]


@pytest.mark.parametrize("name", ["learning", "reuse", "smollm_compare"])
def test_committed_reports_render_from_their_json_without_the_withdrawn_columns(tmp_path, name):
    """`--report-only` on the committed JSON gives the committed report. Those runs predate the within-group ranking
    (issue 31): their sign-accuracy-vs-majority-label columns are not rendered, a note says why."""
    import shutil

    results = BENCHMARKS / name  # the study's folder
    for suffix in (".json", "_verdict.md"):
        shutil.copy(results / f"{name}{suffix}", tmp_path)
    _load(f"{name}/{name}").main(["--report-only", "--out-dir", str(tmp_path)])
    md = (tmp_path / f"{name}.md").read_text()
    assert md == (results / f"{name}.md").read_text(), f"benchmarks/{name}/{name}.md is stale: rerun --report-only"
    rows = "\n".join(line for line in md.splitlines() if line.startswith("| ")).lower()  # the tables
    assert "majority" not in rows and "critic acc" not in rows
    assert "predate the well-posed critic metric" in md and "withdrawn as ill-posed" in md


@pytest.mark.parametrize(
    "script, report, inputs, flags",
    [
        ("anchor/anchor", "anchor.md", ["anchor.json"], []),
        ("anchor/anchor_demo", "anchor_demo.md", ["anchor_demo.json"], []),
        ("anchor/anchor_cost", "anchor_cost.md", ["anchor_cost.json"], []),
        ("dynamic_sampling/ds_cost", "ds_cost.md", ["ds_cost.json"], []),
        ("step_cost/step_cost", "step_cost.md", ["step_cost.json"], []),
        ("step_cost/step_cost", "ab_backward.md", ["ab_backward.json"], ["--ab"]),
        ("filtering/filtering", "filtering.md", ["filtering.json"], []),
        ("sparsity/sparsity", "sparsity.md", ["sparsity.json"], []),
    ],
)
def test_committed_reports_rerender_identically(tmp_path, script, report, inputs, flags):
    """`--report-only` on a study's committed JSON gives its committed report (the reports of learning, reuse and
    smollm_compare: above). Not split_cost.md and loss_cost.md: they predate the wording of step_cost_report.py."""
    import shutil

    folder = (BENCHMARKS / script).parent
    for name in inputs:
        shutil.copy(folder / name, tmp_path)
    _load(script).main(["--report-only", *flags, "--out-dir", str(tmp_path)])
    assert (tmp_path / report).read_text() == (folder / report).read_text(), f"{folder.name}/{report} is stale"


def test_benchmarks_against_trls_grpo_build_trls_own_grpo_trainer():
    """The GRPO baseline of every benchmark is TRL's plain `GRPOTrainer`, not `pacs.grpo.HardenedGRPOTrainer` (the
    layer `pacs train --algorithm grpo` trains with): "TRL's GRPO" in the reports means TRL's trainer. The layer is
    used only where a study says so, under its own name: the `hardened_grpo` family (dynamic sampling)."""
    import inspect

    from pacs import demo

    builders = ["rl_runs.py", "step_cost/step_cost_setup.py", "anchor/anchor_cost.py", "gpu_harness.py"]
    builders.append("vllm_gpu_check.py")
    for name in builders:
        assert re.search(r"from trl import (GRPOConfig, )?GRPOTrainer\b", (BENCHMARKS / name).read_text()), name
    for path in BENCHMARKS.rglob("*.py"):  # the layer appears only under its own name, never as "grpo"
        text = path.read_text()
        assert "Hardened" not in text or "hardened_grpo" in text, f"{path.relative_to(BENCHMARKS)}: a GRPO not TRL's"
    # smollm_compare runs `pacs demo --algorithm trl_grpo`: TRL's own GRPOTrainer, imported from trl by that name
    assert demo.TRAINERS["trl_grpo"] == "GRPOTrainer", "pacs demo's GRPO is not TRL's"
    assert 'import_module("pacs" if algorithm == "pacs" else "trl")' in inspect.getsource(demo)


def test_warm_starts_are_pinned_and_a_changed_file_is_refused(tmp_path, monkeypatch):
    ws, reg = _load("warm_starts/warm_starts"), _load("warm_starts/registry")
    entries = reg.registry()
    assert {"dense-s105", "sparse-s80"} <= set(entries)
    for name, entry in entries.items():  # every committed file hashes to the registry
        path, _ = reg.load(name)
        assert Path(path, reg.MODEL_FILE).exists() and entry["files"][reg.MODEL_FILE]
    # the sparse one is sparse: at least twice the dense one's all-wrong share at step 0 (G 8, temperature 1)
    assert entries["sparse-s80"]["groups"]["all_wrong"] >= 2 * entries["dense-s105"]["groups"]["all_wrong"]
    # a copy with one byte changed is refused, naming the file; a missing one too; an unknown name lists the known
    copy = tmp_path / "dense-s105"
    copy.mkdir()
    for f in Path(reg.HERE, "dense-s105").iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    data = bytearray((copy / "config.json").read_bytes())
    data[-2] ^= 1
    (copy / "config.json").write_bytes(bytes(data))
    monkeypatch.setattr(reg, "HERE", tmp_path)
    with pytest.raises(reg.WarmStartError, match="config.json has sha256"):
        reg.load("dense-s105")
    (copy / "config.json").unlink()
    with pytest.raises(reg.WarmStartError, match="config.json has sha256 missing"):
        reg.load("dense-s105")
    with pytest.raises(reg.WarmStartError, match="dense-s105, sparse-s80"):
        reg.load("no-such-warm-start")
    with pytest.raises(ws.WarmStartError, match="never replaced"):
        ws.build("dense-s105", 1, 1)  # an existing name is never rebuilt


def test_sparsity_smoke(tmp_path):
    sparsity = _load("sparsity/sparsity")
    raw = sparsity.main(["--smoke", "--jobs", "1", "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")])
    arms = {(r["arm"], r["lr"]) for r in raw["runs"]}
    assert {a for a, _ in arms} == set(sparsity.ARMS)
    assert {lr for a, lr in arms if a == "GRPO"} == {1e-4, 1e-3}  # the pick, and the stability sweep at 10x
    for run in raw["runs"]:  # every generation batch's group shares, from the reward function, for every trainer
        assert run["groups"] and all(g["all_wrong"] + g["all_right"] <= 1 for g in run["groups"])
    assert {s["arm"] for s in raw["uniform_share"]} == {"PACS rollout", "PACS ref N=8 reset"}
    assert (tmp_path / "sparsity_smoke.md").exists()


def test_filtering_smoke(tmp_path):
    filtering = _load("filtering/filtering")
    raw = filtering.main(["--smoke", "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")])
    assert {r["arm"] for r in raw["runs"]} == set(filtering.ARMS)
    G = raw["args"]["num_generations"]
    for run in raw["runs"]:  # completions generated: counted by the reward function, every round
        assert run["generated"] == sum(g["groups"] for g in run["rounds"]) * G > 0
        generated = [point[1] for point in run["curve"]]
        assert generated == sorted(generated) and generated[0] == 0 and generated[-1] == run["generated"]
        if run["arm"].endswith("+ DS"):  # the layer's own count agrees with the reward function's
            assert run["ds"] and sum(d["groups_generated"] for d in run["ds"]) * G == run["generated"]
        else:
            assert run["ds"] == []
        assert run["machine"]["cpu_flags_sha256"] == raw["info"]["cpu_flags_sha256"]  # each run names its CPU
    assert (tmp_path / "filtering_smoke.md").exists() and (tmp_path / "filtering_smoke.png").exists()
    assert f"{len(raw['runs'])} run(s) on " in (tmp_path / "filtering_smoke.md").read_text()


def test_filtering_report_p_values_holm_and_recipe_rules():
    report = _load("filtering/filtering_report")
    assert report.p_value([1, 2, 3, 4, 5]) == pytest.approx(0.0132356, abs=1e-6)  # scipy's ttest_1samp
    assert report.p_value([0.01, -0.02, 0.03]) == pytest.approx(0.6913933, abs=1e-6)  # odd degrees of freedom
    assert report.holm([0.01, 0.04, 0.03, None]) == [True, False, False, False]  # 0.03 > 0.05 / 2: stops there
    committed = json.loads((BENCHMARKS / "filtering" / "filtering.json").read_text())
    rules = report.recipe_rules(report.collect(committed))
    assert "not met: the PACS recipes keep dynamic sampling off" in rules[0] and "not met" in rules[1]


def test_filtering_accuracy_per_generated_completion_never_counts_past_the_threshold():
    report = _load("filtering/filtering_report")
    assert report.thresholds(7679) == [1280, 2560, 3840, 5120, 6400]
    assert report.thresholds(30000) == [1280, 2560, 3840, 5120, 6400, 7680, 15360, 23040]
    run = {"generated": 9000, "curve": [(0, 0, 0.1, 0.1), (8, 1800, None, 0.2), (16, 4000, None, 0.3),
                                        (20, 4900, 0.5, 0.4), (24, 9000, None, 0.9)]}  # fmt: skip
    assert report.at_generated(run, 5000) == pytest.approx((0.2 + 0.3 + 0.4) / 3)  # not the eval at 9000
    assert report.at_generated(run, 1280) == pytest.approx(0.1)  # only the step-0 evaluation is within 1280
    assert report.at_generated(run, 10000) is None  # never reached
    assert report.final({"curve": [(s, 0, None, s / 100) for s in (60, 80, 100, 120)]}) == pytest.approx(1.0)


def test_ds_cost_smoke(tmp_path, capsys):
    ds_cost = _load("dynamic_sampling/ds_cost")
    raw = ds_cost.main(["--smoke", "--out-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")])
    md = capsys.readouterr().out
    saved = json.loads((tmp_path / "ds_cost_smoke.json").read_text())
    assert saved["overhead_summary"] == json.loads(json.dumps(raw["overhead_summary"]))
    # 1. overhead: a pair per arm, the never-uniform reward kept every group, on and off ended at the same weights
    runs = saved["overhead_runs"]
    assert sorted((r["arm"], r["ds"]) for r in runs) == sorted((a, ds) for a in ds_cost.ARMS for ds in (True, False))
    for arm, s in saved["overhead_summary"].items():
        on, off = (next(r for r in runs if r["arm"] == arm and r["ds"] == ds) for ds in (True, False))
        assert on["generations"] and all(g["rounds"] == 1 and g["fallback_groups"] == 0 for g in on["generations"])
        assert not off["generations"] and on["weights_sha256"] == off["weights_sha256"]
        assert s["all_rounds_1"] and s["no_fallback"] and s["same_weights"] and s["off_logs_no_ds_key"]
        ratio = on["cpu_s"] / off["cpu_s"]  # the same completions trained: the ratio of times
        assert s["ratio_cpu"] == pytest.approx([ratio] * 3) and f"{ratio:.3f}" in md
    # 2. cost: the smoke warm start solves nothing, so every round's groups are uniform and the fallback fills
    for c in saved["cost_summary"]:
        gens = [g for r in saved["cost_runs"] if (r["arm"], r["ds"]) == (c["arm"], True) for g in r["generations"]]
        assert all(g["rounds"] == 2 and g["generated_per_trained"] == 2 for g in gens)  # max_rounds 2 in smoke
        needed = len(gens) * saved["cost_runs"][0]["needed_groups"]
        assert c["generated_per_trained_mean"] == sum(g["groups_generated"] for g in gens) / needed == 2
        assert c["fallback_groups"] == needed and f"**{c['generated_per_trained_mean']:.2f}**" in md


def test_vllm_gpu_check_workers_start_outside_the_callers_process_group(tmp_path, monkeypatch):
    """The CI failure of 2026-12-07: the vLLM tier calls `vllm_gpu_check.main` in the pytest process after colocate
    tests, which left RANK/WORLD_SIZE/MASTER_PORT set and the port bound; a worker that inherits them fails at
    `TrainingArguments` with EADDRINUSE. Here the caller holds a bound port named in those variables."""
    import socket

    vllm_gpu_check = _load("vllm_gpu_check")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1").items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("MASTER_PORT", str(port))
        env = vllm_gpu_check.worker_env()
        assert not set(vllm_gpu_check.DISTRIBUTED_ENV) & set(env) and env["PATH"] == __import__("os").environ["PATH"]
        start = "from transformers import TrainingArguments; TrainingArguments(output_dir='o', use_cpu=True).device"
        run = subprocess.run([sys.executable, "-c", start], env=env, cwd=tmp_path, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-2000:]


def _runnable_scripts() -> list[str]:
    """Every module under benchmarks/ that runs as a command (it has a `__main__` block), as `benchmarks.<...>`."""
    return sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in BENCHMARKS.rglob("*.py")
        if 'if __name__ == "__main__":' in p.read_text()
    )


def _documented_modules() -> set[str]:
    """The modules of every `python -m benchmarks...` command in the benchmarks' README, the README, the docs and the
    scripts' own docstrings."""
    texts = [BENCHMARKS / "README.md", ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *BENCHMARKS.rglob("*.py")]
    return {m for path in texts for m in re.findall(r"python -m (benchmarks(?:\.\w+)+)", path.read_text())}


def test_every_study_script_is_documented_as_a_module_command():
    # run from the repository root, `python -m benchmarks.<study>.<script>`; never by file path (no sys.path edits)
    documented = {m for m in _documented_modules()}
    table = set(re.findall(r"python -m (benchmarks(?:\.\w+)+)", (BENCHMARKS / "README.md").read_text()))
    assert set(_runnable_scripts()) <= table, sorted(set(_runnable_scripts()) - table)
    assert documented <= set(_runnable_scripts()), sorted(documented - set(_runnable_scripts()))
    # the old form, `python benchmarks/x/y.py` (not report.command's doctest of a run made before the folders)
    by_path = re.compile(r"(?<!')python3? (?:\S*/)?benchmarks/[\w/]+\.py")
    texts = [BENCHMARKS / "README.md", ROOT / "README.md", ROOT / "Makefile", *(ROOT / "docs").glob("*.md")]
    texts += [*BENCHMARKS.rglob("*.py"), *BENCHMARKS.rglob("*.sh"), *(ROOT / ".ci").iterdir()]
    found = [f"{p.relative_to(ROOT)}: {m}" for p in texts for m in by_path.findall(p.read_text())]
    assert not found, found


@pytest.mark.parametrize("module", _runnable_scripts())
def test_every_study_command_runs_as_written_from_the_repository_root(module):
    """`python -m <module> --help` from the repository root, as the README writes the command: the package imports,
    the options parse."""
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and "usage:" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]


def test_the_benchmarks_edit_no_sys_path():
    # a package imports by name: `grep -rn "sys.path" benchmarks/` finds nothing
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sorted(BENCHMARKS.rglob("*"))
        if p.is_file() and p.suffix in (".py", ".md", ".sh")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "sys.path" in line
    ]
    assert not found, found
