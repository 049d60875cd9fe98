"""A MindSpore callback that times every step (or sink) and logs every `log_every` steps."""

import logging
import time

import numpy as np
from mindspore.train import Callback

log = logging.getLogger("runner")


def _first(outputs):
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


class RunMonitor(Callback):
    """Records wall time per step call and the step outputs; syncs with the device only to log.

    The outputs are kept as Tensors and read after training, so recording adds no host-device
    synchronisation per step (the tuning guide's warning about printing every step).
    """

    def __init__(self, log_every: int, total_steps: int, batch_size: int):
        super().__init__()
        self.log_every = max(1, log_every)
        self.total_steps = total_steps
        self.batch_size = batch_size
        self.intervals = []  # seconds between consecutive step-end events
        self.steps = []  # cur_step_num at each step-end (sink mode advances by sink_size)
        self.outputs = []
        self._last = None
        self._logged = 0

    def on_train_begin(self, run_context):
        self._last = time.perf_counter()

    def on_train_step_end(self, run_context):
        now = time.perf_counter()
        cb = run_context.original_args()
        self.intervals.append(now - self._last)
        self._last = now
        self.steps.append(cb.cur_step_num)
        self.outputs.append(cb.net_outputs)
        if cb.cur_step_num // self.log_every > self._logged or cb.cur_step_num == self.total_steps:
            self._logged = cb.cur_step_num // self.log_every
            loss = float(_first(cb.net_outputs).asnumpy())
            per_step = self.intervals[-1] / self.steps_in_last_call() * 1000
            log.info(
                "epoch %d step %d/%d loss %.4f step %.1f ms",
                cb.cur_epoch_num,
                cb.cur_step_num,
                self.total_steps,
                loss,
                per_step,
            )

    def steps_in_last_call(self) -> int:
        return self.steps[-1] - (self.steps[-2] if len(self.steps) > 1 else 0)

    def losses(self) -> np.ndarray:
        """Loss at the end of every step call, as float32."""
        return np.array([float(_first(o).asnumpy()) for o in self.outputs], dtype=np.float32)

    def timing(self) -> dict:
        """Compile time (first call minus a steady call) and steady-state per-step statistics."""
        counts = np.diff([0] + self.steps)
        per_step = np.array(self.intervals) / counts
        steady = per_step[1:] if len(per_step) > 1 else per_step
        median = float(np.median(steady))
        compile_s = max(0.0, self.intervals[0] - median * counts[0])
        steady_time = float(np.sum(self.intervals[1:])) if len(per_step) > 1 else self.intervals[0]
        steady_steps = int(np.sum(counts[1:])) if len(per_step) > 1 else int(counts[0])
        return {
            "compile_seconds": compile_s,
            "first_call_seconds": self.intervals[0],
            "step_time_median_ms": median * 1000,
            "step_time_p90_ms": float(np.percentile(steady, 90)) * 1000,
            "throughput_samples_per_s": steady_steps * self.batch_size / steady_time,
            "train_seconds": float(np.sum(self.intervals)),
            "steps": int(self.steps[-1]),
        }
