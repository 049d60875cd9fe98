"""What a user sees on a terminal, read from a tmux screen: the status line from the first second, log records
above the progress bar, a line per epoch, the two losses labelled, warnings repeated under the summary line."""

import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest
from conftest import REPO, TINY

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux to read a terminal's screen")


def screen(cmd: str, timeout: float = 600, every: float = 0) -> str:
    """Run cmd in a detached 200x60 tmux session (a real pty) and return what its screen and scrollback show.
    every > 0: also look every `every` seconds meanwhile, and return (the end, every line seen on the way)."""
    socket = f"runner-test-{uuid.uuid4().hex[:8]}"
    done = "__COMMAND_ENDED__"
    tmux = ["tmux", "-L", socket]
    subprocess.run([*tmux, "new-session", "-d", "-x", "200", "-y", "60", f"{cmd}; echo {done}; sleep 600"], check=True)
    seen: dict = {}
    try:
        deadline = time.time() + timeout
        while True:
            shown = subprocess.run(
                [*tmux, "capture-pane", "-p", "-J", "-S", "-2000"], capture_output=True, text=True
            ).stdout
            for line in shown.splitlines():
                seen.setdefault(line.rstrip(), len(seen))  # in the order first seen
            if done in shown or time.time() > deadline:
                return (shown, list(seen)) if every else shown
            time.sleep(every or 2)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


@pytest.mark.slow
def test_a_run_shows_what_it_does_from_its_first_second_then_a_line_per_epoch(tmp_path):
    # Two epochs of 16x16 inputs, validated after each (the default), compiled anew: the status line names
    # each phase before the first step, the bar names the epoch; neither stays on the screen at the end.
    over = [o for o in TINY if not o.startswith(("epochs=", "log_every=", "padding."))]
    size = ["padding.height=16", "padding.width=16", "compile_cache.enabled=false"]
    args = " ".join([*over, *size, "epochs=2", "log_every=20", "early_stop.patience=5"])
    end, seen = screen(f"cd {REPO} && {sys.executable} -m runner hydra.run.dir={tmp_path} {args}", every=0.1)
    assert seen[seen.index(next(s for s in seen if s.strip())) :][0].startswith(
        ("starting the run", "⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏")
    ), seen[:5]  # the first words on the screen come before any record the run logs
    status = [s[2:] for s in seen if s[:1] in "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏" and s[1:2] == " "]
    named = [p for p in ("composing the configuration", "loading MindSpore", "compiling the train step")]
    assert all(any(s.startswith(p) for s in status) for p in named), status
    bars = [s for s in seen if s.startswith("epoch 1/2 ") and " steps " in s and " in epoch" in s]
    assert bars and all(re.match(r"epoch 1/2 \S+ +\d+/44 steps \d:\d\d:\d\d in epoch", b) for b in bars), bars
    lines = [line for line in end.splitlines() if line.strip()]
    # Every record the run logged reached the screen, in order, above the bar (none hidden while it showed).
    for text in ("epoch 1 step 20/88 train_loss", "epoch 1/2: train_loss", "epoch 2/2: train_loss"):
        assert sum(text in line for line in lines) == 1, (text, end)
    epoch = next(line for line in lines if "epoch 2/2: train_loss" in line)
    assert " val_accuracy " in epoch and " lr " in epoch and " samples/s" in epoch and "s validation)" in epoch
    assert not [line for line in lines if line[:1] in "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏" or "━" in line], end  # nothing left behind
    summary = next(line for line in lines if line.startswith("val_acc "))
    assert " val_loss " in summary and "| train_loss " in summary and "(last step)" in summary
    assert "Traceback" not in end


@pytest.mark.slow
def test_warnings_are_repeated_under_the_summary_line(tmp_path):
    # sink=on warns on CPU (MindSpore runs without sink there) before training scrolls on: the recap repeats it.
    shown = screen(f"cd {REPO} && {sys.executable} -m runner hydra.run.dir={tmp_path} {' '.join(TINY)} sink=on")
    lines = [line for line in shown.splitlines() if line.strip()]
    warned = [line for line in lines if "[WARNING]" in line]
    assert warned, shown
    end = next(i for i, line in enumerate(lines) if line.startswith("val_acc "))
    recap = lines[end + 1 :]
    assert recap[0].endswith("during the run (also in runner.log):"), shown
    assert any("sink=on has no effect on CPU" in line for line in warned)
    assert any(line.startswith("- sink=on has no effect on CPU") for line in recap), recap


def test_a_run_on_a_terminal_says_it_is_starting_before_its_imports(tmp_path):
    # Issue 39: nothing on screen for seconds. The first bytes on the terminal are the starting line, written
    # before Hydra and MindSpore load; a Ctrl-C then takes it back and says one line.
    import os
    import pty
    import select
    import signal

    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on the pty
        os.chdir(REPO)
        os.execv(sys.executable, [sys.executable, "-m", "runner", f"hydra.run.dir={tmp_path / 'run'}", *TINY])
    out = b""
    try:
        while b"starting the run" not in out:
            ready, _, _ = select.select([fd], [], [], 60)
            assert ready, out
            out += os.read(fd, 1024)
        os.kill(pid, signal.SIGINT)
        while True:
            ready, _, _ = select.select([fd], [], [], 60)
            try:
                chunk = os.read(fd, 4096) if ready else b""
            except OSError:  # the child closed the pty
                break
            if not chunk:
                break
            out += chunk
    finally:
        _, status = os.waitpid(pid, 0)
    assert out.startswith(b"starting the run (loading Hydra)..."), out[:200]
    assert os.WEXITSTATUS(status) == 130 and b"Interrupted by SIGINT (signal 2)." in out, out
    assert b"Traceback" not in out
