"""What every run leaves behind besides its checkpoints: a re-runnable config.yaml, metrics.json, the
plot, the advice and the final line a user reads."""

import logging
import os
import platform
import resource
from importlib import metadata
from typing import Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from runner.report import advice, flops
from runner.report.metrics import RunMetrics
from runner.rundir.layout import RunDir

log = logging.getLogger("runner")


def versions() -> dict:
    """Versions of what decides the numbers."""
    out = {"python": platform.python_version()}
    for pkg in ("mindspore", "numpy", "hydra-core", "omegaconf"):
        out[pkg] = metadata.version(pkg)
    return out


def _status_mb(field: str) -> Optional[float]:
    """A memory field of /proc/self/status (VmRSS, VmHWM) in MiB; None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def current_rss_mb() -> float:
    """Resident memory of this process now, MiB (Linux /proc; the peak so far elsewhere)."""
    now = _status_mb("VmRSS")
    return now if now is not None else peak_rss_mb()


def peak_rss_mb() -> float:
    """Peak resident memory of this process, MiB: Linux's VmHWM, the high-water mark of this program's own
    memory. ru_maxrss is kept across exec on Linux: a run started by a larger process (a test session with
    torch loaded, a notebook) reported its parent's peak (2889 MB for a 600 MB run). ru_maxrss elsewhere."""
    peak = _status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


RANK_LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's default job log format


def write_config(run_dir: str, cfg, record: bool = True) -> str:
    """Save the resolved config so `python -m runner --config-path <run_dir> --config-name config` re-runs it.

    A resume keeps the config.yaml its run started with (it copied the source's when it branched into a
    new directory); what the resume changed goes to history.json (runner/rundir/resume_check.py). So the
    saved config re-runs to the same result whatever the run's history, and holds no `resume`.
    record=False: a plain copy of cfg, `resume` included, into run_dir (what data-parallel ranks run).
    """
    path = RunDir(run_dir).config
    if record and os.path.exists(RunDir(run_dir).history) and os.path.exists(path):  # this run resumed
        return path
    body = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    if record:
        body["resume"] = None  # how the run came to be is history, not configuration
    rerun = {
        # The saved values are checked against the same schema, and re-runs land beside the original.
        "defaults": ["base_config", "_self_"],
        "hydra": {
            "run": {"dir": os.path.join(run_dir, "rerun-${now:%Y-%m-%d_%H-%M-%S-%f}")},
            "job": {"name": "runner", "chdir": False},
        },
        **body,
    }
    if not record:
        # Data-parallel ranks log to the console (hydra/job_logging=stdout, msrun keeps it per rank) with the
        # logger and level in each line, so the launching process can pick out rank 0's progress and every
        # rank's warnings (runner/training/distributed.py follow_ranks).
        rerun["hydra"]["job_logging"] = {"formatters": {"simple": {"format": RANK_LOG_FORMAT}}}
    os.makedirs(run_dir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(OmegaConf.to_yaml(OmegaConf.create(rerun)))
    os.replace(tmp, path)
    return path


def measure(m: RunMetrics, net, data, series: dict, pynative_step_ms: Optional[float] = None) -> None:
    """Fill in FLOPs (counted from the layers), peak device memory, the per-step curves and the advice.

    series: the monitor's per-step step/loss/step_time_ms/lr and the loss scale each step used (or None).
    pynative_step_ms: this configuration's measured pynative step on this machine, for the advice.
    """
    threads = (m.setup.distributed or {}).get("threads_per_rank")
    m.resources.flops, m.resources.peak_device_memory_mb = flops.measure(
        net, data, m.timing.throughput_samples_per_s, m.setup.device_target, threads
    )
    m.setup.pid = os.getpid()  # each sweep job runs in its own process (hydra_plugins/runner_launcher)
    m.files.plot = os.path.join(m.files.run_dir, "curves.png")
    m.precision.loss_scale_curve = series["loss_scale"]
    m.timing.step_time_ms_curve = series["step_time_ms"]
    m.results.lr_curve = series["lr"]
    m.files.advice = advice.run_notes(m, pynative_step_ms, in_sweep=_in_sweep())


def plot(m: RunMetrics, series: dict, title: str, steps_per_epoch: int = 0) -> None:
    """curves.png: training and validation loss, validation accuracy, learning rate, loss scale (when there is
    one) and step time, against the step and the epoch."""
    from runner.report import plots  # matplotlib: ~0.5 s, only when a plot is drawn

    plots.run_plot(series, m.plot, title, m.val_curve, steps_per_epoch, compiles=m.mode != "pynative")


def summary_line(m: RunMetrics) -> str:
    """The one line a user reads at the end of a run."""
    # Two losses, labelled: the validation loss of the model the run ends with (after early stopping, the
    # restored best one), and the training loss of the last step taken (whose weights a restore discarded).
    acc = f"val_acc {m.val_accuracy:.4f}" if m.val_accuracy is not None else "val_acc -"
    if m.val_loss is not None:
        acc += f" val_loss {m.val_loss:.4f}"
    stop = m.early_stop or {}
    if stop.get("restored"):
        acc += f" (restored best, step {stop.get('restored_step')})"
    f = m.flops or {}
    util = f" ({f['utilization']:.0%} of matmul peak)" if f.get("utilization") is not None else ""
    gflops = f" | {f['achieved_gflops_per_s']:.1f} GFLOP/s{util}" if f.get("achieved_gflops_per_s") else ""
    prof = m.profile or {}
    profiled = f"profile: {prof['dir']} | " if prof.get("recorded") else ""
    jit = f" (jit_level {m.jit_level})" if m.jit_level != "auto" else ""
    state = (m.compile_cache or {}).get("state")
    cached = f", cache {state}" if state in ("hit", "miss") else ""
    if m.step_time_median_ms is None:  # too few steps in this process to measure (timing_note says why)
        timing = f"compile - ({m.compile_count}x{cached}) | step - | - samples/s"
    else:
        timing = (
            f"compile {m.compile_seconds:.2f} s ({m.compile_count}x{cached}) | step {m.step_time_median_ms:.1f} ms "
            f"(median) {m.step_time_p90_ms:.1f} (p90) | {m.throughput_samples_per_s:.0f} samples/s{gflops}"
        )
    first = (m.startup or {}).get("total")
    started = f" | first step after {first:.1f} s" if first is not None else ""
    return (
        f"{acc} | train_loss {m.final_loss:.4f} (last step) | {timing}{started} | "
        f"peak RSS {m.peak_host_memory_mb:.0f} MB | "
        f"{m.mode}{jit} {m.amp_level_used} on {m.device_target} | {profiled}outputs: {m.run_dir}"
    )


def publish(m: RunMetrics, logger, advise: bool = True) -> None:
    """Log the advice (advise=False: not printed, still in metrics.json) and hand the final metrics and
    artifacts to the configured logger. In a sweep the summary prints each note once for all jobs."""
    if advise and not _in_sweep():
        for note in m.advice:
            log.info("note: %s", note)
    artifacts = [RunDir(m.run_dir).config, RunDir(m.run_dir).metrics, m.plot]
    logger.finish(m, artifacts)


def _in_sweep() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # no Hydra (the Python API): a single run
        return False


class _Warnings(logging.Handler):
    """The runner's warnings during this run, for the recap under the summary line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


_warnings = _Warnings()


def watch_warnings() -> None:
    """Start recording the `runner` logger's warnings and errors (for warnings_recap)."""
    _warnings.messages.clear()
    runner_log = logging.getLogger("runner")
    if _warnings not in runner_log.handlers:
        runner_log.addHandler(_warnings)


def warnings_recap(more: Sequence[str] = ()) -> str:
    """The run's warnings again, under the summary line ("" when there were none); `more` adds those
    recorded elsewhere (a data-parallel run's ranks)."""
    messages = [*_warnings.messages, *more]
    if not messages:
        return ""
    lines = [f"- {' '.join(m.split())}" for m in dict.fromkeys(messages)]
    where = "runner.log and rank_logs/" if more else "runner.log"
    return f"\n{len(lines)} warning{'s' if len(lines) > 1 else ''} during the run (also in {where}):\n" + "\n".join(
        lines
    )


class _JobTag(logging.Filter):
    """Puts `#<job>` before each record's message, once (it passes the console and the file handler)."""

    def __init__(self, num) -> None:
        super().__init__()
        self.tag = f"#{num} "

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "runner_job_tagged", False):
            record.msg, record.runner_job_tagged = self.tag + str(record.msg), True
        return True


def tag_job_records(num) -> None:
    """In a sweep, every log record of this job starts with its number: the joblib launcher runs jobs side
    by side in one console, and their lines interleave. Hydra configures fresh handlers for each job."""
    tag = _JobTag(num)
    for handler in logging.getLogger().handlers:
        handler.addFilter(tag)
