"""Shared helpers: run the real CLI in a subprocess and read what it left behind."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from runner.schema import register

register()

REPO = Path(__file__).resolve().parents[1]
# Tiny and fast: 8x8 inputs, a narrow resnet8, one epoch, no per-epoch noise in the logs.
TINY = ["epochs=1", "padding.height=8", "padding.width=8", "model.width=8", "log_every=1000"]


def run_cli(run_dir, *overrides, multirun=False, check=True, timeout=600, env=None):
    """`python -m runner` from the repository root, with its outputs under run_dir unless it is None."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    where = [f"{key}={run_dir}"] if run_dir is not None else []
    cmd = [sys.executable, "-m", "runner", *(["-m"] if multirun else []), *where, *overrides]
    # In-process tests set ONEDNN_MAX_CPU_ISA for themselves; a child must see only what the test passes.
    base = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env={**base, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def metrics(run_dir) -> dict:
    return json.loads((Path(run_dir) / "metrics.json").read_text())


@pytest.fixture
def tiny():
    return list(TINY)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One run of the default configuration at TINY size, shared by the tests that only read it."""
    run_dir = tmp_path_factory.mktemp("tiny_run")
    run_cli(run_dir, *TINY)
    return run_dir


def compose_cfg(*overrides):
    """The composed, typed config `python -m runner <overrides>` would run (no validation)."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def build(*overrides):
    """datasets.build_data on the composed config, as the runner calls it."""
    from datasets import build_data

    cfg = compose_cfg(*overrides)
    return build_data(cfg.data, cfg.padding, cfg.batch_size, cfg.seed)


def batches(dataset):
    return list(dataset.create_tuple_iterator(output_numpy=True))


def pytest_collection_modifyitems(config, items):
    """cpu_only tests assert what MindSpore does on a CPU; elsewhere they are skipped."""
    if os.environ.get("RUNNER_TEST_DEVICE", "cpu") == "cpu":
        return
    skip = pytest.mark.skip(reason="asserts CPU-specific behaviour (RUNNER_TEST_DEVICE is not cpu)")
    for item in items:
        if "cpu_only" in item.keywords:
            item.add_marker(skip)
