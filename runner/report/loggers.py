"""Consumer of the `logger` group: where a run's params, metrics and artifacts go besides metrics.json.

`csv` (default) needs nothing; `tensorboard` and `mlflow` come with `pip install -e .[loggers]`.
Every logger gets the same calls: live values at each `log_every` step (when the monitor reads
the loss anyway), then the run's final metrics and its artifacts.
"""

import csv
import os

from runner.errors import ConfigError

FINAL_KEYS = (
    "val_accuracy",
    "val_loss",
    "val_top5_accuracy",
    "final_loss",
    "compile_seconds",
    "step_time_median_ms",
    "step_time_p90_ms",
    "throughput_samples_per_s",
    "peak_host_memory_mb",
    "compile_count",
)


def build_logger(logger_cfg, params: dict, experiment_name: str, run_dir: str):
    """The logger the `logger` group names, started with the run's config (as a plain dict) as params."""
    kind = logger_cfg.name
    if kind == "csv":
        return CsvLogger(run_dir)
    params = _flatten(params)
    if kind == "tensorboard":
        return TensorBoardLogger(run_dir, params)
    return MlflowLogger(logger_cfg, experiment_name, run_dir, params)


def final_scalars(m) -> dict:
    """The numbers worth a chart point at the end of a run (m: a RunMetrics)."""
    out = {k: float(getattr(m, k)) for k in FINAL_KEYS if getattr(m, k) is not None}
    if (m.flops or {}).get("achieved_gflops_per_s") is not None:
        out["achieved_gflops_per_s"] = float(m.flops["achieved_gflops_per_s"])
    return out


class CsvLogger:
    """metrics.csv in the run directory: one row per logged step, then one row of final values."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, "metrics.csv")
        self.rows = []

    def log_metrics(self, values: dict, step: int) -> None:
        self.rows.append({"step": step, **values})

    def finish(self, metrics, artifacts: list) -> None:
        self.rows.append({"step": metrics.steps, **final_scalars(metrics)})
        fields = list(dict.fromkeys(k for row in self.rows for k in row))
        with open(self.path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(self.rows)


class TensorBoardLogger:
    """TensorBoard event files in <run_dir>/tensorboard (tensorboardX writes them without TF/torch)."""

    def __init__(self, run_dir: str, params: dict):
        try:
            from tensorboardX import SummaryWriter
        except ImportError as e:
            raise ConfigError("logger=tensorboard needs tensorboardX: pip install -e '.[loggers]'") from e
        self.writer = SummaryWriter(logdir=os.path.join(run_dir, "tensorboard"))
        self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in params.items()), 0)
        self.params = params

    def log_metrics(self, values: dict, step: int) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)

    def finish(self, metrics, artifacts: list) -> None:
        scalars = final_scalars(metrics)
        for k, v in scalars.items():
            self.writer.add_scalar(f"final/{k}", v, metrics.steps)
        hparams = {k: v for k, v in self.params.items() if isinstance(v, (int, float, str, bool))}
        self.writer.add_hparams(hparams, {f"hparam/{k}": v for k, v in scalars.items()}, name="hparams")
        for path in artifacts:
            if path.endswith(".png"):
                import matplotlib.image as mpimg

                self.writer.add_image(os.path.basename(path), mpimg.imread(path)[..., :3], 0, dataformats="HWC")
        self.writer.close()


class MlflowLogger:
    """An MLflow run: params, live and final metrics, and the run's config, metrics and plot as artifacts."""

    def __init__(self, logger_cfg, experiment_name: str, run_dir: str, params: dict):
        try:
            import mlflow
        except ImportError as e:
            raise ConfigError("logger=mlflow needs mlflow-skinny: pip install -e '.[loggers]'") from e
        uri = logger_cfg.tracking_uri or "file:" + os.path.abspath("outputs/mlruns")
        if uri.startswith("file:"):
            # MLflow 3 keeps the file store in maintenance mode behind this opt-in; a local file
            # store needs no database and is what a laptop run wants.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.mlflow = mlflow
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(logger_cfg.experiment or experiment_name)
        self.run = mlflow.start_run(run_name=os.path.basename(run_dir))
        mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        mlflow.set_tag("run_dir", run_dir)

    def log_metrics(self, values: dict, step: int) -> None:
        self.mlflow.log_metrics({k.replace("/", "_"): v for k, v in values.items()}, step=step)

    def finish(self, metrics, artifacts: list) -> None:
        self.mlflow.log_metrics(final_scalars(metrics))
        for path in artifacts:
            if os.path.exists(path):
                self.mlflow.log_artifact(path)
        self.mlflow.end_run()


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out
