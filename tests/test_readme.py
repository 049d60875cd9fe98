"""The documentation's commands, run as written in a fresh directory: "Using a trained model" and "When the loss
becomes NaN" print the numbers their pages show (accuracies, losses, counts; timings and paths differ from
machine to machine), and every training command of the README and the site's pages composes."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cpu_class
from docs_pages import page, section, user_docs

# The numbers the pages show are those of one CPU class (conftest.py cpu_class: the vector ISA and the threads),
# named on the page as "CPU class `...`". A run is deterministic within a class (tests/test_train.py pins a loss
# curve), so on that class every figure must be the one shown, digit for digit. Another class's kernels sum in
# another order (over three epochs: an accuracy a sample or two apart, a loss a few percent), so there the
# commands still run as written and the counts are compared, and the figures are not: they were measured on
# the class the page names.
EXACT = re.compile(r"\b(val_acc|val_loss|train_loss|top1|top5|top-1 agreement) ([0-9.]+)|(\d+) images classified")
DIFF = re.compile(r"max \|diff\| ([0-9.e+-]+)")


def commands(text: str) -> list:
    """(command, the output lines the page shows for it) for each `$ ` line of the section's code blocks;
    a here-document (<<'EOF') runs to its EOF line. Package installs are left to the reader."""
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.startswith("$ "):
                if found and line.strip():
                    found[-1][1].append(line)
                continue
            cmd = line[2:].split("  #")[0].strip()
            if "<<'EOF'" in cmd:
                body = []
                while lines[i] != "EOF":
                    body.append(lines[i])
                    i += 1
                i += 1
                cmd = "\n".join([cmd, *body, "EOF"])
            found.append((cmd, []))
    return [(c, out) for c, out in found if not c.startswith("pip ")]


def reader_env() -> dict:
    """The environment a reader's shell has: `python` is the venv's, as the pages say, and no
    ONEDNN_MAX_CPU_ISA of the tests' own."""
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def numbers(line: str) -> list:
    return [m.group(0) for m in EXACT.finditer(line)]


def quoted_class(text: str) -> str:
    """The CPU class a page's figures were measured on ("CPU class `AVX-512 with AVX512_BF16, 2 threads`")."""
    found = re.search(r"CPU class `([^`]+)`", text)
    assert found, "the page names no CPU class its figures are of"
    return found.group(1)


def agree(shown: list, got: list, exact: bool) -> bool:
    """The same numbers: digit for digit on the page's CPU class (exact), else the same names and counts."""
    if len(shown) != len(got):
        return False
    for a, b in zip(shown, got):
        name, x = a.rsplit(" ", 1) if not a.endswith("classified") else (a, "")
        name_b, y = b.rsplit(" ", 1) if not b.endswith("classified") else (b, "")
        if name != name_b or (exact and x != y):
            return False
    return True


def same_line(shown: str, out: list) -> str:
    """The output line a page's line shows: the same log message, or the line with the same first word."""
    if shown.startswith("[") and "] - " in shown:
        message = shown.split("] - ", 1)[1].split(":")[0]
        hits = [line for line in out if f"] - {message}:" in line]
    else:
        hits = [line for line in out if line.split()[:1] == shown.split()[:1]]
    assert hits, (shown, out[-20:])
    return hits[-1]


@pytest.mark.slow
def test_using_a_trained_model_runs_as_written(tmp_path):
    steps = commands(page("using-a-trained-model.md"))
    assert [c.split()[2] if c.startswith("python -m") else c.split()[0] for c, _ in steps][:5] == [
        "runner",
        "runner.evaluate",
        "python",
        "runner.predict",
        "runner.export",
    ]
    env = reader_env()
    exact = quoted_class(page("using-a-trained-model.md")) == cpu_class()
    for cmd, shown in steps:
        proc = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{cmd}\n{out[-3000:]}"
        assert "Traceback" not in out, out[-3000:]
        for line in (line for line in shown if numbers(line)):
            got = same_line(line, out.splitlines())
            assert agree(numbers(line), numbers(got), exact), (cmd, line, got, cpu_class())
        for value in (float(d) for line in out.splitlines() for d in DIFF.findall(line)):
            assert value <= 1e-4  # the parity the command checks
    predictions = next((tmp_path / "outputs" / "digits").glob("predict-*/predictions.csv")).read_text().splitlines()[1:]
    truth = [(re.search(r"true(\d)", row).group(1), row.split(",")[1]) for row in predictions]
    assert len(truth) == 60 and all(t == p for t, p in truth)  # "All 60 are classified as their true class"


def _training_commands(lines: list) -> list:
    """Every `python -m runner ...` / `runner-train ...` / `runner-configs ...` command line in the code blocks of
    a page (a trailing `\\` continues it), in order, with comments cut."""
    found, block = [], False
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("```"):
            block = not block
            continue
        text = line[2:] if line.startswith("$ ") else line
        if not block or not re.match(r"(python -m runner(?![.\w])|runner-train\b|runner-configs\b)", text):
            continue
        while text.rstrip().endswith("\\") and i < len(lines):
            text = text.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
        found.append(re.split(r"\s+#\s", text)[0].strip())
    return found


# Commands that need what a test machine lacks: a user's data set or a checkpoint on disk (named by an
# absolute path or a placeholder), a Slurm cluster.
NEEDS_ELSEWHERE = re.compile(r"<|~/|=/data|=/w/|submitit_slurm")


def dry_run_commands() -> dict:
    """{page: its training commands a test machine can run}, each command under the first page that shows it."""
    seen, pages = set(), {}
    for name, text in user_docs():
        for cmd in _training_commands(text.splitlines()):
            if cmd in seen or NEEDS_ELSEWHERE.search(cmd) or cmd.count("python -m runner") > 1:
                continue  # (two nodes' commands side by side need two machines)
            seen.add(cmd)
            pages.setdefault(name, []).append(cmd)
    return pages


def test_the_docs_show_the_training_commands_the_dry_runs_read():
    assert sum(map(len, dry_run_commands().values())) >= 15 and "README.md" in dry_run_commands()


# One case a page, the page's commands in order: the slow suite's workers share them out, where one case of
# 45 commands (4 min) kept a worker busy after the other had finished.
@pytest.mark.slow
@pytest.mark.parametrize("name", list(dry_run_commands()))
def test_every_training_command_in_the_docs_runs_as_a_dry_run(tmp_path, name):
    from test_commands import readme_files

    readme_files(tmp_path)  # the pages' example config files, for the commands that use them
    env = reader_env()
    for cmd in dry_run_commands()[name]:
        prints = any(flag in cmd.split() for flag in ("--help", "--cfg", "-sc")) or cmd.startswith("runner-configs")
        full = cmd if prints or "dry_run=" in cmd else f"{cmd} dry_run=true"
        # An Optuna sweep's dry run validates each trial in a process of its own (~4 s each): two trials show
        # the command composes and samples, where the page's 20 took 77 s of the slow suite.
        full = re.sub(r"hydra\.sweeper\.n_trials=\d+", "hydra.sweeper.n_trials=2", full)
        proc = subprocess.run(["bash", "-c", full], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0 and "Traceback" not in out, f"{full}\n{out[-3000:]}"


NUMBER = re.compile(r"\d+\.\d+(?:e[+-]?\d+)?|\d+(?:e[+-]?\d+)?")


def same_text(shown: str, got: str, exact: bool) -> bool:
    """The same words and, on the page's CPU class (exact), the same numbers; elsewhere integers (steps, scales,
    counts) still exactly, decimals not compared."""
    if NUMBER.sub("#", shown) != NUMBER.sub("#", got):
        return False
    return all(a == b or (not exact and "." in a) for a, b in zip(NUMBER.findall(shown), NUMBER.findall(got)))


@pytest.mark.slow
def test_when_the_loss_becomes_nan_runs_as_written(tmp_path):
    import json

    text = section("amp.md", "When the loss becomes NaN")
    steps = commands(text)
    assert len(steps) == 4, [c for c, _ in steps]
    env = reader_env()
    exact = quoted_class(text) == cpu_class()

    def run(cmd):
        proc = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
        assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
        return proc

    (stop, stop_shown), (trace, trace_shown), (fixed, fixed_shown), (o0, o0_shown) = steps
    proc = run(stop)
    assert proc.returncode == 2, proc.stderr[-3000:]  # stopped, diagnosed: a user error
    out = (proc.stdout + proc.stderr).splitlines()
    for line in (line for line in stop_shown if line.startswith("[runner]")):
        message = line.split("] - ", 1)[1]
        got = [o.split("] - ", 1)[1] for o in out if "] - " in o and o.split("] - ", 1)[1][:12] == message[:12]]
        assert got and same_text(message, got[-1], exact), (line, got)
    # The error paragraph up to the paths (which are this machine's).
    paragraph = " ".join(stop_shown[stop_shown.index(next(s for s in stop_shown if s.startswith("Error:"))) :])
    both = proc.stdout + proc.stderr
    error = " ".join(both[both.index("Error:") :].split())
    cut = "are in"
    assert same_text(paragraph.split(cut)[0].strip(), error.split(cut)[0].strip(), exact), (paragraph, error)

    proc = run(trace)
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == len(trace_shown) == 5
    for shown, got in zip(trace_shown, proc.stdout.splitlines()):
        assert same_text(shown, got, exact), (shown, got)

    for cmd, shown in ((fixed, fixed_shown), (o0, o0_shown)):
        proc = run(cmd)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = same_line(shown[0], proc.stdout.splitlines())
        assert agree(numbers(shown[0]), numbers(got), exact), (shown[0], got, cpu_class())
        assert shown[0].split(" | ")[-2] == got.split(" | ")[-2]  # graph O2 on CPU / graph O0 on CPU
        if cmd == fixed:
            run_dir = Path(got.rsplit("outputs: ", 1)[1])
            scale = json.loads((run_dir / "metrics.json").read_text())["loss_scale"]
            assert (scale["initial"], scale["min"], scale["skipped_steps"]) == (1024, 1024, 0)  # as the prose says

    # "Under O3 ... the diagnosis needs two rounds and suggests amp.keep_fp32=[stem.0,stem.1]"
    proc = run(stop.replace("amp=o2", "amp=o3").replace("nan-demo", "nan-demo-o3"))
    both = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "re-run with 'amp.keep_fp32=[stem.0,stem.1]'" in " ".join(both.split())
    rounds = [line for line in both.splitlines() if "went non-finite first; trying again" in line]
    assert len(rounds) == 2, both[-3000:]
