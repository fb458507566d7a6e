"""`pacs.grpo.resume` (how a launch resumes, decided once per process: the run identity, the refusals before any model
loads), the test-only kill hook (tests/faults/sitecustomize.py, installed on a launch by its `PYTHONPATH`) and the
launches they serve: a worker killed under `--max_restarts 1` (inside a generation batch, inside a checkpoint save),
the launcher killed with `kill -9` (no worker outlives it; the rerun takes over the lock), two machines on one host
(the docs' SLURM lines, plain DDP), the hostfile launch's `deepspeed` command.

The distributed tests share one uninterrupted reference run (ZeRO-3, 2 processes, 12 steps, a checkpoint every 2):
each of them ends with that run's final model, byte for byte. They run one at a time (one module, one fixture)."""

import base64
import contextlib
import hashlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from pacs.grpo.checkpoints import COMPLETE_MARKER, run_identity, write_complete_marker
from pacs.grpo.resume import ResumeRefused, resume_decision
from pacs.run_lock import LOCK_FILE, OutputDirInUse, clear_for_fresh_start
from tests.launching import free_port


ROOT = Path(__file__).resolve().parents[1]
FAULTS = Path(__file__).resolve().parent / "faults"  # the kill hook's `sitecustomize`: first on a launch's PYTHONPATH
DOCS = ROOT / "docs" / "recipes.md"
ARGS = types.SimpleNamespace(
    per_device_train_batch_size=4, gradient_accumulation_steps=1, num_generations=4, steps_per_generation=2, seed=42
)
STEPS, SAVE_STEPS = 12, 2
TIMING_KEYS = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


def resume_checkpoint(resume, output_dir: str, identity: dict, overwrite_output_dir: bool = False) -> str | None:
    """The checkpoint `pacs train` resumes from, for a run of 100 steps: its overwrite policy (`pacs.run_lock`, on the
    process that may delete), then the resume decision."""
    clear_for_fresh_start(output_dir, resume, overwrite_output_dir, delete=True)
    args = types.SimpleNamespace(output_dir=output_dir, max_steps=100, num_train_epochs=3.0)
    return resume_decision(resume, args, identity).checkpoint


def _checkpoint(out: Path, step: int, world_size: int = 2, **run) -> Path:
    folder = out / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    identity = {**run_identity("/models/tiny", world_size, ARGS), **run}
    write_complete_marker(folder, global_step=step, world_size=world_size, run=identity)
    return folder


# ---------------------------------------------------------------------------------------------------------------------
# Which checkpoint, and the refusals (no model, no launch)
# ---------------------------------------------------------------------------------------------------------------------


def test_auto_takes_the_newest_complete_checkpoint_or_starts_fresh(tmp_path):
    here = run_identity("/models/tiny", 2, ARGS)
    assert resume_checkpoint("auto", str(tmp_path / "new"), here) is None  # nothing there: a fresh start
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4)
    (tmp_path / "checkpoint-6").mkdir()  # a save that did not finish
    assert resume_checkpoint("auto", str(tmp_path), here) == str(tmp_path / "checkpoint-4")


def test_an_elastic_restart_resumes_whatever_the_recipe_says(tmp_path, monkeypatch):
    _checkpoint(tmp_path, 4)
    here = run_identity("/models/tiny", 2, ARGS)
    with pytest.raises(OutputDirInUse, match="already holds the checkpoints"):
        resume_checkpoint(None, str(tmp_path), here)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert resume_checkpoint(None, str(tmp_path), here) == str(tmp_path / "checkpoint-4")
    # a named older checkpoint too: the restarted group continues from the newest complete one
    _checkpoint(tmp_path, 6)
    assert resume_checkpoint(str(tmp_path / "checkpoint-4"), str(tmp_path), here) == str(tmp_path / "checkpoint-6")


@pytest.mark.parametrize(
    ("resume", "world_size", "changed", "message"),
    [
        ("auto", 1, {}, "was saved by 2 processes and this launch has 1: .* universal checkpoint .* weights-only"),
        ("checkpoint-4", 4, {}, "was saved by 2 processes and this launch has 4"),
        ("true", 2, {"num_generations": 8}, r"another run's checkpoint \(num_generations 8 there, 4 here\)"),
        ("auto", 2, {"model": "/models/other"}, "another run's checkpoint .*model /models/other there"),
        ("auto", 2, {"seed": 7}, r"another run's checkpoint \(seed 7 there, 42 here\)"),
        ("checkpoint-8", 2, {}, "checkpoint-8 does not exist .*newest complete one in .* is .*checkpoint-4"),
        (
            None,
            2,
            {},
            "already holds the checkpoints of a run .*--resume_from_checkpoint auto.*--overwrite_output_dir",
        ),
    ],
)
def test_another_runs_checkpoint_is_refused_in_one_line(tmp_path, resume, world_size, changed, message):
    _checkpoint(tmp_path, 4, **changed)
    if resume and resume.startswith("checkpoint-"):
        resume = str(tmp_path / resume)
    with pytest.raises((ResumeRefused, OutputDirInUse), match=message) as error:
        resume_checkpoint(resume, str(tmp_path), run_identity("/models/tiny", world_size, ARGS))
    assert "\n" not in str(error.value)


def test_overwrite_output_dir_allows_a_fresh_start(tmp_path):
    _checkpoint(tmp_path, 4)
    assert clear_for_fresh_start(str(tmp_path), None, True) == []  # a process that may not delete: nothing deleted
    assert (tmp_path / "checkpoint-4").is_dir()
    assert clear_for_fresh_start(str(tmp_path), "auto", True, delete=True) == []  # a resume asked for: not its policy
    assert resume_checkpoint(None, str(tmp_path), run_identity("/models/tiny", 2, ARGS), True) is None
    assert not (tmp_path / "checkpoint-4").exists()  # deleted, so that a later `auto` cannot pick up the old run


def test_pacs_train_refuses_before_launching_and_exits_2(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    _checkpoint(out, 4)  # saved by 2 processes of another model
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    base = [sys.executable, "-m", "pacs", "train", "--config", "tiny_cpu", "--model_name_or_path", tiny_model_dir,
            "--output_dir", str(out), "--accelerate_config", "zero3", "--mixed_precision", "no"]  # fmt: skip
    cases = {
        ("--num_processes", "1", "--resume_from_checkpoint", str(out / "checkpoint-4")): "saved by 2 processes",
        ("--num_processes", "2", "--resume_from_checkpoint", "auto"): "another run's checkpoint",
        ("--num_processes", "2"): "already holds the checkpoints",
    }
    for extra, message in cases.items():
        started = time.monotonic()
        result = subprocess.run([*base, *extra], env=env, capture_output=True, text=True, timeout=120)
        errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
        assert result.returncode == 2, result.stderr[-2000:]
        assert len(errors) == 1 and message in errors[0] and errors[0].startswith("pacs train: error:")
        assert "accelerate launch" not in result.stderr  # refused before anything started
        assert time.monotonic() - started < 60


def _faults():
    spec = importlib.util.spec_from_file_location("pacs_test_faults", FAULTS / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # without PACS_TEST_KILL_AT in this process's environment: installs nothing
    return module


faults = _faults()
KILL_ENV, fault_point = faults.ENV, faults.fault_point


def test_the_launching_process_decides_once_and_takes_no_lock(tmp_path, monkeypatch, caplog):
    import logging

    import pacs.train

    launched = []
    monkeypatch.setattr(pacs.train, "launch", launched.append)  # what would start the workers: recorded, not run
    out = tmp_path / "run"
    _checkpoint(out, 4, seed=0)  # tiny_cpu's seed
    argv = ["--config", "tiny_cpu", "--model_name_or_path", "/models/tiny", "--output_dir", str(out),
            "--accelerate_config", "zero3", "--num_processes", "2", "--resume_from_checkpoint", "auto",
            "--max_steps", "8"]  # fmt: skip
    monkeypatch.setattr(pacs.train, "check_inputs", lambda *args: None)  # /models/tiny: the identity's, not on disk
    with caplog.at_level(logging.DEBUG, logger="pacs.grpo.resume"):
        assert pacs.train.train_command(argv) == 0
    decisions = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Resume decision: ")]
    assert decisions == [f"Resume decision: resuming from {out / 'checkpoint-4'}."]  # once, in this process
    assert len(launched) == 1 and not (out / LOCK_FILE).exists()  # the run's first process takes the lock


def test_the_kill_hook_is_only_armed_on_the_first_attempt(monkeypatch):
    monkeypatch.setenv(KILL_ENV, "1:generation:4")
    fault_point("generation", 3, 1)  # not yet
    fault_point("generation", 9, 0)  # another rank
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    fault_point("generation", 9, 1)  # a restarted attempt trains through
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv(KILL_ENV, "1:nowhere:4")
    with pytest.raises(ValueError, match="is not RANK:POINT:STEP"):
        fault_point("generation", 9, 1)


def test_the_kill_hook_is_the_tests_alone_and_installs_on_a_launch():
    # nothing of it in the wheel's code
    src = ROOT / "src"
    assert not [p for p in src.rglob("*.py") if re.search(r"PACS_TEST_KILL_AT|fault_point", p.read_text())]
    # a process started with the hook on its PYTHONPATH and PACS_TEST_KILL_AT set gets the layer's two points wrapped
    code = (
        "import pacs.grpo.trainer as t; c = t.HardenedGRPOTrainer; "
        "print(getattr(c, '_test_faults_installed', False), c._save_checkpoint.__module__)"
    )
    path = os.pathsep.join([str(FAULTS), *sys.path])
    for env, expected in (({KILL_ENV: "1:generation:4"}, "True sitecustomize"), ({}, "False pacs.grpo.trainer")):
        environ = {k: v for k, v in os.environ.items() if k != KILL_ENV} | {"PYTHONPATH": path, **env}
        result = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120)
        assert result.stdout.split() == expected.split(), result.stderr[-2000:]


def test_max_restarts_sets_the_c10d_rendezvous(monkeypatch):
    import pacs.train
    from pacs.recipes.reader import read_recipe

    for key in ("PET_RDZV_ENDPOINT", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"):
        monkeypatch.delenv(key, raising=False)
    port = free_port()
    recipe = read_recipe(["--config", "tiny_cpu", "--accelerate_config", "zero3", "--max_restarts", "1",
                          "--main_process_port", str(port)])  # fmt: skip
    assert pacs.train._restart_options(recipe) == ["--rdzv_backend", "c10d"]  # the config file's `static` is ignored
    assert os.environ["PET_RDZV_ENDPOINT"] == f"127.0.0.1:{port}"
    assert os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # torch 2.13: pytorch#135712
    assert pacs.train._restart_options(read_recipe(["--config", "tiny_cpu", "--accelerate_config", "zero3"])) == []


# ---------------------------------------------------------------------------------------------------------------------
# Launched runs: the shared reference, then kills, a stop, two machines
# ---------------------------------------------------------------------------------------------------------------------


class Launched:
    """A `pacs train` launch in its own session; every output line with the time it arrived."""

    def __init__(self, cmd: list[str], env: dict | None = None, cwd: Path = ROOT):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})}
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"no exit within {timeout} s:\n{self.text()[-5000:]}")
        self.reader.join(timeout=10)
        return rc

    def stop(self):
        # the launcher and every process under it (torchrun starts each worker in a session of its own)
        for pid in [*_descendants(self.proc.pid), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def pacs_train(model_dir: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pacs", "train", *tiny_run(model_dir, out), *extra]


def tiny_run(model_dir: str, out: Path) -> list[str]:
    return ["--config", "tiny_cpu", "--model_name_or_path", model_dir, "--output_dir", str(out), "--mixed_precision",
            "no", "--expected_world_size", "2", "--max_steps", str(STEPS), "--save_strategy", "steps",
            "--save_steps", str(SAVE_STEPS), "--eval_strategy", "no"]  # fmt: skip


def run_ok(launched: Launched, timeout: float = 600) -> str:
    rc = launched.wait(timeout)
    assert rc == 0, f"exit {rc}:\n{launched.text()[-6000:]}"
    return launched.text()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def log_history(out: Path) -> list[dict]:
    state = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    return [{k: v for k, v in entry.items() if k not in TIMING_KEYS} for entry in state["log_history"]]


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory) -> Path:
    """The uninterrupted run: ZeRO-3, one machine, 2 processes."""
    pytest.importorskip("deepspeed")
    out = tmp_path_factory.mktemp("reference") / "out"
    launch = ["--accelerate_config", "zero3", "--num_processes", "2", "--main_process_port", str(free_port())]
    run_ok(Launched(pacs_train(tiny_model_dir, out, *launch)))
    assert (out / "model.safetensors").exists()
    return out


def _kill_time(text: str) -> float:
    (match,) = re.findall(r"sends itself SIGKILL at .* \(unix time ([\d.]+)\)", text)
    return float(match)


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("kill_at", "resumed", "interrupted"),
    [("1:generation:4", 4, None), ("1:optimizer_shard:6", 4, 6)],
    ids=["inside-a-generation-batch", "inside-a-checkpoint-save"],
)
def test_a_killed_worker_restarts_and_the_run_ends_as_the_uninterrupted_one(
    reference, tiny_model_dir, tmp_path, kill_at, resumed, interrupted
):
    out = tmp_path / "out"
    launch = ["--accelerate_config", "zero3", "--num_processes", "2", "--main_process_port", str(free_port()),
              "--max_restarts", "1", "--resume_from_checkpoint", "auto"]  # fmt: skip
    hook = {KILL_ENV: kill_at, "PYTHONPATH": os.pathsep.join([str(FAULTS), *sys.path])}  # the test-only kill hook
    launched = Launched(pacs_train(tiny_model_dir, out, *launch), env=hook)
    text = run_ok(launched)
    killed = _kill_time(text)

    # 1. restarted by the agent, from the newest complete checkpoint; the interrupted save is skipped, named
    assert f"Resume decision: resuming from {out / f'checkpoint-{resumed}'}." in text
    if interrupted is not None:
        assert f"Not resuming from {out / f'checkpoint-{interrupted}'}: its save did not finish" in text
    # 2. the weights and the logs of the uninterrupted run
    assert sha256(out / "model.safetensors") == sha256(reference / "model.safetensors")
    assert log_history(out) == log_history(reference)
    # 3. the first attempt's complete checkpoints were not written again
    for step in range(SAVE_STEPS, resumed + 1, SAVE_STEPS):
        files = [p for p in (out / f"checkpoint-{step}").rglob("*") if p.is_file()]
        assert files and max(p.stat().st_mtime for p in files) <= killed  # complete before the kill, and untouched
    # 4. kill -> training again: the first logged training step after the kill
    again = next(t for t, line in launched.lines if t > killed and "'pacs/loss'" in line)
    print(f"\n{kill_at}: kill -> training again {again - killed:.1f} s")


def _alive(pids: list[int]) -> list[int]:
    """The processes of `pids` still running (a zombie is not)."""
    alive = []
    for pid in pids:
        with contextlib.suppress(OSError, IndexError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                alive.append(pid)
    return alive


@pytest.mark.distributed
def test_kill_9_of_the_launcher_leaves_no_worker_and_the_rerun_ends_as_the_uninterrupted_one(
    reference, tiny_model_dir, tmp_path
):
    out = tmp_path / "out"

    def launch() -> Launched:
        options = ["--accelerate_config", "zero3", "--num_processes", "2", "--main_process_port", str(free_port()),
                   "--resume_from_checkpoint", "auto"]  # fmt: skip
        return Launched(pacs_train(tiny_model_dir, out, *options))

    first = launch()
    deadline = time.monotonic() + 600
    while not (out / "checkpoint-4" / COMPLETE_MARKER).exists():  # training, with complete checkpoints behind it
        assert first.proc.poll() is None and time.monotonic() < deadline, first.text()[-5000:]
        time.sleep(0.1)
    workers = _descendants(first.proc.pid)
    assert len(workers) >= 2 and (out / LOCK_FILE).exists()
    # 1. kill -9 of the launcher's process group: torchrun's workers run in sessions of their own, out of its reach;
    #    they stop by themselves (their parent-death signal), within a bounded time
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    deadline = time.monotonic() + 30
    while _alive(workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(workers), f"workers alive 30 s after the launcher's kill -9: {_alive(workers)}"
    # 2. the same command again: it takes over the dead run's lock, resumes, and ends as the uninterrupted run
    text = run_ok(launch())
    assert "Taking over the lock of" in text and "on this host is gone" in text
    assert "Resume decision: resuming from" in text
    assert sha256(out / "model.safetensors") == sha256(reference / "model.safetensors")
    assert log_history(out) == log_history(reference)
    assert not (out / LOCK_FILE).exists()


def slurm_script(model_dir: str, out: Path, port: int) -> str:
    """The docs' SLURM lines with the allowed substitutions: the tiny recipe and model, 1 process per node, CPU flags."""
    block = re.search(r"```bash\n(#!/bin/bash\n#SBATCH.*?)```", DOCS.read_text(), re.S).group(1)
    assert "--config qwen3_8b_pacs" in block and "8 * SLURM_NNODES" in block
    tiny = " ".join(tiny_run(model_dir, out))
    cpu = f"{tiny} --accelerate_config zero3_multinode --main_process_port {port}"
    return block.replace("--config qwen3_8b_pacs", cpu).replace("8 * SLURM_NNODES", "1 * SLURM_NNODES")


STAND_INS = {
    # `scontrol show hostnames LIST`: this host, once per node
    "scontrol": '#!/bin/bash\nfor i in $(seq "$SLURM_NNODES"); do echo 127.0.0.1; done\n',
    # `srun CMD`: one task per node, in parallel, with that node's SLURM_NODEID; fails if any task fails
    "srun": '#!/bin/bash\npids=()\nfor ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i SLURM_PROCID=$i "$@" &\n'
    'pids+=($!); done\nrc=0\nfor p in "${pids[@]}"; do wait "$p" || rc=1; done\nexit $rc\n',
    # `pdsh ... CMD`: records the command it was given
    "pdsh": '#!/bin/bash\nprintf "%s\\n" "$@" > "$PDSH_RECORD"\n',
    "ssh": "#!/bin/bash\necho 127.0.0.1\n",  # DeepSpeed's runner checks that the first host answers
}


def stand_ins(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in STAND_INS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    pacs = bin_dir / "pacs"  # `pacs` as installed, on this interpreter
    pacs.write_text(f'#!/bin/bash\nexec {sys.executable} -m pacs "$@"\n')
    pacs.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.distributed
def test_the_docs_slurm_lines_train_two_machines_as_one(reference, tiny_model_dir, tmp_path):
    # two machines of one process each (zero3_multinode, --machine_rank 0|1, one shared output_dir) end with the model
    # of one machine with two processes
    out = tmp_path / "out"
    script = tmp_path / "job.sh"
    script.write_text(slurm_script(tiny_model_dir, out, free_port()))
    slurm = {"SLURM_JOB_NODELIST": "node-[1-2]", "SLURM_NNODES": "2", "SLURM_JOB_ID": "1"}
    text = run_ok(Launched(["bash", str(script)], env={**stand_ins(tmp_path), **slurm}))
    assert text.count("accelerate launch --config_file") == 2 and "zero3_multinode.yaml" in text
    assert sha256(out / "model.safetensors") == sha256(reference / "model.safetensors")
    assert log_history(out) == log_history(reference)


@pytest.mark.distributed
def test_plain_ddp_on_two_machines(reference, tiny_model_dir, tmp_path):
    out, port = tmp_path / "out", free_port()
    machines = [
        Launched(
            pacs_train(
                tiny_model_dir,
                out,
                "--accelerate_config",
                "ddp",
                "--num_machines",
                "2",
                "--num_processes",
                "2",
                "--machine_rank",
                str(rank),
                "--main_process_ip",
                "127.0.0.1",
                "--main_process_port",
                str(port),
            )
        )  # fmt: skip
        for rank in (0, 1)
    ]
    for machine in machines:
        run_ok(machine)
    # against the ZeRO-3 reference (no second reference run): DDP all-reduces the gradients where ZeRO-3
    # reduce-scatters them, so the sums differ in the last bits (on CPU: 1e-6 against an update of 1.5e-4)
    from safetensors.torch import load_file

    ddp, zero3 = load_file(out / "model.safetensors"), load_file(reference / "model.safetensors")
    start = load_file(Path(tiny_model_dir) / "model.safetensors")
    assert ddp.keys() == zero3.keys()
    differ = max((ddp[k] - zero3[k]).abs().max().item() for k in ddp)
    update = max((zero3[k] - start[k]).abs().max().item() for k in zero3)
    assert update > 1e-5 and differ < 0.02 * update, (differ, update)


@contextlib.contextmanager
def holding_port(port: int):
    """`port` held by a listening socket of this process (another process, to the launch) while the block runs; a
    port already held by someone else stays held."""
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:  # already in use: held by another process
            pass
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) == 0, f"port {port} is not held"
        yield


def test_the_hostfile_launch_builds_the_deepspeed_command(tiny_model_dir, tmp_path):
    pytest.importorskip("deepspeed")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-1 slots=1\nnode-2 slots=1\n")
    shipped = (ROOT / "src" / "pacs" / "accelerate_configs" / "zero3_hostfile.yaml").read_text()
    assert "deepspeed_hostfile: /job/hostfile" in shipped
    config = tmp_path / "zero3_hostfile.yaml"
    config.write_text(shipped.replace("/job/hostfile", str(hostfile)))  # the docs: point a copy to the hostfile
    record = tmp_path / "pdsh.txt"
    port = free_port()
    cmd = pacs_train(tiny_model_dir, tmp_path / "out", "--accelerate_config", str(config), "--num_processes", "2",
                     "--main_process_port", str(port))  # fmt: skip
    with holding_port(29500):  # accelerate's default port, held by another job on a busy machine: not needed here
        run_ok(Launched(cmd, env={**stand_ins(tmp_path), "PDSH_RECORD": str(record)}, cwd=tmp_path), timeout=180)
    argv = record.read_text().splitlines()
    assert f"--master_port={port}" in argv
    assert argv[argv.index("-w") + 1] == "node-1,node-2"
    world = next(a for a in argv if a.startswith("--world_info="))
    assert json.loads(base64.urlsafe_b64decode(world.split("=", 1)[1])) == {"node-1": [0], "node-2": [0]}
    assert "--master_addr=node-1" in argv and "--node_rank=%n" in argv
    module = argv.index("pacs.train")
    assert "--module" in argv[:module]
    assert argv[module + 1 : module + 3] == ["--config", str(ROOT / "src" / "pacs" / "recipes" / "tiny_cpu.yaml")]
    assert "ACCELERATE_DEEPSPEED_ZERO_STAGE=3" in " ".join(argv)
    assert not (tmp_path / "out").exists()  # nothing trained here (pdsh would have started the nodes), no lock taken
