"""Every file name of a run directory, and the readers of its records: the one place either is spelled.

A run directory holds, from the top: config.yaml (re-runnable), metrics.json, model.ckpt (the final
weights; model.safetensors with checkpoint.format=safetensors), last_good.ckpt (after a NaN stop),
loss_scale.csv, resume.json (what the last resume changed), history.json (every resume), .runner.complete
(written last), rank_logs/ (data parallel), and checkpoints/ with step_<N>.ckpt, latest.json (which one is
the latest and the best) and val_curve.json. No MindSpore import here: the
run directory is claimed before MindSpore loads.
"""

import glob
import json
import os
import re
from dataclasses import dataclass
from typing import List, Optional

from runner.datasets.errors import error_reason
from runner.errors import ConfigError

CONFIG = "config.yaml"
METRICS = "metrics.json"
MODEL = "model.ckpt"
MODEL_SAFETENSORS = "model.safetensors"  # the final weights with checkpoint.format=safetensors
FINAL_NAMES = {"ckpt": MODEL, "safetensors": MODEL_SAFETENSORS}
CHECKPOINT_SUFFIXES = (".ckpt", ".safetensors")  # the files MindSpore's load_checkpoint reads
LAST_GOOD = "last_good.ckpt"
LOSS_SCALE = "loss_scale.csv"
RESUME_RECORD = "resume.json"
# Every resume of the run, in order: config.yaml stays what the run started as (runner/rundir/resume_check.py).
HISTORY = "history.json"
COMPLETE = ".runner.complete"
FAILED = "failed.json"  # a sweep job that failed before metrics.json: its error, for the summary
RANK_LOGS = "rank_logs"
CHECKPOINTS = "checkpoints"
STATE = "latest.json"  # in checkpoints/
VAL_CURVE = "val_curve.json"  # in checkpoints/


@dataclass(frozen=True)
class RunDir:
    """A run directory's paths by role."""

    path: str

    @property
    def config(self) -> str:
        return os.path.join(self.path, CONFIG)

    @property
    def metrics(self) -> str:
        return os.path.join(self.path, METRICS)

    @property
    def model(self) -> str:
        return os.path.join(self.path, MODEL)

    def final_weights(self, fmt: str = "ckpt") -> str:
        """Where a run writes its final weights in checkpoint.format fmt (model.ckpt, model.safetensors)."""
        return os.path.join(self.path, FINAL_NAMES[str(fmt)])

    def saved_final(self) -> Optional[str]:
        """The final weights the run saved (model.ckpt or model.safetensors, the newer if both), or None."""
        found = [p for p in (os.path.join(self.path, n) for n in FINAL_NAMES.values()) if os.path.isfile(p)]
        return max(found, key=os.path.getmtime) if found else None

    @property
    def last_good(self) -> str:
        return os.path.join(self.path, LAST_GOOD)

    @property
    def loss_scale(self) -> str:
        return os.path.join(self.path, LOSS_SCALE)

    @property
    def resume_record(self) -> str:
        return os.path.join(self.path, RESUME_RECORD)

    @property
    def history(self) -> str:
        return os.path.join(self.path, HISTORY)

    @property
    def complete(self) -> str:
        return os.path.join(self.path, COMPLETE)

    @property
    def failed(self) -> str:
        return os.path.join(self.path, FAILED)

    @property
    def rank_logs(self) -> str:
        return os.path.join(self.path, RANK_LOGS)

    @property
    def checkpoints(self) -> str:
        return os.path.join(self.path, CHECKPOINTS)

    @property
    def state(self) -> str:
        return os.path.join(self.checkpoints, STATE)

    @property
    def val_curve(self) -> str:
        return os.path.join(self.checkpoints, VAL_CURVE)

    def checkpoint(self, name: str) -> str:
        """A file in checkpoints/."""
        return os.path.join(self.checkpoints, name)

    def has_checkpoint(self) -> bool:
        """Whether checkpoints/ holds latest.json or any step_*.ckpt."""
        return has_checkpoint(self.checkpoints)


def of_checkpoints(ckpt_dir: str) -> Optional[RunDir]:
    """The run directory whose checkpoints/ folder ckpt_dir is, or None."""
    ckpt_dir = os.path.abspath(ckpt_dir)
    return RunDir(os.path.dirname(ckpt_dir)) if os.path.basename(ckpt_dir) == CHECKPOINTS else None


def has_checkpoint(ckpt_dir: str) -> bool:
    """Whether ckpt_dir holds latest.json or any step_*.ckpt."""
    return os.path.exists(os.path.join(ckpt_dir, STATE)) or bool(step_files(ckpt_dir))


def step_files(ckpt_dir: str) -> List[str]:
    """step_*.ckpt files in ckpt_dir, newest (highest step) first."""
    names = [os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(ckpt_dir), "step_*.ckpt"))]
    return sorted((n for n in names if re.fullmatch(r"step_\d+\.ckpt", n)), reverse=True)


class StateProblem(Exception):
    """latest.json is missing, unreadable, or names a file that is gone: the message says which."""


def read_state(ckpt_dir: str) -> dict:
    """latest.json of ckpt_dir, with `path` (the latest checkpoint's full path) added.

    Raises StateProblem when it is missing, not a JSON object with `latest` and `global_step`, names a
    missing file or anything but a file name, or records a `best` without a file: each caller decides
    what that means for it
    (resume falls back to the newest intact step file, ckpt=/init_from= refuse).
    """
    path = os.path.join(ckpt_dir, STATE)
    try:
        with open(path) as f:
            state = json.load(f)
        if not isinstance(state, dict):
            raise TypeError(f"a JSON {type(state).__name__}, not an object")
        best = state.get("best")
        if best is not None and not isinstance(best, dict):
            raise TypeError("its best record is not an object")
        top = state.get("top_k") or []
        if not isinstance(top, list) or not all(isinstance(b, dict) for b in top):
            raise TypeError("its top_k record is not a list of objects")
        names = [state["latest"]] + ([best["file"]] if best else []) + [b.get("file") for b in top]
        # Plain file names in checkpoints/ only: a hand-edited "../../x.ckpt" must not reach outside it.
        if not all(isinstance(n, str) and n and os.path.basename(n) == n for n in names):
            raise ValueError(f"checkpoint names {names} are not file names")
        state["path"] = os.path.join(ckpt_dir, state["latest"])
        if not os.path.isfile(state["path"]):
            raise StateProblem(f"{path} names {state['latest']}, which is missing")
        state["global_step"] = int(state["global_step"])
    except FileNotFoundError:
        raise StateProblem(f"{path} is missing") from None
    except (OSError, ValueError, KeyError, TypeError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        detail = error_reason(e)
        raise StateProblem(f"{path} is unreadable ({type(e).__name__}: {detail})") from None
    return state


def file_format(path: str) -> str:
    """MindSpore's name for a checkpoint file's format, by its suffix: safetensors or ckpt."""
    return "safetensors" if str(path).endswith(".safetensors") else "ckpt"


def read_checkpoint(path: str, context: str = "") -> dict:
    """MindSpore's own checkpoint reader (never pickle), .ckpt or .safetensors by the file's suffix; a ConfigError
    when the file is not a checkpoint.

    context prefixes the message with the setting that named the file (e.g. "resume: ").
    """
    import mindspore as ms

    try:
        # load_checkpoint refuses a .safetensors file unless told its format (MindSpore 2.10).
        return ms.load_checkpoint(path, format=file_format(path))
    except (ValueError, RuntimeError, OSError, TypeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{context}{path} cannot be read as a MindSpore checkpoint ({first}).") from None
