"""Installed the usual ways, the runner works from any directory: the config groups ship inside the
package, the isolated launcher is found, and the console script (with Hydra's shell completion) runs.
The wheel owns one import namespace, so it installs beside Hugging Face's `datasets`."""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest
from conftest import REPO, TINY, metrics

IGNORED = shutil.ignore_patterns(".venv", ".git", "outputs", "multirun", "__pycache__", "*.egg-info", "build")


def fresh_venv(path, *pip_args):
    """A new venv with the runner installed by `pip install --no-deps <pip_args>`, that sees this venv's
    site-packages (MindSpore, Hydra) through a .pth line written after the install (else pip would find
    this venv's runner already installed), and not this venv's runner: a .pth path line does not run
    the .pth files found there."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    cmd = [sys.executable, "-m", "pip", "--python", str(path / "bin" / "python"), "install", "-q", "--no-deps"]
    # Built in pip's isolated build environment: this venv's runner must stay out of pip's sight.
    subprocess.run([*cmd, *pip_args], check=True, capture_output=True, env=clean_env())
    site = subprocess.run(
        [str(path / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with open(os.path.join(site, "main-venv.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    return path / "bin"


def clean_env():
    """No PYTHONPATH: the runner must come from the venv, not from this checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ONEDNN_MAX_CPU_ISA")}


def run(cmd, cwd, timeout=600, env=None):
    proc = subprocess.run(cmd, cwd=cwd, env=env or clean_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_editable_install_runs_from_another_directory(tmp_path):
    # pip's default editable install maps packages with an import hook, which Hydra's plugin scan
    # cannot walk: the isolated launcher must still be found, and the config groups too.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=IGNORED)
    bin_dir = fresh_venv(tmp_path / "venv", "-e", str(src))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run(
        [str(bin_dir / "python"), "-m", "runner", "-m", "dry_run=true", f"hydra.sweep.dir={tmp_path}/s"], elsewhere
    )
    assert "Configuration is valid" in proc.stdout
    proc = run([str(bin_dir / "runner-train"), "--cfg", "job", "amp=o2"], elsewhere)
    assert "level: O2" in proc.stdout


def test_console_scripts_and_their_deprecated_aliases():
    from importlib.metadata import distribution

    from runner.cli import aliases

    # As installed (pyproject.toml [project.scripts]).
    scripts = {e.name: e.value for e in distribution("mindspore-runner").entry_points if e.group == "console_scripts"}
    for old, (new, target) in aliases.RENAMED.items():
        assert scripts[new] == target
        assert scripts[old] == f"runner.cli.aliases:{old.replace('-', '_')}"
    assert scripts["runner-configs"] == "runner.cli.commands:configs"  # ls / cp of the built-in configs (no old name)
    assert scripts["runner-runs"] == "runner.cli.commands:runs"  # the run directories as a collection (no old name)
    assert scripts["runner-convert"] == "runner.cli.commands:convert"
    assert {n for n in scripts if not n.startswith("msrun-")} == {n for n, _ in aliases.RENAMED.values()} | {
        "runner-configs",
        "runner-runs",
        "runner-convert",
    }


def top_level_names(wheel) -> set:
    """What a wheel installs at the top of site-packages (its .dist-info aside), two levels for hydra_plugins."""
    names = set()
    for path in zipfile.ZipFile(wheel).namelist():
        parts = path.split("/")
        if not parts[0].endswith(".dist-info"):
            names.add("/".join(parts[:2]) if parts[0] == "hydra_plugins" else parts[0])
    return names


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_trains_and_sweeps(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=IGNORED)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
        env=clean_env(),
    )
    (wheel,) = wheels.glob("*.whl")
    # One import namespace: nothing that another distribution (Hugging Face's `datasets`) could own.
    assert top_level_names(wheel) == {"runner", "hydra_plugins/runner_launcher"}
    assert (
        "License-Expression: Apache-2.0"
        in zipfile.ZipFile(wheel)
        .read(next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA")))
        .decode()
    )
    bin_dir = fresh_venv(tmp_path / "venv", str(wheel))
    work = tmp_path / "work"
    work.mkdir()
    where = run([str(bin_dir / "python"), "-c", "import runner; print(runner.__file__)"], work).stdout
    assert str(tmp_path / "venv") in where  # the wheel's copy, not this checkout

    # Hugging Face's datasets from PyPI into the same site-packages, numpy kept at this venv's version
    # (numpy<2 for MindSpore), so the wheel's runner still runs beside it. pyarrow 24,
    # which the newest datasets requires, imports only under NumPy 2 (measured: "pyarrow requires NumPy
    # 2.0 or newer"), so pip takes the newest datasets that runs with pyarrow 23 (docs/getting-started.md, Install).
    # numpy stays at the fresh venv's version (MindSpore needs numpy<2); the others datasets may move: pinning
    # all of them broke on the registry's drift (fsspec 2026.9 in the venv, datasets asks <=2026.6, so pip went
    # back to a datasets of 2020 built from source).
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pins = tmp_path / "constraints.txt"
    lines = [line for line in frozen.splitlines() if line.lower().startswith("numpy==")]
    pins.write_text("\n".join([*lines, "pyarrow<24"]) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "-q"]
    run([*pip, "-c", str(pins), "datasets"], work, timeout=900)
    both = (
        "import datasets, runner.datasets as mine; print(datasets.load_dataset.__module__, mine.DataConfig.__module__)"
    )
    assert run([str(bin_dir / "python"), "-c", both], work).stdout.split() == [
        "datasets.load",
        "runner.datasets.settings",
    ]

    run([str(bin_dir / "runner-train"), *TINY, f"hydra.run.dir={work}/one"], work)
    assert metrics(work / "one")["val_accuracy"] > 0.3
    evaluated = run([str(bin_dir / "runner-evaluate"), f"run={work}/one"], work).stdout
    assert "top1" in evaluated  # the other commands' console scripts, from the wheel's runner/conf too
    # The old name still runs, after one line on stderr.
    old = run([str(bin_dir / "msrun-evaluate"), f"run={work}/one"], work)
    assert "top1" in old.stdout
    assert "msrun-evaluate is deprecated and will be removed in the next release: use runner-evaluate." in old.stderr
    if shutil.which("g++"):  # model.conv=onednn compiles from the wheel's own copy of its source and headers
        build = "from runner.models import onednn; print(onednn.SOURCE); print(onednn.library())"
        env = {**clean_env(), "XDG_CACHE_HOME": str(tmp_path / "cache")}
        source, lib = run([str(bin_dir / "python"), "-c", build], work, env=env).stdout.split()[-2:]
        assert str(tmp_path / "venv") in source and lib.startswith(str(tmp_path / "cache"))
    run(
        [
            str(bin_dir / "python"),
            "-m",
            "runner",
            "-m",
            "seed=0,1",
            "eval=false",
            *TINY,
            f"hydra.sweep.dir={work}/sweep",
        ],
        work,
    )
    assert sorted(metrics(work / "sweep" / str(i))["seed"] for i in (0, 1)) == [0, 1]
    assert (work / "sweep" / "summary.md").exists()

    # Hydra's tab completion answers for the console script (it cannot for `python -m`).
    comp = subprocess.run(
        [str(bin_dir / "runner-train"), "-sc", "query=bash"],
        cwd=work,
        env={**clean_env(), "COMP_LINE": "runner-train amp=o", "COMP_POINT": str(len("runner-train amp=o"))},
        capture_output=True,
        text=True,
    )
    assert set(comp.stdout.split()) >= {"amp=o0", "amp=o1", "amp=o2", "amp=o3"}


@pytest.mark.slow  # a pytest session in a subprocess: ~20 s here
def test_the_compiled_operators_tests_skip_without_a_compiler_and_say_what_to_install(tmp_path):
    """Every test that builds the oneDNN operators skips with one reason where no C++ compiler is (the SIGTERM
    test of the build failed there instead), and the summary names what to install; so does `make test`."""
    env = {**os.environ, "CXX": str(tmp_path / "no-such-g++"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-q", "-rs", "-m", "slow", "-k", "onednn_build"]
    proc = subprocess.run([*cmd, "tests/test_cli_signals.py"], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "1 skipped" in proc.stdout, proc.stdout[-3000:]
    assert "needs a C++ compiler" in proc.stdout and "apt-get install g++" in proc.stdout
    make = subprocess.run(["make", "-s", "compiler"], cwd=REPO, env=env, capture_output=True, text=True)
    assert make.returncode == 0 and "apt-get install g++" in make.stdout, make.stdout + make.stderr
