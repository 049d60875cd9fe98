"""A signal in the first moments of a command, before runner/cli/app.py's handlers, and the quiet exit every
interrupted command ends with. Standard library only: runner/__init__.py installs the handlers first thing.

Two ways an interrupted command used to end badly, both measured on MindSpore 2.10:
- SIGINT during the imports before the command's function runs (Hydra, ~0.7 s): Python's own handler
  raised KeyboardInterrupt outside any handler, a traceback; SIGTERM's default ended it silently (rc -15).
- SIGINT or SIGTERM while `import mindspore` runs (the first seconds of a run, after the `model.conv` line):
  the import is abandoned half done, and the interpreter's exit then runs MindSpore's native atexit hook
  (pybind_api/init.cc, "Failed to parse profiler data"), which imports the rest of MindSpore during
  shutdown: ~160 lines of tracebacks, then `Fatal Python error: PyThreadState_Get` and SIGABRT (exit 134)
  (docs/mindspore-notes.md#atexit-half-import).
"""

import os
import signal
import sys


def _named(signum: int) -> str:
    # runner/errors.py signal_name's words, without its imports (omegaconf: ~0.25 s before the first line)
    try:
        return f"{signal.Signals(signum).name} (signal {signum})"
    except ValueError:
        return f"signal {signum}"


def mindspore_half_loaded() -> bool:
    """Whether `import mindspore` began in this process and did not complete (it was interrupted): parts of
    it are loaded, its native library among them, and the package itself is not."""
    package = sys.modules.get("mindspore")
    parts = any(name.startswith("mindspore.") for name in list(sys.modules))
    if package is None:
        return parts
    spec = getattr(package, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))  # still importing: a signal handler's exit mid-import


def exit_interrupted(signum: int, at_once: bool = False) -> None:
    """Say which signal stopped the command, in one line on stderr, and exit 128 + signum.

    With MindSpore half imported, the interpreter's usual exit would crash in MindSpore's atexit hook (see
    the module's docstring), so the process ends at once (as with at_once), after flushing what it wrote:
    everything a run saves is written by then, and the kernel releases its run directory's lock."""
    take_back()
    print(f"Interrupted by {_named(signum)}.", file=sys.stderr, flush=True)
    code = 128 + signum
    if at_once or mindspore_half_loaded():
        import logging

        logging.shutdown()  # runner.log's last records
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)


def _while_starting(signum, frame):
    exit_interrupted(signum)


def _while_exiting(signum, frame):
    exit_interrupted(signum, at_once=True)


def catch_signals_while_exiting() -> None:
    """The command's work is done (or given up): a signal from now on, while the interpreter shuts down
    (logging's and MindSpore's atexit hooks), ends the process at once with the same one line. Raised as
    KeyboardInterrupt there, it printed "Exception ignored in atexit callback" and a traceback, exit 0."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _while_exiting)


def is_command() -> bool:
    """Whether this process was started as one of the runner's commands: a console script (`runner-train`,
    `msrun-train`, ...) or `python -m runner...`; not a test session, a notebook or a script importing it."""
    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    if script.startswith(("runner-", "msrun-train")):
        return True
    argv = getattr(sys, "orig_argv", None)  # Python 3.10+
    if argv is None:
        return script == "-m"  # Python 3.9: sys.argv[0] is "-m" while `python -m` imports the package
    if "-m" not in argv[1:]:
        return False
    at = argv.index("-m", 1) + 1
    return at < len(argv) and argv[at].split(".")[0] == "runner"


def catch_signals_while_starting() -> None:
    """In a runner command: SIGINT and SIGTERM end it with one line and 128 + the signal from its first
    import on, until runner/cli/app.py installs the command's own handlers. Handlers someone else set (a
    SIGINT ignored by a shell for a background job) are left alone."""
    if not is_command():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _while_starting)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _while_starting)


# Hydra's flags that only print, and the sweep's: no status line for them (runner/cli/app.py prints_only).
_NO_STATUS = ("-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "-sc", "--shell-completion", "-m")
_NO_STATUS_TOO = ("--multirun", "--version", "-p", "--package")
_said = False  # an unfinished line of say_starting is on the terminal


def say_starting(train_command: bool) -> None:
    """The training command's first output, before its imports (Hydra: ~0.7 s, on a loaded machine 2 s and
    more): an unfinished line on the terminal, which the status line replaces (runner/report/screen.py) and
    any other first output takes back (take_back). train_command: this process runs `runner-train` or
    `python -m runner`, not a module that imports it (a sweep's job)."""
    global _said
    argv = sys.argv[1:]
    if not (train_command and is_command()) or any(a in _NO_STATUS + _NO_STATUS_TOO for a in argv):
        return
    try:
        if sys.stdout.isatty():
            sys.stdout.write("starting the run (loading Hydra)...")
            sys.stdout.flush()
            _said = True
    except (OSError, ValueError, AttributeError):
        pass


def take_back() -> None:
    """Erase say_starting's line (carriage return, erase the line), before anything else is printed."""
    global _said
    if _said:
        _said = False
        try:
            sys.stdout.write("\r\x1b[2K")
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
