"""What a user sees on a terminal, read from a tmux screen: log records above the progress bar, the two
losses labelled, warnings repeated under the summary line."""

import shutil
import subprocess
import sys
import time
import uuid

import pytest
from conftest import REPO, TINY

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux to read a terminal's screen")


def screen(cmd: str, timeout: float = 600) -> str:
    """Run cmd in a detached 200x60 tmux session (a real pty) and return what its screen and scrollback show."""
    socket = f"runner-test-{uuid.uuid4().hex[:8]}"
    done = "__COMMAND_ENDED__"
    tmux = ["tmux", "-L", socket]
    subprocess.run([*tmux, "new-session", "-d", "-x", "200", "-y", "60", f"{cmd}; echo {done}; sleep 600"], check=True)
    try:
        deadline = time.time() + timeout
        while True:
            shown = subprocess.run(
                [*tmux, "capture-pane", "-p", "-J", "-S", "-2000"], capture_output=True, text=True
            ).stdout
            if done in shown or time.time() > deadline:
                return shown
            time.sleep(2)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


@pytest.mark.slow
def test_log_records_print_above_the_progress_bar(tmp_path):
    # Two epochs of 16x16 inputs, validated after each, compiled anew: long enough (> 3 s) for the bar, which
    # a run the compile cache serves can finish before (~2 s at 8x8 on a 2-core EPYC).
    over = [o for o in TINY if not o.startswith(("epochs=", "log_every=", "padding."))]
    size = ["padding.height=16", "padding.width=16", "compile_cache.enabled=false"]
    args = " ".join([*over, *size, "epochs=2", "log_every=20", "validation.every_epochs=1", "early_stop.patience=5"])
    shown = screen(f"cd {REPO} && {sys.executable} -m runner hydra.run.dir={tmp_path} {args}")
    lines = [line for line in shown.splitlines() if line.strip()]
    assert any(line.startswith("train ") and "88/88" in line for line in lines), shown  # the bar was there
    # Every record the run logged reached the screen, in order, above the bar (none hidden while it showed).
    for text in (
        "epoch 1 step 20/88 train_loss",
        "epoch 1 validation: val_accuracy",
        "epoch 2 validation: val_accuracy",
    ):
        assert sum(text in line for line in lines) == 1, (text, shown)
    summary = next(line for line in lines if line.startswith("val_acc "))
    assert " val_loss " in summary and "| train_loss " in summary and "(last step)" in summary
    assert "Traceback" not in shown


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
