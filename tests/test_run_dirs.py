"""Nothing is overwritten: a run starts only in a new or empty directory or in its own run, every check
that can refuse runs before Hydra writes `.hydra/`, and evaluate, predict and export write only a new
directory of their own. In process: the pre-flight check each command runs before Hydra."""

import importlib
import json

import pytest
from conftest import REPO, TINY, compose_cfg, run_cli

from runner.errors import UserError
from runner.report.outputs import write_config


def preflight_of(module: str, *argv):
    """What `python -m <module> argv` checks before Hydra starts (raises the user's error)."""
    from runner.cli.preflight import preflight

    if module == "runner.__main__":
        cli = importlib.import_module(module).train
    else:  # the commands' console-script functions live in the entry layer (runner/cli/commands.py)
        cli = getattr(importlib.import_module("runner.cli.commands"), module.rsplit(".", 1)[1])
    preflight(cli.app, list(argv))


@pytest.fixture
def users_folder(tmp_path):
    """A folder of the user's own, with files named as a run's outputs are: they must survive."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.yaml").write_text("my own config\n")
    (folder / "model.ckpt").write_text("my own weights\n")
    yield folder
    assert (folder / "config.yaml").read_text() == "my own config\n"
    assert (folder / "model.ckpt").read_text() == "my own weights\n"
    assert sorted(p.name for p in folder.iterdir()) == ["config.yaml", "model.ckpt"]


@pytest.fixture
def finished(tmp_path):
    """What a finished run leaves for these checks: its config.yaml, completion record, lock file and
    Hydra's record of the command that made it."""
    run = tmp_path / "run"
    run.mkdir()
    write_config(str(run), compose_cfg(*TINY))
    (run / ".runner.complete").write_text(json.dumps({"steps": 44}))
    (run / ".runner.rundir.lock").write_text("")
    (run / "metrics.json").write_text(json.dumps({"val_accuracy": 0.5}))
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("- the run's own overrides\n")
    return run


def test_a_run_never_starts_in_a_folder_of_someone_elses_files(users_folder):
    with pytest.raises(UserError, match="holds files that are not a run of this runner"):
        preflight_of("runner.__main__", f"hydra.run.dir={users_folder}", *TINY)
    # init_from= a checkpoint in that folder, written into the same folder: its own source.
    with pytest.raises(UserError, match="holds files that are not a run of this runner"):
        preflight_of("runner.__main__", f"init_from={users_folder / 'model.ckpt'}", f"hydra.run.dir={users_folder}")
    with pytest.raises(UserError, match="holds files that are not this runner's"):
        preflight_of("runner.__main__", "-m", "seed=1,2", f"hydra.sweep.dir={users_folder}")
    # The Python API refuses it the same way, before it writes its log there.
    from runner.api import train

    with pytest.raises(UserError, match="holds files that are not a run of this runner.*choose another run_dir"):
        train(compose_cfg(*TINY), str(users_folder))


def test_new_empty_and_own_directories_are_fine(tmp_path, finished):
    (tmp_path / "empty").mkdir()
    preflight_of("runner.__main__", f"hydra.run.dir={tmp_path / 'empty'}", *TINY)
    preflight_of("runner.__main__", f"hydra.run.dir={tmp_path / 'new' / 'run'}", *TINY)
    preflight_of("runner.__main__", f"hydra.run.dir={finished}", "resume=true", *TINY)  # continues its own run


def test_refusals_of_a_run_or_a_resume_come_before_hydra_writes(finished):
    # A fresh run into a finished run, a resume that changes the network, a value out of range: each
    # refused by the check before Hydra, which would otherwise have rewritten .hydra/overrides.yaml first.
    with pytest.raises(UserError, match="already holds a run"):
        preflight_of("runner.__main__", f"hydra.run.dir={finished}", *TINY)
    with pytest.raises(UserError, match="cannot change mid-run.*model.width"):
        preflight_of("runner.__main__", f"hydra.run.dir={finished}", "resume=true", *TINY[:-2], "model.width=16")
    with pytest.raises(UserError, match="optim.lr must be positive"):
        preflight_of("runner.__main__", f"hydra.run.dir={finished}", "resume=true", *TINY, "optim.lr=-1")
    assert not (finished / "resume.json").exists()


def test_a_refused_resume_leaves_the_run_as_it_was(finished):
    # The command line end to end: exit 2, and the run's own record of how it was made is untouched.
    def files():  # (the lock file names whichever process last checked the lock)
        return {p.name: p.read_bytes() for p in finished.rglob("*") if p.is_file() and p.name != ".runner.rundir.lock"}

    before = files()
    proc = run_cli(finished, "resume=true", *TINY[:-2], "model.width=16", check=False)
    assert proc.returncode == 2 and "cannot change mid-run" in " ".join(proc.stderr.split()), proc.stderr
    assert files() == before


@pytest.mark.parametrize("command", ["evaluate", "predict", "export"])
def test_lifecycle_commands_write_only_a_new_directory_of_their_own(finished, users_folder, tmp_path, command):
    args = [f"run={finished}", *(["input=" + str(REPO / "README.md")] if command == "predict" else [])]
    for where in (finished, users_folder):
        with pytest.raises(UserError, match=f"{command} writes only into a directory of its own"):
            preflight_of(f"runner.{command}", *args, f"hydra.run.dir={where}")
    preflight_of(f"runner.{command}", *args)  # the default: a new <run>/<command>-<time>
    preflight_of(f"runner.{command}", *args, f"hydra.run.dir={tmp_path / 'out'}")


@pytest.mark.parametrize("subdir", ["/tmp/elsewhere", "../..", ".hydra/../../x"])
def test_hydras_record_stays_inside_the_run(tmp_path, subdir):
    # hydra.output_subdir is where Hydra writes config.yaml, hydra.yaml and overrides.yaml.
    from runner.errors import ConfigError

    with pytest.raises(ConfigError, match="hydra.output_subdir=.* is refused"):
        preflight_of("runner.__main__", f"hydra.output_subdir={subdir}", f"hydra.run.dir={tmp_path / 'r'}")


@pytest.mark.slow
def test_sweepers_and_launchers_write_only_inside_the_sweep_directory(tmp_path):
    from runner.errors import ConfigError

    sweep = ["-m", f"hydra.sweep.dir={tmp_path / 's'}", "dry_run=true"]
    optuna = [*sweep, "hydra/sweeper=optuna_accuracy", "hydra.sweeper.n_trials=1"]
    for storage in (f"sqlite:///{tmp_path / 'mine.db'}", "postgresql://db.example/x"):
        with pytest.raises(ConfigError, match="hydra.sweeper.storage=.* is refused"):
            preflight_of("runner.__main__", *optuna, f"hydra.sweeper.storage={storage}")
    preflight_of("runner.__main__", *optuna, "hydra.sweeper.storage=sqlite:///${hydra.sweep.dir}/optuna.db")
    with pytest.raises(ConfigError, match="hydra.launcher.submitit_folder=.* is refused"):
        submitit = ["hydra/launcher=submitit_local", f"hydra.launcher.submitit_folder={tmp_path / 'mine'}"]
        preflight_of("runner.__main__", *sweep, "seed=1,2", *submitit)
    preflight_of("runner.__main__", *sweep, "seed=1,2", "hydra/launcher=submitit_local")


def test_claiming_a_directory_says_what_the_run_does_there(tmp_path):
    """claim_run_dir's answer names the case: a fresh start, or a finished run that leaves nothing to train."""
    from runner.rundir.claim import Start, claim_run_dir
    from runner.rundir.layout import RunDir

    assert claim_run_dir(compose_cfg(*TINY), str(tmp_path / "new"), []) is Start.FRESH
    finished = tmp_path / "finished"
    finished.mkdir()
    write_config(str(finished), compose_cfg(*TINY))
    with open(RunDir(str(finished)).complete, "w") as f:
        json.dump({"steps": 44}, f)
    assert claim_run_dir(compose_cfg(*TINY, "resume=true"), str(finished), []) is Start.NOTHING_TO_TRAIN
    with pytest.raises(UserError, match="cannot be extended"):  # more epochs, and no checkpoint to continue
        claim_run_dir(compose_cfg(*TINY, "resume=true", "epochs=2"), str(finished), [])
