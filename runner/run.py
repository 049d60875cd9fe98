"""The whole run, top to bottom: environment, data, network, trainer, training, report."""

import logging
import math
import os

import numpy as np
from hydra.core.hydra_config import HydraConfig

from runner import report
from runner.context import cap_cpu_isa, setup

log = logging.getLogger("runner")


def plan_steps(cfg, steps_per_epoch: int, sink: bool):
    """(total steps, Model.train epochs, sink_size): with sink on, one Model epoch is sink_size steps."""
    total = steps_per_epoch * cfg.epochs
    if not sink or cfg.sink.sink_size in (-1, steps_per_epoch):
        return total, cfg.epochs, -1
    calls = math.ceil(total / cfg.sink.sink_size)
    return calls * cfg.sink.sink_size, calls, cfg.sink.sink_size


def run(cfg) -> dict:
    """Train and evaluate as configured; write the run directory; return the metrics."""
    run_dir = HydraConfig.get().runtime.output_dir
    isa = cap_cpu_isa(cfg.device)  # before MindSpore loads: oneDNN reads it once

    from datasets import build_data
    from models import build_model
    from runner.amp import build_trainer
    from runner.monitor import RunMonitor
    from runner.optim import build_optimizer
    from runner.shapes import InputShapes

    target = setup(cfg)
    mode = cfg.mode.name.name
    data = build_data(cfg.data, cfg.padding, cfg.batch_size, cfg.seed)
    net = build_model(cfg.model, data.num_classes, data.channels, min(data.height, data.width))
    # MindSpore 2.10's Model.train silently trains without sink on CPU (train/model.py), reading
    # epochs as whole passes; say so instead of pretending, and plan the steps it will really run.
    sink = cfg.sink.enabled and target != "CPU"
    if cfg.sink.enabled and not sink:
        log.warning(
            "sink=on has no effect on CPU: MindSpore's Model.train runs without data sink there "
            "(recorded as sink.effective=false in metrics.json)."
        )
    total_steps, train_epochs, sink_size = plan_steps(cfg, data.steps_per_epoch, sink)
    optimizer = build_optimizer(cfg.optim, net.trainable_params(), data.steps_per_epoch, total_steps)
    model, step_cell, evaluator, amp_used = build_trainer(net, cfg.amp, optimizer, mode, target, run_dir)
    if amp_used["amp_level_used"] != "O0" and target == "CPU":
        log.warning(
            "AMP %s on CPU runs slower than O0 (FP16 convolutions compute in FP32 and cast); "
            "it is here for numerics, not speed.",
            amp_used["amp_level_used"],
        )

    monitor = RunMonitor(cfg.log_every, total_steps, cfg.batch_size)
    log.info(
        "training %s (%s, %s) for %d steps on %s", cfg.model.name, mode, amp_used["amp_level_used"], total_steps, target
    )
    shapes = InputShapes(mode, data.padding["compile_budget"])
    model.train(train_epochs, data.train, callbacks=[monitor, shapes], dataset_sink_mode=sink, sink_size=sink_size)

    val = evaluator.eval(data.val, dataset_sink_mode=False) if cfg.eval else {}
    losses = monitor.losses()
    scale = step_cell.scale if hasattr(step_cell, "scale") else step_cell.loss_scaling_manager.get_loss_scale()
    metrics = {
        "val_accuracy": float(val["accuracy"]) if val else None,
        "val_loss": float(val["loss"]) if val else None,
        "final_loss": float(losses[-1]),
        "loss_curve": losses.tolist(),
        **monitor.timing(),
        "compile_count": len(getattr(step_cell, "compile_cache", ())),
        **shapes.metrics(len(getattr(step_cell, "compile_cache", ()))),
        "padding": data.padding,
        "peak_host_memory_mb": report.peak_rss_mb(),
        "loss_scale": {
            "type": amp_used["loss_scale_type_used"],
            "final": float(np.asarray(scale.asnumpy() if hasattr(scale, "asnumpy") else scale)),
            "skipped_steps": int(step_cell.skipped.asnumpy()) if hasattr(step_cell, "skipped") else None,
        },
        **amp_used,
        "mode": mode,
        "device_target": target,
        "cpu_isa": isa,
        "seed": cfg.seed,
        "batch_size": cfg.batch_size,
        "sink": {"requested": cfg.sink.enabled, "effective": sink, "sink_size": sink_size},
        "train_samples": data.train_size,
        "val_samples": data.val_size,
        "versions": report.versions(),
        "run_dir": run_dir,
    }
    report.write_config(run_dir, cfg)
    if cfg.save_checkpoint:
        metrics["checkpoint"] = os.path.join(run_dir, "model.ckpt")
        report.save_checkpoint(net, metrics["checkpoint"])
    report.write_json(os.path.join(run_dir, "metrics.json"), metrics)
    print(report.summary_line(metrics), flush=True)
    return metrics
