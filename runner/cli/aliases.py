"""The console scripts' old names (msrun-train, ...), kept for one release: one deprecation line, then the command.

They were renamed because `msrun` is MindSpore's own distributed launcher, which the runner also calls.
"""

import importlib
import sys
from typing import Callable, Dict, Tuple

# old name -> (new name, "module:function" the new name runs), as in pyproject.toml [project.scripts]
RENAMED: Dict[str, Tuple[str, str]] = {
    "msrun-train": ("runner-train", "runner.__main__:train"),
    "msrun-evaluate": ("runner-evaluate", "runner.cli.commands:evaluate"),
    "msrun-predict": ("runner-predict", "runner.cli.commands:predict"),
    "msrun-export": ("runner-export", "runner.cli.commands:export"),
}


def _alias(old: str) -> Callable[[], None]:
    new, target = RENAMED[old]

    def cli() -> None:
        if not {"-sc", "--shell-completion"} & set(sys.argv[1:]):  # completion's stderr lands on the prompt line
            print(
                f"{old} is deprecated and will be removed in the next release: use {new}.", file=sys.stderr, flush=True
            )
        module, function = target.split(":")
        getattr(importlib.import_module(module), function)()

    cli.__doc__ = f"The deprecated console script {old}: {new} after a warning."
    return cli


msrun_train = _alias("msrun-train")
msrun_evaluate = _alias("msrun-evaluate")
msrun_predict = _alias("msrun-predict")
msrun_export = _alias("msrun-export")
