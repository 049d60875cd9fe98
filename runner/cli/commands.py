"""The console scripts of the commands that use a finished run (runner-evaluate, runner-predict, runner-export)
and of runner-configs: each command's `@hydra.main` task and its entry point. The work itself is a function
of its command module (runner/evaluate.py, predict.py, export.py, builtin_configs.py), which knows nothing of the
command line; here a user's mistake becomes one paragraph and exit status 2.

`python -m runner.evaluate` (and predict, export, builtin_configs) runs the same function as the console script.
"""

import argparse
import os
import sys
from typing import Any, Callable, List, Optional, Sequence

from hydra.core.hydra_config import HydraConfig

from runner import builtin_configs
from runner import convert as convert_module
from runner import runs as runs_module
from runner.cli.app import entry_point
from runner.errors import ConfigError, UserError, print_user_error, user_errors
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
            print(builtin_configs.listing())
        else:
            target = builtin_configs.copy(args.name, args.dest)
            print(f"Copied {args.name} to {target}. {builtin_configs.usage_after_copy(args.name, target)}")
    except ConfigError as e:
        print_user_error(e)
        return 2
    return 0


def configs() -> None:
    """Console entry point of runner-configs."""
    sys.exit(configs_main())


RUNS_COMPLETION = """# bash completion for runner-runs: eval "$(runner-runs --completion bash)"
_runner_runs() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    case "$prev" in
        --sort|--where) return 0 ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "--sort --where --json --out --atol --help" -- "$cur"))
    elif [[ $COMP_CWORD -eq 1 ]]; then
        COMPREPLY=($(compgen -W "diff replay" -- "$cur") $(compgen -d -- "$cur"))
    else
        COMPREPLY=($(compgen -d -- "$cur"))
    fi
}
complete -o filenames -F _runner_runs runner-runs
"""


def _runs_parsers() -> "tuple[argparse.ArgumentParser, argparse.ArgumentParser, argparse.ArgumentParser]":
    listing = argparse.ArgumentParser(
        prog="runner-runs",
        description="List the run directories under DIR (default: outputs/ and multirun/) as one table: when, "
        "experiment, status (from each run's records and lock), epochs, the monitored metric, throughput, and "
        "the settings that differ between them. Also: runner-runs diff A B; runner-runs replay RUN.",
        epilog='Shell completion: eval "$(runner-runs --completion bash)". See docs/runs.md.',
    )
    listing.add_argument("dirs", nargs="*", metavar="DIR")
    listing.add_argument(
        "--sort", metavar="FIELD", help="sort by a field (val_accuracy, optim.lr, ...); -FIELD: descending"
    )
    listing.add_argument(
        "--where", metavar="KEY=VALUE", action="append", default=[], help="keep runs where KEY is VALUE (repeatable)"
    )
    listing.add_argument("--json", action="store_true", help="print JSON for scripts")
    listing.add_argument("--completion", choices=["bash"], help="print the shell completion script")
    differ = argparse.ArgumentParser(
        prog="runner-runs diff",
        description="Compare two runs: configuration (with defaults), environment, metrics and speed, side by "
        "side. Exit status: 0 the same, 1 different (speed is shown, not compared), 2 a mistake.",
    )
    differ.add_argument("a", metavar="A")
    differ.add_argument("b", metavar="B")
    differ.add_argument("--json", action="store_true")
    replayer = argparse.ArgumentParser(
        prog="runner-runs replay",
        description="Reproduce a run as it is now: its config.yaml, then every resume history.json records, in "
        "order, into a new directory; then compare the loss curve and metrics with the run's own.",
    )
    replayer.add_argument("run", metavar="RUN")
    replayer.add_argument("--out", metavar="DIR", help="where (default: RUN/replay-<time>)")
    replayer.add_argument(
        "--atol",
        type=float,
        default=1e-6,
        help="tolerance on losses and metrics (default 1e-6; resuming at an epoch boundary is bit-identical)",
    )
    return listing, differ, replayer


def runs_main(argv: Optional[List[str]] = None) -> int:
    """Run the command on argv; the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    listing, differ, replayer = _runs_parsers()
    try:
        if argv and argv[0] == "diff":
            args = differ.parse_args(argv[1:])
            return runs_module.diff(args.a, args.b, args.json)
        if argv and argv[0] == "replay":
            args = replayer.parse_args(argv[1:])
            return runs_module.replay_run(args.run, args.out, args.atol)
        args = listing.parse_args(argv)
        if args.completion:
            print(RUNS_COMPLETION, end="")
            return 0
        return runs_module.list_runs(args.dirs, args.sort, args.where, args.json)
    except UserError as e:
        print_user_error(e)
        return 2
    except KeyboardInterrupt:
        print("Interrupted by SIGINT.", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def runs() -> None:
    """Console entry point of runner-runs."""
    sys.exit(runs_main())


def convert_main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line; exit 0 written, 2 refused (one paragraph on stderr)."""
    parser = argparse.ArgumentParser(
        prog="runner-convert",
        description="Convert a torchvision or timm ResNet state dict (.pth, .pt, .safetensors) into a MindSpore "
        "checkpoint for the runner's resnet18/34/50 (init_from=) or MindCV's resnets (model.checkpoint=).",
    )
    parser.add_argument("src", metavar="SRC", help="the PyTorch state dict (.pth/.pt through torch; .safetensors)")
    parser.add_argument(
        "out", metavar="OUT", nargs="?",
        help="the checkpoint to write: .ckpt, or .safetensors for MindSpore's safetensors (default: SRC with .ckpt)",
    )  # fmt: skip
    parser.add_argument("--model", help="resnet18|resnet34|resnet50|mindcv:<arch> (default: the source's depth)")
    parser.add_argument(
        "--drop", metavar="PATTERN", nargs="+", action="extend", default=[],
        help="leave these tensors out (source or target names, module names or globs), e.g. --drop fc",
    )  # fmt: skip
    parser.add_argument("--num-classes", type=int, help="the network's classes (default: the source head's)")
    parser.add_argument("--image-size", type=int, default=224, help="side of the parity batch's images (224)")
    parser.add_argument(
        "--tolerance", type=float, default=convert_module.DEFAULT_TOLERANCE, help="largest |logit difference|"
    )
    args = parser.parse_args(argv)
    try:
        convert_module.convert_torch(
            args.src, args.out, args.model, args.drop, args.num_classes, args.image_size, args.tolerance
        )
    except user_errors() as e:
        print_user_error(e)
        return 2
    # The networks' reference cycles, collected while MindSpore is still loaded: left to interpreter
    # shutdown, each Cell.__del__ prints an ignored AttributeError once torch has been imported too.
    import gc

    gc.collect()
    return 0


def convert() -> None:
    """Console entry point of runner-convert."""
    sys.exit(convert_main())
