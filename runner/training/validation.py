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
from typing import Optional

import mindspore as ms
import numpy as np
from mindspore.train import Callback, EarlyStopping

from runner.config.schema import validation_every
from runner.report.accuracy import flat
from runner.rundir.atomic import write_json
from runner.rundir.layout import VAL_CURVE
from runner.rundir.run_state import RunState

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
    runs after the Model epoch in which a chosen data epoch ends. Linear in the epochs validated (a run of
    100000 epochs, validated after each, plans them in milliseconds).
    """
    chosen = {calls}
    if every:
        chosen.update(-(-(e * steps_per_epoch) // steps_per_call) for e in range(every, epochs + 1, every))
    return sorted(k for k in chosen if 1 <= k <= calls)


@dataclass
class Score:
    """Which value is monitored, read from the run state for the epoch that just ended, and which direction is
    better."""

    name: str  # val_accuracy | val_loss | train_loss

    @property
    def mode(self) -> str:
        return MODES[self.name]

    def value(self, state: RunState) -> Optional[float]:
        """This epoch's value; None when it has none (not validated, or no step yet)."""
        if self.name == "train_loss":
            return state.epoch_loss()
        return state.validation[self.name[len("val_") :]] if state.validation else None

    def better(self, a: float, b: Optional[float], min_delta: float = 0.0) -> bool:
        """Whether a beats b (None: nothing yet) by more than min_delta; NaN never does."""
        if a is None or not math.isfinite(a):
            return False
        if b is None:
            return True
        return a < b - min_delta if self.mode == "min" else a > b + min_delta


class Validation(Callback):
    """Records the validation Model.fit ran after this epoch in the run state (`validation`,
    `validation_metrics`); logs it and gives it to the logger.

    Runs before the checkpointer and the early stop (runner/training/callbacks.py ORDER), which read it.
    The curve is also kept in checkpoints/val_curve.json, so that a resumed run continues it (the
    points up to the step it resumes from).
    Once training was stopped mid-epoch (RunState.halted: a signal, the NaN guard) fit would still
    validate that epoch, so the first validation batch stops it there and nothing is recorded.
    """

    def __init__(self, steps_per_epoch: int, state: RunState, ckpt_dir: Optional[str], logger):
        """state: the run's state (its resume record continues the curve); ckpt_dir: where to keep the curve
        (None: not here)."""
        super().__init__()
        self.steps_per_epoch = steps_per_epoch
        self.state = state
        self.start_step = state.start_step  # a resumed run's cur_step_num counts from 0 again
        self.logger = logger
        self.path = os.path.join(ckpt_dir, VAL_CURVE) if ckpt_dir else None
        self.curve = _prior_curve(state.start)  # {"epoch", "step", "accuracy", "loss"} per validation

    def on_train_epoch_begin(self, run_context):
        self.state.validation = None

    def on_eval_step_end(self, run_context):
        if self.state.halted:
            run_context.request_stop()

    def on_train_epoch_end(self, run_context):
        cb = run_context.original_args()

        results = flat(cb.get("eval_results"))
        if not results or self.state.halted:
            return
        step = self.start_step + int(cb.cur_step_num)
        point = {
            "epoch": round(step / self.steps_per_epoch, 3),
            "step": step,
            "accuracy": float(results["accuracy"]),
            "loss": float(results["loss"]),
        }
        self.state.validation = point
        self.state.validation_metrics = dict(results)  # every metric of this validation (top-5, per class, ...)
        self.state.validation_step = step
        self.curve.append(point)
        if self.path:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            write_json(self.path, self.curve)
        # On screen in the epoch's line (runner/report/monitor.py); in the records here.
        if self.logger is not None:
            values = {"epoch": point["epoch"], "val_accuracy": point["accuracy"], "val_loss": point["loss"]}
            self.logger.log_metrics(values, step)

    def last(self) -> dict:
        """The metrics of a validation of the weights as they are now (this process's), or {}."""
        state = self.state
        if state.validation_metrics and state.validation_step == state.step:
            return dict(state.validation_metrics)
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
    """MindSpore's EarlyStopping on the runner's Score; records when and why it stopped in the run state.

    patience counts checks: validations for val_accuracy/val_loss, epochs for train_loss. Under data
    parallel EarlyStopping compares the ranks' mean (its all-reduce), so every rank stops at the same
    epoch; the checkpointer's best is rank 0's own value.
    """

    def __init__(self, score: Score, patience: int, min_delta: float, steps_per_epoch: int, state: RunState):
        super().__init__(monitor=score.name, patience=patience, min_delta=min_delta, mode=score.mode)
        self.score = score
        self.steps_per_epoch = steps_per_epoch
        self.state = state
        self.start_step = state.start_step

    def _get_monitor_value(self, cb_params):
        value = self.score.value(self.state)
        return None if value is None else np.array(value, np.float64)

    def on_train_epoch_end(self, run_context):
        super().on_train_epoch_end(run_context)
        if self.stopped_epoch and self.state.early_stop is None:
            step = self.start_step + int(run_context.original_args().cur_step_num)
            self.state.early_stop = stop = {
                "epoch": round(step / self.steps_per_epoch, 3),
                "step": step,
                "reason": (
                    f"{self.monitor} did not improve by more than {self.min_delta:g} for {self.patience} "
                    f"check(s); best {float(self.best):.6g}"
                ),
            }
            log.warning("early stop at epoch %g (step %d): %s", stop["epoch"], step, stop["reason"])


@dataclass
class ValidationAndStop:
    """What decides the run's end and its best weights: the Validation callback (None without evaluation) and
    the epochs fit validates after, the Score the best checkpoints are chosen by, and the EarlyStop (None
    when early_stop.patience=0) with its settings."""

    validation: Optional[Validation]
    score: Score
    early_stop: Optional[EarlyStop]
    valid_epochs: list = field(default_factory=list)  # Model epochs after which fit validates
    patience: int = 0
    min_delta: float = 0.0

    def fit_args(self, val_data) -> dict:
        """Model.fit's validation arguments (none: fit trains as Model.train does)."""
        if not self.valid_epochs:
            return {}
        # After every Model epoch (the default): fit's int form, which it tests in constant time per epoch.
        every = self.valid_epochs == list(range(1, len(self.valid_epochs) + 1))
        frequency = 1 if every else self.valid_epochs
        return {"valid_dataset": val_data, "valid_frequency": frequency, "valid_dataset_sink_mode": False}

    def curve(self) -> list:
        return list(self.validation.curve) if self.validation else []


def build_validation_and_stop(
    validation_cfg,
    checkpoint_cfg,
    early_stop_cfg,
    epochs: int,
    evaluate: bool,
    plan,
    steps_per_epoch: int,
    state: RunState,
    ckpt_dir,
    logger,
) -> ValidationAndStop:
    """The Validation callback, the Score the checkpointer keeps the best by, and the EarlyStop (or None).

    The config's `validation`, `checkpoint` and `early_stop` sections, its `epochs` and `eval`; state: the
    run's state (the resume record continues the curve); ckpt_dir: where this process keeps the curve (None
    on ranks that write nothing).
    """
    every = validation_every(validation_cfg, evaluate)
    steps_per_call = plan.total_steps // plan.train_epochs
    valid_epochs = (
        validation_epochs(every, epochs, steps_per_epoch, steps_per_call, plan.train_epochs) if evaluate else []
    )
    # The curve file matters only to a resume: none without checkpoints or with a single final validation.
    keep = ckpt_dir if every > 0 and checkpoint_cfg.every_epochs > 0 else None
    validation = Validation(steps_per_epoch, state, keep, logger) if evaluate else None
    es = early_stop_cfg
    # One monitor for both (runner/config/checks.py refuses two different ones): the run stops on the value that
    # chose the checkpoint it keeps.
    chosen = str(checkpoint_cfg.monitor)
    if chosen == "auto" and es.patience > 0:
        chosen = str(es.monitor)
    score = Score(resolve_monitor(chosen, every > 0))
    stop = EarlyStop(score, es.patience, es.min_delta, steps_per_epoch, state) if es.patience > 0 else None
    return ValidationAndStop(validation, score, stop, valid_epochs, es.patience, es.min_delta)


def restore_best(step_cell, state: RunState, checkpointer) -> Optional[str]:
    """Load the best checkpoint into the train cell (after an early stop); return its path, or None."""
    best = state.best
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


def final_validation(
    chosen: ValidationAndStop, trainer, val_data, state: RunState, checkpointer, evaluate: bool, reuse: bool = True
) -> tuple:
    """(final validation metrics or {}, the early-stop record or None), after training.

    After an early stop the best checkpoint's weights become the final ones; the final validation is
    then of those weights. Otherwise a validation fit ran at the last step is reused.
    """
    record = None
    if chosen.early_stop is not None:
        stop = state.early_stop
        record = {
            "stopped": stop is not None,
            "monitor": chosen.early_stop.monitor,
            "patience": chosen.patience,
            "min_delta": chosen.min_delta,
            **(stop or {}),
        }
        if stop is not None:
            record["restored"] = restore_best(trainer.step_cell, state, checkpointer)
            if record["restored"]:
                record["restored_step"] = state.best["global_step"]
    if not evaluate:
        return {}, record
    # reuse=False: the weights changed since the last validation in fit (the EMA was put in).
    last = chosen.validation.last() if reuse and not (record and record.get("restored")) else {}
    if last:
        return last, record

    return flat(trainer.evaluator.eval(val_data, dataset_sink_mode=False)), record


def best_record(state: RunState, ckpt_dir: str, steps_per_epoch: int) -> Optional[dict]:
    """metrics.json's `best_checkpoint`: which checkpoint is the best, at which epoch, with what value."""
    return _record(state.best, ckpt_dir, steps_per_epoch) if state.best else None


def top_records(state: RunState, ckpt_dir: str, steps_per_epoch: int) -> list:
    """metrics.json's `top_checkpoints`: the checkpoint.top_k kept best ones, best first, as best_record."""
    return [_record(b, ckpt_dir, steps_per_epoch) for b in state.top]


def _record(best: dict, ckpt_dir: str, steps_per_epoch: int) -> dict:
    return {
        "monitor": best["monitor"],
        "value": best["value"],
        "epoch": round(best["global_step"] / steps_per_epoch, 3),
        "step": best["global_step"],
        "file": os.path.join(ckpt_dir, best["file"]),
    }
