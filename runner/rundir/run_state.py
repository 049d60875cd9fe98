"""RunState: the state of one training run, owned by the recipe and shared by every callback.

The callbacks do not call each other: each reads and writes this one object, in the order of
runner/training/callbacks.py ORDER (an earlier callback's write is what a later one reads in the same
step or epoch). Who writes what:

- the step clock: `step`, `epoch`;
- the timing callback (report/monitor.py): the per-step-call records (`call_ends`, `call_seconds`,
  `outputs`, `call_lr`, `epoch_first_call`), from which `losses()`, `epoch_loss()` and `series()` are read;
- gradient statistics (amp/diagnose.py): `bad_input`; the loss-scale trace (amp/guard.py): `step_outputs`;
- the NaN guard (amp/guard.py): `guard_trip`;
- validation (training/validation.py): `validation`, `validation_metrics`;
- the checkpointer (training/checkpoints.py): `top` (the best checkpoints), `signal`;
- the early stop (training/validation.py): `early_stop`.

Here (rundir/) rather than in training/ because amp/ and report/ sit below training/ and write it too. It
holds no MindSpore type: step outputs are read through their `asnumpy()`.
"""

from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

import numpy as np


def _first(outputs):
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


@dataclass
class RunState:
    """What the run knows while it trains; a resumed run starts from its resume record (`start`)."""

    start: dict = field(default_factory=dict)  # the resume record (latest.json with `path`); {} for a fresh run
    step: int = 0  # global step of the weights as they are now, across resumes
    epoch: int = 0  # Model.fit's epoch in progress (its cur_epoch_num)
    # why training is ending before its last step (stop_reason says it in words)
    signal: Optional[int] = None  # SIGINT/SIGTERM caught by the checkpointer: stop at this step's end
    guard_trip: Optional[str] = None  # the NaN guard's reason: training stopped on a non-finite step
    early_stop: Optional[dict] = None  # epoch, step and reason when early stopping ended training
    # this step's checks, written before the guard reads them (ORDER: grad_stats, trace, then guard)
    bad_input: Optional[str] = None  # the batch holds non-finite values (diagnose=on)
    step_outputs: Optional[Tuple[float, bool, float]] = None  # this step's (loss, overflow, loss scale)
    # validation and the best checkpoints
    validation: Optional[dict] = None  # this epoch's validation {epoch, step, accuracy, loss}; None: none ran
    validation_metrics: dict = field(default_factory=dict)  # every metric of the last validation
    validation_step: Optional[int] = None  # the global step of the weights the last validation measured
    top: List[dict] = field(default_factory=list)  # the best checkpoints {file, monitor, value, global_step}
    # per step call of this process (one step, or one sink): the timing callback's records
    call_ends: List[int] = field(default_factory=list)  # cur_step_num at each step end
    call_seconds: List[float] = field(default_factory=list)  # wall time between consecutive step ends
    outputs: List[Any] = field(default_factory=list)  # the step outputs, kept as tensors (read after training)
    call_lr: List[float] = field(default_factory=list)  # the learning rate at each step end (training/optim.py)
    epoch_first_call: int = 0  # index into outputs where the current epoch began

    def __post_init__(self) -> None:
        self.step = self.start_step

    @property
    def start_step(self) -> int:
        """The global step the run resumed from (0 for a fresh run); MindSpore's cur_step_num counts from it."""
        return int(self.start.get("global_step", 0))

    @property
    def guard_tripped(self) -> bool:
        return self.guard_trip is not None

    @property
    def halted(self) -> bool:
        """A signal or the NaN guard is ending training mid-epoch: the validation due now is skipped."""
        return self.signal is not None or self.guard_tripped

    @property
    def stop_reason(self) -> Optional[str]:
        """Why training ended before its last step, in words; None while it runs its course."""
        if self.guard_trip is not None:
            return f"NaN guard: {self.guard_trip}"
        if self.signal is not None:
            return f"signal {self.signal}"
        if self.early_stop is not None:
            return f"early stop: {self.early_stop['reason']}"
        return None

    @property
    def best(self) -> Optional[dict]:
        """The best checkpoint by the monitor, or None."""
        return self.top[0] if self.top else None

    def losses(self, first_call: int = 0) -> np.ndarray:
        """This process's loss at the end of every step call from call `first_call` on, as float32."""
        return np.array([float(_first(o).asnumpy()) for o in self.outputs[first_call:]], dtype=np.float32)

    def run_losses(self) -> np.ndarray:
        """The loss curve of the whole run: the resumed run's earlier calls, then this process's."""
        return np.concatenate([np.asarray(self.start.get("losses", []), np.float32), self.losses()])

    def epoch_loss(self) -> Optional[float]:
        """Mean loss of the current epoch's step calls so far (None before its first step)."""
        losses = self.losses(self.epoch_first_call)
        return float(np.mean(losses)) if len(losses) else None

    def series(self) -> dict:
        """Per step call of the whole run (a resumed run's earlier calls first): global step, loss, ms/step and
        learning rate (NaN where a record is missing: a resume from a bare .ckpt, or a version that kept none)."""
        counts = np.diff([0] + self.call_ends)
        prior_loss = list(self.start.get("losses", []))
        n = len(prior_loss)
        prior_steps = self.start.get("record_steps", [])
        prior_ms = self.start.get("step_time_ms", [])
        prior_lr = self.start.get("lr", [])
        return {
            "step": (list(prior_steps) if len(prior_steps) == n else list(range(1, n + 1)))
            + [self.start_step + s for s in self.call_ends],
            "loss": prior_loss + self.losses().tolist(),
            "step_time_ms": (list(prior_ms) if len(prior_ms) == n else [float("nan")] * n)
            + (np.array(self.call_seconds) / counts * 1000).tolist(),
            "lr": (list(prior_lr) if len(prior_lr) == n else [float("nan")] * n)
            + (
                list(self.call_lr) if len(self.call_lr) == len(self.call_ends) else [float("nan")] * len(self.call_ends)
            ),
        }
