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

import atexit
import importlib
import os
import sys
from typing import Any

# First thing in a command (`runner-train`, `python -m runner`, `python -m runner.evaluate`): a signal during
# its imports ends it in one line (runner/cli/starting.py). Only then: a notebook's `import runner.models`
# loads no part of the command line and keeps Python's own handlers. sys.argv[0] is "-m" while `python -m`
# imports the package the module is in.
if sys.argv and (sys.argv[0] == "-m" or os.path.basename(sys.argv[0]).startswith(("runner-", "msrun-"))):
    from runner.cli.starting import catch_signals_while_starting

    catch_signals_while_starting()

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


def _quiet_cell_teardown() -> None:
    """Run at exit, before the interpreter tears its modules down: from then on a MindSpore Cell's __del__
    ignores the errors of a half torn-down MindSpore.

    Why: a Cell still alive at shutdown (held, directly or not, by a module imported before MindSpore, such
    as logging's handlers or a C extension's state) is deleted only after mindspore/nn/cell.py's globals were
    set to None, and its __del__ (mindspore/nn/cell.py, 2.7 to 2.10) then prints "Exception ignored in:
    <function Cell.__del__ ...> AttributeError: 'NoneType' object has no attribute 'del_net_res'" (or
    'total_instance_count'), once per such Cell, at the end of every test session and of some commands.
    What that __del__ would release (the Cell's compiled graphs) goes with the process anyway. The cause
    is MindSpore's; tests/test_api.py fails once MindSpore no longer prints it without this.
    """
    cell = sys.modules.get("mindspore.nn.cell")
    if cell is None:  # MindSpore never loaded
        return
    original = cell.Cell.__del__

    # Defaults, not globals: by the time it runs this module's globals may be None as well.
    def __del__(self, _original=original, _torn_down=(AttributeError, TypeError)):  # noqa: N807
        try:
            _original(self)
        except _torn_down:
            pass

    cell.Cell.__del__ = __del__


atexit.register(_quiet_cell_teardown)
