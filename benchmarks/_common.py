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
