"""runner/errors.py's rule: a user's mistake (bad configuration, bad input files, an environment that cannot
run it) is one clear paragraph and a non-zero exit, never a traceback."""

import json
import os
import random
import shutil
import socket
import subprocess
import sys

import pytest
from conftest import REPO, TINY, cli_in_process, dry_run, metrics, run_in_process
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from runner.config.checks import validate
from runner.errors import ConfigError


def cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "runner", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "args,culprit",
    [
        (["amp=o5"], "amp/o5"),  # unknown group option
        (["optim.lrr=0.1"], "lrr"),  # unknown key
        (["epochs=ten"], "ten"),  # wrong type
        (["batch_size=-4"], "batch_size must be positive"),
        (["sink.sink_size=0"], "sink.sink_size"),
        (["padding.height=0"], "padding.height"),
        (["padding=bucket", "padding.height=8"], "does not use padding.height=8"),  # ignored = refused
        (["data.root=/some/where"], "data=digits does not use data.root=/some/where"),
        (["optim.schedule=constant", "optim.min_lr=0.01"], "does not use optim.min_lr=0.01"),
        (["amp.loss_scale.type=none", "amp.loss_scale.init=512"], "does not use amp.loss_scale.init=512"),
        (["amp.loss_scale.factor=1"], "amp.loss_scale.factor"),
        (["amp.loss_scale.type=dynamic", "amp.loss_scale.drop_overflow_update=true"], "drop_overflow_update"),
        (["optim.warmup_epochs=50", "epochs=2"], "optim.warmup_epochs"),
        (["data=imagefolder"], "data.root"),
        (["+experiment=nope"], "experiment/nope"),  # an override file that does not exist
        (["--config-path", "/nonexistent/dir", "--config-name", "config"], "/nonexistent/dir"),
        (["+model._target_=os.system"], "os.system"),  # nothing can smuggle in a callable
        (["+optim.lrr=0.1"], "optim.lrr"),  # `+` adds keys even to typed nodes: still refused
    ],
)
def test_bad_config_is_one_clear_error(args, culprit):
    proc = cli_in_process(*args, "dry_run=true")
    assert proc.returncode != 0, proc.stdout
    assert culprit in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_unavailable_device_is_a_clear_error():
    proc = cli("device=ascend", "epochs=1")
    assert proc.returncode == 2
    assert "device=ascend is not usable" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_data_root_is_a_clear_error(tmp_path):
    proc = cli_in_process("data=imagefolder", f"data.root={tmp_path / 'missing'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    assert str(tmp_path / "missing") in proc.stderr and "Traceback" not in proc.stderr


# Values that compose and values that do not, mixed at random: every set must either pass validation or
# fail with one of the errors the CLI reports cleanly (Hydra's, OmegaConf's or the runner's own).
POOL = {
    "amp": ["o0", "o1", "o2", "o3", "auto", "o4", "O2", ""],
    "mode": ["graph", "pynative", "jit", "grpah", "eager"],
    "sink": ["on", "off", "maybe"],
    "model": ["resnet8", "resnet20", "resnet50", "resnet9"],
    "data": ["digits", "synthetic", "imagefolder", "mnist"],
    "optim": ["momentum", "adam", "lamb"],
    "device": ["auto", "cpu", "gpu", "tpu"],
    "batch_size": ["32", "0", "-1", "1.5", "abc", "null"],
    "epochs": ["1", "0", "x"],
    "sink.sink_size": ["-1", "8", "0", "-5", "big"],
    "amp.loss_scale.type": ["none", "fixed", "dynamic", "static"],
    "amp.loss_scale.init": ["1024", "0", "-1", "inf"],
    "padding.height": ["16", "0", "-8", "1e3"],
    "optim.lr": ["0.1", "0", "-0.1", "fast"],
    "data.val_fraction": ["0.2", "0", "1.5"],
    "model.num_classes": ["null", "10", "0"],
    "seed": ["0", "7", "-1", "s"],
    "optim.lr_typo": ["0.1"],
}


@pytest.mark.slow
def test_fuzz_random_override_sets():
    rng = random.Random(0)
    outcomes = {"ok": 0, "error": 0}
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        for _ in range(150):
            keys = rng.sample(sorted(POOL), rng.randint(1, 5))
            overrides = [f"{k}={rng.choice(POOL[k])}" for k in keys]
            try:
                validate(compose("config", overrides=overrides))
                outcomes["ok"] += 1
            except (HydraException, OmegaConfBaseException, ConfigError) as e:
                assert str(e).strip(), overrides  # an error with something to say
                outcomes["error"] += 1
    assert outcomes["ok"] > 10 and outcomes["error"] > 10, outcomes


@pytest.mark.slow  # eight CLI start-ups; test_fuzz_random_override_sets covers the same pool in-process
def test_fuzz_through_the_cli():
    rng = random.Random(1)
    for _ in range(8):
        keys = rng.sample(sorted(POOL), 3)
        proc = cli(*(f"{k}={rng.choice(POOL[k])}" for k in keys), "dry_run=true")
        assert "Traceback" not in proc.stderr, proc.stderr
        assert (proc.returncode == 0) == ("Configuration is valid" in proc.stdout)


@pytest.mark.slow
def test_out_of_memory_names_batch_size(tmp_path):
    import resource

    def cap_memory():  # a 6 GB address space: ResNet-50 at 128 px, batch 256, cannot allocate
        resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, 6 * 2**30))

    args = ["data=synthetic", "data.image_size=128", "padding.height=128", "padding.width=128", "model=resnet50"]
    args += ["batch_size=256", "data.num_samples=330", "epochs=1", "eval=false", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(
        [sys.executable, "-m", "runner", *args], cwd=REPO, capture_output=True, text=True, preexec_fn=cap_memory
    )
    assert proc.returncode == 2
    assert "Out of memory while training with batch_size=256" in proc.stderr
    assert "batch_size=128" in proc.stderr and "Traceback" not in proc.stderr
    assert (tmp_path / ".hydra" / "config.yaml").exists()  # what was saved stays


def test_unwritable_output_dir_is_a_clear_error():
    proc = cli_in_process("hydra.run.dir=/proc/runner-outputs", "dry_run=true")
    assert proc.returncode == 2
    assert "/proc/runner-outputs" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_runs_started_together_get_their_own_directories(tmp_path):
    # The default hydra.run.dir, from a scratch working directory: three runs in the same second. Each
    # stops at its data (a dry run would leave no directory to count), after Hydra made its directory.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    (tmp_path / "data" / "train").mkdir(parents=True)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "runner", "data=imagefolder", f"data.root={tmp_path / 'data'}"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(3)
    ]
    assert [p.wait(timeout=120) for p in procs] == [2, 2, 2]
    assert len(list((tmp_path / "outputs").glob("*/*"))) == 3


def test_labels_outside_model_classes(tmp_path):
    proc = cli_in_process("model.num_classes=5", "epochs=1", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert "model.num_classes=5" in proc.stderr and "Traceback" not in proc.stderr


def _small_disk(path):
    """A 64 KiB file system at path: room for a run's config and metrics, not for a checkpoint (each of the
    run's dozen small files takes a 4 KiB tmpfs block, and the TINY checkpoint does not fit)."""
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)]).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    return path


@pytest.mark.slow
def test_disk_full_keeps_what_was_written(tmp_path, tiny):
    mnt = _small_disk(tmp_path / "small")
    try:
        proc = cli(*tiny, "checkpoint.every_epochs=0", f"hydra.run.dir={mnt / 'run'}")
        assert proc.returncode == 2, proc.stderr
        assert "No space left on device" in " ".join(proc.stderr.split()) and "Traceback" not in proc.stderr
        files = {p.name for p in (mnt / "run").iterdir()}
        assert {".hydra", "config.yaml", "metrics.json", "runner.log"} <= files
        assert not [f for f in files if "ckpt" in f or "tmp" in f]  # no checkpoint, not even a partial one
        m = json.loads((mnt / "run" / "metrics.json").read_text())
        assert m["final_loss"] > 0 and m["checkpoint"] is None  # it names no model.ckpt that is not there
    finally:
        subprocess.run(["umount", str(mnt)])
    # A checkpoint during training that does not fit (a disk of its own: the first run's files grow
    # with the metrics record): the same clean error.
    mnt = _small_disk(tmp_path / "small2")
    try:
        proc = cli(*tiny, f"hydra.run.dir={mnt / 'run2'}")
        assert proc.returncode == 2 and "No space left on device" in " ".join(proc.stderr.split())
        assert "Traceback" not in proc.stderr
        assert not list((mnt / "run2").rglob("*partial*")) and not list((mnt / "run2").rglob("*.tmp*"))
    finally:
        subprocess.run(["umount", str(mnt)])


def test_resume_from_corrupt_or_foreign_checkpoint(tmp_path, tiny, tiny_run):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"\x00not a checkpoint" * 10)
    proc = cli_in_process(*tiny, f"resume={bad}", f"hydra.run.dir={tmp_path / 'a'}")
    assert proc.returncode == 2 and str(bad) in proc.stderr and "cannot be read" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr

    # tiny_run: a real run of resnet8 (the same TINY overrides) with its checkpoints
    proc = cli_in_process(*tiny, "model=resnet20", f"resume={tiny_run}", f"hydra.run.dir={tmp_path / 'c'}")
    # Refused before any weight is read: the saved config names resnet8, and the model cannot change.
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "cannot change mid-run" in text and "model.depth: 8 -> 20" in text, text
    assert "Traceback" not in proc.stderr
    assert (tiny_run / "model.ckpt").exists()  # the run resumed from is untouched


def test_saved_config_cannot_smuggle_a_hydra_callback(tmp_path):
    # A run directory's config.yaml may come from someone else: Hydra would instantiate its
    # hydra.callbacks before any runner code, so the runner refuses it before Hydra starts.
    marker = tmp_path / "pwned"
    (tmp_path / "config.yaml").write_text(
        "defaults: [base_config, _self_]\n"
        # Hydra's own blocklist stops os.system or shutil.rmtree, but not this: it creates (or truncates) a file.
        "hydra:\n  callbacks:\n    x:\n      _target_: logging.FileHandler\n"
        f"      filename: {marker}\n"
    )
    proc = cli_in_process("--config-path", str(tmp_path), "--config-name", "config", "dry_run=true")
    assert proc.returncode == 2 and "logging.FileHandler" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()


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
        proc = run_in_process(tmp_path, "distributed=dp", f"distributed.master_port={port}", *TINY, check=False)
    clean_error(proc, f"distributed.master_port={port}", "in use")
    # Named before msrun started (it would have waited distributed.timeout_s for its ranks): no rank was launched.
    assert not list(tmp_path.glob("rank_logs/*.log"))  # msrun's scheduler and workers log there once started


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


@pytest.mark.parametrize("group, use", [("model", "model=bad"), ("experiment", "+experiment=bad")])
def test_a_yaml_syntax_error_in_a_config_dir_file(tmp_path, group, use):
    (tmp_path / "extra" / group).mkdir(parents=True)
    header = "# @package _global_\n" if group == "experiment" else ""
    (tmp_path / "extra" / group / "bad.yaml").write_text(header + "name: resnet8\nwidth: [8\n")
    proc = cli_in_process("--config-dir", tmp_path / "extra", use, "dry_run=true", f"hydra.run.dir={tmp_path / 'run'}")
    clean_error(proc, "bad.yaml", "line 3")
    assert not (tmp_path / "run").exists()
