"""Sweeps that continue: the same -m command run again into its sweep directory keeps the finished jobs,
resumes the interrupted one, runs the failed and the new ones (runner/rundir/sweep_jobs.py)."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from conftest import REPO, TINY, cli_in_process, metrics, run_cli

from runner.rundir.sweep_jobs import subdir_for

SMALL = [o for o in TINY if not o.startswith("epochs=")]


def _summary(sweep_dir):
    return {row["label"]: row for row in csv.DictReader(open(sweep_dir / "summary.csv"))}


def _weights(path):
    import mindspore as ms

    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items()}


def _job(sweep, name, config):
    (sweep / name / ".hydra").mkdir(parents=True)
    (sweep / name / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))


def test_a_job_is_found_by_its_configuration_not_its_number(tmp_path):
    _job(tmp_path, "0", {"seed": 0})
    _job(tmp_path, "1", {"seed": 1})
    (tmp_path / "2").mkdir()  # a folder of someone's: never reused for another configuration
    assert subdir_for(str(tmp_path), 5, {"seed": 1}) == "1"  # reordered: back into its directory
    assert subdir_for(str(tmp_path), 3, {"seed": 3}) == "3"  # new, its number free
    moved = subdir_for(str(tmp_path), 0, {"seed": 7})  # new, its number an earlier job's of another config
    assert moved.startswith("0-") and moved != subdir_for(str(tmp_path), 0, {"seed": 8})
    assert subdir_for(str(tmp_path), 2, {"seed": 9}).startswith("2-")
    assert subdir_for(str(tmp_path / "new"), 4, {"seed": 0}) == "4"


def test_an_optuna_sweep_is_not_continued(tmp_path):
    _job(tmp_path, "0", {"seed": 0})
    (tmp_path / "multirun.yaml").write_text("hydra: {}\n")  # an earlier sweep's record
    proc = cli_in_process("-m", f"hydra.sweep.dir={tmp_path}", "hydra/sweeper=optuna_accuracy", "dry_run=true")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "Optuna sweep cannot continue" in proc.stderr and "new hydra.sweep.dir" in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["0", "multirun.yaml"]  # nothing written


def _kill_during_second_job(sweep, args):
    cmd = [sys.executable, "-m", "runner", "-m", f"hydra.sweep.dir={sweep}", *args]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 600
    # Job 1 is mid-way: its first epoch's checkpoint is written, the second epoch runs.
    while not (sweep / "1" / "checkpoints" / "step_00000044.ckpt").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.05)
    time.sleep(0.5)
    holder = (sweep / "1" / ".runner.rundir.lock").read_text().split()[1]  # the job's own process
    os.kill(proc.pid, signal.SIGKILL)  # the node is gone: the sweep's process and its job's, no handler runs
    os.kill(int(holder), signal.SIGKILL)
    proc.communicate(timeout=60)


@pytest.mark.slow
def test_a_killed_sweep_run_again_ends_as_an_uninterrupted_one(tmp_path):
    args = ["seed=0,1", "epochs=2", *SMALL]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    run_cli(whole, *args, multirun=True)
    _kill_during_second_job(cut, args)
    assert not (cut / "1" / "metrics.json").exists() and (cut / "0" / ".runner.complete").exists()
    started = (cut / "0" / "metrics.json").stat().st_mtime

    proc = run_cli(cut, *args, multirun=True)
    assert "Kept: " in proc.stdout and "Resuming " in proc.stdout
    assert (cut / "0" / "metrics.json").stat().st_mtime == started  # kept: not run again
    a, b = _summary(whole), _summary(cut)
    assert [b[k]["reused"] for k in ("seed=0", "seed=1")] == ["kept", "resumed"]
    for key in ("seed=0", "seed=1"):
        assert b[key]["status"] == "ok" and b[key]["val_accuracy"] == a[key]["val_accuracy"]
        assert (
            metrics(cut / a[key]["dir"].split("/")[-1])["loss_curve"]
            == metrics(whole / a[key]["dir"].split("/")[-1])["loss_curve"]
        )
    # The resumed job is bit-identical to the uninterrupted one, as a resumed run is (tests/test_checkpoints.py).
    w, c = _weights(whole / "1" / "model.ckpt"), _weights(cut / "1" / "model.ckpt")
    assert max(float(np.abs(w[k] - c[k]).max()) for k in w) == 0.0
    assert "kept (finished earlier)" in (cut / "summary.md").read_text()

    # Reordered and extended: matched by configuration, so both earlier jobs are kept; the new one runs.
    proc = run_cli(cut, "seed=1,0", "epochs=2", *SMALL, multirun=True)
    rows = _summary(cut)
    assert {k: (r["job"], r["reused"], r["dir"].split("/")[-1]) for k, r in rows.items()} == {
        "seed=1": ("0", "kept", "1"),
        "seed=0": ("1", "kept", "0"),
    }
    assert json.loads((cut / "1" / "sweep_job.json").read_text())["action"] == "kept"


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_a_sweep_continues_through_other_launchers(tmp_path, launcher):
    run_cli(tmp_path, f"hydra/launcher={launcher}", "seed=0", "eval=false", *TINY, multirun=True)
    # A failed job runs again; a new combination whose number an earlier job has gets a directory of its own.
    (tmp_path / "0" / ".runner.complete").unlink()
    (tmp_path / "0" / "failed.json").write_text(json.dumps({"error": "boom", "error_type": "ValueError"}))
    run_cli(tmp_path, f"hydra/launcher={launcher}", "seed=3,0", "eval=false", *TINY, multirun=True)
    rows = _summary(tmp_path)
    assert {k: (r["status"], r["reused"]) for k, r in rows.items()} == {
        "seed=3": ("ok", "new"),
        "seed=0": ("ok", "rerun"),
    }
    assert rows["seed=3"]["dir"].split("/")[-1].startswith("0-") and metrics(rows["seed=3"]["dir"])["seed"] == 3
    assert json.loads((tmp_path / "0" / "attempts" / "1" / "failed.json").read_text())["error"] == "boom"
