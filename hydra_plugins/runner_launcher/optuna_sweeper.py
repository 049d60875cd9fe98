"""hydra/sweeper=optuna_accuracy's sweeper: hydra-optuna-sweeper's, made to survive failed jobs and dry runs.

A runner job that fails returns NaN and leaves failed.json (the sweep goes on; its summary lists the
failure). Optuna 4 refuses a NaN value with an exception the plugin does not expect, which ended the
whole search; here a failed job is told to Optuna as a failed trial. When no trial completed, Optuna has
no best trial: the sweep ends with the summary and exit 1 instead of "No trials are completed yet".

A dry-run job checks its configuration and returns no value, and Optuna demands a number from every
trial. Under dry_run=true the n_trials trials are asked for and launched as usual (each validates its
sampled configuration; the summary lists it as `validated`), and no result is recorded: there was no search.

The plugin package (the `launchers` extra) is imported only when the sweeper is built, so Hydra's scan of
the hydra_plugins namespace can import this module without it.
"""

import logging
import math
import os
from dataclasses import replace
from typing import Any, List, Optional

from hydra.core.utils import JobStatus
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from runner.cli.hydra_seam import OPTUNA_IMPL_LOGGER, optuna_impl

log = logging.getLogger(__name__)

# What a failed job returns to the plugin: not a number, so it records a failed trial (the job has
# printed its error, and the sweep summary lists it).
FAILED = "the job failed (its failed.json)"


class _Trials(Launcher):
    """Launches through the real launcher and turns the runner's return values into what the plugin accepts."""

    def __init__(self, launcher: Launcher, dry_run: bool) -> None:
        self.launcher, self.dry_run = launcher, dry_run
        self.validated = 0

    def setup(self, **kwargs: Any) -> None:
        self.launcher.setup(**kwargs)

    def launch(self, job_overrides: Any, initial_job_idx: int) -> Any:
        returns = list(self.launcher.launch(job_overrides, initial_job_idx))
        for i, ret in enumerate(returns):
            if ret.status != JobStatus.COMPLETED:
                continue
            value = ret.return_value
            if isinstance(value, float) and math.isnan(value):
                returns[i] = replace(ret)
                returns[i].return_value = FAILED
            elif value is None and self.dry_run:
                self.validated += 1
                returns[i] = replace(ret)
                returns[i].return_value = 0.0  # a placeholder: no result is recorded
        return returns


class _Quiet(logging.Filter):
    """Drops the plugin's lines about our failed-job marker (the job reported its error) and, in a dry
    run, its "Best parameters/value" lines (placeholders, not results)."""

    def __init__(self, dry_run: bool) -> None:
        super().__init__()
        self.dry_run = dry_run

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return FAILED not in message and not (self.dry_run and message.startswith("Best "))


class OptunaSweeper(Sweeper):
    """hydra_optuna_sweeper's OptunaSweeper (same parameters), for the runner's jobs."""

    def __init__(self, **params: Any) -> None:
        import optuna

        from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper as Plugin

        # Optuna's own coloured "A new study created" line: the plugin logs the study's name itself.
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.plugin = Plugin(**params)
        direction: Any = params.get("direction")
        directions = list(direction) if OmegaConf.is_list(direction) or isinstance(direction, list) else [direction]
        if any("minimize" in str(d).lower() for d in directions):
            # The plugin's own default: with the runner's jobs it would search for the worst accuracy.
            log.warning(
                "This Optuna search minimises what each run returns, its val_accuracy: it looks for the worst "
                "settings. hydra/sweeper=optuna_accuracy (or hydra.sweeper.direction=maximize) maximises it."
            )
        self.config: Optional[DictConfig] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.plugin.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> Any:
        assert self.config is not None
        dry_run = bool(self.config.get("dry_run"))
        impl = optuna_impl(self.plugin)
        assert impl.launcher is not None
        impl.launcher = trials = _Trials(impl.launcher, dry_run)
        plugin_log = logging.getLogger(OPTUNA_IMPL_LOGGER)
        quiet = _Quiet(dry_run)
        plugin_log.addFilter(quiet)
        try:
            impl.sweep(arguments)
        except ValueError as e:
            if "No trials are completed yet" not in str(e):
                raise
            log.error("No Optuna trial completed, so there is no best trial (the summary lists why each failed).")
        finally:
            plugin_log.removeFilter(quiet)
        if dry_run:
            results = os.path.join(str(self.config.hydra.sweep.dir), "optimization_results.yaml")
            if os.path.exists(results):
                os.remove(results)  # it would name a "best" trial of placeholder values
            log.info(
                f"dry_run=true: {trials.validated} of {impl.n_trials} Optuna trials validated; nothing was searched."
            )
        return None


def route_plugin_config() -> None:
    """Point the plugin's own `hydra/sweeper=optuna` at this sweeper, so a dry run and a failed job behave
    there as under optuna_accuracy (the plugin's class ends a dry run with "No trials are completed yet").
    Its parameters and their defaults stay the plugin's; without the `launchers` extra there is nothing to do."""
    try:
        from hydra_plugins.hydra_optuna_sweeper.config import OptunaSweeperConf
    except ImportError:
        return
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(
        group="hydra/sweeper",
        name="optuna",
        node=OptunaSweeperConf(_target_=f"{__name__}.OptunaSweeper"),
        provider="optuna_sweeper",
    )
