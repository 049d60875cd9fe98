"""What state a run directory is in, read from the run's own records and its lock (never MindSpore).

The status of a directory, from what the run itself wrote as it went:

- running: a live process holds the directory's lock (runner/rundir/lock.py; the kernel drops it when the
  process dies in any way, so a held lock is a live run);
- finished: `.runner.complete` (written last, after metrics.json and model.ckpt);
- failed: `failed.json` (the error that ended the run, written by `ending_recorded`), or a `metrics.json`
  without the completion marker (a run stopped by its NaN guard writes its numbers, then fails);
- interrupted: `failed.json` saying "Interrupted" (a signal stopped the run; its checkpoint was saved), or
  the run started (config.yaml) and ended without any record: a kill (SIGKILL, OOM, a lost node);
  `resumable` says whether it left a checkpoint to continue from;
- half-written: Hydra's record (.hydra/) or the lock file, and no config.yaml: the run stopped before it
  wrote its configuration, or a file it needs is unreadable;
- too old: a run of an earlier version whose records this version cannot read (its config.yaml names
  settings this version no longer has);
- foreign: files and none of this runner's.

`find_runs` walks directories for them: a sweep directory (multirun.yaml) is looked into, a run directory
is not (its evaluate-*/ outputs are not runs).
"""

import contextlib
import fcntl
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, List, Optional

from runner.rundir import layout
from runner.rundir.lock import LOCK_FILE

FINISHED, FAILED, INTERRUPTED, RUNNING = "finished", "failed", "interrupted", "running"
HALF_WRITTEN, TOO_OLD, FOREIGN = "half-written", "too old", "foreign"
STATUSES = (FINISHED, FAILED, INTERRUPTED, RUNNING, HALF_WRITTEN, TOO_OLD, FOREIGN)
INTERRUPTED_RECORD = "Interrupted"  # failed.json's error_type for a run a signal stopped
HYDRA_RECORD = ".hydra"
SWEEP_RECORD = "multirun.yaml"
DEPTH = 6  # outputs/multirun/<date>/<time>/<job>: deeper than any layout the runner writes


@dataclass
class RunInfo:
    """One directory as `runner-runs` lists it. config: the run's configuration now (config.yaml with its
    resumes applied, runner/rundir/resume_check.py), {} when unreadable; metrics: metrics.json, {} if none."""

    path: str
    status: str
    detail: str = ""  # one line: why this status (the error, the step it stopped at, what is missing)
    started: Optional[float] = None  # when the run started: its config.yaml's (or the directory's) mtime
    experiment: str = ""
    epochs_done: Optional[float] = None
    epochs: Optional[int] = None  # what the run was asked for
    steps: Optional[int] = None
    resumable: bool = False  # a checkpoint to continue from
    config: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    monitor: Optional[str] = None  # the metric the run's best checkpoint is chosen by
    monitor_value: Optional[float] = None
    resumes: int = 0  # entries in history.json

    @property
    def throughput(self) -> Optional[float]:
        """Steady-state samples per second (metrics.json), None before the run measured it."""
        value = self.metrics.get("throughput_samples_per_s")
        return float(value) if isinstance(value, (int, float)) and value else None


def locked(run_dir: str) -> bool:
    """Whether a live process holds run_dir's lock. Asks for a shared lock on a read-only descriptor and
    drops it at once: nothing is written, and a lock only a dead process had is never held. A lock file that
    is not a regular file (a FIFO in its place) is no run's lock, and is never opened."""
    path = os.path.join(run_dir, LOCK_FILE)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing releases the shared lock if it was granted
    return False


def held_by_another(run_dir: str) -> bool:
    """Whether a live process other than this one (and not its launcher) holds run_dir's lock."""
    from runner.rundir import lock

    run_dir = os.path.abspath(run_dir)
    return run_dir not in lock._held and not lock.held_by_parent(run_dir) and locked(run_dir)


def _json(path: str, shape=None):
    """A JSON record (layout.read_json_record): None when absent, RecordProblem when it cannot be read."""
    return layout.read_json_record(path, shape)


def _there(path: str) -> bool:
    """Whether anything is at path (a link to nothing, a symlink loop or a FIFO too: each is listed as the
    record it stands for, unreadable, not skipped as missing)."""
    return os.path.lexists(path)


def _one_line(text, limit: int = 160) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def is_candidate(directory: str) -> bool:
    """Whether directory holds any record a training run writes (so it is listed as a run, not walked into)."""
    names = (layout.CONFIG, layout.METRICS, layout.COMPLETE, layout.FAILED, LOCK_FILE, HYDRA_RECORD)
    return any(_there(os.path.join(directory, n)) for n in names)


def _other_command(directory: str) -> bool:
    """An evaluate/predict/export output directory (Hydra's record of another job name), not a training run."""
    path = os.path.join(directory, HYDRA_RECORD, "hydra.yaml")
    if _there(os.path.join(directory, layout.CONFIG)) or not os.path.isfile(path):
        return False
    import yaml

    try:
        name = ((yaml.safe_load(layout.read_record(path) or "") or {}).get("hydra") or {}).get("job", {}).get("name")
    except (ValueError, AttributeError, yaml.YAMLError):
        return False  # an unreadable record: listed as the run's own problem, not skipped
    return isinstance(name, str) and name != "runner"


def read_run(run_dir: str) -> RunInfo:
    """The status of run_dir and what its records say; never raises for what is in the directory: a record
    that cannot be read (layout.read_record: malformed, of the wrong shape, a FIFO, a symlink loop) makes
    the row say which and why, and nothing that is not a regular file is opened."""
    run_dir = os.path.abspath(run_dir)
    rd = layout.RunDir(run_dir)
    info = RunInfo(run_dir, FOREIGN)
    try:
        info.started = os.path.getmtime(rd.config if os.path.isfile(rd.config) else run_dir)
    except OSError:
        pass
    try:
        candidate = is_candidate(run_dir)
        some = [] if candidate else sorted(os.listdir(run_dir))[:3]
    except OSError as e:
        info.detail = f"cannot be read ({e.strerror or type(e).__name__})"
        return info
    if not candidate:
        info.detail = f"no run of this runner ({', '.join(some) or 'empty'})"
        return info
    problem = _read_records(info, rd)
    running = locked(run_dir)
    complete = _complete(rd)
    failure = _failure(rd) if _there(rd.failed) else None
    if running:
        info.status = RUNNING
        info.detail = _holder(run_dir)
    elif problem and problem[0] == TOO_OLD:
        info.status, info.detail = problem
    elif not _there(rd.config):
        info.status, info.detail = _without_config(rd, failure)
    elif problem:
        info.status, info.detail = problem
    elif complete is not None:
        info.status = FINISHED
        info.detail = f"{complete.get('steps', '?')} steps"
    elif failure is not None:
        kind, message = failure
        info.status = INTERRUPTED if kind == INTERRUPTED_RECORD else FAILED
        info.detail = message
    elif info.metrics:
        info.status = FAILED
        guard = info.metrics.get("nan_guard") or {}
        why = guard.get("reason") or guard.get("why")
        info.detail = _one_line(why or "metrics.json without the completion marker: the run failed after training")
    else:
        info.status = INTERRUPTED
        # A signal or an error leaves failed.json: without one the process was killed (SIGKILL, out of memory).
        info.detail = "killed without a record of why (SIGKILL, out of memory, a lost node)" + (
            f"; its checkpoint at step {info.steps} is saved: resume=true continues it"
            if info.resumable
            else ", before its first checkpoint"
        )
    return info


@contextlib.contextmanager
def ending_recorded(run_dir: str, signal_of: Callable[[BaseException], Optional[int]]) -> Iterator[None]:
    """Around a run in the directory it has claimed: when it ends by an error or a signal, failed.json says
    which (read back by read_run: failed with the error's first line, or interrupted with the signal and the
    checkpoint that continues it), and the exception goes on. signal_of(exception): the signal it stands
    for, None for an error (runner/training/interrupts.py signal_of)."""
    from runner.errors import signal_name

    try:
        yield
    except BaseException as e:
        signum = signal_of(e)
        if signum is not None:
            _write_failure(run_dir, INTERRUPTED_RECORD, _interruption(run_dir, signal_name(signum)))
        elif isinstance(e, Exception):
            _write_failure(run_dir, type(e).__name__, " ".join(str(e).split()) or repr(e))
        raise


def _interruption(run_dir: str, signal: str) -> str:
    """What a signal left: the checkpoint a resume continues from, or nothing to continue."""
    try:
        step = layout.read_state(layout.RunDir(run_dir).checkpoints).get("global_step")
    except (layout.StateProblem, OSError, ValueError):
        step = None
    if step is not None:
        return f"by {signal}; its checkpoint at step {step} is saved: resume=true continues it"
    return f"by {signal} before its first checkpoint: nothing to resume, run it again"


def _write_failure(run_dir: str, kind: str, message: str) -> None:
    from runner.rundir.atomic import write_json

    try:
        write_json(layout.RunDir(run_dir).failed, {"error": message, "error_type": kind})
    except OSError:
        pass  # a full disk: the error itself is what the user reads; the status falls back to the records


def clear_failure(run_dir: str) -> None:
    """Forget an earlier attempt's failed.json: a run starting (or resuming) in run_dir has no failure yet."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(layout.RunDir(run_dir).failed)


def _without_config(rd: layout.RunDir, failure) -> tuple:
    """(status, detail) of a directory with a run's records and no config.yaml."""
    if failure is not None:  # the run's end was recorded before its configuration (ending_recorded)
        if failure[0] == INTERRUPTED_RECORD:
            return INTERRUPTED, failure[1]
        return FAILED, f"failed before it started: {failure[1]}"
    left = [n for n in (layout.METRICS, layout.MODEL, layout.COMPLETE) if _there(os.path.join(rd.path, n))]
    if left or rd.has_checkpoint():
        return HALF_WRITTEN, (
            f"no {layout.CONFIG}, though the run left {', '.join(left) or layout.CHECKPOINTS}: its configuration "
            "was removed, and what it left cannot be continued"
        )
    return HALF_WRITTEN, f"no {layout.CONFIG}: the run stopped before it wrote its configuration"


def _complete(rd: layout.RunDir) -> Optional[dict]:
    if not _there(rd.complete):
        return None
    try:
        record = _json(rd.complete)
        return record if isinstance(record, dict) else {}
    except layout.RecordProblem:
        return {}  # present: the run wrote it last; an unreadable body does not undo that


def _failure(rd: layout.RunDir):
    try:
        record = _json(rd.failed, {"error_type": str})
        if not isinstance(record, dict):
            raise layout.RecordProblem("not an object")
        return str(record.get("error_type") or "Error"), _one_line(record.get("error", ""))
    except layout.RecordProblem as e:
        return "Error", f"{layout.FAILED} is unreadable ({_one_line(e, 60)})"


def _holder(run_dir: str) -> str:
    try:
        return _one_line(layout.read_record(os.path.join(run_dir, LOCK_FILE)) or "") or "a live process holds its lock"
    except layout.RecordProblem:
        return "a live process holds its lock"


def _unreadable(name: str, e: Exception) -> tuple:
    return HALF_WRITTEN, f"{name} is unreadable ({_one_line(e, 100)})"


def _read_records(info: RunInfo, rd: layout.RunDir):
    """Fill info from config.yaml, history.json, metrics.json, latest.json; (status, detail) for a record
    that cannot be read (half-written, or too old for this version), else None."""
    from runner.errors import UserError
    from runner.rundir.resume_check import config_after_resumes

    problem = None
    try:
        history = layout.read_history(rd.path)
        info.resumes = len(history)
    except layout.RecordProblem as e:
        return _unreadable(layout.HISTORY, e)
    if _there(rd.config):
        try:
            info.config = config_after_resumes(rd.path)
        except UserError as e:  # named relative to the row's own directory, so the why fits the line
            return HALF_WRITTEN, _one_line(str(e).replace(rd.path + os.sep, ""))
        old = too_old(info.config)
        if old:
            problem = TOO_OLD, old
        info.experiment = str(info.config.get("experiment_name", ""))
        epochs = info.config.get("epochs")
        info.epochs = epochs if isinstance(epochs, int) and not isinstance(epochs, bool) else None
    try:
        info.metrics = layout.read_metrics(rd.path) or {}
        if not isinstance(info.metrics, dict):
            info.metrics = {}
            raise layout.RecordProblem("not an object")
    except layout.RecordProblem as e:
        return problem or _unreadable(layout.METRICS, e)
    state = None
    if _there(rd.state):
        try:
            state = layout.read_state(rd.checkpoints)
            info.resumable = True
        except layout.StateProblem:
            info.resumable = bool(layout.step_files(rd.checkpoints))
    else:
        info.resumable = bool(os.path.isdir(rd.checkpoints) and layout.step_files(rd.checkpoints))
    steps = info.metrics.get("steps")
    info.steps = steps if isinstance(steps, int) else (state or {}).get("global_step")
    best = info.metrics.get("best_checkpoint") or (state or {}).get("best")
    if isinstance(best, dict) and isinstance(best.get("value"), (int, float)):
        info.monitor, info.monitor_value = str(best.get("monitor")), float(best["value"])
    info.epochs_done = _epochs_done(info, state)
    return problem


def _epochs_done(info: RunInfo, state: Optional[dict]) -> Optional[float]:
    curve = info.metrics.get("val_curve")
    stopped = (info.metrics.get("early_stop") or {}).get("stopped")
    if curve and isinstance(curve[-1], dict) and curve[-1].get("epoch") is not None:
        if info.metrics.get("early_stop") or not info.epochs:
            return float(curve[-1]["epoch"])
    if info.metrics and info.epochs and not stopped:
        return float(info.epochs)
    if state and isinstance(state.get("epoch"), (int, float)):
        return float(state["epoch"])
    return None


def too_old(config: dict) -> Optional[str]:
    """Why a saved configuration cannot be read by this version (settings it no longer has), or None."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from runner.config.schema import Config

    body = {k: v for k, v in config.items() if k not in ("defaults", "hydra")}
    try:
        OmegaConf.merge(OmegaConf.structured(Config), body)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or ""
        return _one_line(f"written by an earlier version: {key or 'a setting'} is not a setting of this one")
    return None


def find_runs(roots: Iterable[str]) -> List[RunInfo]:
    """Every run directory under roots (a root may be a run itself), each read once, in path order.

    Folders are walked into, up to DEPTH levels. A folder of files and no run record is listed as foreign
    where a run would be: a root itself, or beside runs (in a sweep, or among other runs); elsewhere (docs/
    in a checkout) it is not a run's place and is left out."""
    found: dict = {}
    for root in roots:
        root = os.path.abspath(root)
        if _walk(root, 0, found) == "foreign":
            found[root] = read_run(root)
    return [found[p] for p in sorted(found)]


def _walk(directory: str, depth: int, found: dict) -> str:
    """Add the runs under directory to found; "run", "foreign" (a leaf of files, no run), or "" (neither)."""
    if directory in found or depth > DEPTH or not os.path.isdir(directory):
        return ""
    if is_candidate(directory):
        if _other_command(directory):
            return ""
        found[directory] = read_run(directory)
        return "run"
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as e:
        if depth == 0:
            return "foreign"  # a root: listed, its row saying why it cannot be read
        found[directory] = RunInfo(directory, FOREIGN, f"cannot be read ({e.strerror or type(e).__name__})")
        return ""
    sweep = _there(os.path.join(directory, SWEEP_RECORD))
    # Never followed: a symlink (to a directory, a loop, nothing) is an entry of this folder, not a folder to walk.
    subdirs = [e.path for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    files = [e.name for e in entries if not e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    if files and not subdirs and not sweep:
        return "foreign"
    kinds = {sub: _walk(sub, depth + 1, found) for sub in subdirs}
    if sweep or "run" in kinds.values():
        for sub in (s for s, kind in kinds.items() if kind == "foreign"):
            found[sub] = read_run(sub)
    return ""


def when(info: RunInfo) -> str:
    """The run's start as local 'YYYY-MM-DD HH:MM'."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(info.started)) if info.started else "-"
