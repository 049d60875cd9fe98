"""Bad input that used to end in a traceback: each is one paragraph and a clear exit code."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import REPO, TINY, cli_in_process, dry_run, metrics, run_in_process


def clean_error(proc, *words, code=2):
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    text = " ".join(proc.stderr.split())
    for w in words:
        assert w in text, (w, proc.stderr)


def bad_folder(root, *kinds):
    """A small image folder with one bad training file per kind: a dangling symlink or an oversized image."""
    from imagegen import digit_folder, oversized_png

    digit_folder(root, [(12, 12)], per_class=6, classes=3, val_per_class=2)
    bad = []
    for kind in kinds:
        path = root / "train" / "1" / f"bad_{kind}.png"
        if kind == "dangling":
            os.symlink(root / "nowhere.png", path)
        else:
            oversized_png(path)
        bad.append(str(path))
    return bad


@pytest.mark.parametrize("kind,words", [("dangling", ["symbolic link", "nowhere.png"]), ("bomb", ["pixels"])])
def test_bad_image_file_is_named(tmp_path, kind, words):
    (victim,) = bad_folder(tmp_path / "data", kind)
    proc = run_in_process(tmp_path / "run", "data=imagefolder", f"data.root={tmp_path / 'data'}", *TINY, check=False)
    clean_error(proc, victim, "data.on_bad_sample=skip", *words)


@pytest.mark.slow
def test_skip_leaves_out_and_lists_dangling_links_and_oversized_images(tmp_path):
    bad = bad_folder(tmp_path / "data", "dangling", "bomb")
    args = ["data=imagefolder", f"data.root={tmp_path / 'data'}", "data.on_bad_sample=skip", "batch_size=4", *TINY]
    run_in_process(tmp_path / "run", *args)
    m = metrics(tmp_path / "run")
    assert sorted(m["skipped_samples"]) == sorted(bad)
    assert m["train_samples"] == 18 and m["final_loss"] > 0  # 3 classes x 6 good files, nothing else


@pytest.mark.parametrize(
    "overrides,words",
    [
        (["optim.lr=${oc.env:HOME}"], ["optim.lr cannot be resolved", "${oc.env:HOME}"]),
        (["optim.lr=${nowhere}"], ["optim.lr cannot be resolved", "nowhere"]),
        (["seed=-1"], ["seed must be between 0 and 2**32 - 1", "got -1"]),
        ([f"seed={2**32}"], ["seed must be between", f"got {2**32}"]),
        (["data.num_parallel_workers=100000"], ["data.num_parallel_workers must be at most", "100000"]),
        (["optim.lr=nan"], ["Non-finite", "optim.lr=nan"]),
        (["optim.lr=inf"], ["Non-finite", "optim.lr=inf"]),
        (["amp.loss_scale.type=fixed", "amp.loss_scale.init=-inf"], ["amp.loss_scale.init=-inf"]),
        (["device.cpu_isa_cap=garbage"], ["device.cpu_isa_cap='garbage'", "AVX2", "AVX512_CORE"]),
        (["distributed=dp", "distributed.master_port=70000"], ["distributed.master_port", "70000"]),
        (["distributed=dp", "distributed.master_port=-5"], ["distributed.master_port", "-5"]),
    ],
)
def test_bad_values_are_refused_before_anything_runs(tmp_path, overrides, words):
    clean_error(dry_run(tmp_path, *overrides), *words)


def test_unknown_isa_in_the_environment(tmp_path):
    proc = dry_run(tmp_path, env={"ONEDNN_MAX_CPU_ISA": "garbage"})
    clean_error(proc, "ONEDNN_MAX_CPU_ISA='garbage'", "SSE41")
    # oneDNN reads the names in any case.
    assert dry_run(tmp_path / "b", env={"ONEDNN_MAX_CPU_ISA": "avx2"}).returncode == 0


def test_val_fraction_leaving_no_training_rows(tmp_path):
    proc = run_in_process(tmp_path, "data.val_fraction=0.9999", *TINY, check=False)
    clean_error(proc, "data.val_fraction=0.9999 leaves no training samples", "1797")


def test_master_port_in_use_is_named_before_msrun_waits(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        start = time.monotonic()
        proc = run_in_process(tmp_path, "distributed=dp", f"distributed.master_port={port}", *TINY, check=False)
    clean_error(proc, f"distributed.master_port={port}", "in use")
    assert time.monotonic() - start < 60  # msrun would have waited distributed.timeout_s (120 s) for its ranks


def test_quoted_run_dir_under_dp(tmp_path):
    # Quotes (needed for spaces) are Hydra's syntax: the checks see the path Hydra will use, and no
    # directory named after a quote appears.
    args = ["distributed=dp", "dry_run=true"]
    proc = cli_in_process(*args, "hydra.run.dir='/proc/no such/run'", cwd=tmp_path)
    clean_error(proc, "cannot write the run's outputs under '/proc/no such/run'")
    target = tmp_path / "with space" / "run"
    proc = cli_in_process(*args, f"hydra.run.dir='{target}'", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # A dry run leaves no run directory; nothing named after a quote was made either.
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(shutil.which("sbatch") is not None, reason="Slurm is installed here")
def test_slurm_launcher_without_slurm(tmp_path):
    proc = dry_run(tmp_path, "hydra/launcher=submitit_slurm", multirun=True)
    clean_error(proc, "hydra/launcher=submitit_slurm needs Slurm", "Slurm was not found")


def test_unquoted_path_with_spaces_gets_a_hint(tmp_path):
    proc = dry_run(tmp_path, "data=imagefolder", "data.root=/my", "images/set")
    clean_error(proc, "'images/set'", "quote the whole override", "'data.root=/my images/set'")


def _loaded(pid: int, library: str) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return library in f.read()
    except OSError:
        return False


def test_ctrl_c_while_mindspore_imports(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", *TINY, f"hydra.run.dir={tmp_path}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    # MindSpore's first native library is mapped early in `import mindspore`; the import goes on for seconds.
    while not _loaded(proc.pid, "mindspore") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and "NameError" not in err, err


@pytest.mark.slow
def test_ctrl_c_on_a_sweep(tmp_path):
    # The job running when the sweep's process gets SIGINT saves a checkpoint and stops; the rest never
    # start; the summary says which is which; the exit status is 130, with no traceback.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = ["-m", f"hydra.sweep.dir={tmp_path}", "seed=0,1,2", "epochs=4", "log_every=1"]
    args += ["padding.height=8", "padding.width=8", "model.width=8", "checkpoint.every_epochs=0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = tmp_path / "0" / "runner.log"
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if log.exists() and "step" in log.read_text():
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)  # the sweep's process only, as a console's Ctrl-C reaches it
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (proc.returncode, out[-2000:], err[-3000:])
    assert "Traceback" not in err and "Interrupted by SIGINT (signal 2)." in err, err
    assert "interrupted #0" in out and "2 not started" in out, out
    assert (tmp_path / "0" / "checkpoints" / "latest.json").exists()  # saved on the signal, not killed
    assert "interrupted" in (tmp_path / "summary.md").read_text()
    assert not (tmp_path / "1").exists()


def test_a_sweep_stopped_by_sigterm_exits_143_naming_it(monkeypatch, capsys):
    # 128 + the signal that reached the sweep (passed on to its job), not 130 whatever it was.
    from hydra_plugins.runner_launcher import isolated_launcher
    from runner.cli import app

    monkeypatch.setitem(isolated_launcher._interrupted, "signal", "SIGTERM")
    assert app.interrupt_signal() == signal.SIGTERM
    with pytest.raises(SystemExit) as e:
        app.quiet_interrupt(app.interrupt_signal())
    assert e.value.code == 143 and "Interrupted by SIGTERM (signal 15)." in capsys.readouterr().err
    monkeypatch.setitem(isolated_launcher._interrupted, "signal", None)
    assert app.interrupt_signal() is None


def test_help_into_a_closed_pipe_exits_quietly():
    # `python -m runner --help | head -1`, made deterministic: the reader is gone before the first write.
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "runner", "--help"], cwd=REPO, stdout=write, stderr=subprocess.PIPE, text=True
        )
    finally:
        os.close(write)
    # Ended by SIGPIPE as `head` expects of a filter (a shell reports 141 = 128 + SIGPIPE), or exit 141.
    assert proc.returncode in (141, -signal.SIGPIPE) and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("group, use", [("model", "model=bad"), ("experiment", "+experiment=bad")])
def test_a_yaml_syntax_error_in_a_config_dir_file(tmp_path, group, use):
    (tmp_path / "extra" / group).mkdir(parents=True)
    header = "# @package _global_\n" if group == "experiment" else ""
    (tmp_path / "extra" / group / "bad.yaml").write_text(header + "name: resnet8\nwidth: [8\n")
    proc = cli_in_process("--config-dir", tmp_path / "extra", use, "dry_run=true", f"hydra.run.dir={tmp_path / 'run'}")
    clean_error(proc, "bad.yaml", "line 3")
    assert not (tmp_path / "run").exists()
