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

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException
from yaml import YAMLError

from runner.config.tree import walk
from runner.errors import ConfigError

# Every callable a configuration may name (`_target_`), each with the reason it is needed; anything else
# is refused. An exact list, not packages: "defined in MindSpore" is not safe (mindspore.common._utils.load_lib
# loads any shared library), and the runner itself builds nothing from a `_target_` (the job's config
# names no callable), so only Hydra's own node needs any.
ALLOWED_TARGETS = {
    "runner.report.sweep.SweepSummary": "hydra.callbacks.sweep_summary: the sweep's summary (conf/config.yaml)",
    "hydra_plugins.runner_launcher.isolated_launcher.IsolatedLauncher": "the default launcher: one process per job",
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher": "hydra/launcher=basic",
    "hydra._internal.core_plugins.basic_sweeper.BasicSweeper": "the default sweeper (-m a=1,2)",
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher": "hydra/launcher=joblib",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher": "hydra/launcher=submitit_local",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher": "hydra/launcher=submitit_slurm",
    "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper": "hydra/sweeper=optuna",
    "hydra_plugins.runner_launcher.optuna_sweeper.OptunaSweeper": "hydra/sweeper=optuna_accuracy (dry-runs too)",
    "optuna.samplers.TPESampler": "hydra/sweeper/sampler=tpe (optuna_accuracy's sampler)",
    "optuna.samplers.RandomSampler": "hydra/sweeper/sampler=random",
    "optuna.samplers.CmaEsSampler": "hydra/sweeper/sampler=cmaes",
    "optuna.samplers.NSGAIISampler": "hydra/sweeper/sampler=nsgaii",
    "optuna.samplers.MOTPESampler": "hydra/sweeper/sampler=motpe",
    "optuna.samplers.GridSampler": "hydra/sweeper/sampler=grid",
}
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


def refuse(where: str, what, why: str) -> ConfigError:
    return ConfigError(
        f"{where}={what!r} is refused: {why} No configuration is allowed to run code of its own choosing."
    )


def target_allowed(target) -> bool:
    """Whether a config may name `target` as something to instantiate or call (ALLOWED_TARGETS)."""
    return isinstance(target, str) and target in ALLOWED_TARGETS


def target_refusal(where: str, target) -> ConfigError:
    """The refusal of a `_target_` outside ALLOWED_TARGETS."""
    return refuse(
        where,
        target,
        "a config may name only the callables Hydra's launchers, sweepers and the runner's sweep summary need "
        f"({', '.join(sorted(ALLOWED_TARGETS))}).",
    )


# ---------------------------------------------------------------------------------------------------
# The configuration as Hydra will see it: resolved, with what Hydra fills in at run time.


@contextmanager
def at_run_time(cfg, job_num: int, multirun: bool):
    """A copy of a composed config with what Hydra sets before it acts on it, as run_job sets it: the
    job's number (a sweep's launcher) and hydra.runtime.output_dir (left unset when it cannot be resolved:
    then whatever reads it cannot be resolved either, and is refused), and HydraConfig set to it, so
    `${hydra:...}` resolves as it will in the job. A single run and a sweep's own process get number 0:
    a number or a path filled in here can never pass for an allowed callable."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import read_write

    previous = HydraConfig.instance().cfg
    cfg = copy.deepcopy(cfg)
    try:
        with read_write(cfg.hydra):
            cfg.hydra.job.num = job_num
            cfg.hydra.job.id = str(job_num)
        HydraConfig.instance().set_config(cfg)
        try:
            out = os.path.join(cfg.hydra.sweep.dir, str(cfg.hydra.sweep.subdir)) if multirun else cfg.hydra.run.dir
            with read_write(cfg.hydra):
                cfg.hydra.runtime.output_dir = os.path.abspath(str(out))
            HydraConfig.instance().set_config(cfg)
        except OmegaConfBaseException:
            pass
        yield cfg
    finally:
        HydraConfig.instance().cfg = previous


def _as_written(overrides) -> list:
    """Override strings as the user typed them: `${...}` inside one is text, not resolved here."""
    from omegaconf import OmegaConf

    typed = OmegaConf.to_container(overrides, resolve=False) if overrides is not None else []
    return [str(o) for o in typed] if isinstance(typed, list) else []


# The command line as typed, kept as text under hydra.*: a value like optim.lr=${x} is text there (Hydra
# saves overrides.yaml unresolved), and the job's own value is checked under its own key.
AS_TYPED = ("overrides", "job.override_dirname")


def _resolved_except(node, as_typed, prefix: str = "") -> dict:
    """node as plain containers, resolved, except the dotted paths in as_typed (kept as written)."""
    from omegaconf import OmegaConf

    out = {}
    for key in node.keys():
        path = f"{prefix}{key}"
        if path in as_typed:
            child = node._get_node(key)
            out[key] = OmegaConf.to_container(child, resolve=False) if OmegaConf.is_config(child) else child._value()
        elif any(t.startswith(path + ".") for t in as_typed):
            out[key] = _resolved_except(node[key], as_typed, path + ".")
        else:
            child = node[key]
            out[key] = OmegaConf.to_container(child, resolve=True) if OmegaConf.is_config(child) else child
    return out


def resolved(cfg, job_num: int = 0, multirun: bool = False, printing: bool = False) -> dict:
    """The composed config (a mapping with its `hydra` node) as plain dicts and lists with every
    interpolation resolved as Hydra will resolve it, or ConfigError: a value under `hydra` that cannot be
    resolved before Hydra runs is refused, as it cannot be checked. The job's own part may hold values
    only the job can resolve; it is left as written where it cannot be resolved. printing: the command only
    prints (--help, --cfg, --info): a required top-level value it lacks (`runner-evaluate --help` has no
    run= for hydra.run.dir's ${run}) stands in as `<run>`, so the rest is checked as usual."""
    from omegaconf import OmegaConf, open_dict

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
                    where = getattr(e, "full_key", None) or "hydra"
                    raise ConfigError(
                        f"{where} cannot be resolved before Hydra runs ({str(e).splitlines()[0].strip()}), so what "
                        "it names cannot be checked, and the command refuses to start. Give it a literal value."
                    ) from None
                node = cfg._get_node(key)
                # A top-level value (evaluate's `run: ???`) is a leaf node, not a container.
                out[key] = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node._value()
        return out


def _inside_sweep_dir(where: str, value, hydra: dict) -> None:
    """Refuse a place a sweeper or launcher writes to (Optuna's study database, submitit's job files)
    outside the sweep directory: nothing is written into a directory that is not the sweep's."""
    sweep = os.path.abspath(str((hydra.get("sweep") or {}).get("dir")))
    path = str(value)
    if where == "hydra.sweeper.storage":
        path = path[len("sqlite:///") :] if path.startswith("sqlite:///") else ""
    if not path or not os.path.abspath(path).startswith(sweep + os.sep):
        raise refuse(
            where,
            value,
            f"it is written to, and must lie inside the sweep directory ({sweep}); for Optuna, "
            "sqlite:///${hydra.sweep.dir}/optuna.db keeps a resumable study there.",
        )


def _expected_handlers(hydra: dict) -> list:
    """(class, filename, stream) of the handlers in Hydra's own shipped logging configs, their file names
    resolved for this run: the only handlers a config may use (the console, <run dir>/<job name>.log)."""
    import hydra as hydra_pkg
    import yaml

    root = os.path.join(os.path.dirname(hydra_pkg.__file__), "conf", "hydra")
    found = []
    for group in LOGGING_NODES:
        for name in sorted(os.listdir(os.path.join(root, group))):
            with open(os.path.join(root, group, name)) as f:
                data = yaml.safe_load(f) or {}
            for h in (data.get("handlers") or {}).values():
                filename = h.get("filename")
                if filename is not None:
                    # Hydra's file handler: ${hydra.runtime.output_dir}/${hydra.job.name}.log
                    runtime, job = hydra.get("runtime") or {}, hydra.get("job") or {}
                    filename = filename.replace("${hydra.runtime.output_dir}", str(runtime.get("output_dir")))
                    filename = filename.replace("${hydra.job.name}", str(job.get("name")))
                found.append((h.get("class"), filename, h.get("stream")))
    return found


HANDLER_KEYS = {"class", "formatter", "stream", "filename", "level", "filters"}


def check_composed(cfg, job_num: int = 0, multirun: bool = False, printing: bool = False) -> None:
    """Raise ConfigError for the first callable the composed config (with its `hydra` node, resolved as
    Hydra will resolve it) names outside ALLOWED_TARGETS, and for logging handlers other than Hydra's own,
    env_set names outside ENV_ALLOWED and the rest below."""
    plain = resolved(cfg, job_num, multirun, printing)
    hydra = plain.get("hydra") or {}
    handlers = _expected_handlers(hydra)
    for where, key, value in walk(plain):
        if key == "_target_" and not target_allowed(value):
            raise target_refusal(where, value)
        if where == "hydra.sweeper.custom_search_space" and value is not None:
            raise refuse(where, value, "a search space is given with hydra.sweeper.params, not by a function.")
        logging_node = any(where.startswith(f"hydra.{n}.") for n in LOGGING_NODES)
        if logging_node and key == "()":
            raise refuse(where, value, "a logging config may not name a factory.")
        if logging_node and isinstance(value, str) and value.startswith(("ext://", "cfg://")):
            if value not in ("ext://sys.stdout", "ext://sys.stderr"):
                raise refuse(where, value, "a logging config may only refer to ext://sys.stdout or ext://sys.stderr.")
        if logging_node and key == "class" and not re.fullmatch(r"hydra\.\w+\.handlers\.[^.\[]+\.class", where):
            raise refuse(where, value, "a logging config may name a class only for its handlers.")
        if logging_node and isinstance(value, dict) and re.fullmatch(r"hydra\.\w+\.handlers\.[^.\[]+", where):
            spec = (value.get("class"), value.get("filename"), value.get("stream"))
            if spec not in handlers or set(value) - HANDLER_KEYS:
                raise refuse(
                    where,
                    value,
                    "logging handlers may only be Hydra's own, exactly as its logging configs use them (a "
                    "StreamHandler on the console, a FileHandler writing <run dir>/<job name>.log).",
                )
        if where.startswith("hydra.job.env_set.") and where.count(".") == 3 and key not in ENV_ALLOWED:
            raise refuse(
                where,
                value,
                f"hydra.job.env_set may set only {', '.join(sorted(ENV_ALLOWED))}; other variables (CXX, CPATH, "
                "LD_PRELOAD, PYTHONPATH, ...) make the run's processes run or load code of the config's choosing.",
            )
        if where.startswith("hydra.launcher.") and isinstance(value, str) and ("\n" in value or "\r" in value):
            raise refuse(
                where,
                value,
                "a launcher's settings become lines of a job script (Slurm's #SBATCH header), so a line break "
                "in one would add a command of its own.",
            )
        # Only a sweep runs the sweeper and the launcher; a single run leaves hydra.sweep unresolved.
        if multirun and where in ("hydra.sweeper.storage", "hydra.launcher.submitit_folder") and value is not None:
            _inside_sweep_dir(where, value, hydra)
        if (
            where == "hydra.output_subdir"
            and value is not None
            and (os.path.isabs(str(value)) or ".." in str(value).split("/"))
        ):
            raise refuse(
                where,
                value,
                "Hydra writes its record (config.yaml, hydra.yaml, overrides.yaml) there, which must stay inside the "
                "run's own directory.",
            )
        if where == "hydra.job.name" and (os.sep in str(value) or str(value).startswith(".")):
            raise refuse(where, value, "the job name becomes the log file's name and cannot be a path.")
        if where == "hydra.launcher.setup" and value:
            raise refuse(
                where,
                value,
                "hydra.launcher.setup runs shell commands in every Slurm job; put them in your cluster "
                "environment (a module file, ~/.bashrc) instead.",
            )


# ---------------------------------------------------------------------------------------------------
# Composing as @hydra.main will.


def _hydra_main_settings(task):
    """(config_path, config_name) given to @hydra.main: closure variables of Hydra 1.3's decorator."""
    names = task.__code__.co_freevars
    cells = dict(zip(names, (c.cell_contents for c in task.__closure__ or ())))
    if "config_path" not in cells or "config_name" not in cells:
        raise TypeError(f"{task!r} is not a function decorated with Hydra 1.3's @hydra.main")
    return cells["config_path"], cells["config_name"]


def _job_overrides(parser, arguments: list) -> list:
    """The override list of every job of a sweep, in the order Hydra's basic sweeper runs them (the
    product of every swept value). An interval (Optuna's) yields numbers; its two ends stand for it."""
    lists = {}
    for o in parser.parse_overrides(arguments):
        key = o.get_key_element()
        if o.is_interval_sweep():
            lists[key] = [f"{key}={o.value().start}", f"{key}={o.value().end}"]
        elif o.is_sweep_override():
            lists[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            lists[key] = [f"{key}={o.get_value_element_as_str()}"]
    return [list(x) for x in itertools.product(*lists.values())]


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


def compose_like_hydra(task, argv):
    """[(config, job number, multirun)] that @hydra.main will compose for argv: the run's, or with -m the
    sweep's own and every job's (each combination of the swept values). ConfigError where Hydra would fail
    to compose one; any other failure propagates: preflight() then refuses to start (fails closed)."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import (
        create_automatic_config_search_path,
        detect_calling_file_or_module_from_task_function,
        detect_task_name,
        get_args_parser,
    )
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.utils import setup_globals
    from hydra.types import RunMode

    config_path, config_name = _hydra_main_settings(task)
    try:
        args = get_args_parser().parse_args(argv)
    except SystemExit:
        return []  # argparse has printed its usage; @hydra.main prints it again and exits the same way (2)
    if args.experimental_rerun is not None:
        raise ConfigError(
            f"--experimental-rerun {args.experimental_rerun!r} is refused: it unpickles the file, and unpickling "
            "runs whatever code the file names. Start the run again from its config.yaml (see the README)."
        )
    config_name = args.config_name or config_name
    config_path = args.config_path if args.config_path is not None else config_path
    calling_file, calling_module = detect_calling_file_or_module_from_task_function(task)
    search_path = create_automatic_config_search_path(calling_file, calling_module, config_path)
    if args.config_dir is not None:
        from hydra.core.config_search_path import SearchPathQuery

        if not os.path.isdir(os.path.abspath(args.config_dir)):
            raise ConfigError(f"--config-dir {args.config_dir!r} is not a directory.")
        search_path.prepend(
            provider="command-line",
            path=f"file://{os.path.abspath(args.config_dir)}",
            anchor=SearchPathQuery(provider="schema"),
        )
    setup_globals()
    GlobalHydra.instance().clear()
    overrides = list(args.overrides)
    try:
        hydra = Hydra.create_main_hydra2(
            task_name=detect_task_name(calling_file, calling_module), config_search_path=search_path
        )
        parser = OverridesParser.create(config_loader=hydra.config_loader)
        try:
            run_mode = RunMode.MULTIRUN if args.multirun else RunMode.RUN
            base = hydra.compose_config(config_name, overrides, run_mode, validate_sweep_overrides=False)
            multirun = args.multirun or base.hydra.mode == RunMode.MULTIRUN
            # As Hydra does once it knows the mode: `run=a,b` without -m is ambiguous, a swept hydra.* unsupported.
            mode = RunMode.MULTIRUN if multirun else RunMode.RUN
            hydra.config_loader.validate_sweep_overrides_legal(parser.parse_overrides(overrides), mode, from_shell=True)
            if not multirun:
                return [(base, 0, False)]
            configs = [(base, 0, True)]
            params = base.hydra.sweeper.get("params") or {}
            # As Hydra's multirun: the sweeper gets the task's overrides, load_sweep_config puts the hydra ones first.
            arguments = [f"{k}={v}" for k, v in params.items()] + _as_written(base.hydra.overrides.task)
            prefix = _as_written(base.hydra.overrides.hydra)
            for num, job in enumerate(_job_overrides(parser, arguments)):
                configs.append((hydra.compose_config(config_name, prefix + job, RunMode.RUN), num, True))
            return configs
        except COMPOSE_ERRORS as e:
            check_package_header(e)
            raise compose_error(e) from None
    finally:
        GlobalHydra.instance().clear()


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
    raw = str(node._get_node("dir")._value())
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


def preflight(task, argv, before_run=None) -> None:
    """Everything checked before @hydra.main runs `task`: the overrides' syntax, callables named
    anywhere in the composed config, the launcher, the output directory, then the command's own
    `before_run(job config, output dir, task overrides, in a sweep)` for the run or each job of a sweep
    (with HydraConfig set as in the job): every check that can refuse runs before Hydra writes `.hydra/`.
    Raises ConfigError (or another of the user's errors). `--cfg hydra --resolve` is answered here, after the
    checks (SystemExit 0): Hydra's own answer fails on any interpolation into the rest of the config.

    The check composes the way Hydra 1.3 does, through its internals (@hydra.main's closure, hydra._internal).
    If that machinery fails in a way that is not Hydra's own report of a bad configuration (another Hydra
    version, a changed internal), nothing was checked: the command refuses to start rather than let Hydra
    instantiate what the configuration names unchecked.
    """
    from runner.errors import user_errors

    try:
        _preflight(task, argv, before_run)
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


def _preflight(task, argv, before_run=None) -> None:
    from hydra._internal.utils import get_args_parser

    try:
        args = get_args_parser().parse_args(argv)
    except SystemExit:
        return  # argparse printed its usage; Hydra will do the same
    if args.shell_completion:
        return  # `-sc install=bash`: its arguments are the completion's, not overrides; nothing runs
    check_split_values(args.overrides)
    configs = compose_like_hydra(task, argv)
    # --cfg, --help, --info and shell completion only print: they need no output directory.
    prints = bool(args.cfg or args.help or args.hydra_help or args.info or args.shell_completion)
    for cfg, num, multirun in configs:
        check_composed(cfg, num, multirun, prints)
    if args.cfg == "hydra" and args.resolve and configs:
        # Hydra resolves the `hydra` node cut from the rest of the config, so ${experiment_name} in
        # hydra.run.dir ends in its traceback: print it resolved as the run will see it, instead.
        from omegaconf import OmegaConf

        cfg, num, multirun = configs[0]
        print(OmegaConf.to_yaml({"hydra": resolved(cfg, num, multirun, printing=True)["hydra"]}), end="")
        raise SystemExit(0)
    if configs and not prints:
        base, _, multirun = configs[0]
        check_launcher(base, multirun)
        if multirun:
            check_sweep_dir(base)
            check_continuable_sweep(base)
        for cfg, num, in_sweep in configs[1:] if multirun else configs:
            if before_run is not None:
                _before_run(before_run, cfg, num, in_sweep)
        # Last: its probe file is written only where the checks above let the run write.
        check_output_dir(output_root(base, multirun))


def check_sweep_dir(cfg) -> None:
    """ConfigError unless the sweep directory (where Hydra writes multirun.yaml) is new, empty or a sweep's."""
    from runner.rundir.claim import ours

    try:
        where = os.path.abspath(str(cfg.hydra.sweep.dir))
    except OmegaConfBaseException:
        return  # resolved only at run time: ${now:...} names a new directory
    if os.path.isdir(where) and os.listdir(where) and not ours(where):
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
    """before_run on the job's config as @hydra.main's task will get it (no `hydra` node, HydraConfig set)."""
    from omegaconf import OmegaConf, open_dict, read_write

    with at_run_time(cfg, num, in_sweep) as cfg:
        if OmegaConf.is_missing(cfg.hydra.runtime, "output_dir"):
            return  # a directory only the run can name (${now:...} in a sweep subdir): a new one
        out = str(cfg.hydra.runtime.output_dir)
        overrides = _as_written(cfg.hydra.overrides.task)
        task_cfg = copy.deepcopy(cfg)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        before_run(task_cfg, out, overrides, in_sweep)
