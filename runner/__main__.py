"""`runner-train [overrides]` or `python -m runner [overrides]`: Hydra composes conf/ into the
typed config and hands it to run(). runner/cli/app.py checks what Hydra would act on before it starts."""

import os
import sys

from runner.cli.starting import say_starting

# On a terminal, before the seconds of imports below (the status line takes its place).
say_starting(__name__ == "__main__" or os.path.basename(sys.argv[0]) == "runner-train")

import logging  # noqa: E402
import math  # noqa: E402
from typing import Optional  # noqa: E402

from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402

from runner.cli.app import entry_point  # noqa: E402
from runner.config.schema import register  # noqa: E402
from runner.rundir import sweep_jobs  # noqa: E402
from runner.rundir.claim import check_run_dir  # noqa: E402
from runner.rundir.lock import check_free  # noqa: E402

register()
# sweep_jobs registers ${runner_sweep_job:...} (hydra.sweep.subdir) when imported: a joblib worker gets main
# pickled by value, and imports the module because continue_job names it.
sweep_jobs.register()


def main(cfg) -> Optional[float]:
    """Train one run (or one job of a sweep) from the composed config; return its val_accuracy for a sweeper.
    Errors are reported by runner/cli/app.py `handled`."""
    from runner import api

    if HydraConfig.get().mode == RunMode.MULTIRUN:
        from runner.report.outputs import tag_job_records

        tag_job_records(HydraConfig.get().job.num)
        kept = continue_job(cfg, HydraConfig.get().runtime.output_dir)
        if kept is not None:
            return kept
    try:
        metrics = api.train(cfg, HydraConfig.get().runtime.output_dir, HydraConfig.get().overrides.task)
    finally:
        # A check or plan, answered or refused, leaves no run directory (a sweep's summary reads its job dirs).
        if (cfg.dry_run or cfg.plan) and HydraConfig.get().mode != RunMode.MULTIRUN:
            discard_run_dir(HydraConfig.get().runtime.output_dir)
    return metrics.val_accuracy if metrics is not None else None


def continue_job(cfg, job_dir: str) -> Optional[float]:
    """A sweep job in a directory an earlier run of the sweep left (runner/rundir/sweep_jobs.py): a finished
    job is kept (its val_accuracy returned, nothing trained), an interrupted one resumes (cfg.resume set), a
    failed one runs again; None when the job is to train."""
    from runner.errors import UserError

    job = sweep_jobs.plan(cfg, job_dir)
    if job.action in (sweep_jobs.REFUSED, sweep_jobs.BUSY):
        raise UserError(f"This sweep job is refused: {job.detail}.")
    sweep_jobs.prepare(job, job_dir)
    if job.action == sweep_jobs.KEPT:
        print(f"Kept: {job_dir} {job.detail}; not run again.", flush=True)
        return math.nan if job.val_accuracy is None else job.val_accuracy
    if job.action == sweep_jobs.RESUMED:
        print(f"Resuming {job_dir}: {job.detail}.", flush=True)
        cfg.resume = True
    elif job.action == sweep_jobs.RERUN:
        print(f"Running {job_dir} again: it {job.detail}.", flush=True)
    return None


def before_run(cfg, run_dir: str, overrides, in_sweep: bool) -> None:
    """What refuses a run before Hydra writes .hydra/ and runner.log into its directory: the configuration
    (a sweep's jobs fail one by one instead, recorded in its summary) and the directory (claim.check_run_dir).
    A sweep job whose directory an earlier run of the sweep left is decided by continue_job in the job
    itself (a refused resume is a failed job in the summary); a job another process runs refuses the sweep."""
    if not in_sweep:
        from runner.config.checks import check_loggers, check_tools, validate
        from runner.rundir.saved_run import init_from_problems

        validate(cfg, init_from_problems)  # as runner.api.train does first
        check_tools(cfg)
        check_loggers(cfg)
        if cfg.dry_run:  # its data and device too, before Hydra writes the directory the dry run would discard
            from runner.api import check_before_training

            check_before_training(cfg)
    else:
        job = sweep_jobs.plan(cfg, run_dir)
        if job.action == sweep_jobs.BUSY:
            from runner.errors import UserError

            raise UserError(f"This sweep cannot start: {job.detail}. Wait for it to end, then run the sweep again.")
        if job.action in (sweep_jobs.KEPT, sweep_jobs.RESUMED, sweep_jobs.RERUN):
            return  # decided in the job; a foreign or other run's directory is refused below
    check_run_dir(cfg, run_dir, overrides, in_sweep)


def discard_run_dir(run_dir: str) -> None:
    """Remove the directory Hydra made for a dry run (its .hydra/ and an empty log) and the folders above it
    (under the working directory) it leaves empty; a directory that holds anything else (an earlier run)
    is left as it is."""
    import shutil

    if not os.path.isdir(run_dir) or set(os.listdir(run_dir)) - {".hydra", "runner.log"}:
        return
    for handler in logging.getLogger().handlers:  # Hydra's file handler holds runner.log open
        if isinstance(handler, logging.FileHandler) and handler.baseFilename.startswith(os.path.abspath(run_dir)):
            logging.getLogger().removeHandler(handler)
            handler.close()
    shutil.rmtree(run_dir, ignore_errors=True)
    parent = os.path.dirname(os.path.abspath(run_dir))
    while parent.startswith(os.getcwd() + os.sep) and os.path.isdir(parent) and not os.listdir(parent):
        os.rmdir(parent)  # outputs/<date>/, then outputs/ when nothing else is there
        parent = os.path.dirname(parent)


# check_free: a directory a live run holds is refused before Hydra writes .hydra/ and runner.log into it.
train = entry_point(main, check_free, config_name="config", before_run=before_run, shows_status=True)


if __name__ == "__main__":
    train()
