"""runner/cli/app.py and runner/__main__.py: a signal in the first seconds of a command, before a run's own
handlers take over (runner/training/checkpoints.py), ends it naming the signal, exit 128 + signal; Ctrl-C while
MindSpore imports and on a sweep; a closed pipe ends a command quietly."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO, TINY, needs_compiler, wait_for


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
@needs_compiler()  # it watches the compiler build the library
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


def _loaded(pid: int, library: str) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return library in f.read()
    except OSError:
        return False


def test_ctrl_c_while_mindspore_imports(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", *TINY, f"hydra.run.dir={tmp_path}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    # MindSpore's first native library is mapped early in `import mindspore`; the import goes on for seconds.
    while not _loaded(proc.pid, "mindspore") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and "NameError" not in err, err


@pytest.mark.slow
def test_ctrl_c_on_a_sweep(tmp_path):
    # The job running when the sweep's process gets SIGINT saves a checkpoint and stops; the rest never
    # start; the summary says which is which; the exit status is 130, with no traceback.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = ["-m", f"hydra.sweep.dir={tmp_path}", "seed=0,1,2", "epochs=4", "log_every=1"]
    args += ["padding.height=8", "padding.width=8", "model.width=8", "checkpoint.every_epochs=0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = tmp_path / "0" / "runner.log"
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if log.exists() and " train_loss " in log.read_text():
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)  # the sweep's process only, as a console's Ctrl-C reaches it
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (proc.returncode, out[-2000:], err[-3000:])
    assert "Traceback" not in err and "Interrupted by SIGINT (signal 2)." in err, err
    assert "interrupted #0" in out and "2 not started" in out, out
    assert (tmp_path / "0" / "checkpoints" / "latest.json").exists()  # saved on the signal, not killed
    assert "interrupted" in (tmp_path / "summary.md").read_text()
    assert not (tmp_path / "1").exists()


def test_a_sweep_stopped_by_sigterm_exits_143_naming_it(monkeypatch, capsys):
    # 128 + the signal that reached the sweep (passed on to its job), not 130 whatever it was.
    from hydra_plugins.runner_launcher import isolated_launcher
    from runner.cli import app

    monkeypatch.setitem(isolated_launcher._interrupted, "signal", "SIGTERM")
    assert app.interrupt_signal() == signal.SIGTERM
    with pytest.raises(SystemExit) as e:
        app.quiet_interrupt(app.interrupt_signal())
    assert e.value.code == 143 and "Interrupted by SIGTERM (signal 15)." in capsys.readouterr().err
    monkeypatch.setitem(isolated_launcher._interrupted, "signal", None)
    assert app.interrupt_signal() is None


def test_help_into_a_closed_pipe_exits_quietly():
    # `python -m runner --help | head -1`, made deterministic: the reader is gone before the first write.
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "runner", "--help"], cwd=REPO, stdout=write, stderr=subprocess.PIPE, text=True
        )
    finally:
        os.close(write)
    # Ended by SIGPIPE as `head` expects of a filter (a shell reports 141 = 128 + SIGPIPE), or exit 141.
    assert proc.returncode in (141, -signal.SIGPIPE) and "Traceback" not in proc.stderr, proc.stderr


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


def _signal_at(tmp_path, signum, line, *overrides, also=lambda pid: True, timeout=300):
    """Run `python -m runner` on TINY, send signum once a line of its output contains `line` and also(pid)
    holds, and return (exit status, everything it printed, the run directory)."""
    run_dir = tmp_path / "run"
    proc = start(tmp_path, "log_every=10", *overrides)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    out, sent = [], False
    try:
        for text in proc.stdout:
            out.append(text)
            if not sent and line in text:
                deadline = time.monotonic() + 60
                while not also(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                proc.send_signal(signum)
                sent = True
        proc.wait()
    finally:
        killer.cancel()
    assert sent, "".join(out)
    return proc.returncode, "".join(out), run_dir


def _quiet(out: str) -> bool:
    """Nothing but the runner's own lines: no traceback, no fatal error, no MindSpore error."""
    return not any(noise in out for noise in ("Traceback", "Fatal Python error", "[ERROR]", "Aborted"))


def test_ctrl_c_while_mindspore_loads_is_one_line_and_the_run_is_listed_interrupted(tmp_path):
    # Issue 39: Ctrl-C after the `model.conv=best ...` line crashed in MindSpore's atexit hook (Fatal Python
    # error, exit 134). The signal comes once MindSpore's native module is mapped, while its import goes on.
    from runner.rundir.status import read_run

    code, out, run_dir = _signal_at(
        tmp_path, signal.SIGINT, "model.conv=", also=lambda pid: _loaded(pid, "_c_expression")
    )
    assert code == 130 and _quiet(out), out
    assert out.strip().splitlines()[-1] == "Interrupted by SIGINT (signal 2).", out
    info = read_run(str(run_dir))
    assert info.status == "interrupted" and info.detail == (
        "by SIGINT (signal 2) before its first checkpoint: nothing to resume, run it again"
    ), info


def test_sigterm_mid_training_is_one_line_and_the_run_is_listed_resumable(tmp_path):
    from runner.rundir.status import read_run

    code, out, run_dir = _signal_at(tmp_path, signal.SIGTERM, "step 10/", "epochs=3")
    assert code == 143 and _quiet(out), out
    assert sum("SIGTERM (signal 15)" in line for line in out.splitlines()) == 1, out
    info = read_run(str(run_dir))
    assert info.status == "interrupted" and info.resumable, info
    assert re.fullmatch(
        r"by SIGTERM \(signal 15\); its checkpoint at step \d+ is saved: resume=true continues it", info.detail
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, line, status, detail",
    [
        # MindSpore loading, signalled at once (the import has just begun) and by SIGTERM
        (signal.SIGINT, "model.conv=", "interrupted", "before its first checkpoint"),
        (signal.SIGTERM, "model.conv=", "interrupted", "before its first checkpoint"),
        # the first step's compilation: before the checkpointer is armed, or saved at step 1
        (signal.SIGINT, "training (", "interrupted", r"before its first checkpoint|checkpoint at step 1 "),
        # the final phase (evaluation and report), and after the last write
        (signal.SIGINT, "epoch 1/1: train_loss", "interrupted", "checkpoint at step 44 is saved"),
        (signal.SIGTERM, "val_acc ", "finished", "44 steps"),
    ],
)
def test_a_signal_at_each_moment_of_a_run_is_one_line_and_a_true_record(tmp_path, signum, line, status, detail):
    from runner.rundir.status import read_run

    code, out, run_dir = _signal_at(tmp_path, signum, line)
    assert code == 128 + signum and _quiet(out), out
    named = f"{signal.Signals(signum).name} (signal {int(signum)})"
    assert sum(named in text for text in out.splitlines()) == 1, out
    info = read_run(str(run_dir))
    assert info.status == status and re.search(detail, info.detail), info


@pytest.mark.parametrize("handler", ["cli", "final_phase"])
def test_a_signal_that_lands_in_a_finalizer_still_stops_the_command(handler):
    # CI: SIGTERM while the run ended landed in a MindSpore Cell's __del__; Python printed "Exception ignored
    # in: <function Cell.__del__>" with a traceback and dropped the signal. The CLI's handler stays in charge.
    code = (
        "import os, signal\n"
        "from runner.cli import app\n"
        "from runner.training.interrupts import FinalPhaseInterrupted\n"
        "app._catch_interrupts()\n"
        "def final_phase(signum, frame):\n"
        "    raise FinalPhaseInterrupted(signum)\n"
        f"if {handler!r} == 'final_phase':\n"
        "    signal.signal(signal.SIGTERM, final_phase)  # the run's own handler after training\n"
        "class Collected:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        sum(range(1000))  # the handler runs here, inside the finalizer\n"
        "try:\n"
        "    Collected()\n"
        "    for _ in range(10**9):\n"
        "        pass\n"
        "    print('the signal was lost')\n"
        "except KeyboardInterrupt:\n"
        "    print('stopped by', app.interrupt_signal())\n"
        "except FinalPhaseInterrupted as e:\n"
        "    print('stopped by', e.signum)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == f"stopped by {int(signal.SIGTERM)}", proc.stdout + proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
