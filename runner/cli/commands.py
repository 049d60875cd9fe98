"""The console scripts of the commands that use a finished run (runner-evaluate, runner-predict, runner-export)
and of runner-configs: each command's `@hydra.main` task and its entry point. The work itself is a function
of its command module (runner/evaluate.py, predict.py, export.py, configs.py), which knows nothing of the
command line; here a user's mistake becomes one paragraph and exit status 2.

`python -m runner.evaluate` (and predict, export, configs) runs the same function as the console script.
"""

import argparse
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Optional

import hydra
from hydra.core.hydra_config import HydraConfig

from runner import configs as configs_module
from runner.cli.app import entry_point
from runner.errors import ConfigError, print_user_error, user_errors
from runner.evaluate import evaluate as evaluate_run
from runner.export import export as export_run
from runner.predict import predict as predict_run
from runner.rundir.saved_run import check_run_argument, own_new_dir


@contextmanager
def reported_errors() -> Iterator[None]:
    """A user's mistake (the runner's, datasets' or models' error types) ends the command with one
    paragraph and exit status 2, never a traceback."""
    try:
        yield
    except user_errors() as e:
        print_user_error(e)
        sys.exit(2)


@hydra.main(version_base="1.3", config_path="pkg://runner.conf", config_name="evaluate")
def evaluate_task(app: Any) -> float:
    with reported_errors():
        return evaluate_run(app, HydraConfig.get().runtime.output_dir).top1


@hydra.main(version_base="1.3", config_path="pkg://runner.conf", config_name="predict")
def predict_task(app: Any) -> None:
    with reported_errors():
        predict_run(app, HydraConfig.get().runtime.output_dir)


@hydra.main(version_base="1.3", config_path="pkg://runner.conf", config_name="export")
def export_task(app: Any) -> None:
    with reported_errors():
        export_run(app, HydraConfig.get().runtime.output_dir)


def _needs_run(command: str) -> Callable[[List[str]], None]:
    """The command's check before Hydra starts: run= names a saved run (runner/rundir/saved_run.py)."""
    return lambda argv: check_run_argument(argv, command)


evaluate = entry_point(evaluate_task, _needs_run("evaluate"), before_run=own_new_dir("evaluate"))
predict = entry_point(predict_task, _needs_run("predict"), before_run=own_new_dir("predict"))
export = entry_point(export_task, _needs_run("export"), before_run=own_new_dir("export"))


def configs_main(argv: Optional[List[str]] = None) -> int:
    """runner-configs: ls or cp; 2 (one paragraph) on a mistake."""
    parser = argparse.ArgumentParser(
        prog="runner-configs", description="List the runner's built-in configs, or copy one to edit."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ls", help="list the config groups and their options")
    cp = sub.add_parser("cp", help="copy <group>/<option> (or a command's config) into a local directory")
    cp.add_argument("name", help="<group>/<option>, e.g. optim/sgd or experiment/quick; or config, evaluate, ...")
    cp.add_argument("dest", nargs="?", help="a directory (default ./conf; the group's folder is added) or a .yaml path")
    args = parser.parse_args(argv)
    try:
        if args.command == "ls":
            print(configs_module.listing())
        else:
            target = configs_module.copy(args.name, args.dest)
            print(f"Copied {args.name} to {target}. {configs_module.usage_after_copy(args.name, target)}")
    except ConfigError as e:
        print_user_error(e)
        return 2
    return 0


def configs() -> None:
    """Console entry point of runner-configs."""
    sys.exit(configs_main())
