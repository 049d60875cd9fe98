"""The signal that ends a run after its training (no MindSpore import: recipe.py catches it before MindSpore loads)."""

from runner.errors import signal_name


class FinalPhaseInterrupted(BaseException):
    """SIGINT/SIGTERM arrived after training, while the run evaluated or wrote its report.

    A BaseException, as KeyboardInterrupt is: library code that catches Exception must not swallow it.
    """

    def __init__(self, signum: int):
        super().__init__(signal_name(signum))
        self.signum = signum
