"""Declarative training runner for MindSpore; its public surface is the Python API below (runner/api.py).

    import runner
    cfg = runner.compose("epochs=1")
    metrics = runner.train(cfg, "outputs/notebook")        # RunMetrics, as metrics.json
    scores = runner.evaluate_run("outputs/notebook")       # EvalMetrics
    runs = runner.runs_under("outputs", where=["status=finished"], sort="-val_accuracy")  # [RunInfo]
    runner.convert_torch("resnet18.pth")                   # PyTorch weights -> resnet18.ckpt (runner-convert)

The commands are modules (runner.evaluate, runner.predict, runner.export), so the functions that act on
a finished run are named evaluate_run, predict_run and export_run: a package attribute cannot be both.
Everything is imported on first use (module __getattr__): `import runner.models` loads no other layer.
"""

import importlib
from typing import Any

__all__ = [
    "compose",
    "train",
    "evaluate_run",
    "predict_run",
    "export_run",
    "runs_under",
    "diff_runs",
    "replay_run",
    "RunInfo",
    "convert_torch",
    "RunMetrics",
    "EvalMetrics",
    "UserError",
    "ConfigError",
    "Interrupted",
]

_HOMES = {
    "compose": "runner.api",
    "train": "runner.api",
    "evaluate_run": "runner.api",
    "predict_run": "runner.api",
    "export_run": "runner.api",
    "runs_under": "runner.runs",
    "diff_runs": "runner.runs",
    "replay_run": "runner.runs",
    "RunInfo": "runner.rundir.status",
    "convert_torch": "runner.convert",
    "RunMetrics": "runner.report.metrics",
    "EvalMetrics": "runner.evaluate",
    "UserError": "runner.errors",
    "ConfigError": "runner.errors",
    "Interrupted": "runner.errors",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'runner' has no attribute {name!r}")

    return getattr(importlib.import_module(_HOMES[name]), name)


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
