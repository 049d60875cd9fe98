"""One run per run directory: an advisory lock held for the life of the process.

The lock is fcntl.flock on `<run_dir>/.runner.rundir.lock`. The kernel releases it when the process exits
in any way (SIGKILL and OOM kills included), so a killed run never leaves a stale lock behind; the
pid written into the file is only for the message a refused run prints.

Data parallel: the launching process takes the lock and tells the ranks through LOCK_ENV that
their directory is already held for them (msrun starts them as its children, and a flock is not
shared with a process that did not inherit the open file). Ranks started by msrun without such a
parent lock the directory themselves, rank 0 only, since all ranks share one directory.
"""

import fcntl
import os
import time

from runner.errors import UserError

LOCK_FILE = ".runner.rundir.lock"
LOCK_ENV = "RUNNER_RUN_DIR_LOCKED"  # set by the process that holds the lock, for its msrun ranks

_held = {}  # run_dir -> open file: closing it (or exiting) releases the lock


def in_msrun() -> bool:
    """True inside a process msrun started (a worker, or the scheduler that runs the same script)."""
    return os.environ.get("MS_ROLE") in ("MS_WORKER", "MS_SCHED")


def held_by_parent(run_dir: str) -> bool:
    """True in a process whose launcher already holds the lock on run_dir."""
    return os.environ.get(LOCK_ENV) == os.path.abspath(run_dir)


def acquire(run_dir: str) -> None:
    """Lock run_dir for this process, or raise UserError naming the run that holds it."""
    run_dir = os.path.abspath(run_dir)
    if run_dir in _held:
        return
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, LOCK_FILE)
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise UserError(
            f"Another run ({holder}) is running in {run_dir} and holds its lock ({path}); two runs in one "
            "directory would overwrite each other's checkpoints, metrics and log. Choose another "
            "hydra.run.dir, or wait for that run to end and continue it with resume=true."
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {os.uname().nodename}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    _held[run_dir] = f


def hand_to_ranks(run_dir: str, env: dict) -> dict:
    """The environment for msrun's ranks: they share this process's lock on run_dir."""
    return {**env, LOCK_ENV: os.path.abspath(run_dir)}


def check_free(argv) -> None:
    """Before Hydra starts (it writes .hydra/ and the log into the run directory first): a UserError when
    the run directory these arguments name is locked by a running run. run() takes the lock itself."""
    if "-m" in argv or "--multirun" in argv:
        return  # each sweep job locks its own directory
    chosen = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir=")]
    if not chosen or "${" in chosen[-1]:
        return
    run_dir = chosen[-1].strip("'\"")
    if not os.path.exists(os.path.join(run_dir, LOCK_FILE)) or held_by_parent(run_dir):
        return
    acquire(run_dir)
    release(run_dir)


def release(run_dir: str) -> None:
    """Drop this process's lock on run_dir (the OS does it at exit anyway)."""
    f = _held.pop(os.path.abspath(run_dir), None)
    if f is not None:
        f.close()
