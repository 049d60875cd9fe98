"""Optimizers and schedules declared once (runner/config/optim_options.py): the docs' tables are the
registries', a field two options share has one default, and a package installed beside the runner adds an
optimizer and a schedule that train, are checked and recorded like the runner's own."""

import textwrap
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import REPO, TINY, metrics, run_cli

from runner.config.optim_options import OPTIMIZERS, SCHEDULES
from runner.config.options import Option, Options


def test_the_docs_tables_are_the_registries():
    page = (REPO / "docs" / "optimizers.md").read_text()
    assert OPTIMIZERS.table("optim", "optimizer") in page
    assert SCHEDULES.table("schedule", "rate") in page


def test_a_field_two_options_declare_with_other_defaults_is_refused():
    @dataclass
    class Slow:
        gamma: float = 0.1

    @dataclass
    class Fast:
        gamma: float = 0.5

    options = Options("optim.schedule", "none")
    options.register(Option("slow", Slow, "m:f", "slow"))
    with pytest.raises(ValueError, match="gamma"):
        options.register(Option("fast", Fast, "m:f", "fast"))
    with pytest.raises(ValueError, match="registered twice"):
        options.register(Option("slow", Slow, "m:f", "slow"))


# A package of someone's: its options in a light module, their builders (MindSpore) in another, named under the
# runner's entry-point groups by its dist-info (what `pip install` of a package declaring them leaves).
PACKAGE = {
    "my_options/__init__.py": """
        from dataclasses import dataclass

        from runner.config.options import Option

        @dataclass
        class RMSPropSettings:
            rho: float = 0.9  # the squared gradients' decay

        @dataclass
        class HalvingSettings:
            halve_epochs: float = 1.0

        RMSPROP = Option("rmsprop", RMSPropSettings, "my_options.build:rmsprop", "RMSProp",
                         defaults={"lr": 0.01, "weight_decay": 0.0})
        HALVING = Option("halving", HalvingSettings, "my_options.build:halving", "x 0.5 every `halve_epochs`")
    """,
    "my_options/build.py": """
        import numpy as np
        from mindspore import nn, ops
        from mindspore import dtype as mstype
        from mindspore.nn.learning_rate_schedule import LearningRateSchedule

        def rmsprop(cfg, params, lr, wd):
            return nn.RMSProp(params, lr, decay=cfg.rho, weight_decay=wd)

        class Halving(LearningRateSchedule):
            def __init__(self, every):
                super().__init__()
                self.every = float(every)

            def construct(self, global_step):
                return ops.pow(0.5, ops.floor(ops.cast(global_step, mstype.float32) / self.every))

            def host_rates(self, updates):  # the lr record's formula: numpy, no graph
                return 0.5 ** np.floor(updates / self.every)

        def halving(cfg, updates_per_epoch, steps):
            return Halving(max(1.0, round(cfg.halve_epochs * updates_per_epoch)))
    """,
    "my_options-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: my-options\nVersion: 0.1\n",
    "my_options-0.1.dist-info/entry_points.txt": """
        [runner.optimizers]
        rmsprop = my_options:RMSPROP

        [runner.schedules]
        halving = my_options:HALVING
        broken = my_options:NOT_THERE
    """,
}


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """PYTHONPATH for a process that has the package installed."""
    where = tmp_path_factory.mktemp("site")
    for name, text in PACKAGE.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(textwrap.dedent(text).lstrip())
    return {"PYTHONPATH": str(where)}


@pytest.mark.parametrize(
    "overrides, messages",
    [
        (
            ["optim=rmsprop", "optim.nesterov=true", "optim.schedule=halving", "optim.min_lr=0.001"],
            ["optim.name=rmsprop does not use optim.nesterov=True", "optim.schedule=halving does not use optim.min_lr"],
        ),
        (
            ["optim.rho=0.5", "optim.halve_epochs=2"],  # the defaults: momentum, cosine
            ["optim.name=momentum does not use optim.rho=0.5", "optim.schedule=cosine does not use optim.halve_epochs"],
        ),
    ],
)
def test_an_installed_options_fields_are_checked_as_the_runners_own(tmp_path, package, overrides, messages):
    proc = run_cli(tmp_path, *TINY, *overrides, "dry_run=true", check=False, env=package)
    out = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert all(m in out for m in messages), proc.stderr[-2000:]
    # A package option that fails to load is left out with one line; the rest still works.
    assert "optim.schedule=broken left out" in proc.stderr


@pytest.mark.slow  # one tiny training in a process that has the package
def test_an_installed_optimizer_and_schedule_train_and_are_recorded(tmp_path, package):
    run = tmp_path / "run"
    args = ["optim=rmsprop", "optim.rho=0.95", "optim.schedule=halving", "optim.halve_epochs=0.5", "eval=false"]
    run_cli(run, *TINY, *args, env=package)
    m = metrics(run)
    saved = (run / "config.yaml").read_text()
    assert "rho: 0.95" in saved and "halve_epochs: 0.5" in saved and "lr: 0.01" in saved  # its defaults file
    # 44 steps, one update each: the rate halves at update 22 (0.5 epoch); the record (the schedule's host_rates)
    # against the cell the optimizer ran, in test_a_schedules_record_is_its_cells_rates below.
    assert np.allclose(m["lr_curve"][:22], 0.01) and np.allclose(m["lr_curve"][22:], 0.005), m["lr_curve"]
    assert m["final_loss"] < m["loss_curve"][0]
    # Its field is typed as its dataclass declares it.
    proc = run_cli(
        tmp_path / "typo", *TINY, "optim=rmsprop", "optim.rho=fast", "dry_run=true", check=False, env=package
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "optim.rho" in proc.stderr, proc.stderr[-2000:]


def test_a_schedules_record_is_its_cells_rates_and_one_without_a_formula_is_refused(package, monkeypatch):
    from mindspore import ops
    from mindspore.nn.learning_rate_schedule import LearningRateSchedule

    from runner.errors import UserError
    from runner.training.optim import WarmupSchedule, host_rates, schedule_rates

    monkeypatch.syspath_prepend(package["PYTHONPATH"])
    from my_options.build import Halving

    schedule = WarmupSchedule(0.01, Halving(5), 2)
    assert np.allclose(host_rates(schedule, np.arange(20)), schedule_rates(schedule, 20))

    class Bare(LearningRateSchedule):
        def construct(self, global_step):
            return ops.ones_like(global_step)

    with pytest.raises(UserError, match="Bare has no host_rates"):
        host_rates(WarmupSchedule(0.01, Bare(), 0), [0])
