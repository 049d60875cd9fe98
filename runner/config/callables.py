"""The callables a configuration may name (`_target_`): an explicit list, each with its reason.

Checked twice: by the pre-flight on what Hydra itself instantiates (runner/cli/preflight.py) and by
runner/config/checks.py on the job's own config.
"""

from typing import Any

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


def refuse(where: str, what: Any, why: str) -> ConfigError:
    """The refusal of a config value that would run code of the config's choosing: where, what, why."""
    return ConfigError(
        f"{where}={what!r} is refused: {why} No configuration is allowed to run code of its own choosing."
    )


def target_allowed(target: Any) -> bool:
    """Whether a config may name `target` as something to instantiate or call (ALLOWED_TARGETS)."""
    return isinstance(target, str) and target in ALLOWED_TARGETS


def target_refusal(where: str, target: Any) -> ConfigError:
    """The refusal of a `_target_` outside ALLOWED_TARGETS."""
    return refuse(
        where,
        target,
        "a config may name only the callables Hydra's launchers, sweepers and the runner's sweep summary need "
        f"({', '.join(sorted(ALLOWED_TARGETS))}).",
    )
