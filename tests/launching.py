"""Launching `accelerate launch` from a test or a check: a free port for the rendezvous, the launch command, an offline
run of it, and a DeepSpeed ZeRO-3 config for one CPU process. Used by the tests and by the GPU check
(benchmarks/gpu_check.py's zero3 section, which runs from the repository root: `tests` is importable there)."""

from __future__ import annotations

import os


ZERO3_CPU_ACCELERATE_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  zero_stage: 3
  zero3_init_flag: true
  offload_optimizer_device: none
  offload_param_device: none
mixed_precision: 'no'
num_machines: 1
num_processes: 1
use_cpu: true
"""
"""An `accelerate launch --config_file` for DeepSpeed ZeRO-3 on one CPU process, for tests and smoke runs."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a launch's rendezvous: tests never rely on accelerate's default 29500,
    which another job on the machine may hold."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_launch() -> list[str]:
    """The command that starts `accelerate launch` (the console script, or the module where it is not on PATH) on a
    free port (`free_port`), so that a launch never fails on a port another process holds."""
    import shutil
    import sys

    exe = shutil.which("accelerate")
    command = [exe, "launch"] if exe else [sys.executable, "-m", "accelerate.commands.launch"]
    return [*command, "--main_process_port", str(free_port())]


def run_launched(cmd: list[str], cwd, timeout: int = 900):
    """Run a launch command (`accelerate_launch()` + its arguments) offline, one OpenMP thread per process, and return
    the `subprocess.CompletedProcess`; a failure is an AssertionError carrying the tail of its output."""
    import subprocess

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result
