"""The console scripts as a user types them: Hydra's printing flags (shell completion, --help) work for
every command, also where the command needs run=, and a closed pipe ends them quietly."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from docs_pages import user_docs

BIN = Path(sys.executable).parent
SCRIPTS = ["runner-train", "runner-evaluate", "runner-predict", "runner-export"]


def script(name, *args, **kw):
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, timeout=120, env=env, **kw)


@pytest.mark.parametrize("name", SCRIPTS)
def test_shell_completion_installs_for_every_console_script(name, tmp_path):
    proc = script(name, "-sc", "install=bash", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"export _HYDRA_OLD_COMP=$(complete -p {name} "), proc.stdout[:200]
    assert f"complete -o nospace -o default -F hydra_bash_completion {name}" in proc.stdout
    assert proc.stderr == ""
    assert not any(tmp_path.iterdir())  # printing writes no outputs/ directory


def test_completion_offers_the_commands_own_fields(tmp_path):
    # What bash asks when the user presses Tab after a partial word (evaluate needs run=, not given here).
    name = "runner-evaluate"
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    query = subprocess.run(
        [str(BIN / name), "-sc", "query=bash"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**env, "COMP_LINE": f"{name} bat"},
    )
    assert query.returncode == 0 and "batch_size=" in query.stdout.split(), query.stdout + query.stderr


@pytest.mark.slow
def test_deprecated_alias_completes_without_its_warning(tmp_path):
    proc = script("msrun-evaluate", "-sc", "install=bash", cwd=tmp_path)
    assert proc.returncode == 0 and "hydra_bash_completion msrun-evaluate" in proc.stdout
    assert proc.stderr == ""  # bash shows a completion's stderr on the prompt line
    assert "deprecated" in script("msrun-evaluate", "--help", cwd=tmp_path).stderr


def test_a_closed_pipe_ends_printing_quietly(tmp_path):
    # `runner-evaluate -sc install=bash | head`: the reader is gone before the command writes.
    proc = subprocess.Popen(
        [str(BIN / "runner-evaluate"), "-sc", "install=bash"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (-13, 0), err  # killed by SIGPIPE, as `cat file | head` kills cat
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_the_run_argument_is_still_required_for_running(tmp_path):
    proc = script("runner-evaluate", cwd=tmp_path)
    assert proc.returncode == 2 and "evaluate needs the run to use" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_configs_ls_lists_every_group_a_user_selects(capsys):
    from runner.cli.commands import configs_main as main

    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("  ")}
    assert lines["optim"] == ["adam", "adamw", "lion", "momentum", "sgd"]
    assert {"ladder", "quick"} <= set(lines["experiment"]) and "+experiment" not in out  # experiment=quick works
    assert "hydra/sweeper" in lines and "ladder" not in lines  # the ladder's rungs are internal


def test_configs_cp_copies_an_experiment_that_the_runner_then_uses(tmp_path, monkeypatch, capsys):
    from runner.cli.commands import configs_main as main

    monkeypatch.chdir(tmp_path)
    assert main(["cp", "experiment/quick"]) == 0
    out = capsys.readouterr().out
    copy = tmp_path / "conf" / "experiment" / "my_quick.yaml"
    assert copy.read_text().startswith("# @package _global_")  # the line a user experiment needs
    assert "runner-train --config-dir conf experiment=my_quick" in out
    copy.write_text(copy.read_text().replace("epochs: 2", "epochs: 7"))
    # The command line the copy prints, as a user runs it; the + of earlier releases selects it too.
    for spelling in ("experiment=my_quick", "+experiment=my_quick"):
        proc = script("runner-train", "--config-dir", "conf", spelling, "--cfg", "job", cwd=tmp_path)
        assert proc.returncode == 0 and "\nepochs: 7\n" in proc.stdout, proc.stderr
    # Never over an existing file, and never under a built-in's name (Hydra would use the built-in).
    assert main(["cp", "experiment/quick"]) == 2
    assert main(["cp", "optim/sgd", "conf/optim/sgd.yaml"]) == 2
    assert "would be hidden by the built-in optim/sgd" in capsys.readouterr().err
    assert main(["cp", "optim/nope"]) == 2 and "its options are adam, adamw" in " ".join(
        capsys.readouterr().err.split()
    )


def readme_files(tmp_path) -> None:
    """Write the documentation's example config files (```yaml blocks that start `# file: <path>`; today those of
    docs/configuration.md) under tmp_path."""
    text = "\n".join(text for _, text in user_docs())
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        first, _, body = block.partition("\n")
        if first.startswith("# file: "):
            path = tmp_path / first[len("# file: ") :]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)


def test_readme_user_experiment_and_option_compose_as_written(tmp_path):
    readme_files(tmp_path)
    assert (tmp_path / "conf/experiment/wide.yaml").exists() and (tmp_path / "conf/optim/slow_sgd.yaml").exists()
    proc = script("runner-train", "--config-dir", "conf", "+experiment=wide", "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    job = yaml.safe_load(proc.stdout)
    assert (job["model"]["name"], job["optim"]["name"], job["optim"]["lr"], job["optim"]["nesterov"]) == (
        "resnet20",
        "sgd",
        0.01,
        True,
    )
    assert (job["epochs"], job["batch_size"], job["experiment_name"]) == (3, 64, "wide")
    # Without `# @package _global_` the keys land under `experiment:`: the pre-flight says what the file lacks.
    bare = tmp_path / "conf/experiment/bare.yaml"
    bare.write_text("epochs: 3\n")
    proc = script("runner-train", "--config-dir", "conf", "+experiment=bare", "dry_run=true", cwd=tmp_path)
    assert proc.returncode == 2 and "starts with the line `# @package _global_`" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr


def test_train_help_has_one_line_per_group_and_the_commands_after_training(tmp_path):
    from runner.builtin_configs import groups

    proc = script("runner-train", "--help", cwd=tmp_path)
    assert proc.returncode == 0 and "powered by Hydra" not in proc.stdout, proc.stderr
    text = proc.stdout.split("Config groups", 1)[1].split("\n\n", 1)[0]
    lines: dict = {}
    last = ""
    for line in text.splitlines()[1:]:  # a group's line, and its continuation lines (deeper indented)
        if line.startswith("   "):
            lines[last] += line
        else:
            last = line.split()[0]
            lines[last] = line
    user_groups = {g for g in groups() if "/" not in g}  # hydra/sweeper is Hydra's, in --hydra-help
    assert set(lines) == user_groups and "ladder" not in lines  # the ladder's rungs are internal
    for group in user_groups:
        for option in groups()[group]:
            assert re.search(rf"\b{option}\b", lines[group]), (group, option)
    for after in ("runner-evaluate run=", "runner-predict run=", "runner-export run=", "--config-name config"):
        assert after in proc.stdout
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["evaluate", "predict", "export"])
@pytest.mark.slow
def test_each_command_help_shows_its_own_usage(name, tmp_path):
    proc = script(f"runner-{name}", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"\n  runner-{name} run=<run dir>" in proc.stdout and f"python -m runner.{name} ..." in proc.stdout
    assert "Settings and their defaults" in proc.stdout and not any(tmp_path.iterdir())


def test_a_dry_run_leaves_no_run_directory(tmp_path):
    proc = script("runner-train", "dry_run=true", cwd=tmp_path)
    assert proc.returncode == 0 and "Configuration is valid" in proc.stdout, proc.stderr
    assert not any(tmp_path.iterdir())  # not even an empty outputs/
    # A directory of the user's own is refused, as the real run would be (tests/test_run_dirs.py), before
    # Hydra writes anything into it: it keeps its files, and only them.
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    proc = script("runner-train", "dry_run=true", "hydra.run.dir=keep", cwd=tmp_path)
    assert proc.returncode == 2 and "not a run of this runner" in " ".join(proc.stderr.split()), proc.stderr
    assert [p.name for p in keep.iterdir()] == ["notes.txt"] and (keep / "notes.txt").read_text() == "mine"


def test_runner_configs_and_its_module_print_the_same_listing(tmp_path):
    by_script = script("runner-configs", "ls", cwd=tmp_path)
    by_module = subprocess.run(
        [sys.executable, "-m", "runner.builtin_configs", "ls"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert by_script.returncode == by_module.returncode == 0, by_script.stderr + by_module.stderr
    assert by_script.stdout == by_module.stdout and "optim" in by_script.stdout
