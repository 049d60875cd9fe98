"""The console scripts as a user types them: Hydra's printing flags (shell completion, --help) work for
every command, also where the command needs run=, and a closed pipe ends them quietly."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
