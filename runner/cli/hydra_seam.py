"""The one place where the runner reaches past Hydra's (and its plugins') public API.

The pre-flight check (runner/cli/preflight.py) must compose a configuration exactly as `hydra.main` will,
before Hydra runs anything, and Hydra 1.3 offers no public call for that: its command-line parser, its
config search path and its composer live in `hydra._internal`. The sweep launcher and the job process
need two more of Hydra's internals (the callbacks a job runs, a failed job's exception), and the Optuna
sweeper wraps the plugin's implementation object. Every such call is a function here, and nothing else in
the project imports `hydra._internal`, reads a private attribute of Hydra's objects or calls a private
OmegaConf method. tests/test_hydra_seam.py holds one contract test per function: a Hydra upgrade that
changes one fails there, naming the call, instead of stopping every command with a refusal.

What is public stays where it is used: `hydra.main`, `HydraConfig`, `OverridesParser`, `ConfigStore`,
`Plugins`, `run_job`, `JobReturn.return_value`, `OmegaConf.*`.
"""

import argparse
import os
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional, Tuple

# Where the runner's Hydra apps find conf/: the package, so that an installed wheel and a checkout compose alike.
CONFIG_PATH = "pkg://runner.conf"
# The version_base every app runs under (Hydra's defaults as of 1.3: no working-directory change, ...).
VERSION_BASE = "1.3"


def args_parser() -> argparse.ArgumentParser:
    """Hydra's own command-line parser (overrides, -m, --cfg, --config-dir, ...), as `hydra.main` uses it."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


class Composer:
    """Hydra's composer for one app: the config search path `hydra.main` builds (its config path, a
    `--config-dir`) and `compose`, the call `hydra.main` makes before it runs or sweeps."""

    def __init__(self, hydra: Any) -> None:
        self._hydra = hydra

    def compose(self, config_name: Optional[str], overrides: List[str], multirun: bool, validate_sweep: bool = True):
        """The composed config (with its `hydra` node) for the overrides, as Hydra composes it for a run
        (multirun False) or for a sweep's own process (multirun True)."""
        from hydra.types import RunMode

        mode = RunMode.MULTIRUN if multirun else RunMode.RUN
        return self._hydra.compose_config(config_name, overrides, mode, validate_sweep_overrides=validate_sweep)

    def is_group(self, name: str) -> bool:
        """Whether `name` is a config group (a choice of files) rather than a value."""
        return bool(self._hydra.config_loader.get_group_options(name))

    def groups(self) -> List[str]:
        """The config groups a user may choose an option of (Hydra's own under hydra/ left out)."""
        found: List[str] = []
        loader = self._hydra.config_loader

        def walk(parent: str) -> None:
            for name in loader.list_groups(parent):
                group = f"{parent}/{name}" if parent else name
                if group != "hydra":
                    found.append(group)
                    walk(group)

        walk("")
        return found

    def check_sweep_overrides(self, overrides: List[str], multirun: bool) -> None:
        """Raise Hydra's own error for overrides its mode does not allow: `a=1,2` without -m is ambiguous,
        a swept `hydra.*` key is not supported."""
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.types import RunMode

        parsed = OverridesParser.create(config_loader=self._hydra.config_loader).parse_overrides(overrides)
        mode = RunMode.MULTIRUN if multirun else RunMode.RUN
        self._hydra.config_loader.validate_sweep_overrides_legal(parsed, mode, from_shell=True)


@contextmanager
def composer(task, config_path: Optional[str], config_dir: Optional[str]) -> Iterator[Composer]:
    """A Composer for the app whose task function is `task` (its module decides where a relative
    config_path is looked up, as in `hydra.main`), with `--config-dir` in front of the search path.
    Hydra's global state is cleared before and after: the run that follows initialises it afresh."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import (
        create_automatic_config_search_path,
        detect_calling_file_or_module_from_task_function,
        detect_task_name,
    )
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import setup_globals

    calling_file, calling_module = detect_calling_file_or_module_from_task_function(task)
    search_path = create_automatic_config_search_path(calling_file, calling_module, config_path)
    if config_dir is not None:
        search_path.prepend(
            provider="command-line",
            path=f"file://{os.path.abspath(config_dir)}",
            anchor=SearchPathQuery(provider="schema"),
        )
    setup_globals()
    GlobalHydra.instance().clear()
    try:
        yield Composer(
            Hydra.create_main_hydra2(
                task_name=detect_task_name(calling_file, calling_module), config_search_path=search_path
            )
        )
    finally:
        GlobalHydra.instance().clear()


def job_callbacks(cfg) -> Any:
    """Hydra's Callbacks object for a composed job config (`hydra.callbacks`), as the basic launcher
    gives `run_job` through its HydraContext."""
    from hydra._internal.callbacks import Callbacks

    return Callbacks(cfg)


def job_error(ret) -> Optional[BaseException]:
    """The exception a failed job raised (JobReturn keeps it where its value would be; the public
    `return_value` re-raises it and prints a line of its own)."""
    from hydra.core.utils import JobStatus

    return ret._return_value if ret.status == JobStatus.FAILED else None


@contextmanager
def hydra_config_set(cfg) -> Iterator[None]:
    """HydraConfig (what `${hydra:...}` and HydraConfig.get() read) set to a composed config's `hydra`
    node for the block, then put back as it was (Hydra has no call that restores it)."""
    from hydra.core.hydra_config import HydraConfig

    previous = HydraConfig.instance().cfg
    try:
        HydraConfig.instance().set_config(cfg)
        yield
    finally:
        HydraConfig.instance().cfg = previous


def shipped_logging_configs() -> List[Tuple[str, str, dict]]:
    """(group, option, YAML content) of every logging config hydra-core ships (hydra/job_logging and
    hydra/hydra_logging): read from the package's files, where Hydra's own config source reads them."""
    import hydra
    import yaml

    root = os.path.join(os.path.dirname(hydra.__file__), "conf", "hydra")
    found = []
    for group in ("job_logging", "hydra_logging"):
        for name in sorted(os.listdir(os.path.join(root, group))):
            with open(os.path.join(root, group, name)) as f:
                found.append((group, os.path.splitext(name)[0], yaml.safe_load(f) or {}))
    return found


# The optuna sweeper plugin's implementation module: it logs its trials and best values under this name.
OPTUNA_IMPL_LOGGER = "hydra_plugins.hydra_optuna_sweeper._impl"


def optuna_impl(plugin) -> Any:
    """The implementation object behind hydra-optuna-sweeper's OptunaSweeper (its `sweep`, `launcher`,
    `n_trials`): the runner swaps its launcher to turn failed jobs into failed trials."""
    return plugin.sweeper
