"""The signal that ends a run after its training (no MindSpore import: run.py catches it before MindSpore loads)."""

import signal


def signal_name(signum: int) -> str:
    """`SIGINT (signal 2)`: what the run says when a signal stops it (it then exits 128 + signum)."""
    try:
        return f"{signal.Signals(signum).name} (signal {signum})"
    except ValueError:
        return f"signal {signum}"


class FinalPhaseInterrupted(BaseException):
    """SIGINT/SIGTERM arrived after training, while the run evaluated or wrote its report.

    A BaseException, as KeyboardInterrupt is: library code that catches Exception must not swallow it.
    """

    def __init__(self, signum: int):
        super().__init__(signal_name(signum))
        self.signum = signum
