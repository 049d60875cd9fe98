"""The run directory's life: one run holds it (a lock), a finished run is marked complete, and only
a resume of that run may reuse it."""

import json
import logging
import os
from typing import Optional

from runner.errors import UserError

log = logging.getLogger("runner")
COMPLETE = ".runner.complete"  # written last: the run's outputs are all there


def claim(cfg, run_dir: str, overrides) -> bool:
    """Lock the run directory and decide what a resume may do; True when the run is complete already.

    overrides: the command line's (an lr given there is applied on resume).

    A directory that holds a run (checkpoints, metrics) is reused only by resuming that run; a
    resume's configuration is checked against the saved one (runner/rundir/resume_check.py). The same
    decision is made before Hydra starts (check_run_dir), so a refusal normally comes from there.
    """
    from runner.rundir import lock
    from runner.rundir import resume_check as resume_config

    lock.acquire(run_dir)
    run_dir = os.path.abspath(run_dir)
    source, changes, done = _decide(cfg, run_dir, overrides)
    stale = os.path.join(run_dir, resume_config.RECORD)
    if source is None:
        if os.path.exists(stale):
            os.remove(stale)
        return False
    from runner.rundir.atomic import write_json

    write_json(stale, {"from": source, "changes": changes})  # what the resume applies, for metrics.json
    if done and "epochs" not in changes:
        print(
            f"The run in {source} is already complete ({done.get('steps')} steps, {cfg.epochs} epochs); "
            "nothing to train. To train it longer, resume with a larger epochs=...",
            flush=True,
        )
        return True
    if changes:
        log.warning("resume: applying %s", "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items()))
    return False


def _decide(cfg, run_dir: str, overrides):
    """(source run to resume or None, the changes a resume applies, the source's completion record or
    None), or UserError for a run this directory and configuration cannot start. Writes nothing."""
    from runner.rundir import resume_check as resume_config
    from runner.rundir.resume_check import has_checkpoint, resume_source

    source = resume_source(cfg.resume, run_dir)
    held = _holds_run(run_dir)
    if held and source != run_dir:
        raise UserError(
            f"{run_dir} already holds a run ({held}). A run directory is reused only to continue its run: "
            f"resume=true (with a larger epochs=... to extend a finished one). To re-run its configuration, "
            f"use --config-path {run_dir} --config-name config (it writes into {run_dir}/rerun-<time>), or "
            "choose another hydra.run.dir."
        )
    if source is None or not (has_checkpoint(os.path.join(source, "checkpoints")) or _complete(source)):
        return None, {}, None
    changes = resume_config.check(cfg, source, run_dir, overrides, record=False)
    # A named .ckpt branches off wherever it is; a run directory (or resume=true) continues its end.
    done = None if os.path.isfile(os.path.abspath(str(cfg.resume))) else _complete(source)
    if done and "epochs" in changes and not has_checkpoint(os.path.join(source, "checkpoints")):
        raise UserError(
            f"The run in {source} cannot be extended: it saved no resumable checkpoint "
            "(checkpoint.every_epochs=0). Start a new run with the epochs you want."
        )
    return source, changes, done


def ours(directory: str) -> bool:
    """Whether a directory holds this runner's work: a run (its lock file, written when a run claims the
    directory), a sweep (Hydra's multirun.yaml) or Hydra's record of a run (.hydra/, also a dry run's)."""
    from runner.rundir.lock import LOCK_FILE

    return any(os.path.exists(os.path.join(directory, f)) for f in (LOCK_FILE, "multirun.yaml", ".hydra"))


def check_new_dir(directory: str, what: str) -> None:
    """UserError unless directory is new or empty: where evaluate, predict and export write their outputs."""
    if os.path.isdir(directory) and os.listdir(directory):
        raise UserError(
            f"{what} writes only into a directory of its own, and {os.path.abspath(directory)} already holds files "
            f"({', '.join(sorted(os.listdir(directory))[:3])}, ...): nothing in it may be overwritten. Leave "
            "hydra.run.dir at its default (a new <run>/<command>-<time>) or name a new or empty directory."
        )


def check_run_dir(cfg, run_dir: str, overrides, in_sweep: bool = False) -> None:
    """Before Hydra writes anything (.hydra/, the log) into run_dir: UserError unless it is new, empty,
    or holds this runner's run that this configuration may continue (resume) or start afresh in."""
    from runner.training.distributed import in_msrun

    run_dir = os.path.abspath(run_dir)
    if os.path.isdir(run_dir) and os.listdir(run_dir) and not ours(run_dir):
        raise UserError(
            f"{run_dir} holds files that are not a run of this runner ({', '.join(sorted(os.listdir(run_dir))[:3])}, "
            "...), and a run writes config.yaml, model.ckpt, metrics.json and more into its directory. A run starts "
            "only in a new or empty directory or one holding its own run (resume=true): choose another "
            f"{'hydra.sweep.dir' if in_sweep else 'hydra.run.dir'}."
        )
    if not in_msrun():  # msrun's ranks join the directory their launcher has claimed
        _decide(cfg, run_dir, overrides)


def run_dir_of(ckpt_path: Optional[str]) -> Optional[str]:
    """The run directory a resumable checkpoint belongs to (<run>/checkpoints/step_N.ckpt), if it is one."""
    if not ckpt_path:
        return None
    ckpt_dir = os.path.dirname(os.path.abspath(ckpt_path))
    return os.path.dirname(ckpt_dir) if os.path.basename(ckpt_dir) == "checkpoints" else None


def _complete(run_dir: str) -> Optional[dict]:
    try:
        with open(os.path.join(run_dir, COMPLETE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _holds_run(run_dir: str) -> Optional[str]:
    """What in run_dir shows an earlier run that a fresh start would overwrite (None: nothing)."""
    from runner.rundir.resume_check import has_checkpoint

    if _complete(run_dir):
        return "a finished run"
    if has_checkpoint(os.path.join(run_dir, "checkpoints")):
        return "an unfinished run with checkpoints"
    if os.path.exists(os.path.join(run_dir, "metrics.json")):
        return "a run's metrics.json"
    return None
