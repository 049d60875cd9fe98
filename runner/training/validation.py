"""Consumer of `validation`, `checkpoint.monitor` and `early_stop`: validate while training, say which
checkpoint is the best, stop when the monitored value stops improving.

MindSpore's own machinery does the work where it fits (all read in MindSpore 2.10's sources and tried
on CPU here, docs/mindspore-notes.md#fit-validation):
- `Model.fit(valid_dataset=..., valid_frequency=[epochs])` validates after the chosen epochs, with the
  train Model's eval network (the FP32-logits WithEvalCell the evaluator shares, so validation and the
  final evaluation compile one graph), and hands the result to the callbacks in `eval_results`.
- `mindspore.train.EarlyStopping` counts patience and min_delta and requests the stop. Its own reader of
  the monitored value is replaced: it drops a value of 0 (`if monitor_value`), and it reads "loss" as
  the last step's loss, not the epoch's mean.
- fit's `eval_loss` is the last validation batch's loss only (the metric is created anew per batch),
  so the curve takes the `loss` metric (nn.Loss, the mean over the set) instead.
"""

import json
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

import mindspore as ms
import numpy as np
from mindspore.train import Callback, EarlyStopping

from runner.report.accuracy import flat
from runner.rundir.atomic import write_json
from runner.rundir.layout import VAL_CURVE

log = logging.getLogger("runner")

MODES = {"val_accuracy": "max", "val_loss": "min", "train_loss": "min"}


def resolve_monitor(name, validating: bool) -> str:
    """`auto` is val_accuracy when validation runs during training, else the epoch's mean training loss."""
    name = str(name)
    if name == "auto":
        return "val_accuracy" if validating else "train_loss"
    return name


def validation_epochs(every: int, epochs: int, steps_per_epoch: int, steps_per_call: int, calls: int) -> list:
    """Model.fit's epochs (1-based) after which to validate: every `every` data epochs, and after the last.

    A Model epoch is one pass over the data, or sink_size steps with a custom sink size; validation
    runs after the Model epoch in which a chosen data epoch ends.
    """
    ends = {e * steps_per_epoch for e in range(every, epochs + 1, every)} if every else set()
    chosen = {calls}
    for k in range(1, calls + 1):
        if any((k - 1) * steps_per_call < s <= k * steps_per_call for s in ends):
            chosen.add(k)
    return sorted(chosen)


@dataclass
class Score:
    """The monitored value of the epoch that just ended, and which direction is better."""

    name: str  # val_accuracy | val_loss | train_loss
    read: Callable[[], Optional[float]]  # None when this epoch has no value (not validated)

    @property
    def mode(self) -> str:
        return MODES[self.name]

    def value(self) -> Optional[float]:
        return self.read()

    def better(self, a: float, b: Optional[float], min_delta: float = 0.0) -> bool:
        """Whether a beats b (None: nothing yet) by more than min_delta; NaN never does."""
        if a is None or not math.isfinite(a):
            return False
        if b is None:
            return True
        return a < b - min_delta if self.mode == "min" else a > b + min_delta


class Validation(Callback):
    """Records the validation Model.fit ran after this epoch; logs it and gives it to the logger.

    Runs before the checkpointer and the early stop in the callback list, which read `current`.
    The curve is also kept in checkpoints/val_curve.json, so that a resumed run continues it (the
    points up to the step it resumes from).
    skip() is true once training was stopped mid-epoch (a signal, the NaN guard): fit would still
    validate that epoch, so the first validation batch stops it there and nothing is recorded.
    """

    def __init__(self, steps_per_epoch: int, start: dict, ckpt_dir: Optional[str], logger, skip: Callable[[], bool]):
        """start: the resume state ({} for a fresh run); ckpt_dir: where to keep the curve (None: not here)."""
        super().__init__()
        self.steps_per_epoch = steps_per_epoch
        start_step = start.get("global_step", 0)
        self.start_step = start_step  # a resumed run's cur_step_num counts from 0 again
        self.logger = logger
        self.skip = skip
        self.path = os.path.join(ckpt_dir, VAL_CURVE) if ckpt_dir else None
        self.curve = _prior_curve(start)  # {"epoch", "step", "accuracy", "loss"} per validation
        self.current = None  # this epoch's point, or None
        self.results = {}  # the last validation's metrics, as Model.fit returned them
        self.step = start_step  # the global step of the weights as they are now

    def on_train_epoch_begin(self, run_context):
        self.current = None

    def on_train_step_end(self, run_context):
        self.step = self.start_step + int(run_context.original_args().cur_step_num)

    def on_eval_step_end(self, run_context):
        if self.skip():
            run_context.request_stop()

    def on_train_epoch_end(self, run_context):
        cb = run_context.original_args()

        results = flat(cb.get("eval_results"))
        if not results or self.skip():
            return
        step = self.start_step + int(cb.cur_step_num)
        point = {
            "epoch": round(step / self.steps_per_epoch, 3),
            "step": step,
            "accuracy": float(results["accuracy"]),
            "loss": float(results["loss"]),
        }
        self.current = point
        self.results = dict(results)  # every metric of this validation (top-5, per class, ...)
        self.curve.append(point)
        if self.path:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            write_json(self.path, self.curve)
        log.info(
            "epoch %g validation: val_accuracy %.4f val_loss %.4f", point["epoch"], point["accuracy"], point["loss"]
        )
        if self.logger is not None:
            self.logger.log_metrics({"val/accuracy": point["accuracy"], "val/loss": point["loss"]}, step)

    def last(self) -> dict:
        """The metrics of a validation of the weights as they are now (this process's), or {}."""
        if self.results and self.curve and self.curve[-1]["step"] == self.step:
            return dict(self.results)
        return {}


def _prior_curve(start: dict) -> list:
    """The validations before the step a run resumes from, from the checkpoint's own directory."""
    if not start:
        return []
    path = os.path.join(os.path.dirname(start["path"]), VAL_CURVE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [p for p in json.load(f) if p["step"] <= start["global_step"]]


class EarlyStop(EarlyStopping):
    """MindSpore's EarlyStopping on the runner's Score; remembers when and why it stopped.

    patience counts checks: validations for val_accuracy/val_loss, epochs for train_loss. Under data
    parallel EarlyStopping compares the ranks' mean (its all-reduce), so every rank stops at the same
    epoch; the checkpointer's best is rank 0's own value.
    """

    def __init__(self, score: Score, patience: int, min_delta: float, steps_per_epoch: int, start_step: int):
        super().__init__(monitor=score.name, patience=patience, min_delta=min_delta, mode=score.mode)
        self.score = score
        self.steps_per_epoch = steps_per_epoch
        self.start_step = start_step
        self.stop = None  # filled when it stops

    def _get_monitor_value(self, cb_params):
        value = self.score.value()
        return None if value is None else np.array(value, np.float64)

    def on_train_epoch_end(self, run_context):
        super().on_train_epoch_end(run_context)
        if self.stopped_epoch and self.stop is None:
            step = self.start_step + int(run_context.original_args().cur_step_num)
            self.stop = {
                "epoch": round(step / self.steps_per_epoch, 3),
                "step": step,
                "reason": (
                    f"{self.monitor} did not improve by more than {self.min_delta:g} for {self.patience} "
                    f"check(s); best {float(self.best):.6g}"
                ),
            }
            log.warning("early stop at epoch %g (step %d): %s", self.stop["epoch"], step, self.stop["reason"])


@dataclass
class Watch:
    """What build() sets up for validation, the best checkpoint and early stopping."""

    validation: Optional[Validation]
    score: Score
    early_stop: Optional[EarlyStop]
    valid_epochs: list = field(default_factory=list)  # Model epochs after which fit validates
    patience: int = 0
    min_delta: float = 0.0

    def callbacks(self, checkpointer) -> list:
        """In their order: record the validation, then the checkpointer reads it, then the early stop."""
        first = [self.validation] if self.validation else []
        return first + [checkpointer] + ([self.early_stop] if self.early_stop else [])

    def fit_args(self, val_data) -> dict:
        """Model.fit's validation arguments (none: fit trains as Model.train does)."""
        if not self.valid_epochs:
            return {}
        return {"valid_dataset": val_data, "valid_frequency": self.valid_epochs, "valid_dataset_sink_mode": False}

    def curve(self) -> list:
        return list(self.validation.curve) if self.validation else []


def build_watch(
    cfg, evaluate: bool, plan, steps_per_epoch: int, start: dict, ckpt_dir, epoch_loss, logger, skip
) -> Watch:
    """The Validation callback, the Score the checkpointer keeps the best by, and the EarlyStop (or None).

    cfg: the whole config (validation, checkpoint.monitor, early_stop, epochs); start: the resume state;
    ckpt_dir: where this process keeps the curve (None on ranks that write nothing); epoch_loss(): the
    current epoch's mean training loss; skip(): whether training was stopped mid-epoch.
    """
    every = cfg.validation.every_epochs
    steps_per_call = plan.total_steps // plan.train_epochs
    valid_epochs = (
        validation_epochs(every, cfg.epochs, steps_per_epoch, steps_per_call, plan.train_epochs) if evaluate else []
    )
    start_step = start.get("global_step", 0)
    # The curve file matters only to a resume: none without checkpoints or with a single final validation.
    keep = ckpt_dir if every > 0 and cfg.checkpoint.every_epochs > 0 else None
    validation = Validation(steps_per_epoch, start, keep, logger, skip) if evaluate else None

    def reader(name):
        if name == "train_loss":
            return epoch_loss
        key = name[len("val_") :]
        return lambda: validation.current[key] if validation and validation.current else None

    es = cfg.early_stop
    # One monitor for both (runner/config/checks.py refuses two different ones): the run stops on the value that
    # chose the checkpoint it keeps.
    chosen = str(cfg.checkpoint.monitor)
    if chosen == "auto" and es.patience > 0:
        chosen = str(es.monitor)
    name = resolve_monitor(chosen, every > 0)
    score = Score(name, reader(name))
    stop = EarlyStop(score, es.patience, es.min_delta, steps_per_epoch, start_step) if es.patience > 0 else None
    return Watch(validation, score, stop, valid_epochs, es.patience, es.min_delta)


def restore_best(step_cell, checkpointer) -> Optional[str]:
    """Load the best checkpoint into the train cell (after an early stop); return its path, or None."""
    best = checkpointer.best
    if not best or not checkpointer.writer:
        return None  # data parallel: only the rank that wrote it reads it back, and only it writes outputs
    path = os.path.join(checkpointer.dir, best["file"])
    ms.load_param_into_net(step_cell, ms.load_checkpoint(path))
    if getattr(step_cell, "ema_decay", 0) > 0:
        step_cell.use_ema()  # the checkpoint's average (its ema.*), as model.ckpt of a run without early stop
    log.info(
        "early stop: the best checkpoint (%s %.6g, %s) becomes the final weights", best["monitor"], best["value"], path
    )
    return path


def finish(watch: Watch, trainer, val_data, checkpointer, evaluate: bool, reuse: bool = True) -> tuple:
    """(final validation metrics or {}, the early-stop record or None), after training.

    After an early stop the best checkpoint's weights become the final ones; the final validation is
    then of those weights. Otherwise a validation fit ran at the last step is reused.
    """
    record = None
    if watch.early_stop is not None:
        stop = watch.early_stop.stop
        record = {
            "stopped": stop is not None,
            "monitor": watch.early_stop.monitor,
            "patience": watch.patience,
            "min_delta": watch.min_delta,
            **(stop or {}),
        }
        if stop is not None:
            record["restored"] = restore_best(trainer.step_cell, checkpointer)
            if record["restored"]:
                record["restored_step"] = checkpointer.best["global_step"]
    if not evaluate:
        return {}, record
    # reuse=False: the weights changed since the last validation in fit (the EMA was put in).
    last = watch.validation.last() if reuse and not (record and record.get("restored")) else {}
    if last:
        return last, record

    return flat(trainer.evaluator.eval(val_data, dataset_sink_mode=False)), record


def best_record(checkpointer, steps_per_epoch: int) -> Optional[dict]:
    """metrics.json's `best_checkpoint`: which checkpoint is the best, at which epoch, with what value."""
    return _record(checkpointer.best, checkpointer, steps_per_epoch) if checkpointer.best else None


def top_records(checkpointer, steps_per_epoch: int) -> list:
    """metrics.json's `top_checkpoints`: the checkpoint.top_k kept best ones, best first, as best_record."""
    return [_record(b, checkpointer, steps_per_epoch) for b in checkpointer.top]


def _record(best: dict, checkpointer, steps_per_epoch: int) -> dict:
    return {
        "monitor": best["monitor"],
        "value": best["value"],
        "epoch": round(best["global_step"] / steps_per_epoch, 3),
        "step": best["global_step"],
        "file": os.path.join(checkpointer.dir, best["file"]),
    }
