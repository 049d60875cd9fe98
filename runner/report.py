"""What every run leaves behind: metrics.json, a re-runnable config.yaml, an FP32 checkpoint, a summary."""

import glob
import json
import os
import platform
import resource
from importlib import metadata

from omegaconf import OmegaConf


def versions() -> dict:
    """Versions of what decides the numbers."""
    out = {"python": platform.python_version()}
    for pkg in ("mindspore", "numpy", "hydra-core", "omegaconf"):
        out[pkg] = metadata.version(pkg)
    return out


def peak_rss_mb() -> float:
    """Peak resident memory of this process (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_config(run_dir: str, cfg) -> str:
    """Save the resolved config so `python -m runner --config-path <run_dir> --config-name config` re-runs it."""
    body = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    rerun = {
        # The saved values are checked against the same schema, and re-runs land beside the original.
        "defaults": ["base_config", "_self_"],
        "hydra": {
            "run": {"dir": os.path.join(run_dir, "rerun-${now:%Y-%m-%d_%H-%M-%S-%f}")},
            "job": {"name": "runner", "chdir": False},
        },
        **body,
    }
    path = os.path.join(run_dir, "config.yaml")
    with open(path, "w") as f:
        f.write(OmegaConf.to_yaml(OmegaConf.create(rerun)))
    return path


def write_json(path: str, data: dict) -> None:
    """Write atomically: a crash mid-write never leaves a truncated file in place of a good one."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def save_checkpoint(net, path: str, append_dict=None) -> None:
    """Save a cell's (FP32 master) weights in MindSpore's format, atomically; never a partial file."""
    import mindspore as ms

    tmp = path + ".tmp.ckpt"
    try:
        ms.save_checkpoint(net, tmp, append_dict=append_dict)
        os.replace(tmp, path)
    finally:  # MindSpore writes through a temporary of its own; leave no partial file behind
        for leftover in glob.glob(glob.escape(path + ".tmp") + "*"):
            os.remove(leftover)


def summary_line(m: dict) -> str:
    """The one line a user reads at the end of a run."""
    acc = f"val_acc {m['val_accuracy']:.4f}" if m.get("val_accuracy") is not None else "val_acc -"
    return (
        f"{acc} | loss {m['final_loss']:.4f} | compile {m['compile_seconds']:.2f} s | "
        f"step {m['step_time_median_ms']:.1f} ms (median) | {m['throughput_samples_per_s']:.0f} samples/s | "
        f"{m['mode']} {m['amp_level_used']} on {m['device_target']} | outputs: {m['run_dir']}"
    )
