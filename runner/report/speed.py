"""speed.json in the cache directory: the steady step time of each configuration this machine has run,
which plan=true reads (runner/training/plan.py) instead of estimating."""

import json
import logging
import time
from typing import Optional

log = logging.getLogger("runner")
SPEED_FILE = "speed.json"


# What a step's time depends on besides the machine: whole sections (any model setting, depth included, changes
# the network; any padding, mode, precision or sink setting how it runs) and the few settings of others that add
# work to a step. Two runs share a record only when all of them agree.
STEP_SECTIONS = ("model", "padding", "mode", "amp", "sink", "augment", "distributed", "device")
STEP_SETTINGS = (
    "batch_size",
    "data.name",
    "data.channels",
    "data.image_size",
    "optim.name",
    "optim.accumulate_steps",
    "optim.clip_grad_norm",
    "optim.freeze",
    "ema.decay",
)


def speed_key(cfg, conv_path: str) -> str:
    """The record a step time is kept under: the machine, a readable summary, and a digest of everything the
    step's time depends on (STEP_SECTIONS, STEP_SETTINGS, the convolution path taken)."""
    import hashlib

    from omegaconf import OmegaConf

    from runner.report.flops import machine_key

    parts = {k: OmegaConf.to_container(cfg[k], resolve=True, enum_to_str=True) for k in STEP_SECTIONS if k in cfg}
    parts.update({k: OmegaConf.select(cfg, k) for k in STEP_SETTINGS})
    parts["conv_path"] = conv_path
    digest = hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]
    shape = f"{cfg.padding.name}:{cfg.padding.get('height', '')}x{cfg.padding.get('width', '')}"
    return " | ".join(
        [
            machine_key(None),
            f"{cfg.model.name}/{cfg.model.get('arch', '')}/d{cfg.model.get('depth', '')}/w{cfg.model.get('width', '')}",
            f"{cfg.data.name} {shape}",
            f"batch {cfg.batch_size}",
            f"{cfg.mode.name} {cfg.amp.level} conv {conv_path}",
            digest,
        ]
    )


def comparable(cfg, conv_path: str) -> dict:
    """What a recorded run must share with this configuration for its host cost per layer to stand for this
    one's (runner/training/plan.py): how the steps run, not what they compute."""
    return {"mode": str(cfg.mode.name), "amp": str(cfg.amp.level), "conv": conv_path}


def _speed_file():
    from runner.models.onednn import cache_dir

    return cache_dir() / SPEED_FILE


def speed_records() -> dict:
    try:
        data = json.loads(_speed_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):  # absent or corrupt: estimated from the peak instead
        return {}


def record_speed(
    cfg, conv_path: str, step_ms: Optional[float], compile_s: Optional[float], flops: Optional[dict] = None
) -> None:
    """Remember a finished run's steady step time for later plans of the same configuration on this machine;
    with its FLOPs per step and layers (`flops`: metrics.json's block), plans of other configurations learn
    this machine's cost per layer from it (runner/training/plan.py)."""
    if step_ms is None:
        return
    from runner.rundir.atomic import write_json

    flops = flops or {}
    records = speed_records()
    records[speed_key(cfg, conv_path)] = {
        "step_ms": round(step_ms, 3),
        "compile_s": None if compile_s is None else round(compile_s, 3),
        "when": time.strftime("%Y-%m-%d %H:%M"),
        **comparable(cfg, conv_path),
        "flops_per_step": flops["train_per_sample"] * cfg.batch_size if flops.get("train_per_sample") else None,
        "layers": flops.get("layers"),
    }
    try:
        _speed_file().parent.mkdir(parents=True, exist_ok=True)
        write_json(str(_speed_file()), records)
    except OSError as e:  # a read-only cache: later plans estimate from the peak
        log.debug("could not record the step time in %s: %s", _speed_file(), e)
