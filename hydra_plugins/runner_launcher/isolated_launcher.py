"""Hydra launcher that runs every multirun job in a fresh Python process: the default for `-m`.

Sweep jobs that share a process share MindSpore's warm compile caches (docs/mindspore-notes.md#warm-caches), the
oneDNN ISA that is read once at import (a `device.cpu_isa_cap` sweep would be meaningless) and
the process's peak RSS, so their measurements would depend on their order. Hydra's basic launcher
runs jobs in the sweep's own process; the joblib launcher does too with n_jobs=1, and with
n_jobs>1 it reuses its loky workers and runs jobs side by side (measured: same worker pid for
every job). This launcher composes each job as the basic launcher does, then runs Hydra's own
`run_job` in a child (`runner/cli/job_process.py`), one job at a time; a dry run's jobs, which measure
nothing, run in this process.

A job that fails leaves `failed.json` in its directory (written by the task, or here when the
process died) and returns NaN, so the sweep goes on and the summary shows it as failed; with
`hydra.launcher.fail_fast=true` the sweep stops there instead, and the summary lists the jobs it did not
run (Hydra's own launchers have no such setting: facebookresearch/hydra#2824).

Ctrl-C: each job runs in its own session, so the console's SIGINT reaches only this process, which
passes it on to the running job once (the job saves a checkpoint at its next step and exits 128 + the
signal; subprocess.run would instead SIGKILL it when the parent is interrupted). SIGTERM is passed on the
same way. The jobs not started are skipped, the summary lists the finished and the interrupted jobs, and
the CLI exits 128 + the signal (130 for Ctrl-C, 143 for SIGTERM).
"""

import logging
import math
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Sequence

from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from omegaconf import OmegaConf, open_dict

from runner.rundir.atomic import write_json

log = logging.getLogger(__name__)
_interrupted = {"signal": None, "jobs": [], "not_started": 0}
# The jobs this process's sweep did not run ({"num", "overrides"}), and why: a signal, or fail_fast after a failure.
_not_run: List[dict] = []
_stopped_by: dict = {"failed_job": None}


def sweep_interrupted() -> bool:
    """Whether a signal stopped the sweep this process ran."""
    return _interrupted["signal"] is not None


def interruption() -> dict:
    """{"signal": name or None, "jobs": [job numbers it stopped], "not_started": count}, for the summary."""
    return dict(_interrupted)


def not_run() -> List[dict]:
    """The jobs of this process's sweep that were never started ({"num", "overrides", "why"}), for the summary."""
    return [dict(j) for j in _not_run]


def failed_fast() -> "int | None":
    """The job whose failure stopped the sweep (hydra.launcher.fail_fast=true), or None."""
    return _stopped_by["failed_job"]


# hydra/launcher=isolated is conf/hydra/launcher/isolated.yaml (why there: that file's comment).


def task_reference(task_function) -> tuple:
    """(module, name) the child imports the task from; `python -m runner` names its module __main__."""
    module = task_function.__module__
    if module == "__main__":
        module = sys.modules["__main__"].__spec__.name
    return module, task_function.__qualname__


class IsolatedLauncher(Launcher):
    """Runs each job of a sweep in its own `python -m runner.cli.job_process` process, sequentially."""

    def __init__(self, fail_fast: bool = False) -> None:
        """fail_fast: the first failed job stops the sweep (conf/hydra/launcher/isolated.yaml)."""
        self.fail_fast = bool(fail_fast)

    def setup(self, *, hydra_context, task_function, config) -> None:
        # Once per sweep (launch may run once per batch of an Optuna search): a second sweep in this process
        # (the Python API, the tests) starts with none of the first one's stops.
        _interrupted.update(signal=None, jobs=[], not_started=0)
        _not_run.clear()
        _stopped_by["failed_job"] = None
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        where = "in this process (dry run)" if OmegaConf.select(self.config, "dry_run") else "each in a fresh process"
        log.info(f"Launching {len(job_overrides)} jobs, {where}")
        task = task_reference(self.task_function)
        runs: List[JobReturn] = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            stopped = "interrupted" if sweep_interrupted() else "fail_fast" if failed_fast() is not None else None
            if stopped:  # a signal stopped an earlier job, or one failed under fail_fast: start no more
                _interrupted["not_started"] += stopped == "interrupted"
                _not_run.append({"num": idx, "overrides": list(filter_overrides(overrides)), "why": stopped})
                runs.append(self._not_started(list(overrides)))
                continue
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg):
                cfg.hydra.job.id = idx
                cfg.hydra.job.num = idx
                # Resolved here: ${now:...} evaluated in the child would name another directory.
                cfg.hydra.sweep.dir = str(OmegaConf.select(cfg, "hydra.sweep.dir"))
            # A dry run trains and measures nothing, so nothing can leak into the next job's numbers: in this
            # process, where a fresh one cost ~4 s a job (a 20-trial Optuna dry run took 77 s on 2 cores).
            dry = bool(OmegaConf.select(cfg, "dry_run", default=False))
            ret = self._run_here(cfg, list(overrides), task) if dry else self._run_child(cfg, list(overrides), task)
            runs.append(ret)
            if self.fail_fast and not sweep_interrupted() and _failed(_job_dir(cfg)):
                _stopped_by["failed_job"] = idx
                log.error(f"#{idx} failed; hydra.launcher.fail_fast=true: the sweep starts no more jobs")
        return runs

    def _run_child(self, cfg, overrides: list, task: tuple) -> JobReturn:
        with tempfile.TemporaryDirectory(prefix="runner-job-") as tmp:
            job_file, result_file = os.path.join(tmp, "job.pkl"), os.path.join(tmp, "result.pkl")
            with open(job_file, "wb") as f:
                pickle.dump({"config": cfg, "task": task, "result": result_file}, f)
            returncode, signum = _run_and_forward([sys.executable, "-m", "runner.cli.job_process", job_file])
            if signum is not None:
                _interrupted["signal"] = signal.Signals(signum).name
            result = None
            if os.path.exists(result_file):
                with open(result_file, "rb") as f:
                    result = pickle.load(f)
        ret = JobReturn(overrides=overrides, hydra_cfg=cfg, status=JobStatus.COMPLETED)
        ret.cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        if signum is not None and (result is None or result["error"] is not None):
            _interrupted["jobs"].append(int(cfg.hydra.job.num))
            result = None
        if result is not None:
            ret.working_dir, ret.task_name = result["working_dir"], result["task_name"]
            ret.return_value = result["return_value"]
            if result["error"] is not None:
                _record_failure(result["output_dir"], result["error"])
                ret.return_value = math.nan
        else:
            if signum is not None:
                job_dir = _job_dir(cfg)
                why = f"interrupted by {signal.Signals(signum).name}"
                if os.path.exists(os.path.join(job_dir, "checkpoints", "latest.json")):
                    why += f"; its checkpoint is saved: resume={job_dir} continues it"
                _record_failure(job_dir, why, "Interrupted")
            else:
                why = f"the job's process exited with status {returncode}"
                if returncode < 0:
                    why += f" ({signal.Signals(-returncode).name})"
                _record_failure(_job_dir(cfg), why + " before reporting a result")
            ret.return_value = math.nan
        return ret

    def _run_here(self, cfg, overrides: list, task: tuple) -> JobReturn:
        """The job through Hydra's run_job in this process, as the basic launcher runs one; the task is the
        child's (runner/cli/job_process.py), in the same error handler."""
        from hydra.core.utils import run_job
        from hydra.types import HydraContext

        from runner.cli.app import job_task
        from runner.cli.hydra_seam import job_callbacks, job_error

        ret = run_job(
            hydra_context=HydraContext(config_loader=None, callbacks=job_callbacks(cfg)),
            task_function=job_task(*task),
            config=cfg,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)  # the job set up its own
        error = job_error(ret)
        if error is not None:  # outside the task's own handler (a job callback): recorded as the child's are
            _record_failure(ret.hydra_cfg.hydra.runtime.output_dir, f"{type(error).__name__}: {error}")
            ret.status, ret.return_value = JobStatus.COMPLETED, math.nan
        return ret

    def _not_started(self, overrides: list) -> JobReturn:
        ret = JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
        ret.return_value = math.nan
        return ret


def _run_and_forward(cmd: list):
    """Run cmd in its own session; pass SIGINT/SIGTERM that reach this process on to it, then wait
    for it to finish (it checkpoints first). Return (exit status, the signal forwarded or None)."""
    proc = subprocess.Popen(cmd, start_new_session=True)
    forwarded = None

    def on_term(signum, frame):
        raise _Forward(signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        while True:
            try:
                return proc.wait(), forwarded
            except KeyboardInterrupt:
                forwarded = signal.SIGINT
            except _Forward as f:
                forwarded = f.signum
            proc.send_signal(forwarded)  # a second Ctrl-C is passed on too, and stops the job at once
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Forward(Exception):
    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def _failed(job_dir: str) -> bool:
    """Whether the job in job_dir failed: it left failed.json (the task's error, or this launcher's record of a
    process that died), not an interruption."""
    import json

    try:
        with open(os.path.join(job_dir, "failed.json")) as f:
            return json.load(f).get("error_type") != "Interrupted"
    except (OSError, ValueError, AttributeError):
        return False


def _job_dir(cfg) -> str:
    from runner.cli.hydra_seam import hydra_config_set

    with hydra_config_set(cfg):  # the subdir may use ${hydra:job.num}-style values
        return os.path.join(str(cfg.hydra.sweep.dir), str(OmegaConf.select(cfg, "hydra.sweep.subdir")))


def _record_failure(job_dir: str, error: str, kind: str = "JobProcessError") -> None:
    """failed.json for the sweep summary, unless the task already wrote a more precise one."""
    path = os.path.join(job_dir, "failed.json")
    os.makedirs(job_dir, exist_ok=True)
    if not os.path.exists(path) or kind == "Interrupted":
        write_json(path, {"error": error, "error_type": kind})
