"""Sweeps that continue: the same `-m` command run again into the same sweep directory picks up its jobs.

Each job of a sweep is matched to a directory by its composed configuration (what Hydra saves as the job's
`.hydra/config.yaml`), not by its number, so a reordered or extended sweep still finds its earlier jobs.
conf/config.yaml names each job's directory through the `runner_sweep_job` resolver
(`hydra.sweep.subdir: ${runner_sweep_job:${hydra.job.num}}`):

- a job whose configuration an existing job directory holds goes back into that directory;
- a new job gets its number, or `<number>-<hash of its configuration>` when that number is an earlier
  job's of another configuration (a reordered sweep), so no two configurations ever share a directory.

The answer depends only on the job and the directories already there, so the pre-flight check, the
launcher (in the sweep's process, a joblib worker or the isolated launcher's child) and the job itself
all name the same directory. In the job, `plan` reads the directory's records (runner/rundir/status.py):
a finished job is kept (not run again), an interrupted one resumes from its last checkpoint under resume's
rules, a failed one runs again from the start (what it left moves to `attempts/<n>/`), a new one runs.
"""

import fcntl
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from typing import List, Optional

from runner.errors import ConfigError, UserError
from runner.rundir import layout, status
from runner.rundir.lock import LOCK_FILE

RESOLVER = "runner_sweep_job"
JOB_RECORD = "sweep_job.json"  # what this sweep did with the job: new, kept, resumed, rerun
ATTEMPTS = "attempts"  # <job>/attempts/<n>/: what an earlier attempt left that no longer describes the job
HYDRA_CONFIG = os.path.join(".hydra", "config.yaml")
# Kept where they are when an attempt is moved aside: Hydra's record and log of this attempt, the lock.
STAYS = {".hydra", "runner.log", LOCK_FILE, ATTEMPTS, JOB_RECORD}

NEW, KEPT, RESUMED, RERUN, REFUSED = "new", "kept", "resumed", "rerun", "refused"
BUSY = "busy"  # another process runs the job now
# The sweep's own lock, in its directory: the process that runs a sweep holds it from its pre-flight check to
# its exit, so the same -m command started twice is refused whole before it writes anything (runner/cli/preflight.py).
SWEEP_LOCK = ".runner.sweep.lock"
_sweeps_held: dict = {}  # sweep dir -> open file (closing it, or exiting, releases the lock)


def identity(task_cfg) -> dict:
    """A job's composed configuration (no `hydra` node) as Hydra saves it in .hydra/config.yaml, read back."""
    import yaml
    from omegaconf import OmegaConf

    return yaml.safe_load(OmegaConf.to_yaml(task_cfg, resolve=False)) or {}


def saved_identity(job_dir: str) -> Optional[dict]:
    """The composed configuration a job directory's .hydra/config.yaml records, None when unreadable."""
    import yaml

    try:
        saved = yaml.safe_load(layout.read_record(os.path.join(job_dir, HYDRA_CONFIG)) or "")
        return saved if isinstance(saved, dict) else None
    except (ValueError, yaml.YAMLError):  # layout.RecordProblem: never opens a FIFO, never follows a loop
        return None


def job_dirs(sweep_dir: str) -> dict:
    """{name: recorded configuration or None} of the folders in a sweep directory, in name order."""
    try:
        names = sorted(e.name for e in os.scandir(sweep_dir) if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return {}
    return {n: saved_identity(os.path.join(sweep_dir, n)) for n in names}


def _digest(config: dict) -> str:
    return hashlib.sha1(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:8]


def subdir_for(sweep_dir: str, num, config: dict) -> str:
    """The directory name of job `num` whose composed configuration is `config` (the module's rules)."""
    existing = job_dirs(sweep_dir)
    for name, saved in existing.items():
        if saved == config:
            return name
    return str(num) if str(num) not in existing else f"{num}-{_digest(config)}"


def _resolve_subdir(num, _root_) -> str:
    from omegaconf import OmegaConf

    task = OmegaConf.masked_copy(_root_, [k for k in _root_.keys() if k != "hydra"])
    return subdir_for(str(_root_.hydra.sweep.dir), num, identity(task))


def register() -> None:
    """Make `${runner_sweep_job:...}` known to OmegaConf (every process that resolves a sweep's job directory)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, _resolve_subdir)


register()


@dataclass
class JobPlan:
    """What a sweep job does with what its directory holds: NEW, KEPT, RESUMED, RERUN, REFUSED or BUSY, and why."""

    action: str
    detail: str = ""
    val_accuracy: Optional[float] = None  # a kept job's result


def plan(cfg, job_dir: str) -> JobPlan:
    """Decide from job_dir's records (writes nothing). cfg: the job's configuration, as the task gets it."""
    from omegaconf import OmegaConf

    from runner.rundir.resume_check import _with_defaults, compare

    if not os.path.isdir(job_dir):
        return JobPlan(NEW)
    info = status.read_run(job_dir)
    if info.status == status.RUNNING:
        return JobPlan(BUSY, f"another process is running this job in {job_dir} ({info.detail})")
    if info.status == status.FOREIGN and os.listdir(job_dir):
        return JobPlan(REFUSED, f"{job_dir} holds files that are not a run of this runner")
    if info.status in (status.FOREIGN, status.HALF_WRITTEN) and not set(os.listdir(job_dir)) - STAYS:
        return JobPlan(NEW)  # Hydra's record only: a dry run, or a job stopped before it wrote anything
    if info.status in (status.FAILED, status.HALF_WRITTEN, status.TOO_OLD):
        return JobPlan(RERUN, f"was {info.status}: {info.detail}")
    new = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert isinstance(new, dict)  # a job's configuration is a mapping
    changes, refused = compare(_with_defaults(info.config), new, set())
    if refused:
        return JobPlan(
            REFUSED,
            f"{job_dir} holds a run of another configuration ({'; '.join(refused[:3])}), which resume cannot "
            "continue with this one",
        )
    if info.status == status.FINISHED:
        if "epochs" in changes:
            return JobPlan(RESUMED, f"finished at epoch {info.epochs_done}, extended to {cfg.epochs}")
        value = info.metrics.get("val_accuracy")
        return JobPlan(KEPT, "finished earlier", value if isinstance(value, (int, float)) else None)
    if info.resumable:
        return JobPlan(RESUMED, f"interrupted at step {info.steps}")
    return JobPlan(RERUN, "interrupted before its first checkpoint")


def prepare(job_plan: JobPlan, job_dir: str) -> None:
    """In the job, before it trains: move aside what an earlier attempt left that no longer describes the job
    (all of it for a rerun, the interruption's failed.json for a resume), and record the plan (JOB_RECORD)."""
    from runner.rundir.atomic import write_json

    if job_plan.action in (RERUN, RESUMED):
        names = os.listdir(job_dir) if job_plan.action == RERUN else [layout.FAILED]
        moving = [n for n in names if n not in STAYS and os.path.exists(os.path.join(job_dir, n))]
        if moving:
            attempts = os.path.join(job_dir, ATTEMPTS)
            os.makedirs(attempts, exist_ok=True)
            target = os.path.join(attempts, str(len(os.listdir(attempts)) + 1))
            os.makedirs(target)
            for name in moving:
                shutil.move(os.path.join(job_dir, name), os.path.join(target, name))
    write_json(
        os.path.join(job_dir, JOB_RECORD), {"action": job_plan.action, "detail": job_plan.detail, "at": time.time()}
    )


def recorded_plan(job_dir: str, since: Optional[float]) -> Optional[dict]:
    """The JOB_RECORD this sweep wrote for job_dir ({"action", "detail"}), None when the job did not run in it
    (since: when this sweep started; None: any record)."""
    try:
        record = layout.read_json_record(os.path.join(job_dir, JOB_RECORD))
    except layout.RecordProblem:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("at", 0), (int, float)):
        return None
    if since is not None and float(record.get("at", 0)) < since:
        return None
    return record


def check_distinct(job_overrides: List[List[str]]) -> None:
    """ConfigError when two jobs of a sweep set the same values (`seed=0,0`, `optim.lr=0.1,0.10`): each job's
    directory is the one its configuration names, so the second would find the first's and keep it, and the
    summary would list one job for two."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    seen: dict = {}
    for num, job in enumerate(job_overrides):
        parsed = parser.parse_overrides(job)
        key = tuple(sorted((o.get_key_element(), repr(o.value())) for o in parsed))
        if key in seen:
            raise ConfigError(
                f"jobs #{seen[key]} and #{num} of this sweep are one configuration "
                f"({' '.join(job) or 'no overrides'}): "
                "a sweep runs each configuration once, in the directory that configuration names, so the second "
                "would only find the first's result. Drop the repeated value (a run of one configuration gives the "
                "same numbers every time; to see the spread over seeds, sweep seed=0,1,2)."
            )
        seen[key] = num


def claim_sweep(sweep_cfg) -> None:
    """Lock the sweep directory for this process (held until it exits); UserError naming the process that
    holds it. A directory only the run can name (${now:...}) is a new one: nothing to claim."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    # Resolved here, ${now:...} names a directory the sweep itself will not use (it resolves it again later).
    sweep = OmegaConf.to_container(sweep_cfg.hydra.sweep, resolve=False)
    if isinstance(sweep, dict) and "${now:" in str(sweep.get("dir", "")):
        return
    try:
        sweep_dir = os.path.abspath(str(sweep_cfg.hydra.sweep.dir))
    except OmegaConfBaseException:
        return
    if sweep_dir in _sweeps_held:
        return
    os.makedirs(sweep_dir, exist_ok=True)
    path = os.path.join(sweep_dir, SWEEP_LOCK)
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = " ".join(f.read().split()) or "another process"
        f.close()
        raise UserError(
            f"Another process ({holder}) is running a sweep in {sweep_dir} and holds its lock ({path}); two sweeps "
            "in one directory would run, keep or fail each other's jobs. Wait for it to end, then run the command "
            "again: it continues the sweep (finished jobs are kept). Or choose another hydra.sweep.dir."
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {os.uname().nodename}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    _sweeps_held[sweep_dir] = f


def check_continuable(sweep_cfg) -> None:
    """ConfigError when the sweep directory holds jobs and this sweep cannot continue them (Optuna)."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        sweep_dir = os.path.abspath(str(sweep_cfg.hydra.sweep.dir))
        sweeper = str(sweep_cfg.hydra.sweeper.get("_target_", ""))
    except OmegaConfBaseException:
        return  # ${now:...}: a new directory
    if "optuna" not in sweeper.lower() or not any(v is not None for v in job_dirs(sweep_dir).values()):
        return
    raise ConfigError(
        f"hydra.sweep.dir={sweep_dir} holds the jobs of an earlier sweep, and an Optuna sweep cannot continue "
        "there: the sampler's state is Optuna's study, which hydra-optuna-sweeper keeps only with "
        "hydra.sweeper.storage and study_name, and even then it asks for n_trials new trials numbered from 0 "
        "instead of the ones still missing (continuing would take a sweeper that reloads the study, asks only "
        "for the remaining trials and numbers them after the existing jobs). Choose a new hydra.sweep.dir."
    )
