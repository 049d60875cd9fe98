"""What a run shows on a terminal while it works: a status line naming the phase from the command's first
second to the first training step (the command line turns it on), then the progress bar of each epoch.
Both are rich Live displays on stdout, drawn only when stdout is a terminal; the console's log records print
above them, and nothing of either stays on screen or reaches a file.

Without the status line a run printed nothing for 7-10 s after the `model.conv` line (MindSpore's import,
the data, the network, the first step's compilation).
"""

import logging
import os
import sys
import time
from typing import Optional

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.spinner import Spinner
from rich.text import Text

_enabled = False  # the status line: the command line's training command turns it on (runner/cli/app.py)
_live: Optional[Live] = None  # the display on screen now: the status line or the progress bar
_status: Optional["_Phase"] = None
_moved: list = []  # (logging handler, the stream it had) while a display shows


def on_terminal() -> bool:
    """Whether stdout is a terminal (a display would be drawn there)."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def enable_status() -> None:
    """Let `status` draw (the training command, run on its own: a sweep's jobs share one console)."""
    global _enabled
    _enabled = True


def _stderr_here() -> bool:
    """Whether stderr is the terminal stdout is: only then do its lines print above a display through rich
    (which writes them to stdout), not when it goes to a file of its own (`2>err.log`)."""
    try:
        return os.path.samestat(os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno()))
    except (AttributeError, OSError, ValueError):
        return False


def _console() -> Console:
    # soft_wrap: a long log record stays one line the terminal wraps, as without a display (rich would break it).
    return Console(soft_wrap=True)


class _Phase:
    """The status line: a spinner, what the command does now and for how long it has done it."""

    def __init__(self) -> None:
        self.spinner = Spinner("dots")
        self.text, self.since = "", time.monotonic()

    def set(self, text: str) -> None:
        self.text, self.since = text, time.monotonic()

    def __rich__(self):
        self.spinner.update(text=Text(f"{self.text} ({time.monotonic() - self.since:.0f} s)"))
        return self.spinner


def _show(live: Live) -> None:
    """Start live, with the console's log handlers writing above it (rich's proxies for stdout/stderr)."""
    global _live
    live.start()
    _live = live
    proxies = {id(getattr(sys.stdout, "rich_proxied_file", None)): sys.stdout}
    proxies[id(getattr(sys.stderr, "rich_proxied_file", None))] = sys.stderr
    for h in logging.getLogger().handlers:
        if type(h) is logging.StreamHandler and id(h.stream) in proxies:
            _moved.append((h, h.setStream(proxies[id(h.stream)])))


def _hide() -> None:
    """Take the display off the screen; every log handler writes to its real stream again, also one made while
    the display showed (Hydra's console handler, made while the status line named the composition)."""
    global _live
    if _live is None:
        return
    _live.stop()
    _live = None
    for h, stream in _moved:
        h.setStream(stream)
    _moved.clear()
    for h in logging.getLogger().handlers:
        real = getattr(getattr(h, "stream", None), "rich_proxied_file", None)
        if type(h) is logging.StreamHandler and real is not None:
            h.setStream(real)


def status(text: str) -> None:
    """Name the phase the command is in on the status line (started on the first call); nothing when the
    status line is off, stdout is no terminal, or the progress bar shows already."""
    global _status
    if not _enabled or not on_terminal() or (_live is not None and _status is None):
        return
    if _status is None:
        _status = _Phase()
        _status.set(text)
        live = Live(_status, console=_console(), transient=True, refresh_per_second=8, redirect_stderr=_stderr_here())
        _show(live)
    else:
        _status.set(text)


def end_status() -> None:
    """The status line goes (the first step ended, or the command ends)."""
    global _status
    if _status is not None:
        _status = None
        _hide()


class EpochProgress:
    """The progress bar of the epoch in training: `epoch 3/12 ━━━━╸━━━ 20/44 steps 0:00:01 in epoch, ~0:00:12
    left in run | train_loss 0.0080 lr 0.0950 step 24.1 ms`. A no-op off a terminal."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs
        self.progress: Optional[Progress] = None
        self.task: Optional[TaskID] = None
        self.pending: Optional[dict] = None  # the epoch whose bar appears at its first step's end

    def start_epoch(self, epoch: int, steps: int, done: int = 0) -> None:
        """The bar of epoch (1-based) of `steps` steps, `done` of them already (a resumed epoch), from its first
        step's end on: until the first step of the run ends, the status line says it compiles."""
        if on_terminal():
            self.pending = {
                "total": steps,
                "completed": done,
                "epoch": f"{epoch}/{self.epochs}",
                "left": "",
                "info": "",
            }

    def _bar(self) -> None:
        if self.progress is None:
            end_status()
            self.progress = Progress(
                TextColumn("epoch {task.fields[epoch]}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("steps"),
                TimeElapsedColumn(),
                TextColumn("in epoch,{task.fields[left]}"),
                TextColumn("{task.fields[info]}"),
                console=_console(),
                transient=True,
                redirect_stderr=_stderr_here(),
            )
            _show(self.progress.live)
        elif self.task is not None:
            self.progress.remove_task(self.task)
        pending, self.pending = self.pending or {}, None
        self.task = self.progress.add_task("train", **pending)

    def update(self, done: int, left_s: Optional[float] = None, info: Optional[str] = None) -> None:
        """done: the epoch's steps so far; left_s: the run's time left, estimated; info: the latest values."""
        if self.pending is not None:
            self._bar()
        if self.progress is None or self.task is None:
            return
        fields: dict = {} if info is None else {"info": f"| {info}"}
        if left_s is not None:
            fields["left"] = f" ~{_clock(left_s)} left in run"
        self.progress.update(self.task, completed=done, **fields)

    def close(self) -> None:
        if self.progress is not None:
            self.progress = None
            _hide()


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
