"""Consumer of the `logger` group: where a run's params, metrics and artifacts go besides metrics.json.

`logger` is a list of options (`logger=[tensorboard,wandb]`); metrics.csv is always written, as the
run's own record. `csv` needs nothing; `tensorboard`, `mlflow` and `wandb` come with
`pip install -e .[loggers]`. Every logger gets the same calls: live values at each `log_every` step
(when the monitor reads the loss anyway) and at each validation, under the names metrics.json uses
(`train_loss`, `step_time_ms`, `lr`, `epoch`, `val_accuracy`, `val_loss`), then the run's final metrics
and its artifacts.
"""

import csv
import os

from runner.config.tree import flat

# tensorboardX, mlflow and wandb are the optional `loggers` extra: imported by the logger that uses them.
# matplotlib.image (~0.5 s with matplotlib) only when an image is logged.
from runner.errors import ConfigError, UserError

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


def build_logger(
    logger_cfg, params: dict, experiment_name: str, run_dir: str, start_step: int = 0, prior_dir: str = None
):
    """metrics.csv and the loggers the `logger` group names, started with the run's config (as a plain
    dict) as params.

    start_step: a resumed run's global step; metrics.csv keeps prior_dir's rows (this run's by default)
    up to there."""
    loggers: list = [CsvLogger(run_dir, start_step, prior_dir)]
    # One flat dict of scalars: every backend takes params as key -> string or number.
    params = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in flat(params).items()}
    if logger_cfg.get("tensorboard") is not None:
        loggers.append(TensorBoardLogger(run_dir, params))
    if logger_cfg.get("mlflow") is not None:
        loggers.append(MlflowLogger(logger_cfg.mlflow, experiment_name, run_dir, params))
    if logger_cfg.get("wandb") is not None:
        loggers.append(WandbLogger(logger_cfg.wandb, experiment_name, run_dir, params))
    return Loggers(loggers)


def chosen(logger_cfg) -> list:
    """The names of the loggers a run writes: csv, then the chosen others."""
    return ["csv", *(k for k in ("tensorboard", "mlflow", "wandb") if logger_cfg.get(k) is not None)]


class Loggers:
    """Several loggers as one: each call goes to every logger, metrics.csv first."""

    def __init__(self, loggers: list):
        self.loggers = loggers

    def log_metrics(self, values: dict, step: int) -> None:
        for logger in self.loggers:
            logger.log_metrics(values, step)

    def finish(self, metrics, artifacts: list) -> None:
        for logger in self.loggers:
            logger.finish(metrics, artifacts)


def final_scalars(m) -> dict:
    """The numbers worth a chart point at the end of a run (m: a RunMetrics)."""
    out = {k: float(getattr(m, k)) for k in FINAL_KEYS if getattr(m, k) is not None}
    if (m.flops or {}).get("achieved_gflops_per_s") is not None:
        out["achieved_gflops_per_s"] = float(m.flops["achieved_gflops_per_s"])
    return out


class CsvLogger:
    """metrics.csv in the run directory: one row per logged step (every `log_every` steps, and each validation),
    the columns below, one name per metric: the names metrics.json and `runner-runs` use.

    Each row is appended and flushed at once (a killed run keeps its rows); a validation at a step that has a
    row already joins that row, and the file is rewritten with it. A resumed run keeps the rows up to the step
    it resumed from and continues after them. The run's final numbers are metrics.json's, not a row here.
    """

    COLUMNS = ["step", "epoch", "lr", "train_loss", "step_time_ms", "val_accuracy", "val_loss"]

    def __init__(self, run_dir: str, start_step: int = 0, prior_dir: str = None):
        self.path = os.path.join(run_dir, "metrics.csv")
        prior = os.path.join(prior_dir, "metrics.csv") if prior_dir else self.path
        self.rows = self._earlier(prior, start_step) if start_step else []
        self._file = None

    @staticmethod
    def _earlier(path: str, start_step: int) -> list:
        try:
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
        except OSError:
            return []
        keep = []
        for row in rows:
            try:
                step = int(row.get("step") or -1)
            except ValueError:  # a line cut short by a kill
                continue
            # Not the final row an earlier version appended (final_loss), nor a column this one does not write.
            if 0 <= step <= start_step and not row.get("final_loss"):
                keep.append({k: _number(v) for k, v in row.items() if k in CsvLogger.COLUMNS and v not in (None, "")})
        return keep

    def log_metrics(self, values: dict, step: int) -> None:
        values = {k: v for k, v in values.items() if k in self.COLUMNS}
        if self.rows and self.rows[-1].get("step") == step:
            self.rows[-1].update(values)  # a validation at a step the monitor logged: one row per step
            self._rewrite()
            return
        self.rows.append({"step": step, **values})
        if self._file is None:
            self._rewrite()
            self._file = open(self.path, "a", newline="")
            self._writer = csv.DictWriter(self._file, fieldnames=self.COLUMNS)
            return
        self._writer.writerow(self.rows[-1])
        self._file.flush()  # every log_every steps: cheap, and SIGKILL leaves the rows so far

    def _rewrite(self) -> None:
        """The whole file anew, through a temporary renamed into place (the appended rows follow it)."""
        if self._file is not None:
            self._file.close()
        tmp = self.path + ".tmp"
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.COLUMNS)
            writer.writeheader()
            writer.writerows(self.rows)
        os.replace(tmp, self.path)
        if self._file is not None:
            self._file = open(self.path, "a", newline="")
            self._writer = csv.DictWriter(self._file, fieldnames=self.COLUMNS)

    def finish(self, metrics, artifacts: list) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._rewrite()  # also a run that logged no row (a resume with nothing left to train) has its file


def _number(v: str):
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v


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

    def __init__(self, mlflow_cfg, experiment_name: str, run_dir: str, params: dict):
        try:
            import mlflow
        except ImportError as e:
            raise ConfigError("logger=mlflow needs mlflow-skinny: pip install -e '.[loggers]'") from e
        uri = mlflow_cfg.tracking_uri or "file:" + os.path.abspath("outputs/mlruns")
        if uri.startswith("file:"):
            # MLflow 3 keeps the file store in maintenance mode behind this opt-in; a local file
            # store needs no database and is what a laptop run wants.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.mlflow = mlflow
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(mlflow_cfg.experiment or experiment_name)
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


class WandbLogger:
    """A Weights & Biases run: the config, live and final metrics (the summary), and the run's config,
    metrics and plot as files. Its local files go to <run_dir>/wandb; offline (WANDB_MODE=offline or
    logger.wandb.mode=offline) it needs no network or login, and `wandb sync` uploads it later."""

    def __init__(self, wandb_cfg, experiment_name: str, run_dir: str, params: dict):
        try:
            import wandb
        except ImportError as e:
            raise ConfigError("logger=wandb needs wandb: pip install -e '.[loggers]'") from e
        self.wandb, self.run_dir = wandb, os.path.abspath(run_dir)
        mode = str(wandb_cfg.mode) if wandb_cfg.mode is not None else None
        try:
            self.run = wandb.init(
                project=wandb_cfg.project or experiment_name,
                entity=wandb_cfg.entity,
                group=wandb_cfg.group,
                tags=list(wandb_cfg.tags) or None,
                name=os.path.basename(self.run_dir),
                dir=self.run_dir,
                config=params,
                mode=mode,
                # The runner's console stays its own: the summary line must stay the last line of stdout.
                settings=wandb.Settings(console="off"),
            )
        except Exception as e:  # wandb raises its own errors (no login, no network) and plain ones
            raise UserError(
                f"logger=wandb could not start a W&B run: {str(e).strip().splitlines()[0] if str(e).strip() else e!r}. "
                "Log in (`wandb login`), or log offline with WANDB_MODE=offline or logger.wandb.mode=offline "
                f"(then `wandb sync {self.run_dir}/wandb/offline-run-*`)."
            ) from None

    def log_metrics(self, values: dict, step: int) -> None:
        self.run.log(dict(values), step=step)

    def finish(self, metrics, artifacts: list) -> None:
        # W&B holds the latest step's row until the step moves on, and then writes its values into the summary
        # too: committed first, so the final values below (the weights the run ends with) stay the summary's.
        self.run.log({}, commit=True)
        self.run.summary.update(final_scalars(metrics))
        for path in artifacts:
            if path and os.path.exists(path):
                self.run.save(path, base_path=os.path.dirname(path), policy="now")
        self.run.finish()
        # finish() can return before W&B's core process has written the run's file (measured: an
        # offline run file still 7 bytes long just after it); teardown waits for that process, so the
        # record is complete when the run reports done.
        self.wandb.teardown()
