"""`pacs.run_lock`: one run per output folder (the lock: live refused in one line, stale taken over with a warning
that says why, released on exit) and no orphaned workers (a worker stops when its launcher is gone). The 2-process
`kill -9` of a launcher is in tests/test_resume.py, with the reference run it resumes to."""

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from pacs import run_lock
from pacs.run_lock import LOCK_FILE, OutputDirInUse, check_output_dir, hold_output_dir, read_lock


TIMEOUT_S = 1800.0  # the process-group timeout (ddp_timeout's default)


def _write_lock(folder, host: str, pid: int, age_s: float = 0.0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    path.write_text(json.dumps({"host": host, "pid": pid, "started": time.time() - age_s, "token": "other"}))
    os.utime(path, (time.time() - age_s, time.time() - age_s))


@pytest.fixture
def live_pid():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield sleeper.pid
    sleeper.kill()
    sleeper.wait()


def _dead_pid() -> int:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()  # reaped: the pid is free
    return done.pid


def test_a_lock_is_taken_held_once_per_process_and_released(tmp_path):
    out = tmp_path / "out"
    lock = hold_output_dir(str(out), TIMEOUT_S)
    recorded = read_lock(str(out))
    assert (recorded["host"], recorded["pid"]) == (socket.gethostname(), os.getpid())
    assert abs(recorded["started"] - time.time()) < 60
    assert hold_output_dir(str(out), TIMEOUT_S) is lock  # re-entrant: the same process's run
    check_output_dir(str(out), TIMEOUT_S)  # this process's own lock is no other run
    lock.release()
    assert not (out / LOCK_FILE).exists()
    hold_output_dir(str(out), TIMEOUT_S).release()  # free again


@pytest.mark.parametrize("where", ["this host", "another host"])
def test_a_live_run_is_refused_in_one_line(tmp_path, live_pid, where):
    out = tmp_path / "out"
    host = socket.gethostname() if where == "this host" else "node-7"
    _write_lock(out, host, live_pid if where == "this host" else 12345, age_s=TIMEOUT_S / 2)
    for attempt in (check_output_dir, hold_output_dir):
        with pytest.raises(OutputDirInUse, match=f"is in use by a live run .*on {host}, started") as error:
            attempt(str(out), TIMEOUT_S)
        assert "\n" not in str(error.value) and "--output_dir" in str(error.value)
    assert json.loads((out / LOCK_FILE).read_text())["token"] == "other"  # untouched


@pytest.mark.parametrize("where", ["this host", "another host"])
def test_a_stale_lock_is_taken_over_with_a_warning(tmp_path, caplog, where):
    out = tmp_path / "out"
    if where == "this host":
        _write_lock(out, socket.gethostname(), _dead_pid())
        why = r"its process \d+ on this host is gone"
    else:
        _write_lock(out, "node-7", 12345, age_s=TIMEOUT_S + 60)
        why = r"host node-7 has not refreshed it for \d+ s \(> the 1800 s timeout\)"
    check_output_dir(str(out), TIMEOUT_S)  # no refusal, and nothing taken
    assert json.loads((out / LOCK_FILE).read_text())["token"] == "other"
    with caplog.at_level(logging.WARNING, logger="pacs.run_lock"):
        lock = hold_output_dir(str(out), TIMEOUT_S)
    assert read_lock(str(out))["pid"] == os.getpid()
    (record,) = [r.getMessage() for r in caplog.records if "Taking over the lock" in r.getMessage()]
    assert str(out) in record and re.search(why, record), record
    lock.release()


def test_the_holder_refreshes_its_lock_and_exit_releases_it(tmp_path, monkeypatch):
    out = tmp_path / "out"
    code = textwrap.dedent(f"""
        import os, sys, time
        from pacs import run_lock
        run_lock.REFRESH_S = 0.2
        run_lock.hold_output_dir({str(out)!r}, 1800)
        path = os.path.join({str(out)!r}, run_lock.LOCK_FILE)
        os.utime(path, (time.time() - 1000, time.time() - 1000))
        time.sleep(1.5)
        print(round(time.time() - os.path.getmtime(path)))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout.split()[-1]) < 5  # refreshed while held
    assert not (out / LOCK_FILE).exists()  # released at exit


def test_a_worker_stops_when_its_launcher_is_killed(tmp_path):
    # launcher -> worker in a session of its own (as torchrun starts them): kill -9 of the launcher's process group
    # does not reach the worker; the parent-death signal does
    pid_file = tmp_path / "worker.pid"
    worker = (
        "import os, time; from pacs.run_lock import stop_with_launcher; stop_with_launcher(); "
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    )
    launcher = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {worker!r}], start_new_session=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", launcher], start_new_session=True)
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    pid = int(pid_file.read_text())
    assert run_lock._alive(pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while run_lock._alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not run_lock._alive(pid), "the worker outlived its launcher"


GATE_REWARD = """
import os, time


def gate_reward(completions, **kwargs):
    # the run's first reward call waits at the gate: the test knows the run is training, and for how long
    open(os.environ["PACS_TEST_REACHED"], "w").close()
    while not os.path.exists(os.environ["PACS_TEST_GATE"]):
        time.sleep(0.1)
    return [0.0] * len(completions)
"""


def test_a_second_pacs_train_into_a_live_runs_folder_is_refused_and_the_first_finishes(tiny_model_dir, tmp_path):
    (tmp_path / "gate_reward.py").write_text(GATE_REWARD)
    out, reached, gate = tmp_path / "out", tmp_path / "reached", tmp_path / "gate"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PACS_TEST_REACHED": str(reached),
           "PACS_TEST_GATE": str(gate)}  # fmt: skip
    cmd = [sys.executable, "-m", "pacs", "train", "--config", "tiny_cpu", "--model_name_or_path", tiny_model_dir,
           "--output_dir", str(out), "--max_steps", "2", "--eval_strategy", "no", "--save_strategy", "steps",
           "--save_steps", "2", "--reward_funcs", "gate_reward.gate_reward", "--resume_from_checkpoint", "auto"]  # fmt: skip
    first = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600
        while not reached.exists():  # the first run is training (its model loaded, its first rollout scored)
            assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()[-3000:]
            time.sleep(0.2)
        assert read_lock(str(out))["pid"] == first.pid
        second = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        errors = [line for line in second.stderr.splitlines() if "error" in line.lower()]
        assert second.returncode == 2, second.stderr[-3000:]
        assert len(errors) == 1 and errors[0].startswith("pacs train: error: ")
        assert f"{out} is in use by a live run (process {first.pid} on {socket.gethostname()}" in errors[0]
        assert read_lock(str(out))["pid"] == first.pid  # the first run's lock, untouched
    finally:
        gate.touch()
    text = first.communicate(timeout=600)[0]
    assert first.returncode == 0, text[-5000:]  # the first run, unharmed: trained to the end, saved its model
    assert (out / "model.safetensors").exists() and (out / "checkpoint-2" / "pacs_checkpoint_complete.json").exists()
    assert not (out / LOCK_FILE).exists()  # released on exit
