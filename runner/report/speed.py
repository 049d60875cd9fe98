"""speed.json in the cache directory: the steady step time of each configuration this machine has run,
which plan=true reads (runner/training/plan.py) instead of estimating."""

import json
import logging
import time
from typing import Optional

log = logging.getLogger("runner")
SPEED_FILE = "speed.json"


def speed_key(cfg, conv_path: str) -> str:
    """What a step's time depends on besides the machine: the model, the input, the batch, how it runs."""
    from runner.report.flops import machine_key

    shape = f"{cfg.padding.name}:{cfg.padding.get('height', '')}x{cfg.padding.get('width', '')}"
    return " | ".join(
        [
            machine_key(None),
            f"{cfg.model.name}/{cfg.model.get('arch', '')}/w{cfg.model.get('width', '')}",
            f"{cfg.data.name} {shape}",
            f"batch {cfg.batch_size}",
            f"{cfg.mode.name} {cfg.amp.level} conv {conv_path}",
        ]
    )


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
        "conv": conv_path,
        "flops_per_step": flops["train_per_sample"] * cfg.batch_size if flops.get("train_per_sample") else None,
        "layers": flops.get("layers"),
    }
    try:
        _speed_file().parent.mkdir(parents=True, exist_ok=True)
        write_json(str(_speed_file()), records)
    except OSError as e:  # a read-only cache: later plans estimate from the peak
        log.debug("could not record the step time in %s: %s", _speed_file(), e)
