"""Hydra launchers and sweepers from their plugin packages, driving the real runner."""

import csv
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, TINY, cli_in_process, metrics, run_cli


@pytest.mark.parametrize("launcher", ["joblib", "submitit_local", "submitit_slurm"])
def test_launcher_configs_compose(launcher):
    proc = cli_in_process(f"hydra/launcher={launcher}", "--cfg", "hydra")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert launcher.split("_")[0] in yaml.safe_load(proc.stdout)["hydra"]["launcher"]["_target_"].lower()


@pytest.mark.slow
def test_the_isolated_launcher_composes_from_any_directory_however_python_starts(tmp_path):
    # Hydra's plugin scan sees hydra_plugins/ only where it is on sys.path as a directory (the repository
    # root as the working directory of `python -m`); the launcher's config ships in runner.conf instead.
    compose = (
        "from hydra import compose, initialize_config_module\n"
        "with initialize_config_module('runner.conf', version_base='1.3'):\n"
        "    cfg = compose('config', return_hydra_config=True)\n"
        "print(cfg.hydra.launcher._target_)"
    )
    proc = subprocess.run([sys.executable, "-c", compose], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "hydra_plugins.runner_launcher.isolated_launcher.IsolatedLauncher", proc.stderr
    # pytest started from tests/ (or as the `pytest` script): the repository root is not on sys.path.
    test = "test_config.py::test_every_option_composes[amp-auto]"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "", test],  # the test may be slow
        cwd=REPO / "tests",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow
def test_optuna_two_trials_maximise_val_accuracy(tmp_path):
    run_cli(
        tmp_path,
        "hydra/sweeper=optuna_accuracy",
        "hydra.sweeper.n_trials=2",
        "optim.lr=interval(0.02,0.2)",
        *TINY,
        multirun=True,
    )
    result = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    accs = [metrics(tmp_path / str(i))["val_accuracy"] for i in (0, 1)]
    assert result["best_value"] == pytest.approx(max(accs))  # maximised, not Optuna's default minimise
    lrs = {yaml.safe_load((tmp_path / str(i) / "config.yaml").read_text())["optim"]["lr"] for i in (0, 1)}
    assert len(lrs) == 2 and all(0.02 <= lr <= 0.2 for lr in lrs)  # the search space reached the runs


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_sweep_through_launcher(tmp_path, launcher):
    extra = ["hydra.launcher.n_jobs=2"] if launcher == "joblib" else []
    run_cli(tmp_path, f"hydra/launcher={launcher}", *extra, "seed=0,1", "eval=false", *TINY, multirun=True)
    seeds = sorted(metrics(tmp_path / str(i))["seed"] for i in (0, 1))
    assert seeds == [0, 1]
    if launcher == "submitit_local":
        assert (tmp_path / ".submitit").is_dir()


def optuna_sweep(tmp_path, *overrides, sweeper="optuna_accuracy"):
    proc = cli_in_process("-m", f"hydra.sweep.dir={tmp_path}", f"hydra/sweeper={sweeper}", *overrides)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "alembic" not in out, out[-3000:]
    statuses = [row["status"] for row in csv.DictReader(open(tmp_path / "summary.csv"))]
    return proc, out, statuses


@pytest.mark.slow
@pytest.mark.parametrize("sweeper", ["optuna_accuracy", "optuna"])
def test_optuna_dry_run_validates_its_trials(tmp_path, sweeper):
    # `optuna` is the plugin's own config: its dry run used to end in "No trials are completed yet".
    proc, out, statuses = optuna_sweep(
        tmp_path, "hydra.sweeper.n_trials=2", "optim.lr=interval(0.02,0.2)", "dry_run=true", sweeper=sweeper
    )
    assert proc.returncode == 0, out[-3000:]
    assert statuses == ["validated", "validated"]
    assert "2 of 2 Optuna trials validated; nothing was searched" in out
    assert not (tmp_path / "optimization_results.yaml").exists()  # no search, no "best" trial
    # The plugin's default direction minimises the returned val_accuracy: said, with the fix.
    assert ("looks for the worst settings" in out) == (sweeper == "optuna"), out[-3000:]


@pytest.mark.slow
def test_optuna_sweep_with_only_failed_trials_ends_with_its_summary(tmp_path):
    # A failed job returns NaN, which Optuna 4 refuses with an exception: the search used to end there.
    proc, out, statuses = optuna_sweep(tmp_path, "hydra.sweeper.n_trials=1", "optim.lr=interval(-0.2,-0.1)")
    assert proc.returncode == 1, out[-3000:]
    assert statuses == ["failed"] and "optim.lr must be positive" in out
    assert "No Optuna trial completed" in out
