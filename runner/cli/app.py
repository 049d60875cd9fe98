"""What every command of the runner does around its `@hydra.main` function: the console scripts
(pyproject.toml `[project.scripts]`) and `python -m runner` both start here.

A runner app is a module with a `@hydra.main(config_path="pkg://runner.conf", ...)` function `main` and one line
`cli = entry_point(main)`; its console script is one line in pyproject.toml (`runner-<name> =
"runner.<module>:cli"`), and Hydra's shell completion works for it like for `runner-train`.
`python -m runner.<module>` runs the same `cli()`.
"""

import os
import signal
import sys

from hydra_plugins.runner_launcher import isolated_launcher, optuna_sweeper
from runner.errors import print_user_error, user_errors

_interrupted = False


def interrupted() -> bool:
    """Whether this process got SIGINT (Ctrl-C) from the console."""
    return _interrupted


def _on_sigint(signum, frame):
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def quiet_interrupt(signum: int = signal.SIGINT) -> None:
    """Exit 128 + signum (130 for Ctrl-C, 143 for SIGTERM), naming the signal, without a traceback."""
    from runner.errors import signal_name

    print(f"Interrupted by {signal_name(signum)}.", file=sys.stderr, flush=True)
    sys.exit(128 + signum)


def interrupt_signal():
    """The signal that stopped this command, itself or its sweep's running job (None: no signal)."""
    name = isolated_launcher.interruption()["signal"]
    if name is not None:
        return int(signal.Signals[name])
    return int(signal.SIGINT) if _interrupted else None


def prints_only(argv) -> bool:
    """Whether argv asks Hydra only to print (--help, --hydra-help, --cfg, --info, -sc shell completion)."""
    from hydra._internal.utils import get_args_parser

    try:
        args = get_args_parser().parse_args(argv)
    except SystemExit:
        return False  # Hydra prints argparse's usage itself
    return bool(args.help or args.hydra_help or args.cfg or args.info or args.shell_completion)


def entry_point(task, *checks, before_run=None):
    """The console-script function for a `@hydra.main` task: the command's own `checks(argv)`, the
    pre-flight checks (runner/cli/preflight.py) with the command's `before_run(job config, output dir,
    overrides, in_sweep)` (what must refuse before Hydra writes into the output directory), then Hydra.

    Exit codes: 0 done, 1 some jobs of a sweep failed, 2 a user error (one paragraph), 128 + the signal that
    stopped it (130 Ctrl-C, 143 SIGTERM).
    """

    def cli() -> None:
        from hydra.core.plugins import Plugins

        from runner.cli.preflight import preflight
        from runner.report import startup

        startup.command_started(cli)  # metrics.json's startup: the import phase ends here

        # Hydra finds plugins by walking the hydra_plugins namespace on disk; pip's default editable
        # install maps packages with an import hook instead, so the launcher is registered by hand.
        Plugins.instance().register(isolated_launcher.IsolatedLauncher)
        Plugins.instance().register(optuna_sweeper.OptunaSweeper)
        optuna_sweeper.route_plugin_config()
        # Python's own SIGINT handler raises KeyboardInterrupt too, but an import interrupted halfway
        # can turn it into another error (measured: "ImportError: initialization failed" from MindSpore's
        # native module; a NameError from scipy): the flag keeps the fact that it was Ctrl-C.
        signal.signal(signal.SIGINT, _on_sigint)
        prints = prints_only(sys.argv[1:])
        if prints:
            # `runner-evaluate -sc install=bash | head`: Hydra reports a BrokenPipeError as a traceback
            # of its own; a printing command dies of SIGPIPE quietly like any Unix tool. (Not for a
            # training run, which must end by its own rules, whatever reads its output.)
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        try:
            # The command's own checks (the run= it needs) are for running it, not for Hydra's printing flags.
            for check in () if prints else checks:
                check(sys.argv[1:])
            try:
                preflight(task, sys.argv[1:], before_run)
            except user_errors() as e:
                print_user_error(e)
                sys.exit(2)
            task()
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
        finally:
            startup.command_ended()
        from runner.report.sweep import failed_jobs

        stopped_by = interrupt_signal()
        if stopped_by is not None:
            quiet_interrupt(stopped_by)
        sys.exit(1 if failed_jobs() else 0)

    cli.__doc__ = f"Console entry point of {task.__module__}.{task.__name__}."
    return cli
