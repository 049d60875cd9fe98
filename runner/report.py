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
    flops = m.get("flops") or {}
    util = f" ({flops['utilization']:.0%} of matmul peak)" if flops.get("utilization") is not None else ""
    gflops = f" | {flops['achieved_gflops_per_s']:.1f} GFLOP/s{util}" if flops else ""
    return (
        f"{acc} | loss {m['final_loss']:.4f} | compile {m['compile_seconds']:.2f} s "
        f"({m.get('compile_count', '?')}x) | step {m['step_time_median_ms']:.1f} ms (median) "
        f"{m.get('step_time_p90_ms', 0):.1f} (p90) | {m['throughput_samples_per_s']:.0f} samples/s{gflops} | "
        f"peak RSS {m['peak_host_memory_mb']:.0f} MB | "
        f"{m['mode']} {m['amp_level_used']} on {m['device_target']} | outputs: {m['run_dir']}"
    )


# ---- issue 4: measurements beyond timing, the run's plot, advice and the logger's final record ----


def measure(cfg, net, data, monitor, metrics: dict, scales: list) -> dict:
    """FLOPs (counted from the layers) and peak device memory, per-step series, plot and advice.

    scales: the loss scale of every step, as the NaN guard traced it (runner/nan_guard.py).
    """
    from runner import advice, flops, plots

    out = flops.measure(net, data, metrics["throughput_samples_per_s"], metrics["device_target"])
    out["pid"] = os.getpid()  # each sweep job runs in its own process (hydra_plugins/runner_launcher)
    series = {**monitor.series(), "loss_scale": list(scales) or None}
    title = (
        f"{cfg.model.name} {metrics['mode']} {metrics['amp_level_used']} batch {cfg.batch_size}: {metrics['run_dir']}"
    )
    out["plot"] = plots.run_plot(series, os.path.join(metrics["run_dir"], "curves.png"), title)
    out["loss_scale_curve"] = series["loss_scale"]
    out["step_time_ms_curve"] = series["step_time_ms"]
    out["advice"] = advice.run_notes({**metrics, **out}, cfg.padding.name.name)
    return out


def finish(run_dir: str, metrics: dict, logger) -> None:
    """Print the advice, hand the final metrics and artifacts to the configured logger."""
    import logging

    for note in metrics.get("advice", []):
        logging.getLogger("runner").info("note: %s", note)
    artifacts = [os.path.join(run_dir, n) for n in ("config.yaml", "metrics.json")] + [metrics["plot"]]
    logger.finish(metrics, artifacts)
