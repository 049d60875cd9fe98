"""The runner as Python functions: compose a config, train it, then evaluate, predict with or export the run.

The console scripts are thin wrappers over the same code (runner/__main__.py, runner/evaluate.py, ...):
every check the command line makes before training (the configuration, the tools it needs, the run
directory's lock and resume rules) runs here too, and each refusal is raised as the exception the
command line would print as one paragraph (`runner.errors.user_errors()`), never as sys.exit.

Several calls in one process behave as several command-line runs: each writes its own log file and
releases its run directory's lock when it returns, and ONEDNN_MAX_CPU_ISA is as it was before the call.
What MindSpore fixes for the life of a process (oneDNN's ISA cap, the device target) is refused with
one paragraph when a later call asks for another (runner/training/environment.py check_same_process).
"""

import logging
import os
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple

from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runner.config.checks import check_loggers, check_tools, validate
from runner.config.isa import ISA_VAR
from runner.errors import ConfigError
from runner.report import startup
from runner.rundir import lock
from runner.rundir.claim import check_foreign
from runner.rundir.saved_run import config_path, init_from_problems

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from runner.evaluate import EvalMetrics
    from runner.report.metrics import RunMetrics

# Hydra's default job logging, so a run's <run_dir>/runner.log reads the same from either entry point.
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def compose(*overrides: str) -> "DictConfig":
    """The typed config `runner-train <overrides>` would run (validated by train(), not here)."""
    from runner.config.overrides import slotted

    with initialize_config_module("runner.conf", version_base="1.3"):
        return hydra_compose("config", overrides=slotted(list(overrides)))


def train(cfg: "DictConfig", run_dir: str, overrides: Sequence[str] = ()) -> Optional["RunMetrics"]:
    """Train cfg (from compose() or hydra.compose) in run_dir, as `runner-train hydra.run.dir=<run_dir>` does;
    return the run's metrics (what metrics.json holds).

    overrides: the ones cfg was composed with; on resume an optim.lr among them is applied, as one given
    on the command line is. None with dry_run=true (the config is valid) or when a resumed run was
    complete already. Raises runner.errors.Interrupted when SIGINT/SIGTERM stopped the run.
    """
    startup.task_started()
    validate(cfg, init_from_problems)
    check_tools(cfg)  # not in validate: evaluate/export of a finished run need none of them
    check_loggers(cfg)
    if cfg.dry_run:
        check_before_training(cfg)
        print("Configuration is valid (dry_run=true: nothing was trained).", flush=True)
        return None
    if cfg.plan:
        from runner.training.plan import make_plan  # MindSpore loads only after the config was checked

        print(make_plan(cfg).render(), flush=True)
        return None
    from runner.training.recipe import run  # MindSpore loads only after the config was checked

    check_foreign(os.path.abspath(run_dir), "run_dir")  # before anything (the log) is written into it
    with _run_scope(run_dir, "runner"):
        try:
            return run(cfg, run_dir, list(overrides))
        finally:
            lock.release(run_dir)


def check_before_training(cfg: "DictConfig") -> None:
    """What a run checks before it trains, beyond the configuration: its data's folders and files are there
    (nothing is read), and its device is one this MindSpore build can use."""
    from runner.datasets.presence import check_present
    from runner.training.environment import check_device

    check_present(cfg.data)
    check_device(cfg.device, cfg.mode)


def evaluate_run(run: str, out_dir: Optional[str] = None, **options: Any) -> "EvalMetrics":
    """Evaluate a checkpoint of a finished run, as `runner-evaluate run=<run> <options>`; return its metrics.

    options: ckpt (final|last|best|a path), batch_size, use_amp, data={field: value}. out_dir: where
    metrics.json and confusion.png go (default <run>/evaluate-<time>, as the command's).
    """
    from runner.evaluate import EvaluateConfig, evaluate  # numpy, PIL, rich: not for a training run

    app, out_dir = _command(EvaluateConfig, "evaluate", run, out_dir, options)
    with _run_scope(out_dir, "evaluate"):
        return evaluate(app, out_dir)


def predict_run(run: str, input: str, out_dir: Optional[str] = None, **options: Any) -> Dict[str, Any]:
    """Classify image files with a run's network, as `runner-predict run=<run> input=<input>`; return the
    summary written as predict.json (predictions.csv holds one row per image).

    options: topk, ckpt, batch_size, use_amp, show, data={field: value}.
    """
    from runner.predict import PredictConfig, predict  # numpy, PIL, rich: not for a training run

    app, out_dir = _command(PredictConfig, "predict", run, out_dir, {"input": str(input), **options})
    with _run_scope(out_dir, "predict"):
        return predict(app, out_dir)


def export_run(run: str, out_dir: Optional[str] = None, **options: Any) -> Dict[str, Any]:
    """Export a run's network and check it against the checkpoint, as `runner-export run=<run>`; return
    what export.json holds. options: format (mindir|onnx), ckpt, batch_size, parity_samples, tolerance, data."""
    from runner.export import ExportConfig, export  # numpy, PIL, rich: not for a training run

    app, out_dir = _command(ExportConfig, "export", run, out_dir, options)
    with _run_scope(out_dir, "export"):
        return export(app, out_dir)


def _command(schema: type, name: str, run: str, out_dir: Optional[str], options: Dict[str, Any]) -> Tuple[Any, str]:
    """(the command's typed config, its output directory), checked as the command line checks them."""
    try:
        given: Dict[Any, Any] = {"run": str(run), **options}
        app = OmegaConf.merge(OmegaConf.structured(schema), given)
    except OmegaConfBaseException as e:
        raise ConfigError(
            f"runner.{name}_run: {getattr(e, 'full_key', '') or '?'} {str(e).splitlines()[0].strip()}"
        ) from None
    config_path(str(run))  # before the output directory is made under a mistyped run
    return app, out_dir or os.path.join(str(run), f"{name}-{datetime.now().strftime('%Y-%m-%d_%H-%M-%S-%f')}")


@contextmanager
def _run_scope(out_dir: str, log_name: str) -> Iterator[None]:
    """Around one call: <out_dir>/<log_name>.log as Hydra writes it (and the records on the console when
    nothing else prints them), and ONEDNN_MAX_CPU_ISA restored afterwards."""
    isa = os.environ.get(ISA_VAR)
    root = logging.getLogger()
    added: List[logging.Handler] = []
    if not HydraConfig.initialized():  # under Hydra (the command line) its job logging does this
        os.makedirs(out_dir, exist_ok=True)
        added.append(logging.FileHandler(os.path.join(out_dir, f"{log_name}.log")))
        if not root.handlers:  # a plain script or notebook: print the records as the command line does
            added.append(logging.StreamHandler())
    level = root.level
    for h in added:
        h.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(h)
    if added and root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    try:
        yield
    finally:
        for h in added:
            root.removeHandler(h)
            h.close()
        root.setLevel(level)
        if isa is None:
            os.environ.pop(ISA_VAR, None)
        else:
            os.environ[ISA_VAR] = isa
