"""The loss-scale trace, the NaN guard and the post-mortem, as three pieces run in this order:

1. LossScaleTrace (a Callback) reads each step's (loss, overflow, scale) once, appends it to
   loss_scale.csv and puts it in the run state (RunState.step_outputs);
2. NanGuard (the Callback after it, runner/training/callbacks.py ORDER) reads them there and stops
   training when the loss is non-finite, when the batch was (RunState.bad_input, from GradStats), or when
   `diagnose.patience` consecutive steps overflowed and the loss scale cannot answer any more (a
   dynamic scale at its floor of 1, or a fixed scale); it keeps the last finite weights and records
   the trip in the run state (RunState.guard_trip), where validation and the checkpointer read it;
3. postmortem(), after training, saves those weights, asks runner/amp/diagnose.py which layer went
   non-finite first, and returns the error the run raises once everything else is written.
"""

import csv
import logging
import math
import os
from dataclasses import dataclass
from typing import List, Optional

import mindspore as ms
import numpy as np
from mindspore.train import Callback

from runner.amp import diagnose
from runner.amp.diagnose import GradStats
from runner.errors import UserError
from runner.rundir.atomic import finite_or_str, write_json
from runner.rundir.layout import RunDir
from runner.rundir.run_state import RunState

log = logging.getLogger("runner")
FLOOR = 1.0  # ScaledTrainStep and MindSpore's DynamicLossScaleUpdateCell never go below 1


class NonFiniteTrainingError(UserError):
    """Training went non-finite; the message names the first layer that did and the fix to try."""


class LossScaleTrace(Callback):
    """Per-step (step, loss, overflow, scale) into loss_scale.csv, and into the run state for the guard.

    Reading three scalars per step syncs with the device once per step; on CPU every step is
    synchronous anyway, and with data sink on GPU/Ascend the callback runs once per sink.
    """

    def __init__(
        self,
        path: str,
        scale_type: str,
        drops: bool,
        state: RunState,
        flush_every: int = 1,
        prior_from: Optional[str] = None,
    ):
        """state: the run's state; a resumed run's rows up to its global step (from prior_from, by default
        this same file) are kept, later ones dropped."""
        super().__init__()
        self.path = path
        self.scale_type = scale_type
        self.drops = drops
        self.state = state
        self.flush_every = max(1, flush_every)
        self.start_step = start_step = state.start_step
        self.prior_rows = read_trace(prior_from or path, start_step) if start_step else []
        self.scales = [float(r[3]) for r in self.prior_rows]
        self.overflows = [bool(int(r[2])) for r in self.prior_rows]
        self._file = self._writer = None

    def on_train_begin(self, run_context):
        # A resumed run rewrites the rows it continues from, so the file covers the whole run once.
        self._file = open(self.path, "w", newline="")
        self._writer = csv.writer(self._file)
        self._writer.writerow(["step", "loss", "overflow", "scale"])
        self._writer.writerows(self.prior_rows)
        self._file.flush()

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        loss, overflow, scale = (float(np.asarray(t.asnumpy()).reshape(-1)[0]) for t in cb.net_outputs[:3])
        overflow = bool(overflow)
        step = self.start_step + cb.cur_step_num
        self._writer.writerow([step, f"{loss:.6g}", int(overflow), f"{scale:.6g}"])
        if step % self.flush_every == 0:
            self._file.flush()
        self.scales.append(scale)
        self.overflows.append(overflow)
        self.state.step_outputs = (loss, overflow, scale)

    def on_train_end(self, run_context):
        if self._file:
            self._file.close()

    def summary(self) -> dict:
        """The `loss_scale` block of metrics.json."""
        over = int(sum(self.overflows))
        return {
            "type": self.scale_type,
            "initial": self.scales[0] if self.scales else None,
            "final": self.scales[-1] if self.scales else None,
            "min": min(self.scales) if self.scales else None,
            "overflow_steps": over,
            "skipped_steps": over if self.drops else 0,
            "trace": os.path.basename(self.path),
        }


def read_trace(path: str, upto: int) -> list:
    """loss_scale.csv's rows (as strings) up to global step `upto`; [] when the file is missing."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))[1:]
    except OSError:
        return []
    kept = []
    for r in rows:
        try:
            if len(r) == 4 and int(r[0]) <= upto:
                kept.append(r)
        except ValueError:  # a line cut short by a kill
            continue
    return kept


def traced_losses(run_dir: str, upto: int) -> List[float]:
    """The losses run_dir's loss_scale.csv recorded up to global step `upto` (6 significant digits)."""
    return [float(r[1]) for r in read_trace(RunDir(run_dir).loss_scale, upto)]


@dataclass
class Trip:
    """Why and where the guard stopped training, with the batch that showed it."""

    reason: str
    step: int
    loss: float
    scale: float
    batch: Optional[list]  # the step's inputs as numpy arrays; None with data sink


class NanGuard(Callback):
    """Stops training at the first non-finite input, non-finite loss or unanswerable overflow; keeps the last
    finite weights.

    Runs after the trace (and GradStats), whose readings of this step it takes from the run state.
    `net` holds the FP32 master parameters; they are copied every `snapshot_every` steps while finite.
    """

    def __init__(self, net, dynamic: bool, patience: int, snapshot_every: int, state: RunState):
        super().__init__()
        self.net = net
        self.state = state
        self.start_step = start_step = state.start_step  # a resumed run's global step: trips report global steps
        self.dynamic = dynamic
        self.patience = max(1, patience)
        self.snapshot_every = max(1, snapshot_every)
        self.stuck = 0  # consecutive overflowing steps the scale can no longer answer
        self.tripped: Optional[Trip] = None
        self.good = None  # (step, {name: array}) of the last weights known to be finite
        self.snapshot(start_step)

    def on_train_step_end(self, run_context):
        bad_input, outputs = self.state.bad_input, self.state.step_outputs
        self.state.bad_input = self.state.step_outputs = None  # read once: the next step's come fresh
        if bad_input is not None:  # GradStats saw it as the step began
            self.trip(run_context, bad_input)
        elif outputs is not None:
            self.check(run_context, self.start_step + run_context.original_args().cur_step_num, *outputs)

    def check(self, run_context, step: int, loss: float, overflow: bool, scale: float) -> None:
        """One step's outputs, as the trace read them."""
        answerable = self.dynamic and scale > FLOOR
        self.stuck = self.stuck + 1 if overflow and not answerable else 0
        if not math.isfinite(loss):
            self.trip(run_context, "non-finite loss", loss, scale)
        elif self.stuck >= self.patience:
            self.trip(run_context, f"{self.stuck} consecutive overflowing steps at loss scale {scale:g}", loss, scale)
        elif step % self.snapshot_every == 0:
            self.snapshot(step)

    def trip(self, run_context, reason: str, loss: float = math.nan, scale: float = math.nan) -> None:
        """Stop training after this step and remember why (the first trip wins)."""
        if self.tripped is not None:
            return
        cb = run_context.original_args()
        batch = cb.get("train_dataset_element")  # None with data sink: the batch stays on the device
        step = self.start_step + cb.cur_step_num
        self.tripped = Trip(reason, step, loss, scale, [t.asnumpy() for t in batch] if batch else None)
        self.state.guard_trip = reason
        log.error("NaN guard: %s at step %d; stopping", reason, step)
        run_context.request_stop()

    def snapshot(self, step: int) -> bool:
        """Copy the weights if they are all finite; return whether they were."""
        weights = {p.name: p.asnumpy().copy() for p in self.net.get_parameters()}
        if all(np.isfinite(w).all() for w in weights.values()):
            self.good = (step, weights)
            return True
        return False


def postmortem(guard: NanGuard, make_net, run_dir: str, level: str, keep: list, max_islands: int):
    """After training: (record, error) when the guard fired, else (None, None).

    Saves last_good.ckpt and diagnosis.json. make_net() builds a fresh FP32 network of the same
    architecture; the diagnosis loads the last good weights into it and re-applies the AMP level
    with candidate FP32 islands.
    """
    t = guard.tripped
    if t is None:
        return None, None

    # Skipped updates leave the weights finite; BatchNorm's running statistics may not be.
    if not guard.snapshot(t.step):
        log.warning("weights at step %d are not finite; keeping those of step %d", t.step, guard.good[0])
    good_step, weights = guard.good
    ckpt = RunDir(run_dir).last_good
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(w)} for n, w in weights.items()], ckpt)
    result = diagnose.find_islands(make_net, weights, level, keep, t.batch, t.scale, max_islands)
    record = {"reason": t.reason, "step": t.step, "loss": t.loss, "scale": t.scale}
    record.update(last_good_checkpoint=ckpt, last_good_step=good_step, level=level, **result)
    write_json(os.path.join(run_dir, "diagnosis.json"), finite_or_str(record))
    return record, NonFiniteTrainingError(_message(record, run_dir))


def nonfinite_weights(net) -> list:
    """The names of the network's parameters (BatchNorm statistics included) holding a NaN or inf."""
    return [name for name, p in net.parameters_dict().items() if not np.isfinite(p.asnumpy()).all()]


def weights_failure(net, run_dir: str, lr: float, amp_level: str = "O0") -> Optional[NonFiniteTrainingError]:
    """The error a run ends with when its final weights are not finite though no loss the guard saw was (a
    learning rate that large drives weights to inf between checks, or BatchNorm's statistics overflow): such
    weights are never published as model.ckpt, so evaluate, export and init_from never meet them."""
    bad = nonfinite_weights(net)
    if not bad:
        return None
    shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
    if amp_level != "O0" and all(n.endswith(("moving_mean", "moving_variance")) for n in bad):
        # Only the running statistics: the activations they average overflowed float16; no update moved them.
        cause = (
            f"Only BatchNorm's running statistics are, and under amp={amp_level} that means the activations they "
            "average exceed float16's largest value 65504 (an input scaled too large, or a layer that needs FP32), "
            "not the learning rate: diagnose=on counts the non-finite values cell by cell, amp.keep_fp32=[<cell>] "
            "keeps a layer in FP32, amp=o0 trains in FP32; start a new run."
        )
    else:
        cause = (
            f"A learning rate this large (optim.lr={lr:g}) drives weights to inf: lower optim.lr, add "
            "optim.warmup_epochs or optim.clip_grad_norm, and start a new run."
        )
    return NonFiniteTrainingError(
        f"Training ended with {len(bad)} non-finite tensor(s) in the weights ({shown}), though the losses the NaN "
        f"guard checked stayed finite, so model.ckpt was not written and the run is recorded as failed; "
        "metrics.json and any checkpoint saved while training (one is written only when finite) are kept in "
        f"{run_dir}. {cause}"
    )


def guard_metrics(record: Optional[dict]) -> dict:
    """The `nan_guard` block of metrics.json."""
    if record is None:
        return {"tripped": False}
    keys = ("reason", "step", "last_good_step", "last_good_checkpoint", "keep_fp32", "fixed")
    return {
        "tripped": True,
        **{k: record[k] for k in keys},
        "first": record.get("first"),
        "diagnosis": "diagnosis.json",
    }


def _message(r: dict, run_dir: str) -> str:
    head = f"Training stopped at step {r['step']} ({r['reason']}, loss {r['loss']:.4g}, {r['level']})."
    first = r.get("first")
    if r.get("cause") == "input":
        body = f" The input batch itself holds {r['input_nonfinite']} non-finite values: check the data."
    elif first is None:
        # The advice fits the run: comparing with O0 only helps a run that is not O0 already.
        body = (
            " On the last good weights and this batch no layer went non-finite, so mixed precision is not"
            " the cause: the weights diverged. Lower optim.lr"
            + (", or compare with amp=o0." if r["level"] != "O0" else " or add warmup (optim.warmup_epochs).")
        )
    else:
        body = (
            f" First non-finite values: the {first['where']} of {first['cell']} ({first['type']}){_magnitude(first)}."
        )
        fix = "amp.keep_fp32=[" + ",".join(r["keep_fp32"]) + "]"
        if r["fixed"]:
            body += f" With {fix} this batch's loss and gradients are finite: re-run with '{fix}'."
        elif r["level"] == "O0":
            body += " The run is already FP32 (O0): lower optim.lr or check the data."
        else:
            body += f" Even {fix} did not make this batch finite: try amp=o0, or lower optim.lr."
    tail = (
        f" The last good FP32 weights (after step {r['last_good_step']}) are in {r['last_good_checkpoint']};"
        f" the loss-scale trace is {os.path.join(run_dir, 'loss_scale.csv')} and the diagnosis"
        f" {os.path.join(run_dir, 'diagnosis.json')}."
    )
    return head + body + tail


def _magnitude(first: dict) -> str:
    peak = first.get("input_max_abs")
    if peak is not None and peak > 65504:
        return f", whose input reaches |x| = {peak:.3g}, above FP16's largest value 65504"
    return ""


@dataclass
class StepChecks:
    """The callbacks that read every step's outputs for the numerics: the loss-scale trace, the NaN guard and
    (diagnose=on) the gradient statistics; and how many FP32 islands the post-mortem may add."""

    trace: LossScaleTrace
    guard: NanGuard
    grad_stats: Optional[GradStats]
    max_islands: int


def build_step_checks(
    run_dir: str, net, step_cell, used, diagnose_cfg, log_every: int, state: RunState, prior_dir: str = None
) -> StepChecks:
    """The trace, the guard and (diagnose=on) the gradient statistics for this run.

    state: the run's state (a resumed run's global step: the trace continues prior_dir's loss_scale.csv from
    there)."""
    guard = NanGuard(net, used.loss_scale_type_used == "dynamic", diagnose_cfg.patience, log_every, state)
    trace = LossScaleTrace(
        RunDir(run_dir).loss_scale,
        used.loss_scale_type_used,
        used.drops_overflow,
        state,
        flush_every=log_every,
        prior_from=RunDir(prior_dir).loss_scale if prior_dir else None,
    )
    if not diagnose_cfg.enabled:
        return StepChecks(trace, guard, None, diagnose_cfg.max_islands)
    names = [p.name for p in step_cell.weights]
    stats = GradStats(run_dir, names, diagnose_cfg.every or log_every, state)
    return StepChecks(trace, guard, stats, diagnose_cfg.max_islands)
