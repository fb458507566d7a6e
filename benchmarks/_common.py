"""Shared helpers of the benchmark scripts: offline environment, machine/version report, summary statistics.

Not run on its own; `benchmarks/step_cost.py` and `benchmarks/learning.py` import it.
"""

from __future__ import annotations

import os


for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_DISABLED": "true",
}.items():
    os.environ.setdefault(_key, _value)

import datetime  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402


def load_average() -> str:
    """The 1/5/15-minute load averages as a string, e.g. "1.93 2.10 2.05"."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # not on every platform
        return "n/a"


def machine_info() -> dict:
    """Date, host, CPU model, core count, RAM, GPU and package versions, for the header of a results file."""
    import torch
    import transformers
    import trl

    import pacs

    cpu = platform.processor() or "unknown"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
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
        "load_average_start": load_average(),
    }
    try:
        info["pacs_git"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except FileNotFoundError:
        pass
    return info


def machine_markdown(info: dict) -> str:
    """The machine/version block of a results file."""
    lines = [
        f"- date: {info['date']}",
        f"- machine: {info['cpu']}, {info['nproc']} CPU cores, {info['ram_gib']} GiB RAM"
        + (f", GPU {info['gpu']}" if info.get("gpu") else ", no GPU"),
        f"- load average (1/5/15 min) at start: {info['load_average_start']}; at end: {info.get('load_average_end', 'n/a')}",
        f"- versions: python {info['python']}, torch {info['torch']}, transformers {info['transformers']}, "
        f"trl {info['trl']}, pacs {info['pacs']}" + (f" (git {info['pacs_git']})" if info.get("pacs_git") else ""),
    ]
    return "\n".join(lines)


def min_med_max(values) -> tuple[float, float, float]:
    """(min, median, max) of a non-empty sequence."""
    values = list(values)
    return min(values), statistics.median(values), max(values)


def fmt3(values, spec: str = ".3f") -> str:
    """ "median (min–max)" of a sequence, formatted with `spec`."""
    lo, med, hi = min_med_max(values)
    return f"{med:{spec}} ({lo:{spec}}–{hi:{spec}})"


# What PACS's critic does and how often clipping bites ------------------------------------------------------------


def recording(trainer_cls):
    """A subclass of `trainer_cls` that keeps, for every PACS loss call, each completion's sigma(psi), label and step.

    `PACSTrainer` logs only per-step means of psi; the question "is the critic term doing anything" needs the
    distribution of |sigma(psi) - 1/2| per completion, and the critic's accuracy on the off-policy steps only (on the
    first step of a generation round psi == 0 exactly). For GRPO and RLOO the subclass records nothing extra.
    """

    class Recording(trainer_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.critic_records: list[dict] = []

        def _log_pacs_metrics(self, mode, loss, psi, labels, weights, num_generations):
            super()._log_pacs_metrics(mode, loss, psi, labels, weights, num_generations)
            if mode != "train":
                return
            # psi: the gathered critic logits (older pacs passed its stats dict here, with "probs")
            probs = psi["probs"] if isinstance(psi, dict) else psi.sigmoid()
            keep = weights > 0
            self.critic_records.append(
                {
                    # optimizer steps done before this one; TRL generates when it is a multiple of steps_per_generation
                    "step": self.state.global_step,
                    "probs": probs.detach()[keep].float().tolist(),
                    "labels": labels.detach()[keep].float().tolist(),
                }
            )

    Recording.__name__ = Recording.__qualname__ = f"Recording{trainer_cls.__name__}"
    return Recording


def quantiles(values, qs=(0.1, 0.5, 0.9)) -> list[float]:
    """Empirical quantiles (nearest rank) of a non-empty sequence."""
    values = sorted(values)
    return [values[min(len(values) - 1, int(q * len(values)))] for q in qs]


def critic_summary(records: list[dict], steps_per_generation: int) -> dict | None:
    """|sigma(psi) - 1/2| quantiles and critic accuracy over the off-policy steps of `recording(...).critic_records`.

    The critic's guess for a completion is "correct" when sigma(psi) > 1/2; its accuracy is measured against the
    reward label. Returns None when nothing was recorded (GRPO, RLOO).
    """
    off = [r for r in records if r["step"] % steps_per_generation != 0]
    if not off:
        return None
    dev = [abs(p - 0.5) for r in off for p in r["probs"]]
    hits = [(p > 0.5) == (y > 0.5) for r in off for p, y in zip(r["probs"], r["labels"])]
    # accuracy of "always guess the majority label" on the same completions: what the critic has to beat
    pos = sum(y > 0.5 for r in off for y in r["labels"]) / len(hits)
    # per-step accuracy only where the step has both labels (elsewhere the sign of psi cannot be right or wrong alone)
    return {
        "off_policy_steps": len(off),
        "completions": len(dev),
        "abs_sigma_psi_minus_half_q10_q50_q90": quantiles(dev),
        "abs_sigma_psi_minus_half_mean": sum(dev) / len(dev),
        "frac_abs_dev_over_0.05": sum(d > 0.05 for d in dev) / len(dev),
        "critic_accuracy_off_policy": sum(hits) / len(hits),
        "majority_label_accuracy": max(pos, 1 - pos),
    }


def clip_fraction(log_history: list[dict], max_grad_norm: float) -> float | None:
    """Fraction of optimizer steps whose pre-clipping gradient norm (TRL logs it) exceeded `max_grad_norm`."""
    norms = [e["grad_norm"] for e in log_history if e.get("grad_norm") is not None]
    if not norms:
        return None
    return sum(n > max_grad_norm for n in norms) / len(norms)
