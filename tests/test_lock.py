"""Runs never clobber each other: one run per directory, and a killed run leaves no stale lock."""

import csv
import signal

import pytest
from conftest import TINY, run_in_process, start_cli, wait_for

ARGS = [o for o in TINY if not o.startswith(("epochs=", "log_every="))] + ["epochs=2", "log_every=5"]


def _rows(path):
    try:
        return list(csv.DictReader(open(path)))
    except FileNotFoundError:
        return []


@pytest.mark.slow
def test_a_second_run_is_refused_and_a_killed_run_leaves_no_lock(tmp_path):
    run_dir = tmp_path / "run"
    first = start_cli(run_dir, *ARGS)
    wait_for(first, lambda: len(_rows(run_dir / "loss_scale.csv")) >= 10)  # training, mid-epoch 1

    second = run_in_process(run_dir, *ARGS, check=False)
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-2000:]
    text = " ".join(second.stderr.split())
    assert f"pid {first.pid}" in text and "holds its lock" in text and "another hydra.run.dir" in text
    assert first.poll() is None  # the first run goes on untouched

    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
    # Per-step records are flushed every log_every steps, so SIGKILL leaves them.
    assert len(_rows(run_dir / "loss_scale.csv")) >= 10 and len(_rows(run_dir / "metrics.csv")) >= 2

    # The kernel dropped the dead run's lock: the directory can be resumed (here from scratch, no checkpoint yet).
    run_in_process(run_dir, *ARGS, "resume=true")
    assert (run_dir / "metrics.json").exists()
