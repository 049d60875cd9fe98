"""A MindSpore callback that times every step (or sink), keeps its outputs and learning rate in the run state,
logs every `log_every` steps and says one line per epoch, and draws the epoch's progress bar on a terminal."""

import logging
import time
from typing import Optional

import numpy as np
from mindspore.train import Callback

from runner.report import screen
from runner.report.accuracy import flat
from runner.rundir.run_state import RunState

log = logging.getLogger("runner")


def _first(outputs):
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


class RunMonitor(Callback):
    """Records wall time per step call, the step outputs and the learning rate into the run state; syncs with
    the device only to log.

    The outputs are kept as Tensors and read after training, so recording adds no host-device
    synchronisation per step (the tuning guide's warning about printing every step): per step it
    costs two perf_counter calls, a lookup of the rate (runner/training/optim.py StepRates) and three list
    appends. At each epoch's end it says one line, as timm does: the epoch's mean training loss, the
    validation fit ran, the learning rate, the epoch's time and throughput.
    """

    def __init__(
        self,
        log_every: int,
        total_steps: int,
        batch_size: int,
        state: RunState,
        logger=None,
        rates=None,
        steps_per_epoch: Optional[int] = None,
        epochs: Optional[int] = None,
        compiles: bool = False,
    ):
        """state: the run's state; its resume record's global_step and per-step records (losses, step_time_ms,
        record_steps in latest.json) head the run's series, and steps are counted on from there. rates: the
        run's StepRates (None: no rate recorded); compiles: the first step compiles the graph (graph mode)."""
        super().__init__()
        self.state = state
        self.start_step = state.start_step
        self.log_every = max(1, log_every)
        self.total_steps = total_steps
        self.batch_size = batch_size
        self.logger = logger  # runner/report/loggers.py: receives the values that are logged anyway
        self.rates = rates
        self.steps_per_epoch = steps_per_epoch or total_steps
        self.epochs = epochs or max(1, round(total_steps / self.steps_per_epoch))
        self.compiles = compiles
        self.gaps: list = []  # seconds from a step's end to the next step's begin: host-side work
        self._last = None
        self._begin = None
        self._logged = self.start_step // self.log_every
        self._start = None
        self._eval_seconds = 0.0  # this epoch's validation
        self._validated = False  # a validation of this process was said (the first compiles its graph)
        self._logged_step: Optional[int] = None  # the last step the logger got values for
        self._epoch_step = self.start_step  # the global step the epoch in progress began after
        self.bar = screen.EpochProgress(self.epochs)

    def on_train_begin(self, run_context):
        self._start = self._last = time.perf_counter()

    def first_step_times(self):
        """(perf_counter time Model.train began, time its first step ended); None where not reached."""
        seconds = self.state.call_seconds
        return self._start, (self._start + seconds[0] if self._start is not None and seconds else None)

    def on_train_epoch_begin(self, run_context):
        self.state.epoch_first_call = len(self.state.outputs)
        self._eval_seconds = 0.0
        self._epoch_step = step = self.start_step + int(run_context.original_args().cur_step_num)
        epoch = step // self.steps_per_epoch + 1
        self.bar.start_epoch(epoch, self._steps_in_epoch(epoch), step - (epoch - 1) * self.steps_per_epoch)

    def _steps_in_epoch(self, epoch: int) -> int:
        return max(1, min(self.steps_per_epoch, self.total_steps - (epoch - 1) * self.steps_per_epoch))

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
        # The trace of the step before has run since (ORDER): whether that step's update was skipped.
        overflowed = bool(state.step_outputs[1]) if state.step_outputs else False
        lr = self.rates.at(step, overflowed) if self.rates is not None else float("nan")
        state.call_lr.append(lr)
        epoch_done = step - (step - 1) // self.steps_per_epoch * self.steps_per_epoch
        self.bar.update(epoch_done, self._time_left(step))
        if step // self.log_every > self._logged or step == self.total_steps:
            self._logged = step // self.log_every
            self._log(cb, step, lr)

    def _time_left(self, step: int) -> Optional[float]:
        """The run's time left: its steps left at the mean time of the steady steps (the first one compiles)."""
        seconds, ends = self.state.call_seconds, self.state.call_ends
        if len(seconds) < 2:
            return None
        per_step = float(np.sum(seconds[1:])) / max(1, ends[-1] - ends[0])
        return per_step * (self.total_steps - step)

    # Model.fit validates between epochs: that time belongs to no training step.
    def on_eval_begin(self, run_context):
        self._eval_began = time.perf_counter()

    def on_eval_end(self, run_context):
        spent = time.perf_counter() - self._eval_began
        self._eval_seconds += spent
        if self._last is not None:
            self._last += spent

    def on_train_epoch_end(self, run_context):
        cb = run_context.original_args()
        first = self.state.epoch_first_call
        if self.state.halted or len(self.state.outputs) <= first:
            return  # stopped mid-epoch (a signal, the NaN guard): the line would describe a part of it
        step = self.start_step + int(cb.cur_step_num)
        if self.logger is not None and self._logged_step != step:  # a row for the epoch's end, which validation joins
            self.logger.log_metrics(self._values(float(_first(cb.net_outputs).asnumpy()), step), step)
        log.info("%s", self.epoch_line(step, first, flat(cb.get("eval_results"))))

    def epoch_line(self, step: int, first: int, val: dict) -> str:
        """`epoch 3/12: train_loss 0.0512 (mean) | val_loss 0.0201 val_accuracy 0.9889 | lr 0.0950 | 1.21 s,
        1884 samples/s (+0.12 s validation)` for the step calls from index `first` to the latest."""
        state = self.state
        epoch = step / self.steps_per_epoch
        label = f"{epoch:g}" if abs(epoch - round(epoch)) < 1e-9 else f"{epoch:.2f}"
        parts = [f"epoch {label}/{self.epochs}: train_loss {state.epoch_loss():.4f} (mean)"]
        if val:
            parts.append(f"val_loss {float(val['loss']):.4f} val_accuracy {float(val['accuracy']):.4f}")
        if self.rates is not None:
            parts.append(f"lr {state.call_lr[-1]:.4g}")
        seconds = state.call_seconds[first:]
        ends = [self._epoch_step - self.start_step] + state.call_ends[first:]
        steady, steps = seconds, ends[-1] - ends[0]
        timed = f"{sum(seconds):.2f} s"
        if first == 0 and self.compiles and len(seconds) > 1:  # this process's first step compiled the graph
            steady, steps = seconds[1:], ends[-1] - ends[1]
            timed += " (the first step compiles)"
        if steps > 0 and sum(steady) > 0:
            timed += f", {steps * self.batch_size / sum(steady):.0f} samples/s"
        if self._eval_seconds:
            compiled = ", which compiles its graph the first time" if self.compiles and not self._validated else ""
            timed += f" (+{self._eval_seconds:.2f} s validation{compiled})"
            self._validated = True
        parts.append(timed)
        return " | ".join(parts)

    def on_train_end(self, run_context):
        self.bar.close()

    def _log(self, cb, step: int, lr: float):
        loss = float(_first(cb.net_outputs).asnumpy())  # the one host-device sync, every log_every
        per_step = self.state.call_seconds[-1] / self.steps_in_last_call() * 1000
        rate = f" lr {lr:.4g}" if self.rates is not None else ""
        log.info(
            "epoch %d step %d/%d train_loss %.4f%s step %.1f ms",
            cb.cur_epoch_num,
            step,
            self.total_steps,
            loss,
            rate,
            per_step,
        )
        self.bar.update(step - (step - 1) // self.steps_per_epoch * self.steps_per_epoch, info=self._info(loss, lr))
        if self.logger is not None:
            self.logger.log_metrics(self._values(loss, step), step)

    def _values(self, loss: float, step: int) -> dict:
        """The row of metrics.csv (and every logger's values) for this step: its loss, time and rate."""
        self._logged_step = step
        per_step = self.state.call_seconds[-1] / self.steps_in_last_call() * 1000
        values = {"epoch": round(step / self.steps_per_epoch, 4), "train_loss": loss, "step_time_ms": per_step}
        if self.rates is not None:
            values["lr"] = self.state.call_lr[-1]
        return values

    def _info(self, loss: float, lr: float) -> str:
        rate = f"  lr {lr:.4g}" if self.rates is not None else ""
        ms = self.state.call_seconds[-1] / self.steps_in_last_call() * 1000
        return f"train_loss {loss:.4f}{rate}  step {ms:.1f} ms"

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
