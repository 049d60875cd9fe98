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
import stat
from dataclasses import dataclass
from typing import Any, List, Optional

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


# ---------------------------------------------------------------------------------------------------
# Reading a record: the one way every command that reads a run directory opens its files, so that no entry
# (a FIFO, a device, a symlink loop, a file of the wrong shape) can hang or crash it.

MAX_RECORD_BYTES = 256 * 2**20  # far above any record a run writes (a long run's metrics.json is a few MB)


class RecordProblem(ValueError):
    """A run record that is there and cannot be read; the message says why in a few words."""


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "special file"


def read_record(path: str) -> Optional[str]:
    """The text of the record at path, None when there is none. RecordProblem when it is anything but a
    readable regular file of UTF-8 text: a FIFO, socket, device or directory (never opened: opening a FIFO
    waits for a writer, a device may act), a symlink loop or a link to nothing, or larger than any record."""
    try:
        before = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise RecordProblem("a symbolic link to nothing") from None
        return None
    except OSError as e:  # ELOOP, EACCES, ENAMETOOLONG, ...
        raise RecordProblem(e.strerror or type(e).__name__) from None
    if not stat.S_ISREG(before.st_mode):
        raise RecordProblem(f"a {_file_kind(before.st_mode)}, not a file")
    if before.st_size > MAX_RECORD_BYTES:
        raise RecordProblem(f"{before.st_size} bytes, more than any record a run writes")
    try:
        # O_NONBLOCK: were it swapped for a FIFO since the stat, the open returns at once (checked below).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise RecordProblem(e.strerror or type(e).__name__) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RecordProblem("replaced by something other than a file while being read")
        data = f.read(MAX_RECORD_BYTES + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise RecordProblem("not UTF-8 text") from None


NUMBER = "number"  # a JSON number (a bool is not one), or a non-finite float as the runner writes it
# atomic.finite_or_str writes NaN and infinities as these strings (strict JSON has no literal for them): a
# diverged run's records hold them, and are still its records.
NON_FINITE = ("nan", "inf", "-inf")


def check_shape(value: Any, shape: Any, where: str) -> None:
    """RecordProblem naming the first entry of value that is not of shape. shape: a type or tuple of types,
    NUMBER, {key: shape} (an object; each listed key, where present, of its shape), or [shape] (a list of
    them). A null is always accepted: a record writes null for what the run did not measure."""
    if value is None:
        return
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            raise RecordProblem(f"{where} is a JSON {_json_type(value)}, not an object")
        for key, inner in shape.items():
            if key in value:
                check_shape(value[key], inner, f"{where}.{key}" if where else key)
    elif isinstance(shape, list):
        if not isinstance(value, list):
            raise RecordProblem(f"{where} is a JSON {_json_type(value)}, not a list")
        for i, item in enumerate(value):
            check_shape(item, shape[0], f"{where}[{i}]")
    elif shape == NUMBER:
        if isinstance(value, bool) or not (isinstance(value, (int, float)) or value in NON_FINITE):
            raise RecordProblem(f"{where} is a JSON {_json_type(value)}, not a number")
    elif isinstance(value, bool) and shape is int or not isinstance(value, shape):
        raise RecordProblem(f"{where} is a JSON {_json_type(value)}, not {_shape_name(shape)}")


def _json_type(value: Any) -> str:
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "list", dict: "object"}
    return names.get(type(value), type(value).__name__)


def _shape_name(shape: Any) -> str:
    types = shape if isinstance(shape, tuple) else (shape,)
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "a boolean",
        list: "a list",
        dict: "an object",
    }
    return " or ".join(names.get(t, t.__name__) for t in types)


def read_json_record(path: str, shape: Any = None) -> Any:
    """The JSON record at path (None when there is none), checked against shape (check_shape);
    RecordProblem when it cannot be read, is not JSON, or is not of that shape."""
    text = read_record(path)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as e:
        raise RecordProblem(f"not JSON ({e})") from None
    if shape is not None:
        check_shape(value, shape, "")
    return value


# The fields of metrics.json that the collection commands read, and the shapes they read them as: a record
# whose field has another shape is listed as unreadable, naming the field (runner/rundir/status.py).
METRICS_SHAPE = {
    **{k: NUMBER for k in ("val_accuracy", "val_loss", "val_top5_accuracy", "final_loss", "compile_seconds")},
    **{k: NUMBER for k in ("throughput_samples_per_s", "step_time_median_ms", "step_time_p90_ms", "train_seconds")},
    "peak_host_memory_mb": NUMBER,
    **{k: int for k in ("steps", "optimizer_updates", "train_samples", "val_samples")},
    "loss_curve": [NUMBER],
    "val_curve": [{"epoch": NUMBER, "step": int, "accuracy": NUMBER, "loss": NUMBER}],
    "early_stop": {"stopped": bool},
    "nan_guard": {"reason": str, "why": str},
    "best_checkpoint": {"monitor": str, "value": NUMBER},
    "flops": {"achieved_gflops_per_s": NUMBER, "conv_paths": {}},
    "versions": {},
    "conv": {},
    "cpu_isa": {},
    "distributed": {},
}
# history.json: every resume of the run, in order (runner/rundir/resume_check.py).
HISTORY_SHAPE = [{"from": str, "changes": {}, "step": int}]


def read_metrics(run_dir: str) -> Optional[dict]:
    """metrics.json of run_dir (None when there is none); RecordProblem naming what is wrong with it."""
    metrics = read_json_record(RunDir(run_dir).metrics, METRICS_SHAPE)
    paths = (metrics or {}).get("flops", {}) or {}
    for name, entry in (paths.get("conv_paths") or {}).items():
        check_shape(entry, {"layers": int}, f"flops.conv_paths.{name}")
    return metrics


def read_history(run_dir: str) -> list:
    """history.json of run_dir ([] when there is none): RecordProblem unless it is a list of resumes whose
    changes are each [before, after]."""
    history = read_json_record(RunDir(run_dir).history, HISTORY_SHAPE) or []
    for i, entry in enumerate(history):
        for key, pair in (entry.get("changes") or {}).items():
            if not (isinstance(pair, list) and len(pair) == 2):
                raise RecordProblem(f"[{i}].changes.{key} is not a pair [before, after]")
    return history


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
        text = read_record(path)  # never opens a FIFO or follows a symlink loop
        if text is None:
            raise FileNotFoundError(path)
        state = json.loads(text)
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
