"""The whole run, top to bottom: environment, data, network, trainer, training, report."""

import logging
import math
import os
from functools import partial

from hydra.core.hydra_config import HydraConfig

from runner import distributed, report
from runner.context import cap_cpu_isa, setup
from runner.errors import UserError, as_out_of_memory
from runner.validate import validate

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
    validate(cfg)
    run_dir = HydraConfig.get().runtime.output_dir
    if distributed.should_launch(cfg):
        return distributed.launch(cfg, run_dir)  # msrun re-enters run() once per rank
    isa = cap_cpu_isa(cfg.device)  # before MindSpore loads: oneDNN reads it once

    from datasets import build_data
    from models import build_model
    from runner.amp import build_trainer
    from runner.checkpoints import Checkpointer, find_resume, restore
    from runner.eval_metrics import as_metrics, evaluation_metrics
    from runner.loggers import build_logger
    from runner.monitor import RunMonitor
    from runner.nan_guard import attach
    from runner.optim import build_optimizer
    from runner.shapes import InputShapes, compile_count

    target = setup(cfg)
    mode = cfg.mode.name.name
    rank, world = distributed.init(cfg)
    batch = distributed.local_batch(cfg, world)
    shard = (world, rank) if world > 1 else None
    data = build_data(
        cfg.data, cfg.padding, batch, cfg.seed, shard=shard, augment=cfg.augment, label_depth=cfg.model.num_classes
    )
    make_net = partial(build_model, cfg.model, data.num_classes, data.channels, min(data.height, data.width))
    net = make_net()
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
    num_outputs = cfg.model.num_classes or data.num_classes
    model, step_cell, evaluator, amp_used = build_trainer(
        net,
        cfg.amp,
        optimizer,
        mode,
        target,
        run_dir,
        grad_stats=cfg.diagnose.enabled,
        label_smoothing=cfg.loss.label_smoothing,
        metrics=evaluation_metrics(num_outputs),
    )
    if amp_used["amp_level_used"] != "O0" and target == "CPU":
        log.warning(
            "AMP %s on CPU runs slower than O0 (FP16 convolutions compute in FP32 and cast); "
            "it is here for numerics, not speed.",
            amp_used["amp_level_used"],
        )

    logger = build_logger(cfg.logger, cfg, run_dir)
    monitor = RunMonitor(cfg.log_every, total_steps, cfg.batch_size, logger)
    start = find_resume(cfg.resume, run_dir)
    initial_epoch = restore(step_cell, start, data.train, total_steps // train_epochs, total_steps) if start else 0
    ckpt = Checkpointer(
        cfg.checkpoint, os.path.join(run_dir, "checkpoints"), data.steps_per_epoch, start, monitor, rank == 0
    )
    watch, amp_callbacks = attach(cfg, run_dir, net, step_cell, amp_used)  # loss-scale trace + NaN guard
    log.info(
        "training %s (%s, %s) for %d steps on %s", cfg.model.name, mode, amp_used["amp_level_used"], total_steps, target
    )
    shapes = InputShapes(mode, data.padding["compile_budget"])
    try:
        model.train(
            train_epochs,
            data.train,
            [monitor, shapes, *amp_callbacks, ckpt],
            dataset_sink_mode=sink,
            sink_size=sink_size,
            initial_epoch=initial_epoch,
        )
    except (RuntimeError, MemoryError) as e:
        oom = as_out_of_memory(e, cfg.batch_size)
        if oom is None:
            raise
        raise oom from None
    except OSError as e:  # a checkpoint written during training (disk full, directory gone)
        raise UserError(f"Could not write a checkpoint in {run_dir}: {e}. Earlier checkpoints are intact.") from None
    ckpt.exit_if_interrupted()
    failure = watch.finish(make_net)  # None, or the error raised once the outputs are saved

    val = evaluator.eval(data.val, dataset_sink_mode=False) if cfg.eval and not failure else {}
    losses = ckpt.losses()
    compiles = compile_count(step_cell, mode, shapes)
    metrics = {
        "val_accuracy": float(val["accuracy"]) if val else None,
        "val_loss": float(val["loss"]) if val else None,
        **as_metrics(val),
        "final_loss": float(losses[-1]),
        "loss_curve": losses.tolist(),
        **monitor.timing(),
        "compile_count": compiles,
        **shapes.metrics(compiles),
        "padding": data.padding,
        "augment": data.augment,
        "label_smoothing": cfg.loss.label_smoothing,
        "skipped_samples": data.skipped_samples,
        "peak_host_memory_mb": report.peak_rss_mb(),
        **watch.metrics(),
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
        "resumed_from": start.get("path"),
        "distributed": {"workers": world, "per_rank_batch": batch},
    }
    if world > 1:
        distributed.write_rank_record(run_dir, rank, net, float(losses[-1]))
        if rank != 0:
            return metrics  # rank 0 writes the run's outputs
    metrics_path, ckpt_path = os.path.join(run_dir, "metrics.json"), os.path.join(run_dir, "model.ckpt")
    try:  # the numbers first: a checkpoint that cannot be written must not take them with it
        report.write_config(run_dir, cfg)
        report.write_json(metrics_path, metrics)
        if cfg.save_checkpoint and not failure:
            report.save_checkpoint(net, ckpt_path)
            metrics["checkpoint"] = ckpt_path
        # FLOPs, device memory, advice, plot
        metrics.update(report.measure(cfg, net, data, monitor, metrics, watch.scales))
        report.write_json(metrics_path, metrics)
        report.finish(run_dir, metrics, logger)
    except OSError as e:
        raise UserError(
            f"Could not write the run's outputs in {run_dir}: {e}. Free space or choose another "
            "hydra.run.dir; the files already there are complete."
        ) from None
    if failure:
        raise failure
    print(report.summary_line(metrics), flush=True)
    return metrics
