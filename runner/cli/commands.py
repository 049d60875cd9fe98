"""The console scripts of the commands that use a finished run (runner-evaluate, runner-predict, runner-export)
and of runner-configs: each command's `@hydra.main` task and its entry point. The work itself is a function
of its command module (runner/evaluate.py, predict.py, export.py, configs.py), which knows nothing of the
command line; here a user's mistake becomes one paragraph and exit status 2.

`python -m runner.evaluate` (and predict, export, configs) runs the same function as the console script.
"""

import argparse
import sys
from typing import Any, Callable, List, Optional

from hydra.core.hydra_config import HydraConfig

from runner import configs as configs_module
from runner.cli.app import entry_point
from runner.errors import ConfigError, print_user_error
from runner.evaluate import evaluate as evaluate_run
from runner.export import export as export_run
from runner.predict import predict as predict_run
from runner.rundir.saved_run import check_run_argument, own_new_dir


def evaluate_task(app: Any) -> float:
    return evaluate_run(app, HydraConfig.get().runtime.output_dir).top1


def predict_task(app: Any) -> None:
    predict_run(app, HydraConfig.get().runtime.output_dir)


def export_task(app: Any) -> None:
    export_run(app, HydraConfig.get().runtime.output_dir)


def _needs_run(command: str) -> Callable[[List[str]], None]:
    """The command's check before Hydra starts: run= names a saved run (runner/rundir/saved_run.py)."""
    return lambda argv: check_run_argument(argv, command)


# entry_point applies hydra.main to each task and wraps it in the one error handler (runner/cli/app.py).
evaluate = entry_point(
    evaluate_task, _needs_run("evaluate"), config_name="evaluate", before_run=own_new_dir("evaluate")
)
predict = entry_point(predict_task, _needs_run("predict"), config_name="predict", before_run=own_new_dir("predict"))
export = entry_point(export_task, _needs_run("export"), config_name="export", before_run=own_new_dir("export"))


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
