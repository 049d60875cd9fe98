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

import json
import logging
import os
import signal

import numpy as np
from mindspore.train import Callback

from runner.errors import ConfigError
from runner.files import save_checkpoint, write_json

log = logging.getLogger("runner")
STATE = "latest.json"
STEP_KEY = "runner_global_step"  # the optimizer already owns a Parameter named global_step


class Checkpointer(Callback):
    """Saves the train cell every `every_epochs` epochs and at the step end after SIGINT/SIGTERM."""

    def __init__(
        self, cfg, ckpt_dir: str, steps_per_epoch: int, start: dict, epoch_loss, run_losses, writer: bool = True
    ):
        """epoch_loss() is the current epoch's mean training loss, run_losses() this process's loss per step."""
        super().__init__()
        self.cfg = cfg
        self.dir = ckpt_dir
        self.steps_per_epoch = steps_per_epoch
        self.start_step = start.get("global_step", 0)
        self.prior_losses = list(start.get("losses", []))
        self.kept = list(start.get("kept", []))
        self.best = start.get("best")
        self.epoch_loss = epoch_loss
        self.run_losses = run_losses
        self.writer = writer  # data parallel: rank 0 writes, the other ranks only stop with it
        self.signum = None
        self._old_handlers = {}

    # Python runs signal handlers between bytecodes of the main thread, so the flag is seen at the
    # next step end; the step in flight completes and the saved state is consistent.
    def _on_signal(self, signum, frame):
        self.signum = signum
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)  # a second signal acts as it would have without us

    def on_train_begin(self, run_context):
        if self.cfg.on_signal:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def on_train_end(self, run_context):
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)

    def on_train_step_end(self, run_context):
        if self.signum is not None:
            cb = run_context.original_args()
            path = self.save(cb, best_loss=None)
            log.warning("signal %d: saved %s at step %d; stopping", self.signum, path, self.global_step(cb))
            run_context.request_stop()

    def on_train_epoch_end(self, run_context):
        cb = run_context.original_args()
        if self.signum is not None or not self.cfg.every_epochs or cb.cur_epoch_num % self.cfg.every_epochs:
            return
        self.save(cb, best_loss=self.epoch_loss())

    def global_step(self, cb) -> int:
        return self.start_step + cb.cur_step_num

    def losses(self) -> np.ndarray:
        """The loss curve of the whole run, across resumes."""
        return np.concatenate([np.asarray(self.prior_losses, np.float32), self.run_losses()])

    def save(self, cb, best_loss) -> str:
        """Write a checkpoint and latest.json atomically; drop checkpoints beyond keep_last and the best."""
        step = self.global_step(cb)
        name = f"step_{step:08d}.ckpt"
        path = os.path.join(self.dir, name)
        if not self.writer:
            return path
        os.makedirs(self.dir, exist_ok=True)
        save_checkpoint(cb.train_network, path, append_dict={STEP_KEY: step})
        if name not in self.kept:
            self.kept.append(name)
        if best_loss is not None and self.cfg.keep_best and (self.best is None or best_loss < self.best["loss"]):
            self.best = {"file": name, "loss": best_loss, "global_step": step}
        best = self.best["file"] if self.best else None
        recent = [n for n in self.kept if n != best][-max(1, self.cfg.keep_last) :]
        dropped = [n for n in self.kept if n != best and n not in recent]
        self.kept = [n for n in self.kept if n not in dropped]
        state = {
            "latest": name,
            "global_step": step,
            "epoch": step // self.steps_per_epoch,
            "step_in_epoch": step % self.steps_per_epoch,
            "losses": self.losses().tolist(),
            "best": self.best,
            "kept": self.kept,
        }
        # The state names the new file before old ones go: a crash in between leaves extra files, never
        # a latest.json that points at nothing.
        write_json(os.path.join(self.dir, STATE), state)
        for n in dropped:
            try:
                os.remove(os.path.join(self.dir, n))
            except FileNotFoundError:
                pass
        return path

    def exit_if_interrupted(self):
        """After Model.train returned: a signal stopped it, so exit 128+signal (the run can resume)."""
        if self.signum is not None:
            log.warning("interrupted; resume with resume=true and hydra.run.dir=<this run directory>")
            raise SystemExit(128 + self.signum)


def find_resume(resume, run_dir: str) -> dict:
    """What to resume from: {} for a fresh start, else latest.json's content with `path` added.

    resume=true (or "last") looks in this run's own checkpoints/ and starts fresh if there are none,
    so a re-queued job can always pass it. Any other value is a run directory, a checkpoints/
    directory or a .ckpt file, and must exist.
    """
    if resume is None or str(resume).lower() in ("false", "none", ""):
        return {}
    if str(resume).lower() in ("true", "last"):
        state = os.path.join(run_dir, "checkpoints", STATE)
        if not os.path.exists(state):
            log.info("resume=true: no checkpoint in %s yet; starting from scratch", run_dir)
            return {}
        return _read_state(state)
    path = os.path.abspath(str(resume))
    for cand in (os.path.join(path, "checkpoints", STATE), os.path.join(path, STATE)):
        if os.path.exists(cand):
            return _read_state(cand)
    if os.path.isfile(path) and path.endswith(".ckpt"):
        params = _load(path)
        if STEP_KEY not in params:
            raise ConfigError(
                f"resume={resume}: {path} was not written by the runner's checkpointer (it has no step; "
                "model.ckpt holds only the final weights, the resumable ones are in checkpoints/)."
            )
        step = int(params[STEP_KEY].asnumpy())
        return {"path": path, "global_step": step}
    raise ConfigError(f"resume={resume}: no checkpoints/{STATE} or .ckpt file there to resume from.")


def _load(path: str, **kwargs) -> dict:
    """MindSpore's own checkpoint reader (never pickle), its failures turned into a clear error."""
    import mindspore as ms

    try:
        return ms.load_checkpoint(path, **kwargs)
    except (ValueError, RuntimeError, OSError) as e:
        raise ConfigError(
            f"resume: {path} cannot be read as a MindSpore checkpoint ({str(e).splitlines()[0]})."
        ) from None


def _read_state(state_path: str) -> dict:
    with open(state_path) as f:
        state = json.load(f)
    state["path"] = os.path.join(os.path.dirname(state_path), state["latest"])
    return state


def restore(train_cell, state: dict, train_data, steps_per_model_epoch: int, total_steps: int) -> int:
    """Load the train cell's state and position the data pipeline; return Model.train's initial_epoch."""
    import mindspore as ms
    import mindspore.dataset as ds

    params = _load(state["path"])
    try:
        missing, _ = ms.load_param_into_net(train_cell, params)
    except (ValueError, RuntimeError, TypeError) as e:  # shapes of another model
        missing = [str(e).strip().splitlines()[0]]
    if missing:
        raise ConfigError(
            f"resume: {state['path']} does not fit this configuration (missing {', '.join(missing[:5])}); "
            "resume with the configuration the checkpoint was trained with."
        )
    step = int(state["global_step"])
    if step >= total_steps:
        raise ConfigError(f"resume: {state['path']} is at step {step}, the end of this run's {total_steps} steps.")
    # Replay the pipeline instead of jumping: augmentations then draw the same random numbers as in
    # the uninterrupted run (MindSpore's fast recovery skips them and says they may differ).
    ds.config.set_fast_recovery(False)
    # set_init_step makes the next iterator start at this global step with the shuffle order the
    # uninterrupted run had there (measured: identical batches mid-epoch and across epochs).
    train_data.set_init_step(step)
    log.info("resumed from %s at step %d", state["path"], step)
    return step // steps_per_model_epoch
