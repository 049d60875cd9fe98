"""No configuration, however it is found, runs a callable of its own choosing: the composed config
(its `hydra` node included) is checked before Hydra instantiates anything."""

import os
import pickle
import re

import pytest
from conftest import REPO, cli_in_process, dry_run, run_cli

# Each of these would create, truncate or overwrite MARKER if Hydra got to instantiate it.
FILE_HANDLER = "_target_: logging.FileHandler\n      filename: {marker}\n      mode: w\n"
COPY = "_target_: shutil.copyfile\n      src: /etc/hostname\n      dst: {marker}\n"


def refused(proc, key: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"Error: {key}" in " ".join(proc.stderr.split()), proc.stderr
    assert "refused" in proc.stderr


@pytest.fixture
def marker(tmp_path):
    """A file the attack would truncate or overwrite: it must keep its content."""
    path = tmp_path / "marker.txt"
    path.write_text("untouched")
    yield path
    assert path.read_text() == "untouched", "the foreign callable ran"


def callback_yaml(body: str, marker, package_global=True) -> str:
    head = "# @package _global_\n" if package_global else ""
    return head + "hydra:\n  callbacks:\n    x:\n      " + body.format(marker=marker)


def test_config_dir_and_config_name(tmp_path, marker):
    conf = tmp_path / "myconf"
    conf.mkdir()
    (conf / "mine.yaml").write_text("defaults: [config, _self_]\n" + callback_yaml(FILE_HANDLER, marker, False))
    proc = cli_in_process("--config-dir", str(conf), "--config-name", "mine", "dry_run=true")
    refused(proc, "hydra.callbacks.x._target_='logging.FileHandler'")


def test_relative_config_path_is_found_where_hydra_finds_it(tmp_path, marker):
    # Hydra resolves a relative --config-path against runner/ (where @hydra.main is), not the cwd.
    conf = tmp_path / "saved"
    conf.mkdir()
    (conf / "config.yaml").write_text("defaults: [base_config, _self_]\n" + callback_yaml(COPY, marker, False))
    relative = os.path.relpath(conf, REPO / "runner")
    # A subprocess: under `python -m runner` the task's module is __main__, and Hydra finds a relative path
    # from its file; called in-process (or as the console script) the module is runner.__main__.
    proc = run_cli(None, "--config-path", relative, "--config-name", "config", "dry_run=true", check=False)
    refused(proc, "hydra.callbacks.x._target_='shutil.copyfile'")


def test_callback_in_a_file_pulled_in_through_defaults(tmp_path, marker):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "config.yaml").write_text("defaults: [base_config, innocent, _self_]\nepochs: 1\n")
    (conf / "innocent.yaml").write_text(callback_yaml(FILE_HANDLER, marker))
    proc = cli_in_process("--config-path", str(conf), "--config-name", "config", "dry_run=true")
    refused(proc, "hydra.callbacks.x._target_='logging.FileHandler'")


def test_experiment_file_in_a_config_dir(tmp_path, marker):
    (tmp_path / "extra" / "experiment").mkdir(parents=True)
    (tmp_path / "extra" / "experiment" / "fast.yaml").write_text(callback_yaml(COPY, marker) + "epochs: 1\n")
    proc = cli_in_process("--config-dir", str(tmp_path / "extra"), "+experiment=fast", "dry_run=true")
    refused(proc, "hydra.callbacks.x._target_='shutil.copyfile'")


@pytest.mark.parametrize(
    "handler,key",
    [
        # A FileHandler is Hydra's own default, but only for <run dir>/<job name>.log.
        ("class: logging.FileHandler\n        filename: {marker}\n        mode: w", "hydra.job_logging.handlers.x="),
        ("class: shutil.copyfile\n        src: /etc/hostname\n        dst: {marker}", "hydra.job_logging.handlers.x="),
        # Hydra 1.3.8 blocks these itself, with a traceback: the runner refuses them as cleanly as the rest.
        ("(): os.system\n        command: 'echo x > {marker}'", "hydra.job_logging.handlers.x={'()': 'os.system'"),
        (
            '(): builtins.exec\n        source: \'open("{marker}", "w")\'',
            "hydra.job_logging.handlers.x={'()': 'builtins.exec'",
        ),
        (
            "(): subprocess.Popen\n        args: [cp, /etc/hostname, '{marker}']",
            "hydra.job_logging.handlers.x={'()': 'subprocess.Popen'",
        ),
    ],
)
def test_job_logging_handlers(tmp_path, marker, handler, key):
    (tmp_path / "extra" / "experiment").mkdir(parents=True)
    body = "# @package _global_\nhydra:\n  job_logging:\n    handlers:\n      x:\n        " + handler.format(
        marker=marker
    )
    (tmp_path / "extra" / "experiment" / "logs.yaml").write_text(body + "\n")
    proc = cli_in_process("--config-dir", str(tmp_path / "extra"), "+experiment=logs", "dry_run=true")
    refused(proc, key)


@pytest.mark.parametrize(
    "overrides,key",
    [
        (
            [
                "+hydra.callbacks.x._target_=logging.FileHandler",
                "+hydra.callbacks.x.filename={marker}",
                "+hydra.callbacks.x.mode=w",
            ],
            "hydra.callbacks",
        ),
        # An attribute path through an allowed module reaches a foreign function.
        (
            [
                "+hydra.callbacks.x._target_=runner.training.distributed.shutil.copyfile",
                "+hydra.callbacks.x.src=/etc/hostname",
                "+hydra.callbacks.x.dst={marker}",
            ],
            "hydra.callbacks.x._target_='runner.training.distributed.shutil.copyfile'",
        ),
        # (A foreign value in one combination of a sweep: test_every_combination_of_a_sweep_is_checked.)
        (["hydra/launcher=basic", "hydra.launcher._target_=shutil.copyfile"], "hydra.launcher._target_"),
        # Hydra's own blocklist would stop this one with a traceback; the refusal is the same paragraph.
        (
            ["+hydra.callbacks.x._target_=os.system", "+hydra.callbacks.x.command='cp /etc/hostname {marker}'"],
            "hydra.callbacks.x._target_='os.system'",
        ),
        (["+hydra.job.env_set.LD_PRELOAD={marker}"], "hydra.job.env_set.LD_PRELOAD"),
    ],
)
def test_command_line_overrides(tmp_path, marker, overrides, key):
    args = [o.format(marker=marker) for o in overrides]
    proc = cli_in_process(*args, f"hydra.run.dir={tmp_path / 'run'}", "dry_run=true")
    refused(proc, key)


def test_node_built_by_a_resolver(tmp_path, marker):
    # Checked as the dict Hydra will see when it resolves the callback, not as the text of the interpolation.
    (tmp_path / "extra" / "experiment").mkdir(parents=True)
    node = f"'${{oc.create:{{_target_: shutil.copyfile, src: /etc/hostname, dst: \"{marker}\"}}}}'"
    (tmp_path / "extra" / "experiment" / "x.yaml").write_text(
        f"# @package _global_\nhydra:\n  callbacks:\n    x: {node}\n"
    )
    proc = cli_in_process("--config-dir", str(tmp_path / "extra"), "+experiment=x", "dry_run=true")
    refused(proc, "hydra.callbacks.x._target_='shutil.copyfile'")


def test_sweep_params_in_an_experiment_file(tmp_path, marker):
    # hydra.sweeper.params are overrides too: each value of each is composed and checked.
    (tmp_path / "extra" / "experiment").mkdir(parents=True)
    (tmp_path / "extra" / "experiment" / "grid.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n"
        "      +hydra.callbacks.x._target_: runner.report.sweep.SweepSummary,logging.FileHandler\n"
        f"      +hydra.callbacks.x.filename: {marker}\n"
        "      +hydra.callbacks.x.mode: w\n"
    )
    args = ["-m", "--config-dir", str(tmp_path / "extra"), "+experiment=grid", f"hydra.sweep.dir={tmp_path / 's'}"]
    proc = cli_in_process(*args, "dry_run=true")
    refused(proc, "hydra.callbacks.x._target_='logging.FileHandler'")


def test_rerun_pickle_is_refused(tmp_path, marker):
    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    evil = tmp_path / "config.pickle"
    evil.write_bytes(pickle.dumps(Payload()))
    proc = cli_in_process("--experimental-rerun", str(evil))
    refused(proc, "--experimental-rerun")


def test_hydra_defaults_and_project_targets_pass(tmp_path):
    # What ships is allowed: the sweep summary callback, the isolated launcher, Hydra's logging.
    proc = dry_run(tmp_path, "hydra/job_logging=stdout", multirun=True)
    assert "Configuration is valid" in proc.stdout and "refused" not in proc.stderr, proc.stderr
    proc = cli_in_process("hydra/launcher=joblib", "hydra/sweeper=optuna_accuracy", "--cfg", "hydra")
    assert proc.returncode == 0


def test_a_check_that_cannot_run_refuses_to_start(monkeypatch, tmp_path):
    # The check composes through Hydra 1.3's internals (runner/cli/hydra_seam.py); when those fail (another
    # Hydra, a changed internal), nothing has been checked, so the command must refuse (one paragraph, exit 2),
    # never run unchecked.
    from runner.__main__ import train
    from runner.cli import hydra_seam
    from runner.cli.preflight import preflight
    from runner.errors import ConfigError

    def changed(*args, **kwargs):
        raise AttributeError("'Hydra' has no attribute 'create_main_hydra2'")

    monkeypatch.setattr(hydra_seam, "Composer", changed)
    with pytest.raises(ConfigError, match="refuses to start.*hydra-core"):
        preflight(train.app, ["amp=o2"])
    monkeypatch.undo()
    preflight(train.app, ["amp=o2", f"hydra.run.dir={tmp_path}"])  # the check itself passes this config
    proc = cli_in_process("amp=o2", f"hydra.run.dir={tmp_path / 'r'}", "dry_run=true")
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------------------------------
# In process: the pre-flight check on what Hydra will compose, resolve and run.


def preflight_refuses(tmp_path, *argv, match):
    """preflight() on argv (with an experiment dir at tmp_path/extra) raises ConfigError matching `match`."""
    from runner.__main__ import train
    from runner.cli.preflight import preflight
    from runner.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        preflight(train.app, ["--config-dir", str(tmp_path / "extra"), *argv])


def experiment(tmp_path, name: str, text: str) -> str:
    (tmp_path / "extra" / "experiment").mkdir(parents=True, exist_ok=True)
    (tmp_path / "extra" / "experiment" / f"{name}.yaml").write_text("# @package _global_\n" + text)
    return f"+experiment={name}"


def test_a_node_decoded_from_text_is_checked_as_the_dict_it_becomes(tmp_path, marker):
    # oc.decode returns a plain dict, not a DictConfig: the check walks the resolved config.
    node = f"'${{oc.decode:\"{{_target_: shutil.copyfile, src: /etc/hostname, dst: {marker}}}\"}}'"
    exp = experiment(tmp_path, "x", f"hydra:\n  callbacks:\n    x: {node}\n")
    preflight_refuses(
        tmp_path, exp, f"hydra.run.dir={tmp_path / 'r'}", match=r"hydra.callbacks.x._target_='shutil.copyfile'"
    )


def test_hydra_values_resolve_as_at_run_time_and_what_cannot_resolve_is_refused(tmp_path, marker):
    # ${hydra:...} resolves at run time to a FileHandler written into an env_set value (of an allowed name).
    handler = "{class: logging.FileHandler, filename: " + str(marker) + ", mode: w}"
    exp = experiment(
        tmp_path, "x", "hydra:\n  job_logging:\n    handlers:\n      x: ${oc.decode:${hydra:job.env_set.GLOG_v}}\n"
    )
    run = f"hydra.run.dir={tmp_path / 'r'}"
    preflight_refuses(
        tmp_path,
        exp,
        run,
        f"+hydra.job.env_set.GLOG_v='{handler}'",
        match=r"hydra.job_logging.handlers.x=.*FileHandler",
    )
    # A hydra.* value that cannot be resolved before Hydra runs cannot be checked: refused, not skipped.
    exp = experiment(
        tmp_path, "y", "hydra:\n  callbacks:\n    x:\n      _target_: ${oc.decode:${oc.env:NO_SUCH_VARIABLE_19}}\n"
    )
    preflight_refuses(tmp_path, exp, run, match=r"hydra.callbacks.x._target_ cannot be resolved before Hydra runs")


def test_every_combination_of_a_sweep_is_checked(tmp_path):
    # Only seed=1 with epochs=3 picks the foreign entry (index "13"); each value alone, with the other at
    # its default (seed 0, epochs 12), picks an allowed one.
    table = ["runner.report.sweep.SweepSummary"] * 13 + ["shutil.copyfile"]
    exp = experiment(
        tmp_path,
        "x",
        f"amp:\n  keep_fp32: {table}\nhydra:\n  callbacks:\n    x:\n"
        "      _target_: ${oc.select:amp.keep_fp32.${seed}${epochs},runner.report.sweep.SweepSummary}\n",
    )
    sweep = f"hydra.sweep.dir={tmp_path / 's'}"
    preflight_refuses(tmp_path, "-m", exp, "seed=1,2", "epochs=1,3", sweep, match=r"_target_='shutil.copyfile'")
    from runner.__main__ import train
    from runner.cli.preflight import preflight

    preflight(train.app, ["--config-dir", str(tmp_path / "extra"), "-m", exp, "seed=3,4", "epochs=1,2", sweep])


@pytest.mark.parametrize(
    "target",
    [
        "mindspore.common._utils.load_lib",  # loads any shared library
        "mindspore.train.serialization.load_checkpoint",  # "defined in MindSpore" is not a reason
        "runner.training.recipe.run",  # nor is "defined in the runner"
        "optuna.samplers._tpe.sampler.TPESampler",  # another path to an allowed class
    ],
)
def test_only_the_listed_callables_may_be_named(tmp_path, target):
    from runner.config.callables import ALLOWED_TARGETS

    assert all(reason for reason in ALLOWED_TARGETS.values())
    experiment(tmp_path, "unused", "")
    preflight_refuses(
        tmp_path,
        f"+hydra.callbacks.x._target_={target}",
        f"hydra.run.dir={tmp_path / 'r'}",
        match=f"_target_='{target}'",
    )


@pytest.mark.parametrize("name", ["CXX", "CPATH", "LIBRARY_PATH", "GCC_EXEC_PREFIX", "P", "LD_PRELOAD"])
def test_env_set_takes_only_harmless_names(tmp_path, name):
    experiment(tmp_path, "unused", "")
    run = f"hydra.run.dir={tmp_path / 'r'}"
    preflight_refuses(tmp_path, f"+hydra.job.env_set.{name}=x", run, match=f"hydra.job.env_set.{name}='x' is refused")
    from runner.__main__ import train
    from runner.cli.preflight import preflight

    preflight(train.app, ["+hydra.job.env_set.OMP_NUM_THREADS=2", run])


@pytest.mark.parametrize(
    "module,args,message",
    [
        ("runner.__main__", ["sink.sink_sise=4"], "sink.sink_sise is not a setting .*did you mean sink.sink_size"),
        ("runner.__main__", ["a=${"], "Error parsing override 'a=\\$\\{'"),
        ("runner.cli.commands", ["run=a,b"], "Ambiguous value for argument 'run=a,b'"),
        ("runner.__main__", ["--config-dir", "/no/such/dir"], "--config-dir '/no/such/dir' is not a directory"),
    ],
)
def test_hydras_own_composition_errors_are_the_users_mistake(module, args, message):
    # Raised as ConfigError (one paragraph, exit 2: tests/test_config.py runs the CLI), not Hydra's exit 1.
    import importlib

    from runner.cli.preflight import preflight
    from runner.errors import ConfigError

    with pytest.raises(ConfigError, match=message) as e:
        mod = importlib.import_module(module)
        preflight((mod.train if module == "runner.__main__" else mod.evaluate).app, args)
    assert "\n" not in str(e.value)


def test_a_line_break_in_a_launcher_setting_is_refused(tmp_path, marker):
    # Slurm's job script gets `#SBATCH --<key>=<value>` per additional parameter: a line break adds a command.
    exp = experiment(
        tmp_path,
        "x",
        f'hydra:\n  launcher:\n    additional_parameters:\n      comment: "x\\ncp /etc/hostname {marker}"\n',
    )
    sweep = f"hydra.sweep.dir={tmp_path / 's'}"
    preflight_refuses(
        tmp_path, "-m", "hydra/launcher=submitit_slurm", exp, "seed=1,2", sweep, match="additional_parameters.comment"
    )


# ---------------------------------------------------------------------------------------------------
# What a launcher turns into its jobs' environment, command line or script (docs/launchers.md).

SLURM = ("-m", "hydra/launcher=submitit_slurm", "seed=1,2")


def test_ld_preload_through_slurm_directives_is_refused_from_the_command_line(tmp_path):
    # The example: `#SBATCH --export=ALL,LD_PRELOAD=/x/evil.so` in every job script.
    proc = cli_in_process(
        *SLURM,
        '+hydra.launcher.additional_parameters.export="ALL,LD_PRELOAD=/x/evil.so"',
        f"hydra.sweep.dir={tmp_path / 's'}",
    )
    refused(proc, "hydra.launcher.additional_parameters.export='ALL,LD_PRELOAD=/x/evil.so'")
    assert "#SBATCH directives" in proc.stderr and not (tmp_path / "s").exists()


def test_ld_preload_through_slurm_directives_is_refused_from_an_experiment_file(tmp_path):
    exp = experiment(
        tmp_path, "x", 'hydra:\n  launcher:\n    additional_parameters:\n      export: "ALL,LD_PRELOAD=/x/evil.so"\n'
    )
    proc = cli_in_process("--config-dir", tmp_path / "extra", *SLURM, exp, f"hydra.sweep.dir={tmp_path / 's'}")
    refused(proc, "hydra.launcher.additional_parameters.export='ALL,LD_PRELOAD=/x/evil.so'")


@pytest.mark.parametrize(
    "override,key",
    [
        ("+hydra.launcher.srun_args=['--export=ALL,LD_PRELOAD=/x/evil.so']", "hydra.launcher.srun_args"),
        ("+hydra.launcher.teardown=[touch /tmp/x]", "hydra.launcher.teardown"),
        ("hydra.launcher.setup=['export LD_PRELOAD=/x/evil.so']", "hydra.launcher.setup"),
        (
            "+hydra.launcher.additional_parameters.export-file=/x/env",
            "hydra.launcher.additional_parameters.export-file",
        ),
        ("+hydra.launcher.additional_parameters.get_user_env=1", "hydra.launcher.additional_parameters.get_user_env"),
        ("+hydra.launcher.additional_parameters.chdir=/tmp", "hydra.launcher.additional_parameters.chdir"),
    ],
)
def test_a_slurm_field_that_could_carry_code_is_refused(tmp_path, override, key):
    experiment(tmp_path, "unused", "")
    preflight_refuses(tmp_path, *SLURM, override, f"hydra.sweep.dir={tmp_path / 's'}", match=f"{re.escape(key)}=")


def test_the_listed_slurm_fields_pass_the_rules(tmp_path):
    # The rules pass it; then only the missing Slurm (no sbatch here) refuses it, with its own message.
    experiment(tmp_path, "unused", "")
    preflight_refuses(
        tmp_path,
        *SLURM,
        "hydra.launcher.partition=gpu",
        "+hydra.launcher.additional_parameters.mail-type=END",
        "+hydra.launcher.additional_parameters.time=60",
        f"hydra.sweep.dir={tmp_path / 's'}",
        match="needs Slurm",
    )


@pytest.mark.parametrize(
    "launcher,override",
    [
        ("isolated", "+hydra.launcher.env={LD_PRELOAD: /x/evil.so}"),
        ("basic", "+hydra.launcher.n_jobs=2"),
        ("submitit_local", "+hydra.launcher.setup=[touch /tmp/x]"),
        ("joblib", "+hydra.launcher.initializer=os.system"),
    ],
)
def test_a_field_a_launcher_does_not_have_is_refused(tmp_path, launcher, override):
    experiment(tmp_path, "unused", "")
    sweep = f"hydra.sweep.dir={tmp_path / 's'}"
    key = override.split("=", 1)[0].lstrip("+")
    preflight_refuses(tmp_path, "-m", f"hydra/launcher={launcher}", "seed=1,2", override, sweep, match=re.escape(key))


def test_joblibs_temp_folder_stays_inside_the_sweep_dir(tmp_path):
    experiment(tmp_path, "unused", "")
    sweep = f"hydra.sweep.dir={tmp_path / 's'}"
    args = ("-m", "hydra/launcher=joblib", "seed=1,2", sweep)
    preflight_refuses(tmp_path, *args, f"hydra.launcher.temp_folder={tmp_path}", match="inside the sweep directory")
    from runner.__main__ import train
    from runner.cli.preflight import preflight

    preflight(train.app, [*args, f"hydra.launcher.temp_folder={tmp_path / 's' / 'joblib'}"])


def test_env_copy_takes_only_harmless_names(tmp_path, monkeypatch):
    # Hydra copies the variable from the environment into env_set when it composes.
    monkeypatch.setenv("PYTHONSTARTUP", "/x/evil.py")
    experiment(tmp_path, "unused", "")
    run = f"hydra.run.dir={tmp_path / 'r'}"
    preflight_refuses(tmp_path, "hydra.job.env_copy=[PYTHONSTARTUP]", run, match=r"PYTHONSTARTUP.* is refused")


@pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "RUNNER_TEST_UNSET"])
def test_env_copy_of_an_unset_variable_says_it_is_not_set_not_the_hydra_version(tmp_path, monkeypatch, name):
    # Hydra's config loader reads os.environ[name] for each entry: a bare KeyError, not a check that failed.
    monkeypatch.delenv(name, raising=False)
    proc = cli_in_process(f"hydra.job.env_copy=[{name}]", f"hydra.run.dir={tmp_path / 'r'}")
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "hydra-core" not in text, proc.stderr
    assert f"hydra.job.env_copy names {name}" in text and not (tmp_path / "r").exists()
    # An allowed name is only missing; any other is refused whether set or not (the rule above).
    assert ("which is not set in this environment" in text) == (name == "OMP_NUM_THREADS"), text


def test_a_hydra_group_option_outside_the_list_is_refused(tmp_path):
    # A --config-dir may add options under hydra/: only the shipped names are chosen.
    (tmp_path / "extra" / "hydra" / "launcher").mkdir(parents=True)
    (tmp_path / "extra" / "hydra" / "launcher" / "mine.yaml").write_text(
        "_target_: hydra_plugins.runner_launcher.isolated_launcher.IsolatedLauncher\n"
    )
    preflight_refuses(
        tmp_path,
        "-m",
        "hydra/launcher=mine",
        "seed=1,2",
        f"hydra.sweep.dir={tmp_path / 's'}",
        match=r"hydra.runtime.choices.hydra/launcher='mine' is refused",
    )


# ---------------------------------------------------------------------------------------------------
# What the sweeper or the configuration cannot do, refused before the first job.


def test_a_multi_objective_optuna_search_is_refused_before_the_first_trial(tmp_path):
    sweep = tmp_path / "s"
    proc = cli_in_process(
        "-m", "hydra/sweeper=optuna_accuracy", "hydra.sweeper.direction=[maximize,minimize]", f"hydra.sweep.dir={sweep}"
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "hydra.sweeper.direction=['maximize', 'minimize'] is refused: each run returns one number" in " ".join(
        proc.stderr.split()
    )
    assert not sweep.exists()


def test_an_interval_given_high_to_low_is_refused(tmp_path):
    proc = cli_in_process(
        "-m", "hydra/sweeper=optuna_accuracy", "optim.lr=interval(0.3,0.01)", f"hydra.sweep.dir={tmp_path / 's'}"
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "Write interval(0.01, 0.3)" in " ".join(proc.stderr.split()), proc.stderr


def test_a_launcher_chosen_in_an_experiment_file_is_one_paragraph(tmp_path):
    # Its fields land on the runner's default launcher (conf/config.yaml chooses it): refused, with the fix.
    exp = experiment(
        tmp_path, "x", "defaults:\n  - override /hydra/launcher: joblib\nhydra:\n  launcher:\n    n_jobs: 2\n"
    )
    proc = cli_in_process(
        "--config-dir", tmp_path / "extra", "-m", exp, "seed=1,2", f"hydra.sweep.dir={tmp_path / 's'}"
    )
    refused(proc, "hydra.launcher.n_jobs=2")
    assert "choose it on the command line (hydra/launcher=joblib)" in " ".join(proc.stderr.split())


@pytest.mark.parametrize("override", ["logger=[]", "logger=null", "~logger"])
def test_no_logger_at_all_is_refused_with_the_reason(tmp_path, override):
    proc = cli_in_process(override, f"hydra.run.dir={tmp_path / 'r'}")
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"'{override}' leaves the config group logger with no option" in text and "hydra-core" not in text
    assert "logger=csv (the default) is that alone" in text and not (tmp_path / "r").exists()
