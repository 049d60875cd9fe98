"""runner-runs: the run directories as a collection (list, diff, replay), read from each run's own records."""

import csv
import json
import shutil
import sys

import pytest
import yaml
from conftest import REPO, TINY, metrics, run_cli

from runner.cli.commands import runs_main as main
from runner.rundir import lock, status


def _copy(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.lock"))
    return dst


def _runs(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


@pytest.fixture
def zoo(tmp_path, tiny_run):
    """One directory of each status under tmp_path/runs, made from the shared tiny run's real records."""
    root = tmp_path / "runs"
    root.mkdir()
    _copy(tiny_run, root / "finished")
    killed = _copy(tiny_run, root / "killed")  # SIGKILL mid-run: checkpoints, no metrics, no completion marker
    for name in ("metrics.json", "model.ckpt", ".runner.complete"):
        (killed / name).unlink()
    failed = _copy(tiny_run, root / "failed")  # a NaN stop writes metrics.json, then fails: no completion marker
    (failed / ".runner.complete").unlink()
    sweep_job = _copy(tiny_run, root / "sweep_job")
    (sweep_job / ".runner.complete").unlink()
    (sweep_job / "metrics.json").unlink()
    (sweep_job / "failed.json").write_text(json.dumps({"error": "boom", "error_type": "ValueError"}))
    (root / "half" / ".hydra").mkdir(parents=True)  # Hydra's record, nothing of the run's
    broken = _copy(tiny_run, root / "broken")
    (broken / "metrics.json").write_text("{")
    old = _copy(tiny_run, root / "old")
    saved = yaml.safe_load((old / "config.yaml").read_text())
    saved["retired_setting"] = 3  # a setting this version does not have
    (old / "config.yaml").write_text(yaml.safe_dump(saved))
    (root / "notes").mkdir()
    (root / "notes" / "todo.txt").write_text("not a run")
    lr = _copy(tiny_run, root / "other_lr")
    saved = yaml.safe_load((lr / "config.yaml").read_text())
    saved["optim"]["lr"] = 0.5
    (lr / "config.yaml").write_text(yaml.safe_dump(saved))
    return root


def test_each_status_is_read_from_the_runs_records(zoo):
    got = {p.split("/")[-1]: r for p, r in ((r.path, r) for r in status.find_runs([str(zoo)]))}
    assert {k: r.status for k, r in got.items()} == {
        "finished": "finished",
        "killed": "interrupted",
        "failed": "failed",
        "sweep_job": "failed",
        "half": "half-written",
        "broken": "half-written",
        "old": "too old",
        "notes": "foreign",
        "other_lr": "finished",
    }
    assert got["killed"].resumable and "resume=true" in got["killed"].detail
    assert got["sweep_job"].detail == "boom" and "retired_setting" in got["old"].detail
    assert got["finished"].epochs_done == 1 and got["finished"].steps == 44
    # A live process holding the lock is what "running" means, whatever files are there.
    lock.acquire(str(zoo / "killed"))
    try:
        assert status.read_run(str(zoo / "killed")).status == "running"
    finally:
        lock.release(str(zoo / "killed"))
    assert status.read_run(str(zoo / "killed")).status == "interrupted"


@pytest.mark.slow  # 13 s here: nine run directories read through the schema, several times
def test_the_table_the_json_sort_and_where(zoo, capsys):
    code, out, _ = _runs(capsys, zoo)
    assert code == 0
    for word in ("finished", "interrupted", "failed", "half-written", "too old", "foreign", "optim.lr", "0.5"):
        assert word in out
    # The column --sort=-val_accuracy orders by, shown (issue 39): the finished run's value on its row.
    row = next(line for line in out.splitlines() if "/finished " in line or "/finished│" in line)
    assert "val_accuracy" in out and f"{metrics(zoo / 'finished')['val_accuracy']:.4g}" in row, out
    code, out, _ = _runs(capsys, zoo, "--json", "--where", "status=finished", "--sort=-optim.lr")
    rows = json.loads(out)
    assert [r["path"].split("/")[-1] for r in rows] == ["other_lr", "finished"]
    # Only the settings that differ between the listed runs are columns.
    assert all(set(r["config"]) == {"optim.lr"} for r in rows) and rows[0]["config"]["optim.lr"] == 0.5
    assert rows[1]["val_accuracy"] == metrics(zoo / "finished")["val_accuracy"]
    code, out, _ = _runs(capsys, zoo, "--json", "--where", "optim.lr=0.50")
    assert [r["path"].split("/")[-1] for r in json.loads(out)] == ["other_lr"]  # compared as numbers
    # The same from the Python API.
    import runner

    found = runner.runs_under(str(zoo), where=["status=finished"], sort="optim.lr")
    assert [r.path.split("/")[-1] for r in found] == ["finished", "other_lr"]
    assert runner.diff_runs(str(zoo / "finished"), str(zoo / "other_lr"))["differ"]


@pytest.mark.parametrize(
    "argv, culprit",
    [
        (["--sort", "val_acuracy"], "val_acuracy"),
        (["--where", "model.name"], "KEY=VALUE"),
        (["no/such/dir"], "no/such/dir"),
        (["diff", "no/such/a", "no/such/b"], "no/such/a"),
    ],
)
def test_a_mistake_is_one_paragraph_and_exit_2(zoo, capsys, argv, culprit):
    argv = [str(zoo), *argv] if argv[0].startswith("--") else argv
    code, out, err = _runs(capsys, *argv)
    assert code == 2 and culprit in err and not out


def test_a_diverged_runs_non_finite_numbers_are_its_records_not_a_broken_file(zoo):
    # The runner writes NaN and infinities as strings (strict JSON has no literal for them): a run whose
    # lr became inf and whose validation loss is NaN is still read, with its own status.
    diverged = _copy(zoo / "failed", zoo.parent / "diverged")
    m = metrics(diverged)
    m["lr_curve"], m["val_curve"][0]["loss"], m["val_loss"] = ["inf"], "nan", "nan"
    (diverged / "metrics.json").write_text(json.dumps(m))
    assert status.read_run(str(diverged)).status == "failed"
    m["val_curve"][0]["loss"] = "high"  # any other string is not a number
    (diverged / "metrics.json").write_text(json.dumps(m))
    assert status.read_run(str(diverged)).status == "half-written"


def test_diff_exit_status_and_sections(zoo, capsys):
    code, out, _ = _runs(capsys, "diff", zoo / "finished", zoo / "failed")
    assert code == 0 and "The runs are the same" in out and "speed" in out
    code, out, _ = _runs(capsys, "diff", "--json", zoo / "finished", zoo / "other_lr")
    report = json.loads(out)
    assert code == 1 and report["differ"]
    # The learning rate is a Parameter of the train graph (the schema's GRAPH): no other graph compiles for it.
    assert report["config"] == [{"key": "optim.lr", "a": 0.1, "b": 0.5, "graph": False}] and not report["metrics"]
    env = {e["key"] for e in report["speed"]}
    assert "throughput_samples_per_s" in env
    edited = _copy(zoo / "finished", zoo.parent / "edited")
    m = metrics(edited)
    m["versions"]["mindspore"] = "0.0.1"
    m["val_accuracy"] = 0.5
    (edited / "metrics.json").write_text(json.dumps(m))
    code, out, _ = _runs(capsys, "diff", "--json", zoo / "finished", edited)
    report = json.loads(out)
    assert code == 1 and [e["key"] for e in report["environment"]] == ["versions.mindspore"]
    assert [e["key"] for e in report["metrics"]] == ["val_accuracy"]
    plain = _copy(zoo / "finished", zoo.parent / "plain")
    saved = yaml.safe_load((plain / "config.yaml").read_text())
    saved["model"]["blocked_body"], saved["seed"] = False, 7
    (plain / "config.yaml").write_text(yaml.safe_dump(saved))
    code, out, _ = _runs(capsys, "diff", zoo / "finished", plain)
    report = json.loads(_runs(capsys, "diff", "--json", zoo / "finished", plain)[1])
    assert {e["key"]: e["graph"] for e in report["config"]} == {"model.blocked_body": True, "seed": False}
    assert "changes the graph" in out


def test_completion_script_names_the_subcommands(capsys):
    code, out, _ = _runs(capsys, "--completion", "bash")
    assert code == 0 and "complete -o filenames -F _runner_runs runner-runs" in out and "diff replay" in out


@pytest.mark.slow
def test_replay_reproduces_a_resumed_and_extended_run(tmp_path):
    run = tmp_path / "run"
    small = [o for o in TINY if not o.startswith("epochs=")]
    run_cli(run, "epochs=1", *small)
    run_cli(run, "epochs=2", *small, "resume=true")  # extended: history.json records the change
    history = json.loads((run / "history.json").read_text())
    assert history == [{"from": str(run), "changes": {"epochs": [1, 2]}, "step": 44}]
    import subprocess

    out = tmp_path / "replayed"
    proc = subprocess.run(
        [sys.executable, "-m", "runner.runs", "replay", str(run), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "reproduces" in proc.stdout
    a, b = metrics(run), metrics(out)
    assert b["loss_curve"] == a["loss_curve"] and len(a["loss_curve"]) == 88  # bit-identical, both legs
    assert b["val_accuracy"] == a["val_accuracy"] and b["val_loss"] == a["val_loss"]
    losses = [r["train_loss"] for r in csv.DictReader(open(run / "metrics.csv"))]
    assert losses and losses == [r["train_loss"] for r in csv.DictReader(open(out / "metrics.csv"))]
    # Re-running config.yaml alone (what a replay was before) gives the first leg only.
    assert json.loads((out / "history.json").read_text())[0]["changes"] == {"epochs": [1, 2]}


def test_a_run_that_failed_is_listed_failed_with_its_reason_and_a_dry_run_refuses_it_first(tmp_path, capsys):
    # Issue 39: a run stopped by a user error (exit 2) was listed `interrupted | killed or stopped before its
    # first checkpoint`, and dry_run=true called the same command valid.
    from conftest import dry_run, run_in_process

    missing = ["+experiment=cifar10_resnet56", f"data.root={tmp_path / 'missing'}"]
    checked = dry_run(tmp_path / "dry", *missing)
    said = " ".join(checked.stderr.split())
    assert checked.returncode == 2 and "data.root" in said and "does not exist" in said, said
    assert "valid" not in checked.stdout and not (tmp_path / "dry").exists()  # refused before Hydra wrote

    proc = run_in_process(tmp_path / "run", *missing, check=False)
    assert proc.returncode == 2, proc.stderr
    code, out, _ = _runs(capsys, tmp_path / "run", "--json")
    (row,) = json.loads(out)
    assert row["status"] == "failed" and "data.root" in row["detail"] and "does not exist" in row["detail"], row
    # Run again with the data there: the failure is an earlier attempt's, not this run's.
    status.clear_failure(str(tmp_path / "run"))  # what claiming the directory does (runner/rundir/claim.py)
    assert status.read_run(str(tmp_path / "run")).status == "interrupted"  # config.yaml only: killed, no record


def test_a_dry_run_checks_the_device_this_mindspore_can_use(tmp_path):
    from conftest import dry_run
    from mindspore._c_expression import MSContext

    if MSContext.get_instance().is_pkg_support_device("GPU"):
        pytest.skip("this MindSpore runs on a GPU here")
    proc = dry_run(tmp_path / "dry", "device=gpu")
    assert proc.returncode == 2 and "device=gpu is not usable" in proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "valid" not in proc.stdout
    assert dry_run(tmp_path / "cpu", "device=cpu").returncode == 0


# ---------------------------------------------------------------------------------------------------
# Any directory entry: one reader (runner/rundir/layout.py read_record) turns it into a row saying why.


def _hostile(root, base):
    """Run directories, each made from a real run with one record broken the way a careless or hostile user
    breaks it: {name: what its row must say}."""
    import os

    cases = {}

    def case(name, record, body, says):
        d = _copy(base, root / name)
        path = d / record
        path.unlink(missing_ok=True)
        if callable(body):
            body(path)
        else:
            path.write_text(body if isinstance(body, str) else json.dumps(body))
        cases[name] = (record, says)

    m = metrics(base)
    case("history_numbers", "history.json", "[1, 2]", "[0] is a JSON number, not an object")
    case("history_changes", "history.json", '[{"changes": "epochs"}]', "[0].changes is a JSON string")
    case("history_pair", "history.json", '[{"changes": {"epochs": 3}}]', "changes.epochs is not a pair")
    case("early_stop", "metrics.json", {**m, "early_stop": 1}, "early_stop is a JSON number, not an object")
    case("val_curve", "metrics.json", {**m, "val_curve": [{"epoch": "x"}]}, "val_curve[0].epoch is a JSON string")
    case("flops", "metrics.json", {**m, "flops": "x"}, "flops is a JSON string, not an object")
    case("conv_paths", "metrics.json", {**m, "flops": {"conv_paths": {"gemm": 3}}}, "flops.conv_paths.gemm")
    case("loop", "metrics.json", lambda p: os.symlink(p.name, p), "Too many levels of symbolic links")
    case("dangling", "metrics.json", lambda p: os.symlink("gone.json", p), "a symbolic link to nothing")
    case("fifo", "metrics.json", lambda p: os.mkfifo(p), "a FIFO, not a file")
    case("fifo_config", "config.yaml", lambda p: os.mkfifo(p), "a FIFO, not a file")
    case("fifo_history", "history.json", lambda p: os.mkfifo(p), "a FIFO, not a file")
    case("fifo_failed", ".runner.complete", lambda p: os.mkfifo(p), "")  # present: the run wrote it last
    case("fifo_state", "checkpoints/latest.json", lambda p: os.mkfifo(p), "")  # falls back to the step files
    case("binary", "config.yaml", lambda p: p.write_bytes(b"\xff\xfe\x00"), "not UTF-8 text")
    os.symlink("self", root / "self")  # a symlink loop beside the runs: an entry, never walked into
    os.mkfifo(root / "pipe")
    return cases


def _in_time(fn, *args, seconds=60):
    """fn(*args) in a thread; fails the test instead of hanging it (a FIFO opened for reading waits forever)."""
    import threading

    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", fn(*args)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn.__name__} blocked for {seconds} s"
    return result["value"]


def test_every_unreadable_entry_is_a_row_saying_why(tmp_path, tiny_run, capsys):
    root = tmp_path / "runs"
    root.mkdir()
    cases = _hostile(root, tiny_run)
    got = {r.path.split("/")[-1]: r for r in _in_time(status.find_runs, [str(root)])}
    assert set(cases) <= set(got)
    for name, (record, says) in cases.items():
        row = got[name]
        if says:
            assert row.status == "half-written", (name, row)
            assert says in row.detail and record.split("/")[-1] in row.detail, (name, row.detail)
        else:
            assert row.status == "finished", (name, row)
    # The command, its JSON and a diff against each: no traceback, no hang, exit 0 (2 for a diff: not a run).
    code, out, _ = _in_time(_runs, capsys, root, "--json")
    assert code == 0 and len(json.loads(out)) == len(got)
    for name in ("flops", "conv_paths", "early_stop"):
        code, _, err = _in_time(_runs, capsys, "diff", root / name, tiny_run)
        assert code == 2 and name in err and "half-written" in err
    # A root that is a symlink loop is one paragraph, naming it.
    code, _, err = _runs(capsys, root / "self")
    assert code == 2 and "Too many levels of symbolic links" in " ".join(err.split())


# ---------------------------------------------------------------------------------------------------
# Replay takes only training settings (runner/config/schema.py KIND), and writes only its own directory.


def _hostile_history(run, victim):
    """A history.json that names where to write and what to log, beside a real change of epochs."""
    changes = {
        "epochs": [1, 1],
        "hydra.run.dir": [None, str(victim)],
        "hydra.job_logging.handlers.file.filename": [None, str(victim / "runner.log")],
        "logger": [{"csv": {}}, {"mlflow": {"tracking_uri": f"file://{victim}/mlruns"}}],
        "experiment_name": ["default", "renamed"],
        "resume": [None, str(victim)],
    }
    (run / "history.json").write_text(json.dumps([{"from": str(run), "changes": changes, "step": 44}]))


def test_replay_legs_take_only_training_settings(tmp_path, tiny_run):
    import runner.runs as runs

    run, victim = _copy(tiny_run, tmp_path / "run"), tmp_path / "victim"
    _hostile_history(run, victim)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["logger"] = {"mlflow": {"tracking_uri": f"file://{victim}/mlruns"}}
    saved["compile_cache"] = {"enabled": True, "dir": str(victim / "cache")}
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    out = tmp_path / "out"
    source = tmp_path / "source"
    source.mkdir()
    commands = runs.legs(str(run), str(out), runs.replay_source(str(run), str(source)))
    assert len(commands) == 2
    for args, _, _ in commands:
        assert [a for a in args if a.startswith("hydra.")] == [f"hydra.run.dir={out}"]
        assert str(victim) not in " ".join(args)
    assert "epochs=1" in commands[1][0]
    assert commands[1][2] == sorted(
        k for k in json.loads((run / "history.json").read_text())[0]["changes"] if k != "epochs"
    )
    body = yaml.safe_load((source / "config.yaml").read_text())
    assert str(victim) not in json.dumps(body) and body["logger"] == {"csv": {}} and "compile_cache" not in body
    assert body["hydra"] == {"job": {"name": "runner", "chdir": False}} and body["optim"] == saved["optim"]
    # The same declaration is what `runner-runs diff` counts: a renamed experiment is shown, not a difference.
    renamed = _copy(tiny_run, tmp_path / "renamed")
    saved = yaml.safe_load((renamed / "config.yaml").read_text())
    saved["experiment_name"] = "other"
    saved["compile_cache"]["enabled"] = False
    (renamed / "config.yaml").write_text(yaml.safe_dump(saved))
    report = runs.diff_runs(str(tiny_run), str(renamed))
    assert not report["differ"] and not report["config"]
    assert {r["key"] for r in report["bookkeeping"]} == {"experiment_name", "compile_cache.enabled"}


@pytest.mark.parametrize("atol", ["nan", "-1", "inf"])
def test_replay_refuses_a_tolerance_that_passes_anything(tiny_run, capsys, atol):
    code, out, err = _runs(capsys, "replay", tiny_run, "--atol", atol, "--out", tiny_run.parent / "never")
    assert code == 2 and f"--atol {atol}" in err and "finite number >= 0" in err and not out
    assert not (tiny_run.parent / "never").exists()


def test_replay_comparison_counts_nan_and_non_numbers():
    from runner.runs import replay_differences

    ones = {"loss_curve": [1.0, 2.0], "val_accuracy": 0.5, "val_loss": 1.0, "steps": 2}
    assert replay_differences(ones, dict(ones), 0.0) == []
    assert replay_differences(ones, {**ones, "loss_curve": [2.0, 3.0]}, 0.5)  # all 1.0 off
    assert replay_differences(ones, {**ones, "loss_curve": [float("nan"), 2.0]}, 1e6)  # NaN where a number was
    assert replay_differences(ones, {**ones, "val_loss": None}, 1e6)
    nan = {**ones, "loss_curve": [float("nan"), 2.0]}
    assert replay_differences(nan, dict(nan), 0.0) == []  # bit-identical, NaN included


@pytest.mark.slow  # two legs through the CLI: ~30 s here
def test_a_hostile_history_replays_into_its_own_directory_only(tmp_path, tiny_run):
    import subprocess

    run, victim = _copy(tiny_run, tmp_path / "run"), _copy(tiny_run, tmp_path / "victim")
    _hostile_history(run, victim)
    before = {p.name: p.read_bytes() for p in victim.rglob("*") if p.is_file()}
    out = tmp_path / "replayed"
    proc = subprocess.run(
        [sys.executable, "-m", "runner.runs", "replay", str(run), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "no training setting: left out" in proc.stdout and "hydra.run.dir" in proc.stdout
    assert {p.name: p.read_bytes() for p in victim.rglob("*") if p.is_file()} == before
    assert metrics(out)["loss_curve"] == metrics(run)["loss_curve"] and "reproduces" in proc.stdout
