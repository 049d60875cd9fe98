"""A MindSpore callback that times every step (or sink), keeps its outputs in the run state, and logs every
`log_every` steps."""

import logging
import sys
import time

import numpy as np
from mindspore.train import Callback
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from runner.rundir.run_state import RunState

log = logging.getLogger("runner")

PROGRESS_AFTER_S = 3.0  # a progress bar only for runs that last longer than this


def _first(outputs):
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


class RunMonitor(Callback):
    """Records wall time per step call and the step outputs into the run state; syncs with the device only
    to log.

    The outputs are kept as Tensors and read after training, so recording adds no host-device
    synchronisation per step (the tuning guide's warning about printing every step): per step it
    costs two perf_counter calls and two list appends.
    """

    def __init__(self, log_every: int, total_steps: int, batch_size: int, state: RunState, logger=None):
        """state: the run's state; its resume record's global_step and per-step records (losses, step_time_ms,
        record_steps in latest.json) head the run's series, and steps are counted on from there."""
        super().__init__()
        self.state = state
        self.start_step = state.start_step
        self.log_every = max(1, log_every)
        self.total_steps = total_steps
        self.batch_size = batch_size
        self.logger = logger  # runner/loggers.py: receives the values that are logged anyway
        self.gaps: list = []  # seconds from a step's end to the next step's begin: host-side work
        self._last = None
        self._begin = None
        self._logged = self.start_step // self.log_every
        self._start = None
        self._bar = None

    def on_train_begin(self, run_context):
        self._start = self._last = time.perf_counter()

    def first_step_times(self):
        """(perf_counter time Model.train began, time its first step ended); None where not reached."""
        seconds = self.state.call_seconds
        return self._start, (self._start + seconds[0] if self._start is not None and seconds else None)

    def on_train_epoch_begin(self, run_context):
        self.state.epoch_first_call = len(self.state.outputs)

    def on_train_step_begin(self, run_context):
        self._begin = time.perf_counter()
        if self.state.call_ends:
            self.gaps.append(self._begin - self._last)

    def on_train_step_end(self, run_context):
        now = time.perf_counter()
        cb = run_context.original_args()
        state = self.state
        state.call_seconds.append(now - self._last)
        self._last = now
        state.call_ends.append(cb.cur_step_num)
        state.outputs.append(cb.net_outputs)
        step = self.start_step + cb.cur_step_num  # the run's global step, across resumes
        if self._bar is None and now - self._start > PROGRESS_AFTER_S and sys.stdout.isatty():
            self._bar = _ProgressBar(self.total_steps, self.start_step)
        if self._bar is not None:
            self._bar.update(step)
        if step // self.log_every > self._logged or step == self.total_steps:
            self._logged = step // self.log_every
            self._log(cb, step)

    # Model.fit validates between epochs: that time belongs to no training step.
    def on_eval_begin(self, run_context):
        self._eval_began = time.perf_counter()

    def on_eval_end(self, run_context):
        if self._last is not None:
            self._last += time.perf_counter() - self._eval_began

    def on_train_end(self, run_context):
        if self._bar is not None:
            self._bar.close()

    def _log(self, cb, step: int):
        loss = float(_first(cb.net_outputs).asnumpy())  # the one host-device sync, every log_every
        per_step = self.state.call_seconds[-1] / self.steps_in_last_call() * 1000
        log.info(
            "epoch %d step %d/%d train_loss %.4f step %.1f ms",
            cb.cur_epoch_num,
            step,
            self.total_steps,
            loss,
            per_step,
        )
        if self._bar is not None:
            self._bar.show(loss, per_step)
        if self.logger is not None:
            self.logger.log_metrics({"train/loss": loss, "train/step_time_ms": per_step}, step)

    def steps_in_last_call(self) -> int:
        ends = self.state.call_ends
        return ends[-1] - (ends[-2] if len(ends) > 1 else 0)

    def timing(self) -> dict:
        """This process's steps: compile time (first call minus a steady one) and steady per-step statistics.

        What cannot be told apart is recorded as None with the reason in `timing_note`, never guessed: a
        process that trained no step (a resume that only redoes the evaluation and report: the earlier
        process's timing is in its own records), and a single step call, whose time is compile and step
        in one.
        """
        ends, intervals = self.state.call_ends, self.state.call_seconds
        if not ends:
            note = "this process trained no step (it only finished the evaluation and report)"
            return {**_UNMEASURED, "train_seconds": 0.0, "steps": self.start_step, "timing_note": note}
        counts = np.diff([0] + ends)
        per_step = np.array(intervals) / counts
        measured = {
            "first_call_seconds": intervals[0],
            "train_seconds": float(np.sum(intervals)),
            "steps": self.start_step + int(ends[-1]),
        }
        if len(per_step) == 1:
            note = "one step call: its time is the compilation and the step in one, so neither is measured"
            return {**_UNMEASURED, **measured, "timing_note": note}
        steady = per_step[1:]
        median = float(np.median(steady))
        steady_time = float(np.sum(intervals[1:]))
        return {
            **measured,
            "compile_seconds": max(0.0, intervals[0] - median * counts[0]),
            "step_time_median_ms": median * 1000,
            "step_time_p90_ms": float(np.percentile(steady, 90)) * 1000,
            "throughput_samples_per_s": int(np.sum(counts[1:])) * self.batch_size / steady_time,
            # Between a step's end and the next step's begin: data fetch, callbacks, Python.
            "host_fraction": float(np.sum(self.gaps) / steady_time) if self.gaps else None,
            "timing_note": None,
        }


# The timing fields a process could not measure (RunMonitor.timing says why in timing_note).
_UNMEASURED = {
    "compile_seconds": None,
    "first_call_seconds": None,
    "step_time_median_ms": None,
    "step_time_p90_ms": None,
    "throughput_samples_per_s": None,
    "host_fraction": None,
}


class _ProgressBar:
    """rich's progress bar on a terminal, with the console's log records printed above it."""

    def __init__(self, total: int, done: int = 0):
        self.progress = Progress(
            TextColumn("train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
        )
        self.task = self.progress.add_task("train", total=total, completed=done, info="")
        console = (sys.stdout, sys.stderr)
        self.progress.start()
        # While the bar shows, rich's Live puts proxies in sys.stdout/sys.stderr that print each line above
        # the bar. Hydra's console handler kept the real stream, so it would write through the bar: it is
        # pointed at the proxy for as long as the bar shows (runner.log is a file handler, untouched).
        self.moved = []
        for h in logging.getLogger().handlers:
            if type(h) is logging.StreamHandler and h.stream in console:
                proxy = sys.stdout if h.stream is console[0] else sys.stderr
                self.moved.append((h, h.setStream(proxy)))

    def update(self, step: int):
        self.progress.update(self.task, completed=step)

    def show(self, loss: float, step_ms: float):
        self.progress.update(self.task, info=f"train_loss {loss:.4f}  step {step_ms:.1f} ms")

    def close(self):
        for h, stream in self.moved:
            h.setStream(stream)
        self.progress.stop()
