"""Checks made before Hydra starts: what Hydra itself would act on before any runner code runs.

Hydra instantiates parts of the composed configuration on its own, before the task function sees
it: `hydra.callbacks`, the launcher and the sweeper (`_target_`), and the `hydra.job_logging` /
`hydra.hydra_logging` dictConfigs (`class`, `()`, `ext://`). A config file, a `--config-dir`, an
`experiment` file or a command-line override can put anything there. So the configuration is
composed here exactly as `@hydra.main` will compose it (same search path, config dir, overrides and
`hydra` node; with -m the sweep's own config and every job's, each combination of the swept values),
resolved as Hydra will resolve it at run time, and every callable it names is checked against an
explicit list (ALLOWED_TARGETS); then the command's own checks that can refuse (the output directory,
a resume) run, so that nothing is written before a refusal. Only then does Hydra run. Hydra's own
target blocklist stays as a second layer behind this one.
"""

import copy
import itertools
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from yaml import YAMLError

from runner.cli import hydra_seam
from runner.config.callables import refuse, target_allowed, target_refusal
from runner.config.tree import walk
from runner.errors import ConfigError

# What Hydra raises for a configuration it cannot compose (YAML errors included): reported as the user's
# mistake. Anything else from the composition below is a failure of the check, which then refuses (preflight).
COMPOSE_ERRORS = (HydraException, OmegaConfBaseException, YAMLError)
# The only variables `hydra.job.env_set` (and env_copy) may set, each harmless: thread counts and log
# levels. Everything else is refused: CXX, CPATH, LD_*, PYTHON*, PATH, BASH_ENV ... make a process
# run or load code of the config's choosing.
ENV_ALLOWED = {
    "OMP_NUM_THREADS": "OpenMP threads",
    "MKL_NUM_THREADS": "MKL threads",
    "OPENBLAS_NUM_THREADS": "OpenBLAS threads",
    "GLOG_v": "MindSpore's log level",
    "GLOG_logtostderr": "MindSpore's log to stderr",
    "GLOG_stderrthreshold": "MindSpore's stderr log level",
    "PYTHONUNBUFFERED": "unbuffered output",
    "CUDA_VISIBLE_DEVICES": "which GPUs the job sees",
    "ASCEND_RT_VISIBLE_DEVICES": "which Ascend NPUs the job sees",
}
LOGGING_NODES = ("job_logging", "hydra_logging")


# ---------------------------------------------------------------------------------------------------
# The configuration as Hydra will see it: resolved, with what Hydra fills in at run time.


@contextmanager
def at_run_time(cfg, job_num: int, multirun: bool, output_dir: Optional[str] = None):
    """A copy of a composed config with what Hydra sets before it acts on it, as run_job sets it: the
    job's number (a sweep's launcher) and hydra.runtime.output_dir (output_dir when given; left unset when it
    cannot be resolved: then whatever reads it cannot be resolved either, and is refused), and HydraConfig
    set to it, so `${hydra:...}` resolves as it will in the job. A single run and a sweep's own process get
    number 0: a number or a path filled in here can never pass for an allowed callable."""
    from omegaconf import read_write

    cfg = copy.deepcopy(cfg)
    with read_write(cfg.hydra):
        cfg.hydra.job.num = job_num
        cfg.hydra.job.id = str(job_num)
    with hydra_seam.hydra_config_set(cfg):
        try:
            if output_dir is None:
                out = os.path.join(cfg.hydra.sweep.dir, str(cfg.hydra.sweep.subdir)) if multirun else cfg.hydra.run.dir
                output_dir = os.path.abspath(str(out))
            with read_write(cfg.hydra):
                cfg.hydra.runtime.output_dir = output_dir
        except OmegaConfBaseException:
            pass
        with hydra_seam.hydra_config_set(cfg):
            yield cfg


def _as_written(overrides) -> list:
    """Override strings as the user typed them: `${...}` inside one is text, not resolved here."""
    typed = OmegaConf.to_container(overrides, resolve=False) if overrides is not None else []
    return [str(o) for o in typed] if isinstance(typed, list) else []


def _raw(node, key: str):
    """node[key] as written: `${...}` stays text, `???` stays `???` (a container as plain dicts and lists)."""
    raw = OmegaConf.to_container(node, resolve=False)
    assert isinstance(raw, dict)
    return raw[key]


# The command line as typed, kept as text under hydra.*: a value like optim.lr=${x} is text there (Hydra
# saves overrides.yaml unresolved), and the job's own value is checked under its own key.
AS_TYPED = ("overrides", "job.override_dirname")


def _resolved_except(node, as_typed, prefix: str = "") -> dict:
    """node as plain containers, resolved, except the dotted paths in as_typed (kept as written)."""
    out = {}
    for key in node.keys():
        path = f"{prefix}{key}"
        if path in as_typed:
            out[key] = _raw(node, key)
        elif any(t.startswith(path + ".") for t in as_typed):
            out[key] = _resolved_except(node[key], as_typed, path + ".")
        else:
            child = node[key]
            out[key] = OmegaConf.to_container(child, resolve=True) if OmegaConf.is_config(child) else child
    return out


def _unresolvable(e: OmegaConfBaseException) -> ConfigError:
    where = getattr(e, "full_key", None) or "hydra"
    return ConfigError(
        f"{where} cannot be resolved before Hydra runs ({str(e).splitlines()[0].strip()}), so what "
        "it names cannot be checked, and the command refuses to start. Give it a literal value."
    )


def resolved(cfg, job_num: int = 0, multirun: bool = False, printing: bool = False) -> dict:
    """The composed config (a mapping with its `hydra` node) as plain dicts and lists with every
    interpolation resolved as Hydra will resolve it, or ConfigError: a value under `hydra` that cannot be
    resolved before Hydra runs is refused, as it cannot be checked. The job's own part may hold values
    only the job can resolve; it is left as written where it cannot be resolved. printing: the command only
    prints (--help, --cfg, --info): a required top-level value it lacks (`runner-evaluate --help` has no
    run= for hydra.run.dir's ${run}) stands in as `<run>`, so the rest is checked as usual."""
    from omegaconf import open_dict

    if printing:
        cfg = copy.deepcopy(cfg)
        with open_dict(cfg):
            for key in [k for k in cfg.keys() if k != "hydra" and OmegaConf.is_missing(cfg, k)]:
                cfg[key] = f"<{key}>"  # a placeholder where the printing command lacks a value
    with at_run_time(cfg, job_num, multirun) as cfg:
        out: dict = {}
        for key in cfg.keys():
            try:
                node = cfg[key]
                if key == "hydra":
                    # A sweep writes under hydra.sweep, a single run under hydra.run: the other is never used,
                    # and may name what only the other mode has (evaluate's ${run} in hydra.run.dir under -m).
                    out[key] = _resolved_except(node, AS_TYPED + (("run",) if multirun else ("sweep",)))
                    continue
                out[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
            except OmegaConfBaseException as e:
                if key == "hydra":
                    raise _unresolvable(e) from None
                out[key] = _raw(cfg, key)
        return out


# What Hydra acts on anew in every job of a sweep (the callbacks, the job's logging and environment, its
# record and log file names); the launcher, the sweeper and Hydra's own logging act once, from the sweep's
# config. Paths under `hydra`.
PER_JOB = ("callbacks", "job_logging", "job.env_set", "job.env_copy", "job.name", "output_subdir")


def _per_job_values(ran) -> dict:
    return {path: _select(ran, f"hydra.{path}") for path in PER_JOB}


def _select(cfg, path: str):
    value = OmegaConf.select(cfg, path, throw_on_resolution_failure=True)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def depends_on_the_job(cfg) -> bool:
    """Whether what Hydra acts on in each job of a sweep (PER_JOB) can differ between the jobs of the sweep
    whose own config is cfg, other than through a swept config group: it does unless those values resolve
    without the job's part of the config and without the job's number and overrides, to what they are in
    the sweep's config. When they do not depend on it, checking the sweep's config checks every job."""
    from omegaconf import read_write

    try:
        with at_run_time(cfg, 0, True) as ran:
            if OmegaConf.is_missing(ran.hydra.runtime, "output_dir"):
                return True
            output_dir = ran.hydra.runtime.output_dir
            here = _per_job_values(ran)
        alone = OmegaConf.create({})
        alone.hydra = copy.deepcopy(cfg.hydra)  # keeps its type, as HydraConfig requires
        with read_write(alone):
            alone.hydra.job.override_dirname = "<the job's overrides>"
            alone.hydra.overrides.task = ["<the job's overrides>"]
        with at_run_time(alone, -1, True, output_dir) as ran:
            return _per_job_values(ran) != here
    except OmegaConfBaseException:
        return True


# ---------------------------------------------------------------------------------------------------
# The rules: what a composed, resolved configuration may hold, each with its reason.


@dataclass(frozen=True)
class Found:
    """One entry of the resolved config: its dotted path, its key and its value."""

    where: str
    key: Any
    value: Any


@dataclass(frozen=True)
class Context:
    """What a rule may need besides the entry: the resolved `hydra` node, whether this is a sweep, and the
    logging handlers Hydra's own configs use, their file names resolved for this run."""

    hydra: dict
    multirun: bool
    handlers: list


@dataclass(frozen=True)
class Rule:
    """A rule on the entries whose dotted path fully matches `where` (a regular expression): `allows` says
    whether an entry passes; one that does not is refused with `why`. `sweep_only`: the rule applies only
    to a sweep (what it checks is used only by -m; a single run leaves hydra.sweep unresolved)."""

    where: str
    allows: Callable[[Found, Context], bool]
    why: str
    sweep_only: bool = False
    key: Optional[str] = None  # the entry's own key, where a dotted path cannot tell (a key with dots in it)
    about_code: bool = True  # False: a setting the run cannot carry out, not code it would run

    def applies(self, found: Found, ctx: Context) -> bool:
        if self.key is not None and found.key != self.key:
            return False
        return (ctx.multirun or not self.sweep_only) and re.fullmatch(self.where, found.where) is not None

    def refusal(self, found: Found) -> ConfigError:
        if found.key == "_target_":
            return target_refusal(found.where, found.value)
        if not self.about_code:
            return ConfigError(f"{found.where}={found.value!r} is refused: {self.why}")
        return refuse(found.where, found.value, self.why)


def _in_sweep_dir(found: Found, ctx: Context) -> bool:
    if found.value is None:
        return True
    sweep = os.path.abspath(str((ctx.hydra.get("sweep") or {}).get("dir")))
    path = str(found.value)
    if found.where == "hydra.sweeper.storage":
        path = path[len("sqlite:///") :] if path.startswith("sqlite:///") else ""
    return bool(path) and os.path.abspath(path).startswith(sweep + os.sep)


def _relative_inside(found: Found, ctx: Context) -> bool:
    text = str(found.value)
    return found.value is None or not (os.path.isabs(text) or ".." in text.split("/"))


def _a_handler_of_hydras(found: Found, ctx: Context) -> bool:
    value = found.value
    if not isinstance(value, dict):
        return False
    return (value.get("class"), value.get("filename"), value.get("stream")) in ctx.handlers and not (
        set(value) - HANDLER_KEYS
    )


def _launcher_field(found: Found, ctx: Context) -> bool:
    target = str((ctx.hydra.get("launcher") or {}).get("_target_"))
    return found.key in LAUNCHER_FIELDS.get(target, {})


def _slurm_directive(found: Found, ctx: Context) -> bool:
    return str(found.key).replace("_", "-") in SLURM_DIRECTIVES


def _one_line(found: Found, ctx: Context) -> bool:
    return not isinstance(found.value, str) or not ("\n" in found.value or "\r" in found.value)


LOGGING = r"hydra\.(job_logging|hydra_logging)"
HANDLER_KEYS = {"class", "formatter", "stream", "filename", "level", "filters"}
# Group choices under hydra/, by name: Hydra's own options and the plugins' the runner documents. What a file
# of that name holds (a --config-dir can shadow one) is checked by the rules on the values below.
GROUP_CHOICES: Dict[str, Tuple[Optional[str], ...]] = {
    "hydra/launcher": ("isolated", "basic", "joblib", "submitit_local", "submitit_slurm"),
    "hydra/sweeper": ("basic", "optuna", "optuna_accuracy"),
    "hydra/sweeper/sampler": ("tpe", "random", "cmaes", "nsgaii", "motpe", "grid"),
    "hydra/job_logging": ("default", "disabled", "none", "stdout"),
    "hydra/hydra_logging": ("default", "disabled", "none"),
    "hydra/callbacks": (None,),
    "hydra/env": ("default",),
    "hydra/help": ("default",),
    "hydra/hydra_help": ("default",),
    "hydra/output": ("default",),
}
COMMON_LAUNCHER_FIELDS = {"_target_": "the launcher itself (checked against ALLOWED_TARGETS)"}
SUBMITIT_FIELDS = {
    **COMMON_LAUNCHER_FIELDS,
    "submitit_folder": "where submitit writes its job files (inside the sweep directory)",
    "timeout_min": "a number",
    "cpus_per_task": "a number",
    "gpus_per_node": "a number",
    "tasks_per_node": "a number",
    "mem_gb": "a number",
    "nodes": "a number",
    "name": "the Slurm job's name (one line)",
    "stderr_to_stdout": "a flag",
}
# Every field a launcher's configuration may hold, each with what it is. A launcher turns its fields into its
# jobs' command line, environment or script (Slurm's #SBATCH header, srun's arguments, setup lines), so a
# field not listed (srun_args, teardown, a `+hydra.launcher.<key>` of the user's) is refused: docs/launchers.md.
LAUNCHER_FIELDS: Dict[str, Dict[str, str]] = {
    "hydra_plugins.runner_launcher.isolated_launcher.IsolatedLauncher": {
        **COMMON_LAUNCHER_FIELDS,
        "fail_fast": "a flag: stop the sweep at the first failed job",
    },
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher": COMMON_LAUNCHER_FIELDS,
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher": {
        **COMMON_LAUNCHER_FIELDS,
        "n_jobs": "a number",
        "backend": "one of joblib's registered backends, by name",
        "prefer": "processes or threads",
        "require": "sharedmem or nothing",
        "verbose": "a number",
        "timeout": "a number",
        "pre_dispatch": "an expression of n_jobs",
        "batch_size": "a number or auto",
        "temp_folder": "where joblib writes memory maps (inside the sweep directory)",
        "max_nbytes": "a size",
        "mmap_mode": "a memory map mode",
    },
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher": SUBMITIT_FIELDS,
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher": {
        **SUBMITIT_FIELDS,
        "partition": "a #SBATCH directive",
        "qos": "a #SBATCH directive",
        "comment": "a #SBATCH directive",
        "constraint": "a #SBATCH directive",
        "exclude": "a #SBATCH directive",
        "gres": "a #SBATCH directive",
        "cpus_per_gpu": "a number",
        "gpus_per_task": "a number",
        "mem_per_gpu": "a size",
        "mem_per_cpu": "a size",
        "account": "a #SBATCH directive",
        "signal_delay_s": "a number",
        "max_num_timeout": "a number",
        "array_parallelism": "a number",
        "additional_parameters": "#SBATCH directives, only those in SLURM_DIRECTIVES",
        "setup": "must stay empty: its lines run as shell commands in every job",
    },
}
# The #SBATCH directives additional_parameters may add: where and when a job runs, and whom Slurm mails.
# Not --export, --export-file, --get-user-env (the job's environment), --chdir, --container, --prolog and the
# like, nor --output/--error/--open-mode, which submitit sets itself to the files it reads back.
SLURM_DIRECTIVES = (
    "time",
    "comment",
    "mail-type",
    "mail-user",
    "reservation",
    "nodelist",
    "exclusive",
    "requeue",
    "no-requeue",
    "hint",
    "begin",
    "deadline",
    "priority",
    "nice",
    "licenses",
    "wckey",
    "mem",
    "ntasks",
    "ntasks-per-node",
    "distribution",
    "switches",
    "tmp",
    "gpus",
    "cluster-constraint",
    "clusters",
)


def _env_name(found: Found, ctx: Context) -> bool:
    return str(found.key if found.where.startswith("hydra.job.env_set.") else found.value) in ENV_ALLOWED


ENV_REASON = (
    f"the environment of the run's processes may set only {', '.join(sorted(ENV_ALLOWED))}; other variables (CXX, "
    "CPATH, LD_PRELOAD, PYTHONPATH, ...) make them run or load code of the config's choosing."
)

# The table. Each entry: where it applies, what passes, why. The first rule an entry fails refuses the run.
RULES: Tuple[Rule, ...] = (
    Rule(r".*", lambda f, c: target_allowed(f.value), "a callable outside ALLOWED_TARGETS.", key="_target_"),
    Rule(
        r"hydra\.runtime\.choices\.hydra/.*",
        lambda f, c: f.value in GROUP_CHOICES.get(f.where.split(".", 3)[3], ()),
        "the config groups under hydra/ (launcher, sweeper, logging, callbacks) may be only the options Hydra and "
        "its plugins ship (docs/launchers.md lists them).",
    ),
    Rule(
        r"hydra\.sweeper\.direction",
        lambda f, c: not isinstance(f.value, list) or len(f.value) == 1,
        "each run returns one number (its val_accuracy), so an Optuna search has one direction: maximize (as "
        "hydra/sweeper=optuna_accuracy does) or minimize; several directions need as many numbers from every "
        "trial, and every trial would fail.",
        about_code=False,
    ),
    Rule(
        r"hydra\.sweeper\.custom_search_space",
        lambda f, c: f.value is None,
        "a search space is given with hydra.sweeper.params, not by a function.",
    ),
    Rule(LOGGING + r"\..*\.\(\)", lambda f, c: False, "a logging config may not name a factory."),
    Rule(
        LOGGING + r"\..*",
        lambda f, c: (
            not (isinstance(f.value, str) and f.value.startswith(("ext://", "cfg://")))
            or f.value in ("ext://sys.stdout", "ext://sys.stderr")
        ),
        "a logging config may only refer to ext://sys.stdout or ext://sys.stderr.",
    ),
    Rule(
        LOGGING + r"\.(?!handlers\.[^.\[]+\.class$).*\.class",
        lambda f, c: False,
        "a logging config may name a class only for its handlers.",
    ),
    Rule(
        LOGGING + r"\.handlers\.[^.\[]+",
        _a_handler_of_hydras,
        "logging handlers may only be Hydra's own, exactly as its logging configs use them (a StreamHandler on the "
        "console, a FileHandler writing <run dir>/<job name>.log).",
    ),
    Rule(r"hydra\.job\.env_set\.[^.\[]+", _env_name, ENV_REASON),
    Rule(r"hydra\.job\.env_copy\[\d+\]", _env_name, ENV_REASON),
    Rule(
        r"hydra\.launcher\.[^.\[]+",
        _launcher_field,
        "a launcher turns its settings into its jobs' command line, environment or script, so it may hold only "
        "the fields docs/launchers.md lists for it. To use another launcher, choose it on the command line "
        "(hydra/launcher=joblib): an `override /hydra/launcher` in an experiment file does not replace the "
        "runner's own choice (conf/config.yaml), so its settings land on the default launcher.",
    ),
    Rule(
        r"hydra\.launcher\.additional_parameters\.[^.\[]+",
        _slurm_directive,
        "additional_parameters become #SBATCH directives of every job, and only those that say where and when a "
        f"job runs may be added ({', '.join(SLURM_DIRECTIVES)}); --export and the like would set the job's "
        f"environment, which {ENV_REASON[4:]}",
    ),
    Rule(
        r"hydra\.launcher\..*",
        _one_line,
        "a launcher's settings become lines of a job script (Slurm's #SBATCH header), so a line break in one would "
        "add a command of its own.",
    ),
    Rule(
        r"hydra\.launcher\.setup",
        lambda f, c: not f.value,
        "hydra.launcher.setup runs shell commands in every Slurm job; put them in your cluster environment (a module "
        "file, ~/.bashrc) instead.",
    ),
    Rule(
        r"hydra\.(sweeper\.storage|launcher\.submitit_folder|launcher\.temp_folder)",
        _in_sweep_dir,
        "it is written to, and must lie inside the sweep directory; for Optuna, sqlite:///${hydra.sweep.dir}/optuna.db "
        "keeps a resumable study there.",
        sweep_only=True,
    ),
    Rule(
        r"hydra\.output_subdir",
        _relative_inside,
        "Hydra writes its record (config.yaml, hydra.yaml, overrides.yaml) there, which must stay inside the run's "
        "own directory.",
    ),
    Rule(
        r"hydra\.job\.name",
        lambda f, c: os.sep not in str(f.value) and not str(f.value).startswith("."),
        "the job name becomes the log file's name and cannot be a path.",
    ),
)


def _expected_handlers(hydra: dict) -> list:
    """(class, filename, stream) of the handlers in Hydra's own shipped logging configs, their file names
    resolved for this run: the only handlers a config may use (the console, <run dir>/<job name>.log)."""
    found = []
    for _, _, data in hydra_seam.shipped_logging_configs():
        for h in (data.get("handlers") or {}).values():
            filename = h.get("filename")
            if filename is not None:
                # Hydra's file handler: ${hydra.runtime.output_dir}/${hydra.job.name}.log
                runtime, job = hydra.get("runtime") or {}, hydra.get("job") or {}
                filename = filename.replace("${hydra.runtime.output_dir}", str(runtime.get("output_dir")))
                filename = filename.replace("${hydra.job.name}", str(job.get("name")))
            found.append((h.get("class"), filename, h.get("stream")))
    return found


def check_composed(cfg, job_num: int = 0, multirun: bool = False, printing: bool = False) -> None:
    """Raise ConfigError for the first entry of the composed config (with its `hydra` node, resolved as Hydra
    will resolve it) that a rule of RULES refuses."""
    plain = resolved(cfg, job_num, multirun, printing)
    hydra = plain.get("hydra") or {}
    ctx = Context(hydra=hydra, multirun=multirun, handlers=_expected_handlers(hydra))
    for where, key, value in walk(plain):
        found = Found(where, key, value)
        for rule in RULES:
            if rule.applies(found, ctx) and not rule.allows(found, ctx):
                raise rule.refusal(found)


# ---------------------------------------------------------------------------------------------------
# Composing as hydra.main will.


def _swept(parser, arguments: list) -> Dict[str, List[str]]:
    """{key: [override of each value]} of a sweep's arguments, in the order Hydra's basic sweeper runs
    them. An interval (Optuna's) yields numbers; its two ends stand for it."""
    lists = {}
    for o in parser.parse_overrides(arguments):
        key = o.get_key_element()
        if o.is_interval_sweep():
            start, end = o.value().start, o.value().end
            if start is not None and end is not None and start >= end:
                raise ConfigError(
                    f"{o.input_line!r} is refused: an interval goes from low to high, and this one is empty, so "
                    f"the sweeper could sample nothing from it. Write interval({end}, {start})."
                )
            lists[key] = [f"{key}={start}", f"{key}={end}"]
        elif o.is_sweep_override():
            lists[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            lists[key] = [f"{key}={o.get_value_element_as_str()}"]
    return lists


def _job_overrides(parser, arguments: list) -> list:
    """The override list of every job of a sweep (the product of every swept value)."""
    return [list(x) for x in itertools.product(*_swept(parser, arguments).values())]


UNKNOWN_KEY = re.compile(r"Could not override '([^']+)'")


def check_unknown_key(hydra, config_name: str, overrides: list, error: Exception) -> None:
    """ConfigError with the closest real settings when an override names a key the configuration lacks: Hydra
    would suggest `+key=value`, which only adds a key the run then refuses as not a setting (a dead end)."""
    from runner.config.suggest import config_keys, did_you_mean

    found = UNKNOWN_KEY.search(str(error))
    if not found:
        return
    key = found.group(1)
    written = next((o for o in overrides if o.split("=", 1)[0].lstrip("~") == key), f"{key}=...")
    keys: List[str] = []
    for others in ([o for o in overrides if o != written], []):
        try:
            body = OmegaConf.to_container(hydra.compose(config_name, others, False, validate_sweep=False))
        except COMPOSE_ERRORS:
            continue
        assert isinstance(body, dict)
        keys = config_keys(body)
        break
    if "." not in key:
        keys += hydra.groups()  # experimnet=quick: a group is a name that may be meant too
    raise ConfigError(
        f"{written!r}: {key} is not a setting of the runner{did_you_mean(key, keys)}. `--help` lists the config "
        "groups and every setting with its default; `--cfg job` shows the composed configuration."
    )


def compose_error(e: BaseException) -> ConfigError:
    """Hydra's own report of a configuration it cannot compose, as one paragraph."""
    lines = str(e).splitlines()
    if e.__cause__ is not None:  # "Error merging override x=abc" is explained by its cause
        lines += [
            ln
            for ln in str(e.__cause__).splitlines()
            if not ln.strip().startswith(("full_key:", "object_type", "reference_type"))
        ]
    text = " ".join(line.strip() for line in lines if line.strip())
    return ConfigError(f"{text} (`--help` lists the config groups, `--cfg job` shows the composed configuration).")


def compose_like_hydra(app, args) -> list:
    """[(config, job number, multirun)] that hydra.main will compose for the parsed arguments: the run's, or
    with -m the sweep's own, then every job's (each combination of the swept values) where the jobs may differ
    in what the rules check (a swept config group, a value under hydra.* that depends on the job) or where the
    sweep directory already holds jobs (each job's before_run decides). ConfigError where Hydra would fail to
    compose one; any other failure propagates: preflight() then refuses to start (fails closed)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if args.experimental_rerun is not None:
        raise ConfigError(
            f"--experimental-rerun {args.experimental_rerun!r} is refused: it unpickles the file, and unpickling "
            "runs whatever code the file names. Start the run again from its config.yaml (see the README)."
        )
    config_name = args.config_name or app.config_name
    config_path = args.config_path if args.config_path is not None else app.config_path
    if args.config_dir is not None and not os.path.isdir(os.path.abspath(args.config_dir)):
        raise ConfigError(f"--config-dir {args.config_dir!r} is not a directory.")
    from runner.cli.argv import hydra_overrides

    # As the command line hands them to Hydra (runner/cli/app.py): `+experiment=x` is the slot's experiment=x.
    argv = (["--config-path", str(args.config_path)] if args.config_path is not None else []) + (
        ["--config-name", str(args.config_name)] if args.config_name else []
    )
    overrides = hydra_overrides(argv + list(args.overrides), app.config_name, app.config_path)[len(argv) :]
    with hydra_seam.composer(app.task, config_path, args.config_dir) as hydra:
        try:
            check_no_option(hydra, overrides)
            base = hydra.compose(config_name, overrides, bool(args.multirun), validate_sweep=False)
            multirun = args.multirun or base.hydra.mode == RunMode.MULTIRUN
            # As Hydra does once it knows the mode: `run=a,b` without -m is ambiguous, a swept hydra.* unsupported.
            hydra.check_sweep_overrides(overrides, multirun)
            if not multirun:
                return [(base, 0, False)]
            configs = [(base, 0, True)]
            parser = OverridesParser.create()
            params = base.hydra.sweeper.get("params") or {}
            # As Hydra's multirun: the sweeper gets the task's overrides, load_sweep_config puts the hydra ones first.
            arguments = [f"{k}={v}" for k, v in params.items()] + _as_written(base.hydra.overrides.task)
            # Only where a job's directory is the one its configuration names (training's runner_sweep_job):
            # evaluate/predict/export number theirs, so a repeated job there is a second, separate result.
            from runner.rundir.sweep_jobs import RESOLVER, check_distinct

            sweep = OmegaConf.to_container(base.hydra.sweep, resolve=False)
            by_config = isinstance(sweep, dict) and RESOLVER in str(sweep.get("subdir", ""))
            if by_config and str(base.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper"):
                check_distinct(_job_overrides(parser, arguments))
            return configs + _jobs_to_check(hydra, config_name, base, parser, arguments)
        except COMPOSE_ERRORS as e:
            check_package_header(e)
            check_unknown_key(hydra, config_name, overrides, e)
            raise compose_error(e) from None
        except KeyError as e:
            check_env_copy(e)
            raise


def _jobs_to_check(hydra, config_name: str, base, parser, arguments: list) -> list:
    """[(config, job number, True)] of the sweep's jobs the rules must see one by one: all of them where they may
    differ in what the rules check or the sweep directory holds jobs, else none. The first job is composed in any
    case: the sweep's own config holds no swept value, and a misspelled swept key (`optim.lrr=0.1,0.2`) would
    fail every job in the launcher with Hydra's raw message."""
    swept = _swept(parser, arguments)
    jobs = _job_overrides(parser, arguments)
    prefix = _as_written(base.hydra.overrides.hydra)
    first = hydra.compose(config_name, prefix + jobs[0], False) if jobs else None
    if not (
        any(len(v) > 1 and _may_change_hydra(hydra, k.lstrip("+~")) for k, v in swept.items())
        or depends_on_the_job(base)
        or _sweep_dir_holds_jobs(base)
    ):
        return []
    return [
        (first if num == 0 else hydra.compose(config_name, prefix + job, False), num, True)
        for num, job in enumerate(jobs)
    ]


def check_env_copy(error: KeyError) -> None:
    """ConfigError when the KeyError is Hydra copying a `hydra.job.env_copy` variable that is not set: its
    config loader reads os.environ[name] for each, and the bare KeyError would otherwise fail the check itself
    (blamed on the Hydra version)."""
    import traceback

    name = error.args[0] if error.args else None
    in_loader = any(f.name == "_load_configuration_impl" for f in traceback.extract_tb(error.__traceback__))
    if isinstance(name, str) and in_loader and name not in os.environ:
        if name not in ENV_ALLOWED:
            raise ConfigError(f"hydra.job.env_copy names {name}, which is refused: {ENV_REASON}") from None
        raise ConfigError(
            f"hydra.job.env_copy names {name}, which is not set in this environment: Hydra copies each variable it "
            f"names from the environment the command starts in. Set it (export {name}=...) or leave it out of "
            "hydra.job.env_copy."
        ) from None


def check_no_option(hydra, overrides: list) -> None:
    """ConfigError for an override that leaves a config group the configuration needs without an option
    (`logger=[]`, `logger=null`, `~model`): Hydra would report a missing value, far from its cause."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for o in OverridesParser.create().parse_overrides(overrides):
        key = o.key_or_group
        if o.is_sweep_override() or key.startswith("hydra") or not hydra.is_group(key):
            continue
        if o.is_delete() or o.value() in (None, []):
            hint = (
                " metrics.csv is written whichever loggers are chosen; logger=csv (the default) is that alone."
                if key == "logger"
                else ""
            )
            raise ConfigError(
                f"{o.input_line!r} leaves the config group {key} with no option, and the run needs one "
                f"(`runner-configs ls` lists them).{hint}"
            )


def _may_change_hydra(hydra, key: str) -> bool:
    """Whether a swept key can change what Hydra acts on: a config group (its files may set hydra.*) or a
    key under hydra (Hydra refuses one on the command line; a sweeper's params pass it to each job)."""
    return key == "hydra" or key.startswith("hydra.") or hydra.is_group(key)


def _sweep_dir_holds_jobs(cfg) -> bool:
    try:
        where = os.path.abspath(str(cfg.hydra.sweep.dir))
    except OmegaConfBaseException:
        return False  # resolved only at run time: ${now:...} names a new directory
    return os.path.isdir(where) and bool(os.listdir(where))


def check_package_header(error: Exception) -> None:
    """Raise ConfigError with the fix when a group's file put its keys under the group's name: an experiment
    file without `# @package _global_` ("In 'experiment/mine': ... Key 'experiment' not in 'Config'")."""
    found = re.search(r"In '(\w+)/([\w/.-]+)': .*?Key '(\w+)' not in '\w+'", str(error), re.S)
    if found and found.group(1) == found.group(3):
        group, name = found.group(1), found.group(2)
        raise ConfigError(
            f"{group}/{name}.yaml puts its keys under `{group}:`, which the configuration does not have. A file "
            f"that sets top-level keys (as an experiment does) starts with the line `# @package _global_` "
            f"(see conf/{group}/ in the runner, or `runner-configs cp {group}/<option>` for a copy to edit)."
        ) from None


# ---------------------------------------------------------------------------------------------------
# The output directory.


def output_root(cfg, multirun: bool) -> str:
    """The directory to check for the run (or sweep) directory a composed config asks for: the
    directory itself when it is literal; else the parent of what it resolves to now (`${now:...}`
    differs between this check and the run), or the literal part before the first interpolation."""
    node = cfg.hydra.sweep if multirun else cfg.hydra.run
    raw = str(_raw(node, "dir"))
    if "${" not in raw:
        return raw
    try:
        resolved = str(node.dir)
    except Exception:  # a value only the run fills in
        prefix = raw.split("${", 1)[0]
        return (prefix if prefix.endswith("/") else os.path.dirname(prefix)) or "."
    return os.path.dirname(resolved.rstrip("/")) or "."


def check_output_dir(root: str) -> None:
    """Raise ConfigError when the output directory cannot be created or written."""
    try:
        os.makedirs(root, exist_ok=True)
        probe = os.path.join(root, f".write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise ConfigError(
            f"cannot write the run's outputs under {os.path.abspath(root)!r} ({e.strerror}). "
            "Choose a writable place with hydra.run.dir=... (hydra.sweep.dir=... for -m)."
        ) from None


def check_split_values(overrides: list) -> None:
    """Raise ConfigError with a hint when the shell split a value with spaces into two arguments
    (`data.root=/my path` arrives as `data.root=/my` and `path`); Hydra alone says "missing EQUAL"."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for i, arg in enumerate(overrides):
        try:
            parser.parse_override(arg)
        except HydraException as e:
            if i and "=" not in arg and "=" in overrides[i - 1]:
                joined = f"{overrides[i - 1]} {arg}"
                raise ConfigError(
                    f"cannot parse the override {arg!r} ({str(e).splitlines()[0]}). It looks like the shell split a "
                    f"value with spaces: quote the whole override, e.g. '{joined}'."
                ) from None
            return  # Hydra reports it


def check_launcher(cfg, multirun: bool) -> None:
    """Raise ConfigError when the sweep's launcher needs a scheduler this machine lacks."""
    import shutil

    target = str(cfg.hydra.launcher.get("_target_", ""))
    if multirun and target.endswith("SlurmLauncher") and shutil.which("sbatch") is None:
        raise ConfigError(
            "hydra/launcher=submitit_slurm needs Slurm, and Slurm was not found here (no `sbatch` on PATH). Run "
            "the sweep on a Slurm login node, or use hydra/launcher=submitit_local, joblib or the default."
        )


def preflight(app, argv) -> None:
    """Everything checked before hydra.main runs the app's task (app: runner/cli/app.py HydraApp): the
    overrides' syntax, every entry of the composed config against RULES, the launcher, the output directory,
    then the app's own `before_run(job config, output dir, task overrides, in a sweep)` for the run or the
    sweep's jobs (with HydraConfig set as in the job): every check that can refuse runs before Hydra writes
    `.hydra/`. Raises ConfigError (or another of the user's errors). `--cfg hydra --resolve` is answered here,
    after the checks (SystemExit 0): Hydra's own answer fails on any interpolation into the rest of the config.

    The check composes the way Hydra 1.3 does, through its internals (runner/cli/hydra_seam.py). If that
    machinery fails in a way that is not Hydra's own report of a bad configuration (another Hydra version, a
    changed internal), nothing was checked: the command refuses to start rather than let Hydra instantiate
    what the configuration names unchecked.
    """
    from runner.errors import user_errors

    try:
        _preflight(app, argv)
    except user_errors():
        raise
    except Exception as e:
        import hydra

        raise ConfigError(
            f"the pre-flight check of the configuration could not run ({type(e).__name__}: {e}), so nothing "
            f"it names has been checked, and the command refuses to start. It composes the configuration as "
            f"Hydra 1.3 does, through Hydra's internals; this is hydra-core {hydra.__version__}. Install the "
            "version pyproject.toml names (hydra-core>=1.3,<1.4)."
        ) from None


def _preflight(app, argv) -> None:
    try:
        args = hydra_seam.args_parser().parse_args(argv)
    except SystemExit:
        return  # argparse printed its usage; Hydra will do the same
    if args.shell_completion:
        return  # `-sc install=bash`: its arguments are the completion's, not overrides; nothing runs
    check_split_values(args.overrides)
    configs = compose_like_hydra(app, args)
    # --cfg, --help, --info and shell completion only print: they need no output directory.
    prints = bool(args.cfg or args.help or args.hydra_help or args.info or args.shell_completion)
    for cfg, num, multirun in configs:
        check_composed(cfg, num, multirun, prints)
    if args.cfg == "hydra" and args.resolve and configs:
        # Hydra resolves the `hydra` node cut from the rest of the config, so ${experiment_name} in
        # hydra.run.dir ends in its traceback: print it resolved as the run will see it, instead.
        cfg, num, multirun = configs[0]
        print(OmegaConf.to_yaml({"hydra": resolved(cfg, num, multirun, printing=True)["hydra"]}), end="")
        raise SystemExit(0)
    if configs and not prints:
        base, _, multirun = configs[0]
        check_launcher(base, multirun)
        if multirun:
            check_sweep_dir(base)
            check_continuable_sweep(base)
        if app.before_run is not None:
            # A sweep whose jobs were not composed one by one (their checked values cannot differ, and its
            # directory is new) gets its own config checked once; a value only a job sets is the job's to refuse.
            for cfg, num, in_sweep in configs[1:] or configs if multirun else configs:
                _before_run(app.before_run, cfg, num, in_sweep)
        # Last: its probe file is written only where the checks above let the run write.
        check_output_dir(output_root(base, multirun))
        if multirun:
            from runner.rundir.sweep_jobs import claim_sweep

            claim_sweep(base)  # held until this process exits: the same sweep started twice is refused here


def check_sweep_dir(cfg) -> None:
    """ConfigError unless the sweep directory (where Hydra writes multirun.yaml) is new, empty or a sweep's."""
    from runner.rundir.claim import ours

    if not _sweep_dir_holds_jobs(cfg):
        return
    where = os.path.abspath(str(cfg.hydra.sweep.dir))
    if not ours(where):
        some = ", ".join(sorted(os.listdir(where))[:3])
        raise ConfigError(
            f"hydra.sweep.dir={where} holds files that are not this runner's ({some}, ...), and a sweep writes "
            "multirun.yaml and a directory per job there. Choose a new or empty directory."
        )


def check_continuable_sweep(cfg) -> None:
    """A sweep run again into its directory continues it (runner/rundir/sweep_jobs.py); ConfigError for a
    sweeper that cannot (Optuna)."""
    from runner.rundir.sweep_jobs import check_continuable

    check_continuable(cfg)


def _before_run(before_run, cfg, num: int, in_sweep: bool) -> None:
    """before_run on the job's config as hydra.main's task will get it (no `hydra` node, HydraConfig set)."""
    from omegaconf import open_dict, read_write

    with at_run_time(cfg, num, in_sweep) as cfg:
        if OmegaConf.is_missing(cfg.hydra.runtime, "output_dir"):
            return  # a directory only the run can name (${now:...} in a sweep subdir): a new one
        out = str(cfg.hydra.runtime.output_dir)
        overrides = _as_written(cfg.hydra.overrides.task)
        task_cfg = copy.deepcopy(cfg)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        before_run(task_cfg, out, overrides, in_sweep)
