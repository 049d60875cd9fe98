"""What every command of the runner does around its Hydra task: the console scripts
(pyproject.toml `[project.scripts]`) and `python -m runner` both start here.

A runner app is a module with a task function `main(cfg)` and one line `cli = entry_point(main,
config_name="<name>")`; entry_point applies `hydra.main` itself (conf/ is the package's, runner/cli/hydra_seam.py
CONFIG_PATH), so it knows the app's config path and name, and wraps the task in the one error handler
(`handled`). Its console script is one line in pyproject.toml (`runner-<name> = "runner.<module>:cli"`), and
Hydra's shell completion works for it like for `runner-train`. `python -m runner.<module>` runs the same `cli()`.
"""

import functools
import logging
import math
import os
import signal
import sys
import traceback
from dataclasses import dataclass, field
from typing import Callable, Optional

import hydra

from hydra_plugins.runner_launcher import isolated_launcher, optuna_sweeper
from runner.cli import argv as argv_checks
from runner.cli import hydra_seam
from runner.cli.starting import catch_signals_while_exiting, exit_interrupted, take_back
from runner.errors import Interrupted, print_user_error, user_errors
from runner.training.interrupts import FinalPhaseInterrupted, note_signal, route_sigint

# The signal (SIGINT or SIGTERM) that reached this process through the CLI's own handler; False: none.
_interrupted: "int | bool" = False


def interrupted() -> bool:
    """Whether this process got SIGINT (Ctrl-C) or SIGTERM before a run's own handlers took over."""
    return bool(_interrupted)


def _on_signal(signum, frame):
    global _interrupted
    _interrupted = signum
    note_signal(signum)  # for the run's record of what stopped it (runner/rundir/status.py record_end)
    raise KeyboardInterrupt


# Kept for the sweep's job process (runner/cli/job_process.py): the same handler, under its old name.
_on_sigint = _on_signal


def quiet_interrupt(signum: "int | None" = None) -> None:
    """Exit 128 + signum (130 for Ctrl-C, 143 for SIGTERM), naming the signal, without a traceback. Without
    signum: the signal the CLI's handler saw (SIGINT when none was recorded: Python's own Ctrl-C)."""
    if signum is None:
        signum = int(_interrupted) if _interrupted else int(signal.SIGINT)
    exit_interrupted(signum)


def interrupt_signal():
    """The signal that stopped this command, itself or its sweep's running job (None: no signal)."""
    name = isolated_launcher.interruption()["signal"]
    if name is not None:
        return int(signal.Signals[name])
    return int(_interrupted) if _interrupted else None


def prints_only(argv) -> bool:
    """Whether argv asks Hydra only to print (--help, --hydra-help, --cfg, --info, -sc shell completion)."""
    try:
        args = hydra_seam.args_parser().parse_args(argv)
    except SystemExit:
        return False  # Hydra prints argparse's usage itself
    return bool(args.help or args.hydra_help or args.cfg or args.info or args.shell_completion)


@dataclass(frozen=True)
class HydraApp:
    """One command as Hydra sees it: its task function and the config it composes (conf/<config_name>.yaml);
    `before_run(job config, output dir, task overrides, in_sweep)` refuses before Hydra writes anything."""

    task: Callable
    config_name: str
    config_path: str = hydra_seam.CONFIG_PATH
    before_run: Optional[Callable] = field(default=None, compare=False)


def in_sweep() -> bool:
    """Whether the task runs as a job of a sweep (-m), where a failure is recorded and the others go on."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN


def handled(task: Callable) -> Callable:
    """The task as every command runs it, here and in a sweep's job process: the one error handler.
    A user's mistake (runner/errors.py user_errors) is one paragraph and exit 2; a signal that stopped a
    run (Interrupted) exits 128 + the signal; in a sweep a failed job prints its error, leaves failed.json
    for the summary (runner/report/sweep.py) and returns NaN, and the other jobs go on."""

    @functools.wraps(task)
    def run(cfg):
        # A log line that cannot be written (disk full) must not print a traceback of its own: the
        # failure that matters is reported as one paragraph below.
        logging.raiseExceptions = False
        route_sigint()  # in a launcher's worker process too (joblib, submitit): the CLI's cli() did not run there
        try:
            return task(cfg)
        except Interrupted as e:
            raise SystemExit(e.exit_code) from None
        except Exception as e:
            if interrupted():  # Ctrl-C inside an import surfaces as some other error
                quiet_interrupt()
            mine = isinstance(e, user_errors())
            if not in_sweep():
                if not mine:
                    raise
                print_user_error(e)
                sys.exit(2)
            _record_failed_job(e, mine)
            return math.nan

    return run


def _record_failed_job(e: BaseException, mine: bool) -> None:
    from hydra.core.hydra_config import HydraConfig

    from runner.rundir.atomic import write_json
    from runner.rundir.layout import RunDir
    from runner.rundir.status import held_by_another

    if mine:
        print_user_error(e)
    else:
        traceback.print_exc()
    job_dir = HydraConfig.get().runtime.output_dir
    if held_by_another(job_dir):
        return  # another live process's job (this one was refused for that): its directory is not this job's record
    write_json(RunDir(job_dir).failed, {"error": str(e), "error_type": type(e).__name__})


def _register_plugins() -> None:
    from hydra.core.plugins import Plugins

    # Hydra finds plugins by walking the hydra_plugins namespace on disk; pip's default editable
    # install maps packages with an import hook instead, so the launcher is registered by hand.
    Plugins.instance().register(isolated_launcher.IsolatedLauncher)
    Plugins.instance().register(optuna_sweeper.OptunaSweeper)
    optuna_sweeper.route_plugin_config()


def entry_point(task, *checks: Callable, config_name: str, before_run=None, shows_status: bool = False):
    """The console-script function for a task `main(cfg)` composed from conf/<config_name>.yaml: the
    command's own `checks(argv)`, the pre-flight checks (runner/cli/preflight.py) with the command's
    `before_run(job config, output dir, overrides, in_sweep)` (what must refuse before Hydra writes into the
    output directory), then `hydra.main` on the task wrapped in `handled`. shows_status: a run on its own on a
    terminal shows what it does from its first second on (runner/report/screen.py).

    Exit codes: 0 done, 1 some jobs of a sweep failed, 2 a user error (one paragraph), 128 + the signal that
    stopped it (130 Ctrl-C, 143 SIGTERM).
    """
    app = HydraApp(task=task, config_name=config_name, before_run=before_run)
    hydra_main = hydra.main(version_base=hydra_seam.VERSION_BASE, config_path=app.config_path, config_name=config_name)
    run_hydra = hydra_main(handled(task))

    def cli() -> None:
        from runner.report import startup

        startup.command_started(cli)  # metrics.json's startup: the import phase ends here
        _register_plugins()
        _catch_interrupts()
        early = argv_checks.answer_early(argv_checks.command_name(config_name), sys.argv[1:], _keys_of(app))
        if early is not None:
            sys.exit(early)
        # hydra.main reads sys.argv itself: `+experiment=x` of earlier releases becomes the slot's experiment=x.
        sys.argv[1:] = argv_checks.hydra_overrides(sys.argv[1:], app.config_name, app.config_path)
        argv = sys.argv[1:]
        prints = prints_only(argv)
        take_back()  # the first words runner/__main__.py said: the status line takes their place
        if shows_status and not prints and not ({"-m", "--multirun"} & set(argv)):
            from runner.report import screen

            screen.enable_status()
            screen.status("composing the configuration")
        if prints:
            # `runner-evaluate -sc install=bash | head`: Hydra reports a BrokenPipeError as a traceback
            # of its own; a printing command dies of SIGPIPE quietly like any Unix tool. (Not for a
            # training run, which must end by its own rules, whatever reads its output.)
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        try:
            _ending_quietly(lambda: _check_then_run(app, checks, argv, prints, run_hydra))
        finally:
            catch_signals_while_exiting()  # first: from here to the interpreter's end a signal is one line too
            startup.command_ended()
            _end_status()
        sys.exit(_exit_status())

    cli.__doc__ = f"Console entry point of {task.__module__}.{task.__name__} (conf/{config_name}.yaml)."
    cli.app = app  # type: ignore[attr-defined]
    return cli


def _keys_of(app: HydraApp) -> Callable[[], list]:
    """The settings and config groups of the app's default configuration (what a `--key` may have meant)."""

    def keys() -> list:
        from omegaconf import OmegaConf

        from runner.config.suggest import config_keys

        try:
            with hydra_seam.composer(app.task, app.config_path, None) as hydra:
                body = OmegaConf.to_container(hydra.compose(app.config_name, [], False))
                assert isinstance(body, dict)
                return config_keys(body) + hydra.groups()
        except Exception:  # only a suggestion: without it the paragraph still says what to type
            return []

    return keys


def _end_status() -> None:
    screen = sys.modules.get("runner.report.screen")  # only where a status line may show
    if screen is not None:
        screen.end_status()


def job_task(module: str, name: str) -> Callable:
    """The task a sweep's job process runs, wrapped in `handled` as entry_point wraps it: `name` is the
    task function's name in `module` (hydra_plugins/runner_launcher/isolated_launcher.py task_reference)."""
    import importlib

    return handled(getattr(importlib.import_module(module), name))


def _catch_interrupts() -> None:
    # Python's own SIGINT handler raises KeyboardInterrupt too, but an import interrupted halfway
    # can turn it into another error (measured: "ImportError: initialization failed" from MindSpore's
    # native module; a NameError from scipy): the flag keeps the fact that it was Ctrl-C.
    # SIGTERM as well: its default ends the process at once, silently (rc -15), in the seconds before a
    # run's own handlers (runner/training/checkpoints.py) take over, and a subprocess it waits on (the
    # onednn build) is left running; as an exception it unwinds and ends as 143, the signal named.
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    # MindSpore turns SIGINT into SIGTERM once a graph runs; routed, it reaches _on_signal and the run's
    # own handler as SIGINT. This is also why a SIGINT ignored at start (a background job of a script)
    # stops the command: `kill -INT` is a request to stop (docs/checkpoints.md).
    route_sigint()
    sys.unraisablehook = _signal_again_if_swallowed


def _signal_again_if_swallowed(unraisable, _python_hook=sys.unraisablehook) -> None:
    """Python ignores an exception raised while a __del__ runs: an interrupt landing in one (a MindSpore Cell
    collected while the run ends, seen in CI) printed "Exception ignored in: <function Cell.__del__>" and a
    traceback, and the signal was lost. Raise it again 10 ms later, outside the finalizer, in the code the
    collection interrupted, which then unwinds as any interrupt does. That holds for the CLI's KeyboardInterrupt
    and for the run's own FinalPhaseInterrupted (a signal in the final phase, runner/training/checkpoints.py),
    whose handler has already given way. (A timer's SIGALRM, not the signal itself: raised here, its handler
    would run inside this hook.)"""
    error = unraisable.exc_value
    ours = isinstance(error, FinalPhaseInterrupted) or (isinstance(error, KeyboardInterrupt) and _interrupted)
    if ours:

        def again(_alarm, frame):
            raise error

        signal.signal(signal.SIGALRM, again)
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        return
    _python_hook(unraisable)


def _check_then_run(app: HydraApp, checks, argv, prints: bool, run_hydra: Callable[[], None]) -> None:
    """The command's own checks and the pre-flight (a user's mistake: one paragraph, exit 2), then Hydra."""
    from runner.cli.preflight import preflight

    try:
        # The command's own checks (the run= it needs) are for running it, not for Hydra's printing flags.
        for check in () if prints else checks:
            check(argv)
        preflight(app, argv)
    except user_errors() as e:
        print_user_error(e)
        sys.exit(2)
    run_hydra()


def _ending_quietly(body: Callable[[], None]) -> None:
    """body, with an interrupt or a closed pipe ending the command as a Unix tool ends, not as a traceback."""
    try:
        body()
    except KeyboardInterrupt:
        quiet_interrupt()
    except BrokenPipeError:
        # `runner-train --help | head`: the reader is gone. As a SIGPIPE'd Unix tool: exit 141, quietly;
        # stdout goes to /dev/null first, or the interpreter's final flush raises it again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    except Exception:
        if _interrupted:
            quiet_interrupt()
        raise


def _exit_status() -> int:
    """0 done, 1 some jobs of a sweep failed; a signal that stopped the command exits here as 128 + it."""
    from runner.report.sweep import failed_jobs

    stopped_by = interrupt_signal()
    if stopped_by is not None:
        quiet_interrupt(stopped_by)
    return 1 if failed_jobs() else 0
