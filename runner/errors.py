"""Errors a user can fix: the CLI prints their message as one paragraph and exits 2, no traceback.

`models/` and `datasets/` raise their own error types (they never import the runner); user_errors()
names them all for the CLI.
"""

import signal
import sys
import textwrap

from runner.datasets.errors import DataError
from runner.models.errors import ModelError


class UserError(Exception):
    """A mistake in the configuration, the data or the environment; the message names the culprit."""


class ConfigError(UserError):
    """A configuration value that composes but cannot be run (out of range, contradictory)."""


class InputError(UserError):
    """Files a command was given to read (predict's input=) that are missing or unreadable. (The data
    layer's own DataError is runner.datasets.DataError.)"""


def signal_name(signum: int) -> str:
    """`SIGINT (signal 2)`: how a run names the signal that stopped it (the command exits 128 + signum)."""
    try:
        return f"{signal.Signals(signum).name} (signal {signum})"
    except ValueError:
        return f"signal {signum}"


class Interrupted(Exception):
    """SIGINT or SIGTERM stopped a run that the Python API started (the CLI exits 128+signal instead);
    what the run saved is kept, and resume=true continues it."""

    def __init__(self, signum: int, run_dir: str):
        super().__init__(
            f"{signal_name(signum)} stopped the run in {run_dir}; its checkpoints are kept, and resume=true with the "
            "same run directory continues it."
        )
        self.signum = signum
        self.run_dir = run_dir
        self.exit_code = 128 + signum  # what the command line exits with


def user_errors() -> tuple:
    """Every error type whose message is meant for the user: the runner's and the lower layers' own."""
    return (UserError, DataError, ModelError)


def print_user_error(e: BaseException) -> None:
    """A user's mistake as one readable paragraph on stderr, not a traceback; paths are never broken."""
    text = textwrap.fill(f"Error: {e}", width=100, break_on_hyphens=False, break_long_words=False)
    print(text, file=sys.stderr, flush=True)


OOM_MARKERS = ("Memory not enough", "alloc failed", "Out of memory", "out of memory")


def as_out_of_memory(err: BaseException, batch_size: int):
    """A UserError with a hint when err is MindSpore or Python running out of memory, else None."""
    text = str(err)
    if not isinstance(err, MemoryError) and not any(m in text for m in OOM_MARKERS):
        return None
    lines = [line.strip(" -#") for line in text.splitlines()]
    detail = next((line for line in lines if "alloc failed" in line), "") or next(
        (ln for ln in lines if "emory" in ln), ""
    )
    return UserError(
        f"Out of memory while training with batch_size={batch_size}{f' ({detail})' if detail else ''}. "
        f"Lower the batch size (e.g. batch_size={max(1, batch_size // 2)}), the input size (padding.height/width) "
        "or model.width. What the run saved before this is kept."
    )
