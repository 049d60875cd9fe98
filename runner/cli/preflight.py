"""Checks made before Hydra starts: what Hydra itself would act on before any runner code runs.

Hydra instantiates parts of the composed configuration on its own, before the task function sees
it: `hydra.callbacks`, the launcher and the sweeper (`_target_`), and the `hydra.job_logging` /
`hydra.hydra_logging` dictConfigs (`class`, `()`, `ext://`). A config file, a `--config-dir`, an
`experiment` file or a command-line override can put anything there. So the configuration is
composed here exactly as `@hydra.main` will compose it (same search path, config dir, overrides and
`hydra` node, every value of a sweep) and every callable it names is checked against an allowlist;
only then does Hydra run. Hydra's own target blocklist stays as a second layer behind this one.
"""

import ast
import importlib.util
import os
import re
import sys
from functools import cache

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException
from yaml import YAMLError

from runner.errors import ConfigError

# Packages whose classes and functions the job's config (what hydra.utils.instantiate builds) may name as
# a `_target_`: the project, MindSpore and MindCV.
JOB_PACKAGES = ("runner", "models", "datasets", "mindspore", "mindcv")
# Those, and for the `hydra` node Hydra's own launchers/sweepers/callbacks, installed Hydra plugins and
# the Optuna sweeper's samplers.
ALLOWED_PACKAGES = (
    *JOB_PACKAGES,
    "hydra_plugins",
    "hydra._internal.core_plugins",
    "hydra.experimental.callbacks",
    "optuna.samplers",
)
# What Hydra raises for a configuration it cannot compose, and reports itself (YAML errors included):
# anything else from the composition below is a failure of the check, which then refuses (preflight).
COMPOSE_ERRORS = (HydraException, OmegaConfBaseException, YAMLError)
# Variables through which `hydra.job.env_set` would make every later process load foreign code.
UNSAFE_ENV = re.compile(r"^(LD_|DYLD_|PYTHON|PERL|RUBY|NODE_|BASH_ENV$|ENV$|PATH$|IFS$|PS4$|SHELLOPTS$)")
LOGGING_NODES = ("job_logging", "hydra_logging")


def refuse(where: str, what, why: str) -> ConfigError:
    return ConfigError(
        f"{where}={what!r} is refused: {why} No configuration is allowed to run code of its own choosing."
    )


# ---------------------------------------------------------------------------------------------------
# Whether a dotted name is a class or function defined inside the allowed packages.


def _find_module(dotted: str):
    """The spec of module `dotted`, found without importing (or executing) anything."""
    parts = dotted.split(".")
    try:
        # Every finder of a top-level name (an editable install maps its packages with its own finder);
        # finding a top-level module does not import it.
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    for i in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None
        name, locations = ".".join(parts[: i + 1]), list(spec.submodule_search_locations)
        spec = None
        for finder in sys.meta_path:  # the same finders, in the same order, as an import would ask
            find = getattr(finder, "find_spec", None)
            spec = find(name, locations) if find else None
            if spec is not None:
                break
    return spec


@cache
def _module_tree(dotted: str):
    spec = _find_module(dotted)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None, False
    with open(spec.origin, encoding="utf-8") as f:
        return ast.parse(f.read()), bool(spec.submodule_search_locations)


def _statements(body):
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            for block in (
                node.body,
                node.orelse,
                *(h.body for h in getattr(node, "handlers", ())),
                node.finalbody if isinstance(node, ast.Try) else (),
            ):
                yield from _statements(block)


def _allowed_module(dotted: str) -> bool:
    return any(dotted == p or dotted.startswith(p + ".") for p in ALLOWED_PACKAGES)


def _bound_names(node) -> set:
    """Names a statement (re)binds other than by def, class or import: assignments, loops, with, del."""
    names = set()
    targets = []
    if isinstance(node, (ast.Assign,)):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
        targets = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
    elif isinstance(node, ast.Delete):
        targets = node.targets
    for t in targets:
        names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def defined_in(module: str, name: str, depth: int = 0) -> bool:
    """True when `module.name` is a class or function written in `module` (or re-exported there from
    another allowed module) and nothing else in the module binds that name. An imported module, an
    alias to a foreign callable or an assigned name is not: `runner.training.distributed.subprocess.run` must
    not pass for a runner class."""
    if depth > 12 or not _allowed_module(module):
        return False
    tree, is_package = _module_tree(module)
    if tree is None:
        return False
    verdicts, foreign_star = [], False
    for node in _statements(tree.body):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            verdicts.append(True)
        elif isinstance(node, ast.Import):
            verdicts += [False for a in node.names if (a.asname or a.name.split(".")[0]) == name]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                if alias.name == "*":
                    if not _allowed_module(base):
                        foreign_star = True
                    elif defined_in(base, name, depth + 1):
                        verdicts.append(True)
                elif (alias.asname or alias.name) == name:
                    verdicts.append(defined_in(base, alias.name, depth + 1))
        elif name in _bound_names(node):
            verdicts.append(False)
    if not verdicts or foreign_star and not all(verdicts):
        return False
    return all(verdicts)


def target_allowed(target) -> bool:
    """Whether a config may name `target` as something to instantiate or call."""
    if not isinstance(target, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", target):
        return False
    module, name = target.rsplit(".", 1)
    return defined_in(module, name)


# ---------------------------------------------------------------------------------------------------
# The composed configuration, walked with interpolations resolved where they can be.


def _leaves(node, path=""):
    """(dotted path, key, value) of every entry; an interpolation is resolved when it can be (an
    `oc.create` node must be seen as the dict it becomes), else its text is the value."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        where = f"{path}.{key}" if isinstance(node, DictConfig) else f"{path}[{key}]"
        where = where.lstrip(".")
        child = node._get_node(key)
        value = child
        if child is not None and child._is_interpolation():
            try:
                value = node[key]
            except Exception:  # a value Hydra fills in only at run time (hydra.runtime.output_dir)
                value = child._value()
        if isinstance(value, (DictConfig, ListConfig)) and not OmegaConf.is_missing(node, key):
            if value._is_none():
                yield where, key, None
            else:
                yield where, key, value
                yield from _leaves(value, where)
        else:
            yield where, key, value._value() if hasattr(value, "_value") else value


@cache
def hydra_logging_handlers() -> frozenset:
    """(class, filename, stream) of every handler in Hydra's own shipped logging configs: the only
    handlers a config may use (Hydra's default writes <run dir>/<job name>.log and the console)."""
    import hydra
    import yaml

    root = os.path.join(os.path.dirname(hydra.__file__), "conf", "hydra")
    found = set()
    for group in LOGGING_NODES:
        for name in sorted(os.listdir(os.path.join(root, group))):
            with open(os.path.join(root, group, name)) as f:
                data = yaml.safe_load(f) or {}
            for h in (data.get("handlers") or {}).values():
                found.add((h.get("class"), h.get("filename"), h.get("stream")))
    return frozenset(found)


HANDLER_KEYS = {"class", "formatter", "stream", "filename", "level", "filters"}


def check_composed(cfg) -> None:
    """Raise ConfigError for the first callable the composed config (with its `hydra` node) names
    outside the allowlist, and for logging handlers other than Hydra's own."""
    from omegaconf import DictConfig

    handlers = hydra_logging_handlers()
    allowed_handlers = ", ".join(sorted({h[0] for h in handlers}))
    for where, key, value in _leaves(cfg):
        if key == "_target_" or where == "hydra.sweeper.custom_search_space":
            if value is not None and not target_allowed(value):
                raise refuse(
                    where,
                    value,
                    "configs may only name classes and functions defined in this project, MindSpore, Hydra's own "
                    f"launchers, sweepers and callbacks or installed Hydra plugins ({', '.join(ALLOWED_PACKAGES)}).",
                )
        logging_node = any(where.startswith(f"hydra.{n}.") for n in LOGGING_NODES)
        if logging_node and key == "()":
            raise refuse(where, value, "a logging config may not name a factory.")
        if (
            logging_node
            and isinstance(value, str)
            and value.startswith("ext://")
            and value
            not in (
                "ext://sys.stdout",
                "ext://sys.stderr",
            )
        ):
            raise refuse(where, value, "a logging config may only refer to ext://sys.stdout or ext://sys.stderr.")
        if logging_node and key == "class" and ".handlers." not in where:
            raise refuse(where, value, "a logging config may name a class only for its handlers.")
        if logging_node and isinstance(value, DictConfig) and re.fullmatch(r"hydra\.\w+\.handlers\.[^.]+", where):
            spec = (_raw(value, "class"), _raw(value, "filename"), _raw(value, "stream"))
            extra = set(value.keys()) - HANDLER_KEYS
            if spec not in handlers or extra:
                raise refuse(
                    where,
                    {k: _raw(value, k) for k in value.keys()},
                    f"logging handlers may only be {allowed_handlers} exactly as Hydra's own logging configs use "
                    "them (the console, and <run dir>/<job name>.log).",
                )
        if where.startswith("hydra.job.env_set.") and UNSAFE_ENV.match(str(key)):
            raise refuse(where, value, f"{key} would make the run's processes load code from elsewhere.")
        if where == "hydra.job.name" and (os.sep in str(value) or str(value).startswith(".")):
            raise refuse(where, value, "the job name becomes the log file's name and cannot be a path.")
        if where.startswith("hydra.launcher.setup") and value:
            raise refuse(
                where,
                value,
                "hydra.launcher.setup runs shell commands in every Slurm job; put them in your cluster "
                "environment (a module file, ~/.bashrc) instead.",
            )


def _raw(node, key):
    if key not in node:
        return None
    child = node._get_node(key)
    try:
        return node[key]
    except Exception:
        return child._value()


# ---------------------------------------------------------------------------------------------------
# Composing as @hydra.main will.


def _hydra_main_settings(task):
    """(config_path, config_name) given to @hydra.main: closure variables of Hydra 1.3's decorator."""
    names = task.__code__.co_freevars
    cells = dict(zip(names, (c.cell_contents for c in task.__closure__ or ())))
    if "config_path" not in cells or "config_name" not in cells:
        raise TypeError(f"{task!r} is not a function decorated with Hydra 1.3's @hydra.main")
    return cells["config_path"], cells["config_name"]


def _expand_sweeps(overrides: list, sweeper_params) -> list:
    """Override lists that together hold every value of every sweep (one compose per value)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    args = list(overrides) + [f"{k}={v}" for k, v in (sweeper_params or {}).items()]
    parsed = parser.parse_overrides(args)
    fixed = [a for a, o in zip(args, parsed) if not o.is_sweep_override()]
    variants = []
    for o in parsed:
        if not o.is_sweep_override() or o.is_interval_sweep():
            continue  # an interval yields only numbers
        key = o.get_key_element()
        variants += [[*fixed, f"{key}={v}"] for v in o.sweep_string_iterator()]
    return variants or [fixed]


def compose_like_hydra(task, argv):
    """The configurations @hydra.main will compose for argv (one per sweep value with -m), or [] when
    Hydra would fail to compose them itself (it then reports its own error). Any other failure
    propagates: preflight() then refuses to start (fails closed)."""
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
        return []  # argparse has printed its usage; @hydra.main prints it again and exits the same way
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
            return []
        search_path.prepend(
            provider="command-line",
            path=f"file://{os.path.abspath(args.config_dir)}",
            anchor=SearchPathQuery(provider="schema"),
        )
    setup_globals()
    GlobalHydra.instance().clear()
    configs = []
    try:
        hydra = Hydra.create_main_hydra2(
            task_name=detect_task_name(calling_file, calling_module), config_search_path=search_path
        )
        overrides = list(args.overrides)
        try:
            base = hydra.compose_config(
                config_name,
                overrides,
                RunMode.MULTIRUN if args.multirun else RunMode.RUN,
                validate_sweep_overrides=False,
            )
        except COMPOSE_ERRORS as e:
            check_package_header(e)
            return []
        configs.append(base)
        multirun = args.multirun or base.hydra.mode == RunMode.MULTIRUN
        sweeps = any(o.is_sweep_override() for o in OverridesParser.create().parse_overrides(overrides))
        if multirun or sweeps:
            params = base.hydra.sweeper.get("params") if "params" in base.hydra.sweeper else None
            for variant in _expand_sweeps(overrides, params):
                try:
                    configs.append(hydra.compose_config(config_name, variant, RunMode.RUN))
                except COMPOSE_ERRORS:
                    continue  # Hydra reports a value that does not compose when it reaches that job
    finally:
        GlobalHydra.instance().clear()
    return configs


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


def check_config(task, argv) -> None:
    """Raise ConfigError when what argv composes to names a callable outside the allowlist."""
    for cfg in compose_like_hydra(task, argv):
        check_composed(cfg)


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


def preflight(task, argv) -> None:
    """Everything checked before @hydra.main runs `task`: the overrides' syntax, callables named
    anywhere in the composed config, the launcher, then the output directory. Raises ConfigError.

    The check composes the way Hydra 1.3 does, through its internals (@hydra.main's closure, hydra._internal).
    If that machinery fails in a way that is not Hydra's own report of a bad configuration (another Hydra
    version, a changed internal), nothing was checked: the command refuses to start rather than let Hydra
    instantiate what the configuration names unchecked.
    """
    try:
        _preflight(task, argv)
    except ConfigError:
        raise
    except Exception as e:
        import hydra

        raise ConfigError(
            f"the pre-flight check of the configuration could not run ({type(e).__name__}: {e}), so nothing "
            f"it names has been checked, and the command refuses to start. It composes the configuration as "
            f"Hydra 1.3 does, through Hydra's internals; this is hydra-core {hydra.__version__}. Install the "
            "version pyproject.toml names (hydra-core>=1.3,<1.4)."
        ) from None


def _preflight(task, argv) -> None:
    from hydra._internal.utils import get_args_parser

    try:
        args = get_args_parser().parse_args(argv)
    except SystemExit:
        return  # argparse printed its usage; Hydra will do the same
    check_split_values(args.overrides)
    configs = compose_like_hydra(task, argv)
    for cfg in configs:
        check_composed(cfg)
    # --cfg, --help, --info and shell completion only print: they need no output directory.
    prints = args.cfg or args.help or args.hydra_help or args.info or args.shell_completion
    if configs and not prints:
        from hydra.types import RunMode

        runs = args.multirun or configs[0].hydra.mode == RunMode.MULTIRUN
        check_launcher(configs[0], runs)
        check_output_dir(output_root(configs[0], runs))
