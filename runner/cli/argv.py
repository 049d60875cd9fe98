"""The command line before Hydra parses it: `--version`, the `--key value` habit of other trainers, and the
`+experiment=` spelling of earlier releases.

Hydra's own parser (argparse) is called three times on one command line (the printing-only test, the
pre-flight check, hydra.main), so its answers to `--version` or an unknown option would print three times;
they are answered here once, before any of them.
"""

import os
import sys
from importlib import metadata
from typing import Callable, List, Optional, Tuple

from runner.cli import hydra_seam
from runner.config.overrides import slotted
from runner.errors import ConfigError


def version_line(command: str) -> str:
    """`runner-train 0.2.0 (mindspore-runner; MindSpore 2.10.0, Hydra 1.3.8, OmegaConf 2.3.0)`."""

    def of(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (
        f"{command} {of('mindspore-runner')} (mindspore-runner; MindSpore {of('mindspore')}, "
        f"Hydra {of('hydra-core')}, OmegaConf {of('omegaconf')})"
    )


def _parser_options() -> Tuple[List[str], List[str]]:
    """(every option string of Hydra's parser, those that take a value)."""
    # argparse keeps the option strings on its actions; Hydra's parser exposes no list of its own.
    actions = hydra_seam.args_parser()._actions
    every = [s for a in actions for s in a.option_strings]
    return every, [s for a in actions if a.nargs != 0 for s in a.option_strings]


def _option(token: str, known: List[str]) -> Optional[str]:
    """The option of Hydra's parser that argparse takes token for (exactly, or a long option's unique prefix)."""
    name = token.split("=", 1)[0]
    if name in known:
        return name
    if not name.startswith("--"):
        return None
    candidates = [k for k in known if k.startswith(name)]
    return candidates[0] if len(candidates) == 1 else None


def foreign_options(argv: List[str]) -> Tuple[List[str], List[Tuple[str, str]], List[str]]:
    """(the tokens that are neither Hydra's options nor overrides, as written; their (key, value); the other
    tokens) for argv:
    `--model=x` and `--epochs 1` are (model, x) and (epochs, 1), a bare `--flag` is (flag, true), dashes in a
    name are underscores (`--batch-size` is batch_size). Hydra's own options and their values are left alone."""
    known, takes_value = _parser_options()
    foreign: List[str] = []
    pairs: List[Tuple[str, str]] = []
    rest: List[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("-") or token == "-" or _is_number(token):
            rest.append(token)
            continue
        option = _option(token, known)
        # `runner-evaluate --run outputs/x`: Hydra's --run takes no value, and `outputs/x` is no override; the
        # user meant the setting run=.
        bare_value = i < len(argv) and not argv[i].startswith("-") and "=" not in argv[i]
        if option is not None and not (option == "--run" and "=" not in token and bare_value):
            rest.append(token)
            if option in takes_value and "=" not in token and i < len(argv):
                rest.append(argv[i])  # `--config-dir conf`: conf is the option's value, not an override
                i += 1
            continue
        name, eq, value = token.partition("=")
        written = [token]
        if not eq and i < len(argv) and not argv[i].startswith("-") and "=" not in argv[i]:
            value = argv[i]
            written.append(argv[i])
            i += 1
        elif not eq:
            value = "true"
        foreign.append(" ".join(written))
        pairs.append((name.lstrip("-").replace("-", "_"), value))
    return foreign, pairs, rest


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def foreign_options_error(
    command: str, argv: List[str], known_keys: Optional[Callable[[], List[str]]] = None
) -> Optional[ConfigError]:
    """One paragraph for `--model=resnet50 --epochs 1` (timm's, MindCV's and argparse trainers' habit): this
    runner takes key=value, and here is the translation. known_keys: the composed config's keys, to map a
    leaf name to its place (`--lr 0.1` is optim.lr=0.1) and to suggest the closest one."""
    foreign, pairs, rest = foreign_options(argv)
    if not foreign:
        return None
    keys = known_keys() if known_keys is not None else []
    placed, unknown = [], []
    for key, value in pairs:
        where = place(key, keys) if keys else key
        placed.append(f"{where}={value}")
        if keys and where not in keys and not any(k.startswith(where + ".") for k in keys):
            unknown.append(where)
    hint = ""
    if unknown:
        from runner.config.suggest import did_you_mean

        hint = " " + " ".join(f"{k} is not a setting{did_you_mean(k, keys)}." for k in unknown)
    return ConfigError(
        f"{command} takes its settings as key=value (Hydra overrides), not as --options: "
        f"`{' '.join(foreign)}` is `{' '.join(placed)}`, so the command is: {command} {' '.join(rest + placed)}."
        f"{hint} `{command} --help` lists the config groups and every setting."
    )


def place(key: str, keys: List[str]) -> str:
    """key where it is in the configuration: itself when it is a setting or a group, else the one setting whose
    last part it is (`lr` -> optim.lr), else itself."""
    if key in keys or any(k.startswith(key + ".") for k in keys):
        return key
    ends = [k for k in keys if k.endswith("." + key)]
    return ends[0] if len(ends) == 1 else key


def hydra_overrides(argv: List[str], config_name: str, config_path: str) -> List[str]:
    """argv with `+experiment=x` (earlier releases' spelling) as `experiment=x`, for the packaged train config,
    whose defaults list holds the experiment slot; any other primary config is left as written."""
    if config_name != "config" or config_path != hydra_seam.CONFIG_PATH or _other_primary(argv):
        return list(argv)
    return slotted(list(argv))


def _other_primary(argv: List[str]) -> bool:
    """Whether argv names another primary config (--config-path/--config-name): its defaults list is not ours."""
    return any(a.split("=")[0] in ("--config-path", "-cp", "--config-name", "-cn") for a in argv)


def answer_early(command: str, argv: List[str], known_keys: Callable[[], List[str]]) -> Optional[int]:
    """Answer what needs no Hydra: `--version` (printed once, exit 0) and --options (one paragraph, exit 2);
    None when the command goes on."""
    known, _ = _parser_options()
    if any(_option(a, known) == "--version" for a in argv):
        print(version_line(command), flush=True)
        return 0
    error = foreign_options_error(command, argv, known_keys) or modes_error(argv)
    if error is None:
        return None
    from runner.errors import print_user_error

    print_user_error(error)
    return 2


# Hydra runs in one of these modes; two at once end in a ValueError traceback of Hydra's own.
MODES = {"--run": "run it", "--multirun": "sweep", "--cfg": "print the configuration", "--info": "print information",
         "--shell-completion": "shell completion"}  # fmt: skip


def modes_error(argv: List[str]) -> Optional[ConfigError]:
    """One paragraph for two of Hydra's modes on one command line (`-m ... --cfg job`)."""
    known, takes_value = _parser_options()
    chosen: List[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        option = _option(token, known)
        if option is None:
            continue
        skip = option in takes_value and "=" not in token and option != "--info"
        long = next((a for a in MODES if option == a or _short_of(a) == option), None)
        if long is not None and long not in chosen:
            chosen.append(long)
    if len(chosen) < 2:
        return None
    said = " and ".join(f"{m} ({MODES[m]})" for m in chosen)
    return ConfigError(
        f"{said} cannot be combined: Hydra does one of them per command. Drop one (`--cfg job` without -m prints "
        "what the run would compose; a sweep's jobs each save theirs in <job dir>/.hydra/config.yaml)."
    )


def _short_of(long: str) -> Optional[str]:
    """Hydra's short spelling of a long option (-m for --multirun), from its parser."""
    for action in hydra_seam.args_parser()._actions:
        if long in action.option_strings:
            return next((s for s in action.option_strings if not s.startswith("--")), None)
    return None


def command_name(config_name: str) -> str:
    """How the user started the command: `runner-train`, or `python -m runner` (argv[0] is then a .py path)."""
    from runner.builtin_configs import PRIMARY

    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    if script.endswith(".py"):
        module = {"config": "runner"}.get(config_name, f"runner.{config_name}")
        return f"python -m {module}"
    return script or PRIMARY.get(config_name, "runner-train")
