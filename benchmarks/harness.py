"""The harness every study runs in: machine/version info, statistics, the critic and clipping summaries read from a
trainer's `log_history`, a per-run JSON cache and a pool of worker processes.

Not run on its own; the scripts of every study (benchmarks/<study>/) and the GPU check import it (the offline
environment is set by the package, `benchmarks/__init__.py`). Rendering (markdown tables, intervals, goals met or
missed) lives in `report.py`.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import platform
import statistics
import subprocess
from pathlib import Path


# Machine and versions ----------------------------------------------------------------------------------------------


def load_average() -> str:
    """The 1/5/15-minute load averages as a string, e.g. "1.93 2.10 2.05"."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # not on every platform
        return "n/a"


def machine_info() -> dict:
    """Date, host, CPU model, core count, RAM, GPU, package versions and the code that ran, for a results file.

    `code` is `$PACS_BENCH_CODE` when set (e.g. "src/ of commit abc frozen by git archive"), else "this checkout".
    """
    import torch
    import transformers
    import trl

    import pacs

    cpu, cpu_flags = platform.processor() or "unknown", ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        lines = {ln.split(":", 1)[0].strip(): ln.split(":", 1)[1].strip() for ln in out.splitlines() if ":" in ln}
        cpu, cpu_flags = lines.get("Model name", cpu), lines.get("Flags", "")
    except FileNotFoundError:
        pass
    ram_gib = None
    try:
        with open("/proc/meminfo") as f:
            ram_gib = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "ram_gib": ram_gib,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "pacs": pacs.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the kernels torch picked (e.g. AVX512)
        "cpu_flags": cpu_flags,
        "cpu_flags_sha256": hashlib.sha256(cpu_flags.encode()).hexdigest()[:16],
        "torch_threads": torch.get_num_threads(),
        "load_average_start": load_average(),
        "code": os.environ.get("PACS_BENCH_CODE", "this checkout"),
    }
    try:
        git = ["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"]
        info["pacs_git"] = subprocess.run(git, capture_output=True, text=True, check=False).stdout.strip()
    except FileNotFoundError:
        pass
    return info


# Statistics ---------------------------------------------------------------------------------------------------------


def min_med_max(values) -> tuple[float, float, float]:
    """(min, median, max) of a non-empty sequence."""
    values = list(values)
    return min(values), statistics.median(values), max(values)


def quantiles(values, qs=(0.1, 0.5, 0.9)) -> list[float]:
    """Empirical quantiles (nearest rank) of a non-empty sequence."""
    values = sorted(values)
    return [values[min(len(values) - 1, int(q * len(values)))] for q in qs]


# two-sided 95% Student t quantiles by sample size (3 decimals, as the committed results were computed)
_T95 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}


def t_interval(xs) -> tuple[float, float, float] | None:
    """(mean, low, high): the 95% t-interval of the mean of `xs` (n >= 2), or None for fewer than 2 values."""
    xs = list(xs)
    if len(xs) < 2:
        return None
    if len(xs) in _T95:
        t = _T95[len(xs)]
    else:
        from scipy.stats import t as student_t

        t = float(student_t.ppf(0.975, len(xs) - 1))
    m, half = statistics.mean(xs), t * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


# What PACS's critic does and how often clipping bites, from the trainer's log ---------------------------------------

CRITIC_KEYS = ("pacs/critic_margin", "pacs/psi_std")  # on every PACS training step (the ranking: mixed groups only)


def critic_steps(log_history: list[dict], steps_per_cycle: int, which: str = "off_policy") -> list[dict]:
    """The log entries of the optimizer steps that carry PACSTrainer's critic metrics (`CRITIC_KEYS`): `which` is
    "off_policy" (the steps without a generation before them), "first" (each generation's first step) or "all".

    transformers logs optimizer step k (1-based) with `"step": k`; the step was computed at `global_step` k - 1, and
    TRL generates when that is a multiple of `steps_per_cycle` (optimizer steps per generation x num_iterations).
    """
    first = {"all": None, "off_policy": False, "first": True}[which]
    return [
        e
        for e in log_history
        if "step" in e
        and all(k in e for k in CRITIC_KEYS)
        and (first is None or ((e["step"] - 1) % steps_per_cycle == 0) == first)
    ]


def mean_of(entries: list[dict], key: str) -> float | None:
    """The mean of `key` over the entries that logged it (None when none did)."""
    values = [e[key] for e in entries if e.get(key) is not None]
    return statistics.mean(values) if values else None


def critic_summary(log_history: list[dict], steps_per_cycle: int) -> dict | None:
    """The implicit critic over a run, from `trainer.state.log_history` (`logging_steps=1`: one entry per step).

    From PACSTrainer's per-step metrics (`pacs.critic`): `pacs/critic_ranking` (the share of (correct, incorrect)
    pairs of one group that psi orders right, 0.5 = no information) over the off-policy steps (psi trained on those
    very completions: in-sample), `pacs/critic_ranking_fresh` (each generation's first step: completions the policy
    has not trained on, out of sample; exactly 0.5 with the rollout anchor, where psi == 0 there; not
    logged by the reference anchor where pi_ref equals the policy), `pacs/critic_brier_mixed` (Brier
    score of sigma(psi) on groups holding both labels, 0.25 = psi 0), and the per-step medians of |sigma(psi) - 1/2|.
    Every figure is per step first, then the mean (quantiles) over steps. Returns None without off-policy steps
    (GRPO, RLOO).
    """
    off = critic_steps(log_history, steps_per_cycle)
    every = critic_steps(log_history, steps_per_cycle, "all")
    if not off:  # GRPO, RLOO, or every step generated
        return None
    return {
        "summary": "per_step_ranking",
        "off_policy_steps": len(off),
        "critic_margin_step_q10_q50_q90": quantiles([e["pacs/critic_margin"] for e in off]),
        "critic_ranking_off_policy": mean_of(off, "pacs/critic_ranking"),
        "critic_ranking_fresh": mean_of(every, "pacs/critic_ranking_fresh"),
        "fresh_steps": sum("pacs/critic_ranking_fresh" in e for e in every),
        "critic_brier_mixed": mean_of(every, "pacs/critic_brier_mixed"),
        "critic_close_frac": mean_of(off, "pacs/critic_close_frac"),
        "proxy_abs_mean": mean_of(off, "pacs/proxy_abs_mean"),
        "psi_std_mean": mean_of(off, "pacs/psi_std"),
    }


def clip_fraction(log_history: list[dict], max_grad_norm: float) -> float | None:
    """Fraction of optimizer steps whose pre-clipping gradient norm (TRL logs it) exceeded `max_grad_norm`."""
    norms = [e["grad_norm"] for e in log_history if e.get("grad_norm") is not None]
    if not norms:
        return None
    return sum(n > max_grad_norm for n in norms) / len(norms)


def per_step(log_history: list[dict], key: str) -> list[list[float]]:
    """`[[step, value], ...]` of every log entry holding `key` (e.g. TRL's "entropy", for a curve over training)."""
    return [[e["step"], e[key]] for e in log_history if e.get(key) is not None and "step" in e]


# Running many runs: a JSON file per finished run, and a pool of worker processes ------------------------------------


class RunCache:
    """One JSON file per finished run under `directory`, valid while its `key` (every setting that changes the run)
    is the same. An interrupted or extended invocation then redoes nothing, and a run added later (a new config, a
    new seed) leaves the others alone.
    """

    def __init__(self, directory):
        self.directory = Path(directory)

    def get(self, tag: str, key: dict) -> dict | None:
        path = self.directory / f"{tag}.json"
        if path.exists():
            saved = json.loads(path.read_text())
            if saved["key"] == json.loads(json.dumps(key)):
                return saved["run"]
        return None

    def put(self, tag: str, key: dict, run: dict) -> dict:
        """Store `run`; returns it as a later invocation will read it (JSON round trip: tuples become lists)."""
        path = self.directory / f"{tag}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key, "run": run}))
        return json.loads(path.read_text())["run"]


def run_missing(specs: list, cached, run, runs: list, save, jobs: int = 1, cached_only: bool = False, order=None):
    """Add every spec's run to `runs`: `cached(spec)` where it is not None, else `run(spec)`, `jobs` at a time (in
    the order `sorted(..., key=order)` when given), calling `save()` after each new run. `cached_only`: run nothing.
    """
    todo = []
    for spec in specs:
        found = cached(spec)
        if found is None:
            todo.append(spec)
        elif found not in runs:
            runs.append(found)
    if cached_only:
        return

    def done(result):
        runs.append(result)
        save()

    run_all(run, sorted(todo, key=order) if order else todo, jobs, done)


def run_all(fn, specs: list, jobs: int, on_result) -> None:
    """`on_result(fn(spec))` for every spec: in this process for `jobs` <= 1, else in `jobs` spawned workers."""
    if jobs <= 1 or len(specs) <= 1:
        for spec in specs:
            on_result(fn(spec))
        return
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        for result in pool.map(fn, specs):
            on_result(result)
