"""Consumer of `checkpoint` and `resume`: resumable checkpoints, signal-triggered saves, exact resume.

A resumable checkpoint is the whole train cell saved with MindSpore's save_checkpoint: the network
(BatchNorm statistics included), the optimizer's state (momentum/Adam moments and `global_step`,
which is the learning-rate schedule's position) and the loss-scale Parameters of the train step.
`checkpoints/latest.json` says which file is the latest, at which global step, and the loss curve
so far; it is written after the checkpoint file, so it always names a complete file.

Why not MindSpore's built-ins alone (both read in MindSpore 2.10's sources and tried here):
- ModelCheckpoint's save (serialization._exec_save) deletes the existing file before writing the
  new one under a temporary name, and it has no notion of a "best" checkpoint.
- OnRequestExit saves on a signal only in "graceful exit" mode (MS_ENABLE_GRACEFUL_EXIT=1 and a
  `graceful_exit` Parameter in the network); otherwise it writes nothing until on_train_end and
  without the epoch/step, so its directory stayed empty in a try here. It also accepts SIGTERM only
  (docs/mindspore-notes.md#checkpoint-builtins).
So this callback saves with save_checkpoint (MindSpore's format and parameter walk) into a new file
name, renames it into place, and records it in latest.json, also written by rename.
"""

import logging
import os
import signal
from types import SimpleNamespace
from typing import List, Optional

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore.common.dtype import float_type
from mindspore.train import Callback

from runner.errors import ConfigError, Interrupted
from runner.rundir.atomic import save_checkpoint, write_json
from runner.rundir.layout import (
    CHECKPOINT_SUFFIXES,
    STATE,
    RunDir,
    StateProblem,
    has_checkpoint,
    read_checkpoint,
    read_state,
    step_files,
)
from runner.rundir.resume_check import in_place, wants_resume
from runner.rundir.run_state import RunState
from runner.training.interrupts import FinalPhaseInterrupted, signal_name

log = logging.getLogger("runner")
STEP_KEY = "runner_global_step"  # the optimizer already owns a Parameter named global_step


class Checkpointer(Callback):
    """Saves the train cell every `every_epochs` epochs, at an epoch that beats the best by `checkpoint.monitor`,
    and at the step end after SIGINT/SIGTERM.

    Reads and writes the run state: the best checkpoints (`top`), the signal that asks training to stop
    (`signal`); reads the guard's trip (nothing after it is checkpointed), this epoch's monitored value
    (through the Score) and the per-step records saved in latest.json so a resume continues the curves.
    """

    def __init__(self, cfg, ckpt_dir: str, steps_per_epoch: int, state: RunState, score, writer: bool = True):
        """cfg: the config's `checkpoint` section; score: which value the best is chosen by (validation.Score:
        name, value(state), better())."""
        super().__init__()
        self.cfg = cfg
        self.dir = ckpt_dir
        self.steps_per_epoch = steps_per_epoch
        self.state = state
        start = state.start
        self.start_step = state.start_step
        self.kept = list(start.get("kept", []))
        self.score = score
        # The best checkpoints by the monitor, best first: checkpoint.top_k of them (MMEngine's save_best
        # with max_keep_ckpts, MindCV's top_k policy); a latest.json from before top_k has only its best.
        top = start.get("top_k") or ([start["best"]] if start.get("best") else [])
        state.top = [b for b in (_same_monitor(b, score.name) for b in top) if b][: max(1, cfg.top_k)]
        self.writer = writer  # data parallel: rank 0 writes, the other ranks only stop with it
        self.last_saved = self.start_step if start.get("path") else None
        self.final_phase = False
        self.saved_on_signal: tuple = (None, None)  # (path, step) of the checkpoint a signal made
        self._old_handlers: dict = {}

    @property
    def top(self) -> list:
        """The best checkpoints by the monitor ({file, monitor, value, global_step}), best first."""
        return self.state.top

    @property
    def best(self) -> Optional[dict]:
        """The best checkpoint by the monitor, or None."""
        return self.state.best

    def enters_top(self, value) -> bool:
        """Whether an epoch with this monitored value earns a place among the top_k kept checkpoints."""
        if not self.cfg.keep_best or value is None:
            return False
        if len(self.top) < max(1, self.cfg.top_k):
            return self.score.better(value, None)
        return self.score.better(value, self.top[-1]["value"])

    def _rank(self, entry: dict) -> None:
        """Place a checkpoint among the top ones (ties keep the earlier first) and trim to top_k."""
        top = [b for b in self.top if b["file"] != entry["file"]]
        at = next((i for i, b in enumerate(top) if self.score.better(entry["value"], b["value"])), len(top))
        self.state.top = (top[:at] + [entry] + top[at:])[: max(1, self.cfg.top_k)]

    # Python runs signal handlers between bytecodes of the main thread, so the flag is seen at the
    # next step end; the step in flight completes and the saved state is consistent.
    def _on_signal(self, signum, frame):
        self.release()  # a second signal acts as it would have without us
        if self.final_phase:
            raise FinalPhaseInterrupted(signum)
        self.state.signal = signum

    def arm(self, final_phase: bool = False) -> None:
        """Catch SIGINT/SIGTERM (checkpoint.on_signal): in training, stop at the next step end; in the
        final phase (evaluation and report, after training), raise FinalPhaseInterrupted at once."""
        self.final_phase = final_phase
        if self.cfg.on_signal and not self._old_handlers:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def release(self) -> None:
        """Give SIGINT/SIGTERM their previous handlers back."""
        while self._old_handlers:
            sig, old = self._old_handlers.popitem()
            signal.signal(sig, old)

    def on_train_begin(self, run_context):
        self.arm()

    def on_train_end(self, run_context):
        # The handlers stay for the final phase (no gap in which a signal kills the run silently).
        self.final_phase = True
        cb = run_context.original_args()
        signum, vetoed = self.state.signal, self.state.guard_tripped
        if signum is not None and self.last_saved != self.global_step(cb) and not vetoed:
            self.save(cb, value=None)  # the signal came after the last step's end

    def on_train_step_end(self, run_context):
        signum = self.state.signal
        if signum is not None:
            cb = run_context.original_args()
            if not self.state.guard_tripped:  # the guard stopped training: nothing after it is checkpointed
                # Said once, with the resume hint, when training has stopped (exit_if_interrupted).
                self.saved_on_signal = (self.save(cb, value=None), self.global_step(cb))
            run_context.request_stop()

    def on_train_epoch_end(self, run_context):
        cb = run_context.original_args()
        if self.state.signal is not None or not self.cfg.every_epochs:
            return
        # Model.train calls epoch end after the guard's request_stop too: that state is the bad one.
        if self.state.guard_tripped:
            return
        value = self.score.value(self.state)
        # An epoch that enters the top k is saved also between scheduled epochs, so that "best" is the
        # best seen, not the best among the scheduled saves.
        if self.enters_top(value) or cb.cur_epoch_num % self.cfg.every_epochs == 0:
            self.save(cb, value)

    def global_step(self, cb) -> int:
        return self.start_step + cb.cur_step_num

    def save(self, cb, value) -> Optional[str]:
        """Write a checkpoint and latest.json atomically; drop checkpoints beyond keep_last and the top_k best.

        value: the monitored value of this checkpoint's epoch (None: it cannot become the best). State
        holding any non-finite value (weights, BatchNorm statistics, optimizer moments) is never
        written: the latest checkpoint stays the last finite one. Returns None then.
        """
        step = self.global_step(cb)
        name = f"step_{step:08d}.ckpt"
        path = os.path.join(self.dir, name)
        if not self.writer:
            return path
        bad = nonfinite_params(cb.train_network.parameters_dict())
        if bad:
            log.warning(
                "not checkpointing step %d: %s hold non-finite values; the latest checkpoint stays %s",
                step,
                ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else ""),
                self.kept[-1] if self.kept else "none",
            )
            return None
        os.makedirs(self.dir, exist_ok=True)
        save_checkpoint(cb.train_network, path, append_dict={STEP_KEY: step})
        self.last_saved = step
        if name not in self.kept:
            self.kept.append(name)
        if self.enters_top(value):
            self._rank({"file": name, "monitor": self.score.name, "value": value, "global_step": step})
        best = {b["file"] for b in self.top}
        # The keep_last latest files, best or not: a latest checkpoint that is also the best counts
        # once, so top_k=1 keep_last=1 keeps one file, not the best plus the one before it.
        recent = self.kept[-max(1, self.cfg.keep_last) :]
        dropped = [n for n in self.kept if n not in best and n not in recent]
        self.kept = [n for n in self.kept if n not in dropped]
        state = {
            "latest": name,
            "global_step": step,
            "epoch": step // self.steps_per_epoch,
            "step_in_epoch": step % self.steps_per_epoch,
            "losses": self.state.run_losses().tolist(),
            "best": self.best,
            "top_k": self.top,
            "kept": self.kept,
        }
        # Per-step records of the whole run so far, for the curves and metrics of a resumed run.
        series = self.state.series()
        state["step_time_ms"] = [round(t, 3) for t in series["step_time_ms"]]
        state["record_steps"] = series["step"]
        state["lr"] = series["lr"]
        # The state names the new file before old ones go: a crash in between leaves extra files, never
        # a latest.json that points at nothing.
        write_json(os.path.join(self.dir, STATE), state)
        for n in dropped:
            try:
                os.remove(os.path.join(self.dir, n))
            except FileNotFoundError:
                pass
        return path

    def save_final(self, train_cell, step: int) -> Optional[str]:
        """Checkpoint the end of training (unless that step is saved already), so resume can redo the
        final phase (evaluation and report) after an interruption."""
        if self.last_saved == step:
            return None

        return self.save(SimpleNamespace(train_network=train_cell, cur_step_num=step - self.start_step), None)

    def exit_if_interrupted(self):
        """After Model.train returned: a signal stopped it, so raise Interrupted (the run can resume; the command
        line exits 128+signal)."""
        signum = self.state.signal
        if signum is not None:
            self.release()
            path, step = self.saved_on_signal
            saved = f" at step {step}: saved {path};" if path else ";"
            log.warning(
                "interrupted by %s%s resume with resume=true and hydra.run.dir=%s",
                signal_name(signum),
                saved,
                os.path.dirname(os.path.abspath(self.dir)),
            )
            raise Interrupted(signum, os.path.dirname(os.path.abspath(self.dir)))


def _same_monitor(best, monitor: str):
    """A resumed run's best, unless it was chosen by another monitor (then the best starts afresh)."""
    if not best:
        return None
    if "value" not in best:  # latest.json of a version that kept the lowest training loss only
        best = {
            "file": best["file"],
            "monitor": "train_loss",
            "value": best["loss"],
            "global_step": best["global_step"],
        }
    if best["monitor"] != monitor:
        log.info(
            "checkpoint.monitor=%s: the resumed run's best was by %s; choosing the best afresh",
            monitor,
            best["monitor"],
        )
        return None
    return best


def find_resume(resume, run_dir: str) -> dict:
    """What to resume from: {} for a fresh start, else latest.json's content with `path` added.

    resume=true (or "last") looks in this run's own checkpoints/ and starts fresh if there are none,
    so a re-queued job can always pass it. Any other value is a run directory, a checkpoints/
    directory or a .ckpt file, and must exist. An unreadable latest.json or a missing newest file
    falls back to the newest intact checkpoint in the same directory, and says so.
    """
    if not wants_resume(resume):
        return {}
    if in_place(resume):
        ckpt_dir = RunDir(run_dir).checkpoints
        if not has_checkpoint(ckpt_dir):
            log.info("resume=true: no checkpoint in %s yet; starting from scratch", run_dir)
            return {}
        return _read_state(ckpt_dir)
    path = os.path.abspath(str(resume))
    for ckpt_dir in (RunDir(path).checkpoints, path):
        if os.path.isdir(ckpt_dir) and has_checkpoint(ckpt_dir):
            return _read_state(ckpt_dir)
    if os.path.isfile(path) and path.endswith(CHECKPOINT_SUFFIXES):
        params = _load(path)
        if STEP_KEY not in params:
            raise ConfigError(
                f"resume={resume}: {path} was not written by the runner's checkpointer (it has no step; "
                "model.ckpt and model.safetensors hold only the final weights, the resumable ones are in "
                f"checkpoints/: resume={os.path.dirname(path)} continues the run)."
            )
        step = int(params[STEP_KEY].asnumpy())
        return {"path": path, "global_step": step}
    raise ConfigError(f"resume={resume}: no checkpoints/{STATE} or step_*.ckpt file there to resume from.")


def _load(path: str) -> dict:
    return read_checkpoint(path, "resume: ")


def _readable(path: str) -> bool:
    try:
        return STEP_KEY in _load(path)
    except ConfigError:
        return False


def _read_state(ckpt_dir: str) -> dict:
    """latest.json's record, or the newest intact step_*.ckpt when latest.json or its file is broken."""
    try:
        return read_state(ckpt_dir)
    except StateProblem as e:
        problem = str(e)
    for name in step_files(ckpt_dir):
        path = os.path.join(ckpt_dir, name)
        if _readable(path):
            step = int(name[len("step_") : -len(".ckpt")])
            log.warning("resume: %s; resuming from the newest intact checkpoint, %s (step %d)", problem, path, step)
            kept = [n for n in reversed(step_files(ckpt_dir)) if n <= name]
            return {"path": path, "global_step": step, "kept": kept, "fallback": problem}
    raise ConfigError(f"resume: {problem}, and {ckpt_dir} holds no intact step_*.ckpt to resume from.")


def nonfinite_params(params: dict) -> List[str]:
    """Names of the parameters (a name -> Parameter/Tensor dict) holding NaN or infinity."""
    bad = []
    for name, p in params.items():
        a = p.asnumpy()
        if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
            bad.append(name)
    return bad


EVALUATE_HINT = "Use another checkpoint of the run (ckpt=last|best|final, or a step_*.ckpt in its checkpoints/)."


def usable_weights(values: dict, own: dict, path: str, hint: str = EVALUATE_HINT) -> dict:
    """values (name -> the checkpoint's tensor) in the dtypes of own (name -> the network's Parameter).

    Refused (ConfigError naming the parameters): NaN or infinity anywhere, as resume refuses it (a result
    of such a model is no result), and integer or boolean data where the network holds floats. Floats of
    another width (a float16 checkpoint of a float32 network) are cast, as MindSpore's own loader would
    fail on them with a traceback.
    """
    nonfloat = [
        f"{n} ({v.dtype})" for n, v in values.items() if own[n].dtype in float_type and v.dtype not in float_type
    ]
    bad = nonfinite_params(values)
    if nonfloat or bad:
        what = f"{len(bad)} parameter(s) hold NaN or infinity ({', '.join(bad[:3])})" if bad else ""
        if nonfloat:
            what += (" and " if what else "") + f"{len(nonfloat)} hold non-float data ({', '.join(nonfloat[:3])})"
        raise ConfigError(
            f"{path} cannot be used: {what}; a model with such weights gives no meaningful result. {hint}"
        )
    return {
        n: v if v.dtype == own[n].dtype else ms.Parameter(v.astype(own[n].dtype), name=n) for n, v in values.items()
    }


def _last_finite(ckpt_dir: str, before: str) -> Optional[str]:
    """The newest checkpoint in ckpt_dir other than `before` whose state is all finite."""
    for name in step_files(ckpt_dir):
        path = os.path.join(ckpt_dir, name)
        if name == os.path.basename(before):
            continue
        try:
            if not nonfinite_params(_load(path)):
                return path
        except ConfigError:
            continue
    return None


# The learning-rate schedule is rebuilt from the config on every start (the same values when the
# config is unchanged), so a changed epochs or an explicit new optim.lr takes effect; the
# optimizer's stored copy must not overwrite it.
SCHEDULE_PARAMS = ("learning_rate",)


def _is_schedule(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in SCHEDULE_PARAMS)


def restore(train_cell, state: dict, train_data, steps_per_model_epoch: int, total_steps: int) -> int:
    """Load the train cell's state and position the data pipeline; return Model.train's initial_epoch."""
    params = _load(state["path"])
    bad = nonfinite_params(params)
    if bad:
        good = _last_finite(os.path.dirname(state["path"]), state["path"])
        hint = f"resume={good}" if good else "a fresh run (no finite resumable checkpoint is left)"
        raise ConfigError(
            f"resume: {state['path']} holds non-finite values ({', '.join(bad[:3])}"
            f"{' and more' if len(bad) > 3 else ''}); training from it would go on with a broken model. "
            f"Use {hint} instead."
        )
    params = {k: v for k, v in params.items() if not _is_schedule(k)}
    # The schedule the config just built, loaded onto itself: MindSpore would otherwise warn it was not loaded.
    params.update({k: v for k, v in train_cell.parameters_dict().items() if _is_schedule(k)})
    try:
        missing, _ = ms.load_param_into_net(train_cell, params)
    except (ValueError, RuntimeError, TypeError) as e:  # shapes of another model
        missing = [str(e).strip().splitlines()[0]]
    missing = [m for m in missing if not _is_schedule(m)]
    if missing:
        raise ConfigError(
            f"resume: {state['path']} does not fit this configuration (missing {', '.join(missing[:5])}); "
            "resume with the configuration the checkpoint was trained with."
        )
    step = int(state["global_step"])
    if step > total_steps:
        raise ConfigError(
            f"resume: {state['path']} is at step {step}, beyond this run's {total_steps} steps; "
            "raise epochs to continue it."
        )
    # Replay the pipeline instead of jumping: augmentations then draw the same random numbers as in
    # the uninterrupted run (MindSpore's fast recovery skips them and says they may differ).
    ds.config.set_fast_recovery(False)
    # set_init_step makes the next iterator start at this global step with the shuffle order the
    # uninterrupted run had there (measured: identical batches mid-epoch and across epochs).
    if step < total_steps:
        train_data.set_init_step(step)
    log.info("resumed from %s at step %d", state["path"], step)
    return step // steps_per_model_epoch
