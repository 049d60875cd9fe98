"""runner/cli/app.py and runner/__main__.py: a signal in the first seconds of a command, before a run's own
handlers take over (runner/training/checkpoints.py), ends it naming the signal, exit 128 + signal."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, TINY, wait_for


def caught(pid: int, signum: int) -> bool:
    """Whether the process has a handler of its own for signum (Linux: SigCgt in /proc/<pid>/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask & (1 << (signum - 1)))


def start(tmp_path, *overrides):
    cmd = [sys.executable, "-m", "runner", f"hydra.run.dir={tmp_path / 'run'}", *TINY, *overrides]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc to see the handler")
def test_sigterm_while_the_command_starts_is_named_and_exits_143(tmp_path):
    proc = start(tmp_path)
    deadline = time.time() + 60
    while not caught(proc.pid, signal.SIGTERM) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)  # within the imports: the first handler, runner/__main__.py's own
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out
    assert "Interrupted by SIGTERM (signal 15)." in out and "Traceback" not in out, out


@pytest.mark.slow
def test_sigterm_before_training_starts_is_named_and_exits_143(tmp_path):
    # Later: the CLI's handler, while the run sets up (its directory exists, MindSpore is loading).
    proc = start(tmp_path)
    deadline = time.time() + 300
    while not (tmp_path / "run" / "runner.log").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 143, out
    assert "SIGTERM (signal 15)" in out and "Traceback" not in out, out


def compilers_writing(path) -> list:
    """The pids of processes whose command line names path (the compiler driver, cc1plus, as, ld)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(path).encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc for the compiler's processes")
def test_sigterm_during_the_onednn_build_stops_the_compiler_and_leaves_no_temporary_file(tmp_path):
    cache = tmp_path / "cache" / "mindspore-runner"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "runner", f"hydra.run.dir={tmp_path / 'run'}", *TINY, "model.conv=onednn"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.time() + 300
    building = []
    while proc.poll() is None and time.time() < deadline:
        building = sorted(cache.glob("tmp*.so")) if cache.is_dir() else []
        if building and compilers_writing(building[0]):
            break
        time.sleep(0.02)
    assert building, "the build was not seen"
    time.sleep(0.5)  # the compiler is at work
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "SIGTERM (signal 15)" in out and "Traceback" not in out, out
    time.sleep(1)  # what an orphaned linker would still write
    assert not list(cache.glob("tmp*.so")) and not compilers_writing(building[0])


def logged_rows(path) -> int:
    """Rows after the header of metrics.csv (one per logged step): a training step has run when > 0."""
    try:
        return max(0, len(path.read_text().splitlines()) - 1)
    except OSError:
        return 0


@pytest.mark.slow
def test_kill_int_mid_training_to_a_background_job_says_sigint_and_exits_130(tmp_path):
    # As `python -m runner ... &` from a script: a shell starts a background job with SIGINT ignored. Once
    # a graph has run, MindSpore's own SIGINT handler turns SIGINT into SIGTERM (runner/training/interrupts.py):
    # the signal must come after logged steps, not during the first step's compile.
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "runner",
        f"hydra.run.dir={run_dir}",
        *(o for o in TINY if not o.startswith(("epochs=", "log_every="))),
        "epochs=50",
        "log_every=5",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    wait_for(proc, lambda: logged_rows(run_dir / "metrics.csv") >= 2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted by SIGINT (signal 2)" in out and "SIGTERM" not in out and "Traceback" not in out, out[-3000:]
    latest = json.loads((run_dir / "checkpoints" / "latest.json").read_text())
    assert latest["global_step"] >= 10 and (run_dir / "checkpoints" / latest["latest"]).is_file()
