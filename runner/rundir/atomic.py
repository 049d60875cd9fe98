"""Atomic file writes: a crash mid-write never leaves a truncated file in place of a good one."""

import glob
import json
import math
import os

# MindSpore is imported in save_checkpoint: the run directory is claimed before MindSpore may load.


def finite_or_str(obj):
    """JSON without NaN/Infinity literals (strict parsers reject them): non-finite floats become strings."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: finite_or_str(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_str(v) for v in obj]
    return obj


def write_json(path: str, data: dict) -> None:
    """Write data as JSON through a temporary file renamed into place."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:  # a full disk or a signal mid-write: no half-written temporary left beside the file
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def save_checkpoint(net, path: str, append_dict=None) -> None:
    """Save a cell's (FP32 master) weights atomically, never a partial file: MindSpore's .ckpt, or .safetensors
    when path ends so (MindSpore's save_checkpoint(format="safetensors"))."""
    import mindspore as ms

    fmt = "safetensors" if path.endswith(".safetensors") else "ckpt"
    # MindSpore appends the format's suffix to a name that lacks it: the temporary name ends with it.
    tmp = f"{path}.tmp.{fmt}"
    try:
        ms.save_checkpoint(net, tmp, append_dict=append_dict, format=fmt)
        os.replace(tmp, path)
    finally:  # MindSpore writes through a temporary of its own; leave no partial file behind
        for leftover in glob.glob(glob.escape(path + ".tmp") + "*"):
            os.remove(leftover)
