"""Loss-scale trace and the NaN guard (always on), as one MindSpore Callback.

Every step it appends (step, loss, overflow, scale used) to loss_scale.csv. It stops training when
the loss is non-finite, or when `diagnose.patience` consecutive steps overflowed and the loss scale
cannot answer any more (a dynamic scale at its floor of 1, or a fixed scale). Then `finish()` saves
the last good FP32 weights, asks runner/diagnose.py which layer went non-finite first, and returns
the error the run raises once everything else is written.
"""

import csv
import logging
import math
import os

import numpy as np
from mindspore.train import Callback

from runner.errors import UserError

log = logging.getLogger("runner")
FLOOR = 1.0  # ScaledTrainStep and MindSpore's DynamicLossScaleUpdateCell never go below 1


class NonFiniteTrainingError(UserError):
    """Training went non-finite; the message names the first layer that did and the fix to try."""


class AmpWatch(Callback):
    """Per-step loss-scale trace, guard and last-good weights of `net` (the FP32 master parameters).

    Reading three scalars per step syncs with the device once per step; on CPU every step is
    synchronous anyway, and with data sink on GPU/Ascend the callback runs once per sink.
    """

    def __init__(self, run_dir: str, net, scale_type: str, drops: bool, patience: int, snapshot_every: int):
        super().__init__()
        self.scale_type = scale_type
        self.run_dir = run_dir
        self.net = net
        self.dynamic = scale_type == "dynamic"
        self.drops = drops  # whether an overflowing step skips its update
        self.patience = max(1, patience)
        self.snapshot_every = max(1, snapshot_every)
        self.trace_path = os.path.join(run_dir, "loss_scale.csv")
        self.scales, self.overflows = [], []
        self.stuck = 0  # consecutive overflowing steps the scale can no longer answer
        self.tripped = None  # {"reason", "step", "loss", "scale", "batch"} once the guard fires
        self.good = None  # (step, {name: array}) of the last weights known to be finite
        self._file = self._writer = None
        self.grad_stats = None  # diagnose=on: the GradStats callback, for the metrics
        self.diagnosis = None  # (level, keep_fp32, max_islands), set by attach()
        self.record = None  # what finish() found, for metrics.json

    def on_train_begin(self, run_context):
        self._file = open(self.trace_path, "w", newline="")
        self._writer = csv.writer(self._file)
        self._writer.writerow(["step", "loss", "overflow", "scale"])
        self._snapshot(0)

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        out = cb.net_outputs
        loss, overflow, scale = (float(np.asarray(t.asnumpy()).reshape(-1)[0]) for t in out[:3])
        overflow = bool(overflow)
        step = cb.cur_step_num
        self._writer.writerow([step, f"{loss:.6g}", int(overflow), f"{scale:.6g}"])
        self.scales.append(scale)
        self.overflows.append(overflow)
        answerable = self.dynamic and scale > FLOOR
        self.stuck = self.stuck + 1 if overflow and not answerable else 0
        if not math.isfinite(loss):
            self.trip(run_context, "non-finite loss", loss, scale)
        elif self.stuck >= self.patience:
            self.trip(run_context, f"{self.stuck} consecutive overflowing steps at loss scale {scale:g}", loss, scale)
        elif step % self.snapshot_every == 0:
            self._snapshot(step)

    def on_train_end(self, run_context):
        if self._file:
            self._file.close()

    def trip(self, run_context, reason: str, loss: float = math.nan, scale: float = math.nan):
        """Stop training after this step and remember why, with the batch that showed it (first trip wins)."""
        if self.tripped is not None:
            return
        cb = run_context.original_args()
        batch = cb.get("train_dataset_element")  # None with data sink: the batch stays on the device
        self.tripped = {
            "reason": reason,
            "step": cb.cur_step_num,
            "loss": loss,
            "scale": scale,
            "batch": [t.asnumpy() for t in batch] if batch is not None else None,
        }
        log.error("NaN guard: %s at step %d; stopping", reason, cb.cur_step_num)
        run_context.request_stop()

    def _snapshot(self, step: int) -> bool:
        weights = {p.name: p.asnumpy().copy() for p in self.net.get_parameters()}
        if all(np.isfinite(w).all() for w in weights.values()):
            self.good = (step, weights)
            return True
        return False

    def metrics(self) -> dict:
        """What this adds to metrics.json: loss_scale, nan_guard and, with diagnose=on, diagnose."""
        out = {"loss_scale": self.summary(), "nan_guard": {"tripped": self.tripped is not None}}
        if self.record:
            keys = ("reason", "step", "last_good_step", "last_good_checkpoint", "keep_fp32", "fixed")
            out["nan_guard"].update({k: self.record[k] for k in keys}, first=self.record.get("first"))
            out["nan_guard"]["diagnosis"] = "diagnosis.json"
        if self.grad_stats:
            out["diagnose"] = self.grad_stats.summary()
        return out

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
            "trace": os.path.basename(self.trace_path),
        }

    def finish(self, make_net):
        """After training: None if the guard never fired; else save last_good.ckpt, diagnose, return the error.

        make_net() builds a fresh FP32 network of the same architecture; the diagnosis loads the last
        good weights into it and re-applies the AMP level with candidate FP32 islands.
        """
        if self.tripped is None:
            return None
        level, keep, max_islands = self.diagnosis
        import mindspore as ms

        from runner import diagnose

        t = self.tripped
        # Skipped updates leave the weights finite; BatchNorm's running statistics may not be.
        if not self._snapshot(t["step"]):
            log.warning("weights at step %d are not finite; keeping those of step %d", t["step"], self.good[0])
        good_step, weights = self.good
        ckpt = os.path.join(self.run_dir, "last_good.ckpt")
        ms.save_checkpoint([{"name": n, "data": ms.Tensor(w)} for n, w in weights.items()], ckpt)
        result = diagnose.find_islands(make_net, weights, level, keep, t["batch"], t["scale"], max_islands)
        record = {k: v for k, v in t.items() if k != "batch"}
        record.update(last_good_checkpoint=ckpt, last_good_step=good_step, level=level, **result)
        diagnose.write_json(os.path.join(self.run_dir, "diagnosis.json"), record)
        self.record = record
        return NonFiniteTrainingError(_message(record, self.run_dir))


def _message(r: dict, run_dir: str) -> str:
    head = f"Training stopped at step {r['step']} ({r['reason']}, loss {r['loss']:.4g}, {r['level']})."
    first = r.get("first")
    if r.get("cause") == "input":
        body = f" The input batch itself holds {r['input_nonfinite']} non-finite values: check the data."
    elif first is None:
        body = (
            " On the last good weights and this batch no layer went non-finite, so mixed precision is not"
            " the cause: the weights diverged. Lower optim.lr, or compare with amp=o0."
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


def attach(cfg, run_dir: str, net, step_cell, amp_used: dict):
    """The guard for this run and the callbacks to train with (GradStats too with diagnose=on)."""
    from runner.diagnose import GradStats

    d = cfg.diagnose
    scale_type = amp_used["loss_scale_type_used"]
    drops = scale_type == "dynamic" or cfg.amp.loss_scale.drop_overflow_update
    watch = AmpWatch(run_dir, net, scale_type, drops, d.patience, cfg.log_every)
    watch.diagnosis = (amp_used["amp_level_used"], list(cfg.amp.keep_fp32), d.max_islands)
    if not d.enabled:
        return watch, [watch]
    names = [p.name for p in step_cell.weights]
    watch.grad_stats = GradStats(run_dir, names, d.every or cfg.log_every, watch)
    return watch, [watch.grad_stats, watch]
