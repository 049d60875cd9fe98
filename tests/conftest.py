"""Shared helpers: run the real CLI in a subprocess and read what it left behind."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
