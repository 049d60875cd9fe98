"""The run directory's life: one run holds it (a lock), a finished run is marked complete, and only
a resume of that run may reuse it."""

import enum
import json
import logging
import os
from typing import Optional

from runner.errors import UserError
from runner.rundir import lock, resume_check
from runner.rundir.layout import RunDir, of_checkpoints
from runner.rundir.lock import LOCK_FILE, in_msrun
from runner.rundir.resume_check import resume_source
from runner.rundir.status import clear_failure

log = logging.getLogger("runner")


class Start(enum.Enum):
    """What a claimed run directory lets this run do."""

    FRESH = "fresh"  # nothing to continue: train from the start
    RESUME = "resume"  # continue a saved run, its allowed changes applied
    NOTHING_TO_TRAIN = "nothing to train"  # the run resumed is complete already and epochs did not grow


def claim_run_dir(cfg, run_dir: str, overrides) -> Start:
    """Lock the run directory and decide what this run does in it: start fresh, resume, or nothing.

    overrides: the command line's (an lr given there is applied on resume).

    A directory that holds a run (checkpoints, metrics) is reused only by resuming that run; a
    resume's configuration is checked against the saved one (runner/rundir/resume_check.py). The same
    decision is made before Hydra starts (check_run_dir), so a refusal normally comes from there.
    """
    lock.acquire(run_dir)
    run_dir = os.path.abspath(run_dir)
    source, changes, done = _decide(cfg, run_dir, overrides)
    if not (done and "epochs" not in changes):
        clear_failure(run_dir)  # an earlier attempt's error or interruption: this one starts or continues the run
    if source is None:
        for stale in (RunDir(run_dir).resume_record, RunDir(run_dir).history):  # a fresh start records no resume
            if os.path.exists(stale):
                os.remove(stale)
        return Start.FRESH
    resume_check.check_against_saved(cfg, source, run_dir, overrides)  # records what the resume applies
    if done and "epochs" not in changes:
        print(
            f"The run in {source} is already complete ({done.get('steps')} steps, {cfg.epochs} epochs); "
            "nothing to train. To train it longer, resume with a larger epochs=...",
            flush=True,
        )
        return Start.NOTHING_TO_TRAIN
    if changes:
        log.warning("resume: applying %s", "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items()))
    return Start.RESUME


def _decide(cfg, run_dir: str, overrides):
    """(source run to resume or None, the changes a resume applies, the source's completion record or
    None), or UserError for a run this directory and configuration cannot start. Writes nothing."""
    source = resume_source(cfg.resume, run_dir)
    held = _holds_run(run_dir)
    if held and source != run_dir:
        raise UserError(
            f"{run_dir} already holds a run ({held}). A run directory is reused only to continue its run: "
            f"resume=true (with a larger epochs=... to extend a finished one). To re-run its configuration, "
            f"use --config-path {run_dir} --config-name config (it writes into {run_dir}/rerun-<time>), or "
            "choose another hydra.run.dir."
        )
    if source is None or not (RunDir(source).has_checkpoint() or _complete(source)):
        return None, {}, None
    changes = resume_check.check_against_saved(cfg, source, run_dir, overrides, record=False)
    # A named .ckpt branches off wherever it is; a run directory (or resume=true) continues its end.
    done = None if os.path.isfile(os.path.abspath(str(cfg.resume))) else _complete(source)
    if done and "epochs" in changes and not RunDir(source).has_checkpoint():
        raise UserError(
            f"The run in {source} cannot be extended: it saved no resumable checkpoint "
            "(checkpoint.every_epochs=0). Start a new run with the epochs you want."
        )
    return source, changes, done


def ours(directory: str) -> bool:
    """Whether a directory holds this runner's work: a run (its lock file, written when a run claims the
    directory), a sweep (Hydra's multirun.yaml) or Hydra's record of a run (.hydra/, also a dry run's)."""
    records = (LOCK_FILE, "multirun.yaml", ".hydra", ".runner.sweep.lock")  # the last: sweep_jobs.SWEEP_LOCK
    return any(os.path.exists(os.path.join(directory, f)) for f in records)


def check_new_dir(directory: str, what: str) -> None:
    """UserError unless directory is new or empty: where evaluate, predict and export write their outputs."""
    if os.path.isdir(directory) and os.listdir(directory):
        raise UserError(
            f"{what} writes only into a directory of its own, and {os.path.abspath(directory)} already holds files "
            f"({', '.join(sorted(os.listdir(directory))[:3])}, ...): nothing in it may be overwritten. Leave "
            "hydra.run.dir at its default (a new <run>/<command>-<time>) or name a new or empty directory."
        )


def _not_a_directory(path: str) -> Optional[str]:
    """The path (path itself or the first existing folder above it) that is no directory, or None."""
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    return None if os.path.isdir(path) else path


def check_foreign(run_dir: str, setting: str) -> None:
    """UserError when run_dir is a file or lies under one, or holds files and none of this runner's: a run
    never writes among someone else's."""
    blocker = _not_a_directory(run_dir)
    if blocker:
        where = "is" if blocker == run_dir else f"lies under {blocker!r}, which is"
        raise UserError(
            f"{setting} {run_dir!r} {where} not a directory but a file; a run writes its files into a "
            f"directory. Nothing was written: choose another {setting}."
        )
    if os.path.isdir(run_dir) and os.listdir(run_dir) and not ours(run_dir):
        raise UserError(
            f"{run_dir} holds files that are not a run of this runner ({', '.join(sorted(os.listdir(run_dir))[:3])}, "
            "...), and a run writes config.yaml, model.ckpt, metrics.json and more into its directory. A run starts "
            f"only in a new or empty directory or one holding its own run (resume=true): choose another {setting}."
        )


def check_run_dir(cfg, run_dir: str, overrides, in_sweep: bool = False) -> None:
    """Before Hydra writes anything (.hydra/, the log) into run_dir: UserError unless it is new, empty,
    or holds this runner's run that this configuration may continue (resume) or start afresh in."""
    run_dir = os.path.abspath(run_dir)
    check_foreign(run_dir, "hydra.sweep.dir" if in_sweep else "hydra.run.dir")
    if not in_msrun():  # msrun's ranks join the directory their launcher has claimed
        _decide(cfg, run_dir, overrides)


def run_dir_of(ckpt_path: Optional[str]) -> Optional[str]:
    """The run directory a resumable checkpoint belongs to (<run>/checkpoints/step_N.ckpt), if it is one."""
    if not ckpt_path:
        return None

    run = of_checkpoints(os.path.dirname(os.path.abspath(ckpt_path)))
    return run.path if run else None


def _complete(run_dir: str) -> Optional[dict]:
    try:
        with open(RunDir(run_dir).complete) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _holds_run(run_dir: str) -> Optional[str]:
    """What in run_dir shows an earlier run that a fresh start would overwrite (None: nothing)."""
    if _complete(run_dir):
        return "a finished run"
    if RunDir(run_dir).has_checkpoint():
        return "an unfinished run with checkpoints"
    if os.path.exists(RunDir(run_dir).metrics):
        return "a run's metrics.json"
    return None
