"""The signal that ends a run (no MindSpore import: recipe.py catches it before MindSpore loads), and how
SIGINT reaches the runner's handlers past MindSpore's own.

MindSpore's GraphScheduler::Run installs, at the start of every graph run (each training step), a C-level
SIGINT handler (DefaultIntHandler, libmindspore_common) that only does `kill(getpid(), SIGTERM)`; it replaces
whatever Python installed, and no setting turns it off (docs/mindspore-notes.md#sigint-handler). So a SIGINT
after the first step reached the runner as SIGTERM: `kill -INT` or Ctrl-C mid-training said "SIGTERM" and
exited 143. route_sigint() blocks SIGINT in every thread and takes it with sigwait in a thread of its own,
which hands it to the main thread's Python handler: MindSpore's handler never runs, whatever it installs.
"""

import _thread
import contextlib
import signal
import threading

from runner.errors import signal_name

__all__ = [
    "FinalPhaseInterrupted",
    "note_signal",
    "received",
    "route_sigint",
    "sigint_delivered",
    "signal_name",
    "signal_of",
]

# A no-op handler on a signal nobody else uses: sent to the main thread, it ends a blocking system call
# (a wait on the compiler or on a sweep's job) so that the SIGINT handed over is acted on at once.
_WAKE = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else None
_router: "threading.Thread | None" = None
_received: "int | None" = None  # the last SIGINT/SIGTERM a handler of the command line took (note_signal)


def note_signal(signum: int) -> None:
    """Remember the signal the command line's handler raised KeyboardInterrupt for (runner/cli/app.py)."""
    global _received
    _received = signum


def received() -> int:
    """The signal behind a KeyboardInterrupt: the one noted, else SIGINT (Python's own Ctrl-C)."""
    return _received if _received is not None else int(signal.SIGINT)


def signal_of(error: BaseException) -> "int | None":
    """The signal an exception that ended a run stands for (Interrupted, KeyboardInterrupt), None for an error."""
    from runner.errors import Interrupted

    if isinstance(error, Interrupted):
        return error.signum
    return received() if isinstance(error, KeyboardInterrupt) else None


class FinalPhaseInterrupted(BaseException):
    """SIGINT/SIGTERM arrived after training, while the run evaluated or wrote its report.

    A BaseException, as KeyboardInterrupt is: library code that catches Exception must not swallow it.
    """

    def __init__(self, signum: int):
        super().__init__(signal_name(signum))
        self.signum = signum


def route_sigint() -> bool:
    """Take SIGINT away from C-level handlers for this process and the threads it starts from now on.

    Call it from the main thread before MindSpore starts its threads (a thread keeps the signal mask it
    was created with). Processes started afterwards inherit SIGINT blocked: a runner command among them
    routes it again; msrun is started inside sigint_delivered(); the onednn compiler and the matmul probe
    need no SIGINT of their own (this process stops them). Returns whether routing is on."""
    global _router
    if _WAKE is None or threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(_WAKE, _wake)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    if _router is None:  # one per process: it serves every later command run in it (the tests' in-process runs)
        _router = threading.Thread(target=_hand_over, args=(threading.main_thread().ident,), daemon=True)
        _router.name = "runner-sigint"
        _router.start()
    return True


def _wake(signum, frame) -> None:
    """Nothing: the signal only interrupts the main thread's system call."""


def _hand_over(main_thread: int) -> None:
    assert _WAKE is not None  # route_sigint starts no router without it
    while True:
        signal.sigwait({signal.SIGINT})
        handler = signal.getsignal(signal.SIGINT)
        if handler is signal.SIG_IGN:
            continue
        if handler in (signal.SIG_DFL, None):
            # Not Python's to handle: the signal meets the C-level action (the default ends the process).
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            continue
        _thread.interrupt_main(signal.SIGINT)  # the main thread runs the Python handler, with signum 2
        signal.pthread_kill(main_thread, _WAKE)


@contextlib.contextmanager
def sigint_delivered():
    """SIGINT unblocked in this thread meanwhile: a process started inside inherits the usual signal mask."""
    old = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
