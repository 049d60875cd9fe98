"""Consumer of the `profile` settings: MindSpore's profiler over a window of training steps.

`profile.steps=N` records N steps from `profile.start_step` (counted from this process's first step,
so step 1, which compiles the graph in graph mode, can be left out) with `mindspore.profiler.profile`
and its `schedule`; the result is analysed into `<run_dir>/profile` when the window closes (a
`trace_view.json` for chrome://tracing or Perfetto, and per-op CSV tables). The runner's own step
timing stays as it is; the profiled steps run slower and count in it.
"""

import glob
import logging
import os
from typing import Optional

from mindspore.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
from mindspore.train import Callback

log = logging.getLogger("runner")
PROFILE_DIR = "profile"  # in the run directory


class ProfileWindow(Callback):
    """Starts MindSpore's profiler at train begin, steps its schedule at every step end, and stops it
    at train end (a window the run did not reach is recorded as not done)."""

    def __init__(self, start_step: int, steps: int, run_dir: str, target: str):
        super().__init__()

        self.start_step, self.steps = int(start_step), int(steps)
        self.dir = os.path.join(run_dir, PROFILE_DIR)
        activities = [ProfilerActivity.CPU]
        if target == "GPU":
            activities.append(ProfilerActivity.GPU)
        elif target == "Ascend":
            activities.append(ProfilerActivity.NPU)
        # One step of warm-up before the window where there is one (the profiler advises it).
        warmup = 1 if self.start_step >= 2 else 0
        plan = schedule(wait=0, warmup=warmup, active=self.steps, repeat=1, skip_first=self.start_step - 1 - warmup)
        self.prof = profile(
            activities=activities,
            schedule=plan,
            on_trace_ready=tensorboard_trace_handler(dir_name=self.dir),
            start_profile=False,
        )
        self.seen = 0
        self.running = False

    def on_train_begin(self, run_context):
        self.prof.start()
        self.running = True

    def on_train_step_end(self, run_context):
        self.seen += 1
        if self.running:
            self.prof.step()
        if self.running and self.seen >= self.start_step + self.steps - 1:
            self._stop()  # the window is recorded and analysed: the rest of the run goes unprofiled

    def on_train_end(self, run_context):
        if self.running:
            self._stop()

    def _stop(self):
        self.running = False
        self.prof.stop()
        if self.trace() is not None:
            log.info("profile: steps %d-%d recorded in %s", self.start_step, self.recorded_last(), self.dir)
        else:
            log.warning(
                "profile: the run took %d steps, so the window of steps %d-%d was not recorded",
                self.seen,
                self.start_step,
                self.last_step(),
            )

    def last_step(self) -> int:
        return self.start_step + self.steps - 1

    def recorded_last(self) -> int:
        """The last step the window covered: the run may end before the window does."""
        return min(self.seen, self.last_step())

    def recorded_steps(self) -> int:
        """How many steps the profile holds (profile.steps asks for a window; a shorter run records less)."""
        return max(0, self.recorded_last() - self.start_step + 1) if self.trace() is not None else 0

    def trace(self) -> Optional[str]:
        """The trace file the analysis wrote, or None."""
        found = sorted(glob.glob(os.path.join(glob.escape(self.dir), "*", "ASCEND_PROFILER_OUTPUT", "trace_view.json")))
        return found[-1] if found else None

    def record(self) -> dict:
        """metrics.json's `profile`."""
        trace = self.trace()
        return {
            "dir": self.dir,
            "start_step": self.start_step,
            "steps": self.recorded_steps(),  # what was profiled, not what profile.steps asked for
            "steps_requested": self.steps,
            "recorded": trace is not None,
            "trace": trace,
        }
