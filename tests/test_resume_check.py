"""runner/rundir/claim.py and resume_check.py through the CLI: resume is never silently wrong. What may change,
finished runs, records that continue, broken state, signals."""

import csv
import json
import re
import shutil
import signal

import numpy as np
import pytest
import yaml
from conftest import TINY, built_once, metrics, run_cli, run_in_process, start_cli, wait_for

SMALL = [o for o in TINY if not o.startswith(("epochs=", "log_every="))] + ["log_every=20"]
FAULT = ["amp=o3", "data.input_scale=1e5", "diagnose.patience=3"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-epoch run (88 steps, checkpoints at 44 and 88); tests copy it before changing it."""
    return built_once(tmp_path_factory, "finished", lambda d: run_in_process(d / "run", "epochs=2", *SMALL)) / "run"


def _copy(finished, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(finished, dst)
    return dst


def _trace_steps(run_dir):
    return [int(r["step"]) for r in csv.DictReader(open(run_dir / "loss_scale.csv"))]


def _ckpt(path):
    import mindspore as ms

    return ms.load_checkpoint(str(path))


def _all_finite(path):
    return all(np.isfinite(p.asnumpy()).all() for p in _ckpt(path).values() if p.asnumpy().dtype.kind == "f")


@pytest.mark.slow
def test_resume_true_on_a_finished_run_exits_0_and_leaves_it_alone(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    before = (run_dir / "metrics.json").read_bytes(), (run_dir / "model.ckpt").read_bytes()
    proc = run_in_process(run_dir, "epochs=2", *SMALL, "resume=true")  # a re-queued job does exactly this
    assert "already complete" in proc.stdout and "88 steps" in proc.stdout
    assert ((run_dir / "metrics.json").read_bytes(), (run_dir / "model.ckpt").read_bytes()) == before


def test_a_used_directory_is_reused_only_by_resuming(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    before = (run_dir / "metrics.json").read_bytes()
    proc = run_in_process(run_dir, "epochs=2", *SMALL, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    text = " ".join(proc.stderr.split())
    assert "already holds a run (a finished run)" in text and "resume=true" in text and "rerun-" in text
    assert (run_dir / "metrics.json").read_bytes() == before


def test_resume_refuses_what_cannot_change_and_lists_it(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    args = ["epochs=3", *SMALL, "resume=true", "optim.momentum=0.8", "batch_size=16", "seed=1", "optim.lr=0.05"]
    proc = run_in_process(run_dir, *args, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    text = " ".join(proc.stderr.split())
    for diff in ("optim.momentum: 0.9 -> 0.8", "batch_size: 32 -> 16", "seed: 0 -> 1"):
        assert diff in text
    assert "optim.lr:" not in text  # given explicitly: a change resume may apply
    assert metrics(run_dir)["steps"] == 88 and not (run_dir / "checkpoints" / "step_00000132.ckpt").exists()


@pytest.mark.slow
def test_extending_a_finished_run_continues_every_record(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    run_in_process(run_dir, "epochs=3", *SMALL, "resume=true")
    before, m = metrics(finished), metrics(run_dir)
    assert m["resume_changes"] == {"epochs": [2, 3]} and m["resumed_from"].endswith("step_00000088.ckpt")
    # One curve over the whole run, as long as its step count; the first 88 steps are the earlier run's.
    assert m["steps"] == 132 == len(m["loss_curve"]) == len(m["step_time_ms_curve"])
    assert m["loss_curve"][:88] == before["loss_curve"]
    assert _trace_steps(run_dir) == list(range(1, 133))
    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
    # Every 20 steps and each epoch's end (44, 88, 132: its validation joins it), each step once.
    assert [int(r["step"]) for r in rows] == [20, 40, 44, 60, 80, 88, 100, 120, 132]
    assert [r["step"] for r in rows if r["val_accuracy"]] == ["44", "88", "132"]
    assert [float(r["lr"]) for r in rows] == pytest.approx([m["lr_curve"][int(r["step"]) - 1] for r in rows])
    log = (run_dir / "runner.log").read_text()
    assert "step 100/132" in log and "resume: applying epochs: 2 -> 3" in log
    assert json.loads((run_dir / "checkpoints" / "latest.json").read_text())["global_step"] == 132
    # config.yaml stays what the run started as (no resume, 2 epochs); the extension is history.
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["epochs"] == 2 and saved["resume"] is None
    history = json.loads((run_dir / "history.json").read_text())
    assert history == [{"from": str(run_dir), "changes": {"epochs": [2, 3]}, "step": 88}]  # resumed at step 88
    from runner.rundir.saved_run import load_config

    assert load_config(str(run_dir)).epochs == 3  # what evaluate/predict/export rebuild: the run as it is now


@pytest.mark.slow
def test_an_extended_runs_config_re_runs_to_the_same_result(finished, tmp_path):
    # Re-running the saved config gives the run's result whatever happened to the run after it started.
    run_dir = _copy(finished, tmp_path)
    run_cli(run_dir, "epochs=3", *SMALL, "resume=true")
    rerun = tmp_path / "rerun"
    run_cli(rerun, "--config-path", str(run_dir), "--config-name", "config")
    assert "resume" not in (rerun / "runner.log").read_text()
    again, before = metrics(rerun), metrics(finished)
    assert again["val_accuracy"] == before["val_accuracy"] and again["loss_curve"] == before["loss_curve"]


@pytest.mark.slow
def test_an_explicit_new_lr_is_applied_on_resume(finished, tmp_path):
    run_dir = tmp_path / "low_lr"
    start = finished / "checkpoints" / "step_00000044.ckpt"
    run_cli(run_dir, "epochs=2", *SMALL, f"resume={start}", "optim.lr=0.001")
    assert metrics(run_dir)["resume_changes"] == {"optim.lr": [0.1, 0.001]}
    w44, old, new = _ckpt(start), _ckpt(finished / "model.ckpt"), _ckpt(run_dir / "model.ckpt")
    convs = [k for k in old if k.endswith("weight")]

    def moved(end):
        return sum(float(np.abs(end[k].asnumpy() - w44[k].asnumpy()).sum()) for k in convs)

    # The same 44 steps move the weights far less at a 100x smaller rate: the stored schedule did not win.
    assert moved(new) < 0.1 * moved(old), (moved(new), moved(old))


def test_a_non_finite_checkpoint_is_refused_naming_the_last_finite_one(finished, tmp_path):
    import mindspore as ms

    run_dir = _copy(finished, tmp_path)
    latest = run_dir / "checkpoints" / "step_00000088.ckpt"
    params = _ckpt(latest)
    bn = next(k for k in params if k.endswith("moving_mean"))
    params[bn] = ms.Tensor(np.full(params[bn].shape, np.nan, np.float32))
    ms.save_checkpoint([{"name": k, "data": v} for k, v in params.items()], str(latest))
    proc = run_in_process(run_dir, "epochs=3", *SMALL, "resume=true", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    text = " ".join(proc.stderr.split())
    assert "non-finite" in text and bn in text
    assert f"resume={run_dir / 'checkpoints' / 'step_00000044.ckpt'}" in text


@pytest.mark.slow
def test_a_nan_stop_checkpoints_nothing_non_finite_and_the_fix_resumes(tmp_path):
    run_dir = tmp_path / "nan"
    proc = run_cli(run_dir, "epochs=2", *FAULT, *SMALL, "eval=false", check=False)
    assert proc.returncode == 2 and "Training stopped at step" in " ".join(proc.stderr.split())
    ckpts = sorted((run_dir / "checkpoints").glob("step_*.ckpt")) if (run_dir / "checkpoints").exists() else []
    assert all(_all_finite(p) for p in ckpts)  # the epoch end after the stop held NaN BatchNorm statistics
    fix = "amp.keep_fp32=[" + ",".join(json.loads((run_dir / "diagnosis.json").read_text())["keep_fp32"]) + "]"
    run_cli(run_dir, "epochs=2", *FAULT, *SMALL, "resume=true", fix)
    m = metrics(run_dir)
    assert not m["nan_guard"]["tripped"] and np.isfinite(m["loss_curve"]).all() and m["val_accuracy"] > 0.8


@pytest.mark.slow
def test_a_truncated_latest_json_falls_back_to_the_newest_intact_checkpoint(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    state = run_dir / "checkpoints" / "latest.json"
    state.write_text(state.read_text()[:200])
    proc = run_in_process(run_dir, "epochs=3", *SMALL, "resume=true")
    out = " ".join((proc.stdout + proc.stderr).split())
    assert "unreadable" in out and "newest intact checkpoint" in out and "step_00000088.ckpt" in out
    m = metrics(run_dir)
    assert m["resumed_from"].endswith("step_00000088.ckpt")
    assert m["steps"] == 132 == len(m["loss_curve"])  # the earlier losses come back from loss_scale.csv
    assert np.allclose(m["loss_curve"][:88], metrics(finished)["loss_curve"], rtol=1e-5)


@pytest.mark.slow
def test_a_missing_newest_checkpoint_falls_back_and_says_so(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    (run_dir / "checkpoints" / "step_00000088.ckpt").unlink()
    proc = run_cli(run_dir, "epochs=3", *SMALL, "resume=true")
    out = " ".join((proc.stdout + proc.stderr).split())
    assert "step_00000088.ckpt, which is missing" in out and "step_00000044.ckpt (step 44)" in out
    m = metrics(run_dir)
    assert m["steps"] == 132 == len(m["loss_curve"]) and _trace_steps(run_dir) == list(range(1, 133))


@pytest.mark.slow
def test_sigterm_after_training_is_resumable_and_resume_only_reports(tmp_path):
    run_dir = tmp_path / "run"
    args = ["epochs=1", *SMALL]
    proc = start_cli(run_dir, *args)
    state = run_dir / "checkpoints" / "latest.json"
    wait_for(proc, lambda: state.exists() and json.loads(state.read_text())["global_step"] == 44)
    # After the last epoch's checkpoint: the evaluation (its graph compiles for seconds) and the report.
    import time

    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "Traceback" not in out and "SIGTERM (signal 15) during the final phase" in out and "resume=true" in out
    assert not (run_dir / ".runner.complete").exists()

    proc = run_cli(run_dir, *args, "resume=true")
    assert "finishing the evaluation and report" in proc.stderr + proc.stdout + (run_dir / "runner.log").read_text()
    m = metrics(run_dir)
    assert m["steps"] == 44 == len(m["loss_curve"]) == len(m["step_time_ms_curve"]) and m["val_accuracy"] > 0.5
    # This process trained no step: no compile or step time of its own, and not the earlier process's.
    assert m["compile_seconds"] is None and m["throughput_samples_per_s"] is None and "no step" in m["timing_note"]
    # No training graph; the evaluation's went through a compile cache of its own (tests/test_compile_cache.py).
    assert re.search(r"compile - \(0x(, cache (hit|miss))?\) \| step -", proc.stdout), proc.stdout[-2000:]
    assert (run_dir / "model.ckpt").exists() and (run_dir / "curves.png").exists()
    assert _trace_steps(run_dir) == list(range(1, 45))
    assert "already complete" in run_cli(run_dir, *args, "resume=true").stdout


@pytest.mark.slow
def test_ctrl_c_mid_training_says_sigint_and_exits_130(tmp_path):
    # The signal that came is named, and the exit status is 128 + it (130 for Ctrl-C, as the README says).
    run_dir = tmp_path / "run"
    proc = start_cli(run_dir, "epochs=20", *SMALL)
    wait_for(proc, lambda: (run_dir / "loss_scale.csv").exists())
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out[-3000:]
    said = r"interrupted by SIGINT \(signal 2\) at step \d+: saved \S+step_\d+\.ckpt; resume"
    assert len(re.findall(said, out)) == 1 and out.count("SIGINT (signal 2)") == 1, out[-3000:]  # one line
    assert "SIGTERM" not in out and "signal 15" not in out and "Traceback" not in out
