"""The contract of runner/cli/hydra_seam.py: one test per call into Hydra's internals, each failing with a
message that names the call when a Hydra (or OmegaConf, or plugin) release changes it; and a scan that
nothing else in the project reaches into those internals."""

import re
from contextlib import contextmanager

import hydra
import omegaconf
import pytest
from conftest import REPO
from omegaconf import OmegaConf

from runner.cli import hydra_seam


@contextmanager
def contract(call: str):
    """Fail naming the seam's call and the versions, instead of a traceback deep inside Hydra."""
    try:
        yield
    except Exception as e:  # AssertionError included: a changed result is a broken contract too
        pytest.fail(
            f"runner/cli/hydra_seam.py {call} no longer works with hydra-core {hydra.__version__}, omegaconf "
            f"{omegaconf.__version__}: {type(e).__name__}: {e}. Adapt that function (and only it).",
            pytrace=False,
        )


def runner_task():
    from runner.__main__ import main

    return main


def test_args_parser_reads_hydras_command_line():
    with contract("args_parser"):
        args = hydra_seam.args_parser().parse_args(
            ["-m", "seed=1,2", "--cfg", "hydra", "--resolve", "--config-dir", "/tmp", "--config-name", "x"]
        )
        assert args.multirun and args.overrides == ["seed=1,2"] and args.cfg == "hydra" and args.resolve
        assert args.config_dir == "/tmp" and args.config_name == "x" and args.config_path is None
        for flag in ("help", "hydra_help", "info", "shell_completion", "experimental_rerun"):
            assert hasattr(args, flag), flag


def test_composer_composes_as_hydra_main_does(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\nseed: 7\n")
    with contract("composer / Composer.compose"):
        with hydra_seam.composer(runner_task(), hydra_seam.CONFIG_PATH, str(tmp_path)) as c:
            cfg = c.compose("config", ["experiment=mine", "model=resnet20"], multirun=False)
            assert cfg.seed == 7 and cfg.hydra.runtime.choices["model"] == "resnet20"
            assert cfg.hydra.job.name == "runner" and cfg.hydra.mode is None
            sweep = c.compose("config", ["seed=1,2"], multirun=True, validate_sweep=False)
            assert list(OmegaConf.to_container(sweep.hydra.overrides.task)) == ["seed=1,2"]


def test_composer_tells_groups_from_values():
    with contract("Composer.is_group"):
        with hydra_seam.composer(runner_task(), hydra_seam.CONFIG_PATH, None) as c:
            assert c.is_group("model") and c.is_group("experiment")
            assert not c.is_group("seed") and not c.is_group("optim.lr")


def test_composer_lists_the_groups_a_user_chooses(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a.yaml").write_text("x: 1\n")
    with contract("Composer.groups"):
        with hydra_seam.composer(runner_task(), hydra_seam.CONFIG_PATH, str(tmp_path)) as c:
            groups = c.groups()
            assert {"model", "optim", "experiment", "mine"} <= set(groups)
            assert not any(g == "hydra" or g.startswith("hydra/") for g in groups)


def test_composer_refuses_what_the_mode_does_not_allow():
    from hydra.errors import HydraException

    with contract("Composer.check_sweep_overrides"):
        with hydra_seam.composer(runner_task(), hydra_seam.CONFIG_PATH, None) as c:
            c.check_sweep_overrides(["seed=1,2"], multirun=True)
            with pytest.raises(HydraException, match="Ambiguous value"):
                c.check_sweep_overrides(["seed=1,2"], multirun=False)
            with pytest.raises(HydraException, match="Sweeping over Hydra's configuration is not supported"):
                c.check_sweep_overrides(["hydra.job.name=a,b"], multirun=True)


def test_job_callbacks_and_job_error_with_run_job(tmp_path):
    from hydra.core.utils import JobStatus, run_job, setup_globals
    from hydra.types import HydraContext

    with hydra_seam.composer(runner_task(), hydra_seam.CONFIG_PATH, None) as c:
        cfg = c.compose("config", [f"hydra.run.dir={tmp_path}"], multirun=False)

    def fails(cfg):
        raise ValueError("the job's own error")

    setup_globals()
    with contract("job_callbacks / job_error"):
        callbacks = hydra_seam.job_callbacks(cfg)
        assert hasattr(callbacks, "on_job_start") and hasattr(callbacks, "on_job_end")
        context = HydraContext(config_loader=None, callbacks=callbacks)
        ret = run_job(
            hydra_context=context, task_function=fails, config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None
        )
        assert ret.status == JobStatus.FAILED
        error = hydra_seam.job_error(ret)
        assert isinstance(error, ValueError) and str(error) == "the job's own error"
        ret = run_job(
            hydra_context=context,
            task_function=lambda cfg: 0.5,
            config=cfg,
            job_dir_key="hydra.run.dir",
            job_subdir_key=None,
        )
        assert hydra_seam.job_error(ret) is None and ret.return_value == 0.5


def test_hydra_config_set_sets_and_restores():
    from hydra.core.hydra_config import HydraConfig

    with hydra_seam.composer(runner_task(), hydra_seam.CONFIG_PATH, None) as c:
        cfg = c.compose("config", ["hydra.job.name=probe"], multirun=False)
    before = HydraConfig.instance().cfg
    with contract("hydra_config_set"):
        with hydra_seam.hydra_config_set(cfg):
            assert HydraConfig.get().job.name == "probe"
            assert OmegaConf.create({"x": "${hydra:job.name}"}).x == "probe"
        assert HydraConfig.instance().cfg is before


def test_shipped_logging_configs_are_where_hydra_reads_them():
    with contract("shipped_logging_configs"):
        found = {(group, name): data for group, name, data in hydra_seam.shipped_logging_configs()}
        assert {("job_logging", "default"), ("hydra_logging", "default"), ("job_logging", "disabled")} <= set(found)
        handlers = found[("job_logging", "default")]["handlers"]
        assert handlers["file"]["class"] == "logging.FileHandler"
        assert handlers["file"]["filename"] == "${hydra.runtime.output_dir}/${hydra.job.name}.log"
        assert handlers["console"]["stream"] == "ext://sys.stdout"


@pytest.mark.slow  # imports optuna (and SQLAlchemy): about a minute on a busy 2-core machine
def test_optuna_impl_is_the_plugins_implementation():
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    import importlib
    import inspect
    import logging

    from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper

    with contract("optuna_impl / OPTUNA_IMPL_LOGGER"):
        impl_module = importlib.import_module(hydra_seam.OPTUNA_IMPL_LOGGER)
        assert logging.getLogger(hydra_seam.OPTUNA_IMPL_LOGGER).name == impl_module.__name__
        sampler = {"_target_": "optuna.samplers.RandomSampler", "seed": 0}
        plugin = OptunaSweeper(
            sampler=sampler,
            direction="maximize",
            storage=None,
            study_name="s",
            n_trials=3,
            n_jobs=1,
            max_failure_rate=0.0,
            search_space=None,
            custom_search_space=None,
            params=None,
        )
        impl = hydra_seam.optuna_impl(plugin)
        assert isinstance(impl, impl_module.OptunaSweeperImpl)
        assert impl.n_trials == 3 and callable(impl.sweep)
        # The runner replaces the launcher the implementation keeps once set up (optuna_sweeper.OptunaSweeper.sweep).
        assert "self.launcher = " in inspect.getsource(type(impl).setup)


def test_the_hydra_targets_the_allowlist_names_are_what_hydra_composes():
    # ALLOWED_TARGETS names two classes inside hydra._internal: Hydra's own configs must still name them.
    from runner.config.callables import ALLOWED_TARGETS

    with contract("the _target_ of hydra/launcher=basic and the default sweeper"):
        with hydra_seam.composer(runner_task(), hydra_seam.CONFIG_PATH, None) as c:
            cfg = c.compose("config", ["hydra/launcher=basic"], multirun=True, validate_sweep=False)
        assert cfg.hydra.launcher._target_ in ALLOWED_TARGETS
        assert cfg.hydra.sweeper._target_ in ALLOWED_TARGETS


# Hydra's or OmegaConf's private API: what only runner/cli/hydra_seam.py may use.
PRIVATE = re.compile(
    r"hydra\._internal|from hydra\._internal|OmegaConf\._|\._get_node\(|\._value\(\)|_set_flag|_get_flag"
    r"|__closure__|cell_contents|\._return_value|_return_value=|hydra_optuna_sweeper\._impl|\.sweeper\.sweeper"
)


def test_nothing_outside_the_seam_touches_hydras_internals():
    offenders = []
    for folder in ("runner", "hydra_plugins", "models", "datasets"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path == REPO / "runner" / "cli" / "hydra_seam.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                # A _target_ string that names a class of Hydra's is data (ALLOWED_TARGETS), not a call.
                if PRIVATE.search(line) and not re.match(r'\s*"hydra\._internal\.[\w.]+": ', line):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
