"""Sweeps that continue: the same -m command run again into its sweep directory keeps the finished jobs,
resumes the interrupted one, runs the failed and the new ones (runner/rundir/sweep_jobs.py)."""

import csv
import json
import os
import shutil
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
    deadline, job = time.time() + 600, sweep / "1"
    lock, latest = job / ".runner.rundir.lock", job / "checkpoints" / "latest.json"

    def wait_for(path):
        while not path.exists():
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.005)

    wait_for(lock)
    while len(lock.read_text().split()) < 2:  # created, not yet written
        time.sleep(0.005)
    holder = int(lock.read_text().split()[1])  # the job's own process
    # Job 1 is mid-way: its first epoch's checkpoint is recorded, the second epoch runs. That epoch takes
    # ~0.2 s on these tiny shapes, so the job is frozen the moment the record appears (a sleep lost the race).
    wait_for(latest)
    os.kill(holder, signal.SIGSTOP)
    os.kill(proc.pid, signal.SIGKILL)  # the node is gone: the sweep's process and its job's, no handler runs
    os.kill(holder, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert json.loads(latest.read_text())["global_step"] == 44, "frozen after epoch 1's record, not later"


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


# ---------------------------------------------------------------------------------------------------
# One sweep per sweep directory, one directory per configuration, one name per job.


def _hold_sweep_lock(sweep):
    """Another process holding the sweep's lock, as a running `-m` command does (runner/rundir/sweep_jobs.py)."""
    sweep.mkdir(parents=True, exist_ok=True)
    code = (
        "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
        "f.write('pid 1 on elsewhere'); f.flush(); print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(sweep / ".runner.sweep.lock")], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_sweep_another_process_runs_is_refused_before_it_writes(tmp_path):
    sweep = tmp_path / "sweep"
    _job(sweep, "0", {"seed": 0})
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    holder = _hold_sweep_lock(sweep)
    before = sorted(p.relative_to(sweep) for p in sweep.rglob("*"))
    try:
        proc = cli_in_process("-m", f"hydra.sweep.dir={sweep}", "seed=0,1", *TINY)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "is running a sweep in" in proc.stderr and "pid 1 on elsewhere" in proc.stderr
    assert sorted(p.relative_to(sweep) for p in sweep.rglob("*")) == before  # nothing written into its jobs


def test_a_job_refused_for_another_process_writes_nothing_into_its_directory(tmp_path):
    from runner.rundir import lock, status

    job = tmp_path / "0"
    job.mkdir()
    code = "import sys; from runner.rundir import lock; lock.acquire(sys.argv[1]); print('held', flush=True); input()"
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(job)], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert status.held_by_another(str(job))
    finally:
        holder.kill()
        holder.wait()
    assert not status.held_by_another(str(job))
    lock.acquire(str(job))
    try:
        assert not status.held_by_another(str(job))  # this process's own job: its failure is recorded
    finally:
        lock.release(str(job))


@pytest.mark.parametrize("swept", [["seed=0,0"], ["optim.lr=0.1,0.10", "seed=1,2"]])
def test_a_sweep_that_repeats_a_job_is_refused(tmp_path, swept):
    proc = cli_in_process("-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *swept, *TINY)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "jobs #0 and #" in proc.stderr and "one configuration" in proc.stderr
    assert not (tmp_path / "sweep").exists()


def _done_job(sweep, name, base, seed, num, at):
    job = sweep / name
    shutil.copytree(base, job, ignore=shutil.ignore_patterns("*.lock"))
    (job / ".hydra").mkdir(exist_ok=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"seed={seed}"]))
    (job / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": num}}}))
    (job / "sweep_job.json").write_text(json.dumps({"action": "kept", "detail": "", "at": at}))
    os.utime(job / ".hydra" / "hydra.yaml", (at, at))


def test_a_continued_sweep_names_each_job_once(tmp_path, tiny_run):
    from runner.report.sweep import collect, markdown

    sweep = tmp_path / "sweep"
    now = time.time()
    # `seed=0,1` earlier, then `seed=2,0`: seed=2 is new (#0, in 0-<hash>), seed=0 kept (#1, in 0), and the
    # earlier seed=1 job (in 1, numbered 1 by the earlier command) is not in this one.
    _done_job(sweep, "0-1a2b3c4d", tiny_run, 2, 0, now)
    _done_job(sweep, "0", tiny_run, 0, 1, now)
    _done_job(sweep, "1", tiny_run, 1, 1, now - 3600)
    rows = collect(sweep, since=now - 1)
    assert [(r.name, r.reused) for r in rows] == [("#0", "kept"), ("#1", "kept"), ("dir 1", "earlier")]
    table = markdown(rows, [])
    assert table.count("| #1 |") == 1 and "| dir 1 |" in table


def test_a_job_whose_config_yaml_is_gone_runs_again(tmp_path, tiny_run):
    from conftest import compose_cfg

    from runner.rundir import sweep_jobs

    job = tmp_path / "0"
    shutil.copytree(tiny_run, job, ignore=shutil.ignore_patterns("*.lock"))
    (job / "config.yaml").unlink()
    plan = sweep_jobs.plan(compose_cfg(*TINY), str(job))
    assert plan.action == sweep_jobs.RERUN and "config.yaml" in plan.detail, plan
    (tmp_path / "1" / ".hydra").mkdir(parents=True)  # Hydra's record only: a new job
    assert sweep_jobs.plan(compose_cfg(*TINY), str(tmp_path / "1")).action == sweep_jobs.NEW


@pytest.mark.slow
def test_a_sweep_whose_job_lost_its_config_yaml_reruns_it(tmp_path):
    args = ["seed=0,1", "eval=false", *TINY]
    run_cli(tmp_path, *args, multirun=True)
    (tmp_path / "0" / "config.yaml").unlink()
    kept = (tmp_path / "1" / "metrics.json").stat().st_mtime
    proc = run_cli(tmp_path, *args, multirun=True)
    assert "Running " in proc.stdout and "again" in proc.stdout
    rows = _summary(tmp_path)
    assert {k: (r["status"], r["reused"]) for k, r in rows.items()} == {
        "seed=0": ("ok", "rerun"),
        "seed=1": ("ok", "kept"),
    }
    assert (tmp_path / "0" / "config.yaml").exists() and (tmp_path / "0" / "attempts" / "1" / "metrics.json").exists()
    assert (tmp_path / "1" / "metrics.json").stat().st_mtime == kept


@pytest.mark.slow
def test_the_same_sweep_started_twice_at_once(tmp_path):
    args = ["seed=0,1", "eval=false", *TINY]
    cmd = [sys.executable, "-m", "runner", "-m", f"hydra.sweep.dir={tmp_path}", *args]
    first = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while not (tmp_path / "0" / ".runner.rundir.lock").exists():
        assert first.poll() is None and time.time() < deadline, first.stdout.read()[-3000:]
        time.sleep(0.05)
    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    out, _ = first.communicate(timeout=600)
    # Refused whole, by the sweep's lock or its running job's (whichever it meets first), before it writes.
    assert second.returncode == 2 and "another process" in second.stderr.lower(), second.stderr[-2000:]
    assert first.returncode == 0, out[-3000:]
    assert not list(tmp_path.glob("*/failed.json"))
    assert [r["status"] for r in _summary(tmp_path).values()] == ["ok", "ok"]


def test_a_fifo_among_a_sweeps_records_is_no_record_and_no_hang(tmp_path):
    import threading

    from runner.rundir.sweep_jobs import recorded_plan

    (tmp_path / "0" / ".hydra").mkdir(parents=True)
    os.mkfifo(tmp_path / "0" / ".hydra" / "config.yaml")
    os.mkfifo(tmp_path / "0" / "sweep_job.json")
    found = {}
    thread = threading.Thread(
        target=lambda: found.update(
            name=subdir_for(str(tmp_path), 0, {"seed": 0}), plan=recorded_plan(str(tmp_path / "0"), None)
        ),
        daemon=True,
    )
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "a FIFO was opened"
    assert found == {"name": "0-" + found["name"][2:], "plan": None} and found["name"] != "0"
