"""The whole run, top to bottom: environment -> Recipe.setup -> Recipe.train -> Recipe.report -> cleanup.

The Recipe holds what it builds as typed attributes, set by setup() in the order they are built and
read by train() and report(); builders take their slice of the config, never the whole config. What the
callbacks share while training is one RunState (runner/rundir/run_state.py) the Recipe owns, and
Model.fit runs them in the order of runner/training/callbacks.py ORDER.
"""

import logging
import math
import os
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Callable, NoReturn, Optional, cast

import numpy as np
from omegaconf import OmegaConf

from runner.errors import ConfigError, Interrupted, UserError, as_out_of_memory
from runner.models.onednn import THREADS_VAR
from runner.report import outputs, screen
from runner.report.loggers import build_logger, chosen
from runner.report.metrics import Compiles, Files, Precision, Resources, Results, RunMetrics, Setup, Timing
from runner.report.outputs import watch_warnings, write_config
from runner.report.speed import record_speed
from runner.rundir import lock, resume_check
from runner.rundir.atomic import save_checkpoint, write_json
from runner.rundir.claim import Start, claim_run_dir, run_dir_of
from runner.rundir.layout import RunDir
from runner.rundir.run_state import RunState
from runner.rundir.saved_run import write_classes
from runner.rundir.status import ending_recorded
from runner.training import compile_cache, distributed
from runner.training.environment import cap_cpu_isa, choose_conv, setup
from runner.training.interrupts import FinalPhaseInterrupted, signal_name, signal_of

if TYPE_CHECKING:
    from mindspore import nn

    from runner.amp import Trainer
    from runner.amp.guard import StepChecks
    from runner.datasets import Data
    from runner.report.loggers import Loggers
    from runner.report.monitor import RunMonitor
    from runner.report.profiling import ProfileWindow
    from runner.report.shapes import InputShapes
    from runner.training.checkpoints import Checkpointer
    from runner.training.validation import ValidationAndStop

log = logging.getLogger("runner")
# Imported in the functions that use them: everything that loads MindSpore (amp, report.accuracy, monitor,
# shapes, profiling, training.checkpoints/finetune/optim/validation, datasets, models). run() imports this
# module before environment() sets the CPU ISA cap, which oneDNN reads once when MindSpore loads.
LONG_RUN_STEPS = 1_000_000  # a plan this long is announced before its set-up


@dataclass
class Env:
    """Where this process trains: its run directory, device, mode and place among the ranks."""

    run_dir: str
    target: str
    mode: str
    isa: dict
    rank: int
    world: int
    batch: int  # this rank's share of batch_size
    conv: dict  # model.conv as run: asked, path, reason, cost (environment.choose_conv)
    jit_level: str = "auto"  # mode.jit_level as run ("auto" in pynative, which compiles nothing)
    threads: Optional[int] = None  # CPU threads of this rank when ranks share the host (distributed.rank_threads)


@dataclass
class Plan:
    """How many steps really run, and how Model.train is called to run them."""

    total_steps: int
    train_epochs: int
    sink: bool
    sink_size: int


@dataclass
class Outcome:
    """What training produced."""

    val: dict  # runner.report.accuracy.flat(...)'s keys, or {}
    losses: np.ndarray  # loss per step call, across resumes
    compiles: int
    postmortem: Optional[dict]  # the NaN guard's record when it fired
    failure: Optional[Exception]  # raised once the outputs are written
    early_stop: Optional[dict] = None  # when and why early stopping ended the run (None: not configured)


def plan_steps(epochs: int, sink_cfg, steps_per_epoch: int, sink: bool) -> Plan:
    """With sink on, one Model.train epoch is sink_size steps; without, one pass over the data."""
    total = steps_per_epoch * epochs
    if not sink or sink_cfg.sink_size in (-1, steps_per_epoch):
        return Plan(total, epochs, sink, -1)
    calls = math.ceil(total / sink_cfg.sink_size)
    return Plan(calls * sink_cfg.sink_size, calls, sink, sink_cfg.sink_size)


def check_accumulate(optim_cfg, sink: bool, total_steps: int) -> int:
    """optim.accumulate_steps (optim_cfg: the config's `optim`), refused with data sink: the micro-batches of one
    update would run inside a device loop whose per-step loss and overflow flags the runner never sees."""
    n = optim_cfg.accumulate_steps
    if n > 1 and sink:
        raise ConfigError(
            f"optim.accumulate_steps={n} cannot run with sink=on on this device (data sink runs the steps on "
            "the device, out of the runner's accumulation window): use sink=off, or a larger batch_size."
        )
    if total_steps % n:
        log.warning(
            "optim.accumulate_steps=%d: the last %d of %d steps do not fill a window and update nothing",
            n,
            total_steps % n,
            total_steps,
        )
    return n


def run(cfg, run_dir: str, overrides=()) -> Optional[RunMetrics]:
    """Train and evaluate as configured (cfg is validated) in run_dir; return the metrics.

    overrides: the command line's (an optim.lr given there is applied on resume). None when a resumed
    run had nothing left to do (it was complete already).
    """
    watch_warnings()  # repeated under the summary line: on a terminal they scroll past
    if distributed.in_msrun():  # a rank: the process that launched msrun claimed the directory and records its end
        return _train(cfg, run_dir)
    if claim_run_dir(cfg, run_dir, overrides) is Start.NOTHING_TO_TRAIN:
        return None
    with ending_recorded(run_dir, signal_of):  # failed.json: the error or the signal that ended it, for runner-runs
        if distributed.should_launch(cfg.distributed):
            return distributed.launch(cfg, run_dir)  # msrun re-enters run() once per rank
        return _train(cfg, run_dir)


def _train(cfg, run_dir: str) -> Optional[RunMetrics]:
    """One process's training: its environment, the recipe's set-up, training and report."""
    recipe = Recipe(cfg, environment(cfg, run_dir))
    recipe.setup()
    try:
        return recipe.report(recipe.train())
    except FinalPhaseInterrupted as e:
        recipe.interrupted_after_training(e.signum)
    finally:
        recipe.cleanup()


def environment(cfg, run_dir: str) -> Env:
    """Cap the CPU ISA before MindSpore loads, set its context and seeds, join the ranks."""
    if not distributed.in_msrun():  # first: a run stopped in its first seconds is listed as the run it is
        write_config(run_dir, cfg)
    screen.status("choosing the convolutions (model.conv)")
    conv = choose_conv(cfg)  # model.conv=best decides before the cap, which depends on the path
    isa = cap_cpu_isa(cfg.device, conv["path"])  # before MindSpore loads: oneDNN reads it once
    compile_cache.quiet_messages(cfg)  # before MindSpore loads too
    screen.status("loading MindSpore")
    target = setup(cfg.device, cfg.mode, cfg.seed)
    rank, world = distributed.init(cfg.distributed)
    batch = distributed.local_batch(cfg.batch_size, world)
    threads = distributed.rank_threads(cfg.distributed) if distributed.in_msrun() else None
    if threads and target == "CPU":  # before the network is built: onednn's pool reads it when it starts
        import mindspore as ms

        ms.set_context(runtime_num_threads=threads)
        os.environ[THREADS_VAR] = str(threads)
    if rank == 0 and distributed.in_msrun():
        if not lock.held_by_parent(run_dir):  # msrun started without the runner's launcher
            lock.acquire(run_dir)
    if rank == 0 and distributed.in_msrun():  # at the start, so a killed run can be resumed from its own config
        write_config(run_dir, cfg)
    return Env(run_dir, target, str(cfg.mode.name), isa, rank, world, batch, conv, str(cfg.mode.jit_level), threads)


class Recipe:
    """One training run: setup() builds the state below in this order, train() runs it, report() writes it."""

    # build_network
    data: "Data"
    make_net: Callable  # builds a fresh network of the same architecture (the NaN diagnosis)
    net: "nn.Cell"  # the FP32 network (its parameters are the master weights)
    fine_tune: Optional[dict]  # init_from / optim.freeze record, or None
    # build_training
    plan: Plan
    trainer: "Trainer"
    # resume
    start: dict  # the resume record ({} for a fresh run)
    initial_epoch: int  # Model.train's epoch to start from (resume)
    state: RunState  # what the callbacks share while training (runner/rundir/run_state.py)
    # build_callbacks, run by Model.fit in the order of runner/training/callbacks.py ORDER
    step_checks: "StepChecks"  # the loss-scale trace, the NaN guard, the gradient statistics
    logger: "Loggers"
    monitor: "RunMonitor"
    validation_and_stop: "ValidationAndStop"  # validation, the best checkpoint's score, early stop
    checkpointer: "Checkpointer"
    shapes: "InputShapes"
    profiler: Optional["ProfileWindow"]  # with profile.steps, else None
    cache: Optional[dict] = None  # compile_cache.prepare's record until finish() took it

    def __init__(self, cfg, env: Env):
        self.cfg = cfg
        self.env = env

    def setup(self) -> None:
        """Data and network, then the trainer, then the resume state and the callbacks that share it."""
        self.build_network()
        self.build_training()
        self.resume()
        self.build_callbacks()
        self.prepare_cache()

    def prepare_cache(self) -> None:
        """The compile cache for the graphs this process compiles (after set-up, which compiles none through it):
        the train step unless a resume only reports, then the evaluation's."""
        env = self.env
        trains = self.state.start_step < self.plan.total_steps
        graphs = compile_cache.training_graphs(self.data, env.batch, self.plan.total_steps, trains, self.cfg.eval)
        self.cache = compile_cache.prepare(
            self.cfg,
            purpose="train",
            graphs=graphs,
            target=env.target,
            rank=env.rank,
            world=env.world,
            conv=env.conv["path"],
            isa=str(env.isa.get("value")),
            cells=(self.trainer.step_cell, self.net),
        )

    def finish_cache(self, compile_seconds: Optional[float], complete: bool) -> dict:
        """compile_cache.finish once (report, or cleanup after an interruption: complete=False keeps nothing)."""
        record, self.cache = self.cache, None
        return compile_cache.finish(record, compile_seconds, self.env.target, complete) if record else {}

    def cleanup(self) -> None:
        """Give back the signal handlers the checkpointer took; drop a compile-cache fill the run did not finish."""
        self.finish_cache(None, complete=False)
        self.checkpointer.release()

    def build_network(self) -> None:
        """The pipelines, the network, and what init_from/freeze did to it."""
        from runner.datasets import build_data
        from runner.models import build_model
        from runner.training.finetune import prepare

        shard = (self.env.world, self.env.rank) if self.env.world > 1 else None
        screen.status(f"reading the data (data={self.cfg.data.name})")
        self.data = data = build_data(
            self.cfg.data,
            self.cfg.padding,
            self.env.batch,
            self.cfg.seed,
            shard=shard,
            augment=self.cfg.augment,
            label_depth=self.cfg.model.num_classes,
        )
        log.info(
            "data: %s, %d training and %d validation samples, %d steps an epoch of batch %d",
            self.cfg.data.name,
            data.train_size,
            data.val_size,
            data.steps_per_epoch,
            self.env.batch,
        )
        if self.env.rank == 0:  # what each output of the network stands for; evaluate, predict and init_from read it
            write_classes(self.env.run_dir, data)
        self.make_net = partial(
            build_model,
            self.cfg.model,
            data.num_classes,
            data.channels,
            min(data.height, data.width),
            # best with oneDNN available: each layer takes the algorithm measured fastest for its shape
            # (models/conv.py choose_path), oneDNN's direct kernels where nothing beats them.
            conv="best"
            if self.env.conv["asked"] == "best" and self.env.conv["path"] == "onednn"
            else self.env.conv["path"],
        )
        screen.status(f"building the network (model={self.cfg.model.name})")
        self.net = net = self.make_net()
        sizes = [int(np.prod(p.shape)) for p in net.get_parameters()]
        log.info("model: %s, %s parameters, %d classes", self.cfg.model.name, f"{sum(sizes):,}", data.num_classes)
        if self.cfg.model.num_classes is not None and self.cfg.model.num_classes > data.num_classes:
            log.warning(
                "model.num_classes=%d but the data has %d classes: the model's %d extra outputs never match a "
                "label (they only take probability away); model.num_classes=null takes the count from the data.",
                self.cfg.model.num_classes,
                data.num_classes,
                self.cfg.model.num_classes - data.num_classes,
            )
        # before the optimizer takes the trainable params
        c = self.cfg
        self.fine_tune = prepare(net, c.init_from, c.optim.freeze, data.class_names, c.data, c.seed)

    def build_training(self) -> None:
        """The steps that really run, the optimizer and the AMP train and eval Models."""
        from runner.amp import build_trainer
        from runner.report.accuracy import evaluation_metrics
        from runner.training.optim import build_optimizer

        cfg, env, data, net = self.cfg, self.env, self.data, self.net
        screen.status("building the optimizer and the train step")
        # MindSpore 2.10's Model.train silently trains without sink on CPU (docs/mindspore-notes.md#cpu-sink),
        # reading epochs as whole passes; say so instead of pretending, and plan the steps it really runs.
        if cfg.sink.enabled and env.target == "CPU":
            log.warning(
                "sink=on has no effect on CPU: MindSpore's Model.train runs without data sink there "
                "(recorded as sink.effective=false in metrics.json)."
            )
        self.plan = plan = plan_steps(
            cfg.epochs, cfg.sink, data.steps_per_epoch, cfg.sink.enabled and env.target != "CPU"
        )
        if plan.total_steps >= LONG_RUN_STEPS:
            log.info("%d epochs of %d steps: %d steps", cfg.epochs, data.steps_per_epoch, plan.total_steps)
        accumulate = check_accumulate(cfg.optim, plan.sink, plan.total_steps)
        optimizer = build_optimizer(cfg.optim, net.trainable_params(), data.steps_per_epoch, plan.total_steps)
        self.trainer = trainer = build_trainer(
            net,
            cfg.amp,
            optimizer,
            env.mode,
            env.target,
            env.run_dir,
            cfg.diagnose.enabled,
            update={"clip_norm": cfg.optim.clip_grad_norm, "accumulate": accumulate, "ema_decay": cfg.ema.decay},
            label_smoothing=cfg.loss.label_smoothing,
            metrics=partial(evaluation_metrics, cfg.model.num_classes or data.num_classes),
            jit_level=env.jit_level,
        )
        used = trainer.used
        if used.amp_level_used != "O0" and env.target == "CPU":
            if "rounded" in str((used.amp_compute or {}).get("body", "")):
                log.info(
                    "AMP %s float16 on CPU: FP16 numerics (overflow, loss scale) on the FP32 fast path, at about "
                    "O0's speed; it is here for numerics, not speed (docs/amp.md#on-a-cpu).",
                    used.amp_level_used,
                )
            else:
                log.warning(
                    "AMP %s on CPU runs MindSpore's float16 kernels, slower than O0 (docs/amp.md#on-a-cpu); "
                    "it is here for numerics, not speed.",
                    used.amp_level_used,
                )

    def resume(self) -> None:
        """The resume record, the train cell's state and the data's position restored from it, and the run
        state the callbacks start from."""
        from runner.amp.guard import traced_losses
        from runner.training.checkpoints import find_resume, restore

        cfg, env, data, plan, trainer = self.cfg, self.env, self.data, self.plan, self.trainer
        self.start = start = find_resume(cfg.resume, env.run_dir)
        if start:
            screen.status(f"restoring {start['path']}")
        steps_per_call = plan.total_steps // plan.train_epochs
        self.initial_epoch = (
            restore(trainer.step_cell, start, data.train, steps_per_call, plan.total_steps) if start else 0
        )
        prior_dir = run_dir_of(start.get("path"))
        if start and "losses" not in start and prior_dir:
            # latest.json was lost: the loss curve so far survives in loss_scale.csv (6 significant digits).
            start["losses"] = traced_losses(prior_dir, int(start.get("global_step", 0)))
        self.state = RunState(start)

    def build_callbacks(self) -> None:
        """The callbacks, each given the run state and its slice of the config: trace and guard, logger,
        monitor, validation and early stop, checkpoints, shapes, profiler."""
        from runner.amp.guard import build_step_checks
        from runner.report.monitor import RunMonitor
        from runner.report.shapes import InputShapes
        from runner.training.checkpoints import Checkpointer
        from runner.training.optim import StepRates
        from runner.training.validation import build_validation_and_stop

        cfg, env, data, plan, trainer, state = self.cfg, self.env, self.data, self.plan, self.trainer, self.state
        prior_dir = run_dir_of(self.start.get("path"))
        self.step_checks = build_step_checks(
            env.run_dir, self.net, trainer.step_cell, trainer.used, cfg.diagnose, cfg.log_every, state, prior_dir
        )
        params = cast(dict, OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
        # Other ranks keep their metrics.csv only: one tracking run (W&B, MLflow, TensorBoard) per training run.
        loggers = cfg.logger if env.rank == 0 else {}
        self.logger = logger = build_logger(
            loggers, params, cfg.experiment_name, env.run_dir, state.start_step, prior_dir
        )
        rates = StepRates(
            trainer.step_cell.optimizer, plan.total_steps, cfg.optim.accumulate_steps, trainer.used.drops_overflow
        )
        self.monitor = RunMonitor(
            cfg.log_every,
            plan.total_steps,
            cfg.batch_size,
            state,
            logger,
            rates=rates,
            steps_per_epoch=data.steps_per_epoch,
            epochs=cfg.epochs,
            compiles=env.mode != "pynative",
        )
        ckpt_dir = RunDir(env.run_dir).checkpoints
        self.validation_and_stop = chosen = build_validation_and_stop(
            cfg.validation,
            cfg.checkpoint,
            cfg.early_stop,
            cfg.epochs,
            cfg.eval,
            plan,
            data.steps_per_epoch,
            state,
            ckpt_dir if env.rank == 0 else None,
            logger,
        )
        self.checkpointer = Checkpointer(
            cfg.checkpoint, ckpt_dir, data.steps_per_epoch, state, chosen.score, writer=env.rank == 0
        )
        self.shapes = InputShapes(env.mode, data.padding["compile_budget"], data.padding)
        self.profiler = _profiler(cfg.profile, env)

    def callbacks(self) -> list:
        """The list Model.fit runs, in the order of runner/training/callbacks.py ORDER (fit without a validation
        set trains as Model.train)."""
        from runner.training.callbacks import StepClock, in_order

        checks, chosen = self.step_checks, self.validation_and_stop
        return in_order(
            {
                "profiler": self.profiler,
                "clock": StepClock(self.state),
                "timing": self.monitor,
                "shapes": self.shapes,
                "grad_stats": checks.grad_stats,
                "trace": checks.trace,
                "guard": checks.guard,
                "validation": chosen.validation,
                "checkpoint": self.checkpointer,
                "early_stop": chosen.early_stop,
            }
        )

    def train(self) -> Outcome:
        """Model.fit with the callbacks in their order, then the post-mortem or the evaluation."""
        used = self.trainer.used
        log.info(
            "training (%s, %s) for %d steps on %s",
            self.env.mode,
            used.amp_level_used,
            self.plan.total_steps,
            self.env.target,
        )
        compiling = "compiling the train step and running it (graph mode: the first step waits for it)"
        screen.status(compiling if self.env.mode != "pynative" else "running the first step (pynative)")
        self._fit()
        screen.status("evaluating and writing the report (metrics.json, curves.png)")
        self.checkpointer.exit_if_interrupted()
        self.checkpointer.arm(final_phase=True)  # already armed by Model.train's callbacks, unless it did not run
        return self._after_training()

    def _fit(self) -> None:
        """Model.fit from the resumed position; its errors as the user's (memory, changed data, a full disk)."""
        start_step = self.state.start_step
        try:
            if start_step >= self.plan.total_steps:  # an interrupted final phase: only evaluation and report are left
                log.info(
                    "training ended at step %d before the interruption; finishing the evaluation and report", start_step
                )
            else:
                self.trainer.model.fit(
                    self.plan.train_epochs,
                    self.data.train,
                    callbacks=self.callbacks(),
                    dataset_sink_mode=self.plan.sink,
                    sink_size=self.plan.sink_size,
                    initial_epoch=self.initial_epoch,
                    **self.validation_and_stop.fit_args(self.data.val),
                )
        except (RuntimeError, MemoryError) as e:
            from runner.datasets.sources import data_changed

            known = as_out_of_memory(e, self.env.batch) or data_changed(e)
            if known is None:
                raise
            raise known from None
        except OSError as e:  # a checkpoint written during training (disk full, directory gone)
            raise UserError(
                f"Could not write a checkpoint in {self.env.run_dir}: {e}. Earlier checkpoints are intact."
            ) from None

    def _after_training(self) -> Outcome:
        """The NaN guard's post-mortem, or the EMA weights put in, the best restored after an early stop and the
        final validation."""
        from runner.amp.guard import postmortem, weights_failure
        from runner.report.shapes import compile_count
        from runner.training.validation import final_validation

        used, checks, step_cell = self.trainer.used, self.step_checks, self.trainer.step_cell
        with compile_cache.suspended():  # the diagnosis's graphs are outside the cached sequence
            record, failure = postmortem(
                checks.guard, self.make_net, self.env.run_dir, used.amp_level_used, used.keep_fp32, checks.max_islands
            )
        ema = not failure and getattr(step_cell, "ema_decay", 0) > 0
        if ema:
            step_cell.use_ema()  # the averaged weights are the ones evaluated and saved as model.ckpt
        if not failure:  # a finished run never publishes non-finite weights as its result
            failure = weights_failure(self.net, self.env.run_dir, float(self.cfg.optim.lr), str(used.amp_level_used))
        val, stopped = (
            final_validation(
                self.validation_and_stop,
                self.trainer,
                self.data.val,
                self.state,
                self.checkpointer,
                self.cfg.eval,
                reuse=not ema,
            )
            if not failure
            else ({}, None)
        )
        compiles = compile_count(step_cell, self.env.mode, self.shapes)
        return Outcome(val, self.state.run_losses(), compiles, record, failure, stopped)

    def collect(self, o: Outcome) -> RunMetrics:
        """The run's measurements gathered into the metrics record, section by section (FLOPs, device memory
        and advice come in report())."""
        from runner.report import startup

        timing = Timing(**self.monitor.timing(), startup=startup.record(*self.monitor.first_step_times()))
        return RunMetrics(
            results=self._results(o),
            timing=timing,
            compiles=self._compiles(o),
            resources=Resources(peak_host_memory_mb=outputs.peak_rss_mb()),  # read again at the end (report())
            precision=self._precision(o),
            setup=self._setup(),
            files=self._files(),
        )

    def _results(self, o: Outcome) -> Results:
        from runner.report.accuracy import as_metrics
        from runner.training.validation import best_record, top_records

        ckpt_dir, per_epoch = self.checkpointer.dir, self.data.steps_per_epoch
        return Results(
            val_accuracy=float(o.val["accuracy"]) if o.val else None,
            val_loss=float(o.val["loss"]) if o.val else None,
            **as_metrics(o.val),
            final_loss=float(o.losses[-1]),
            loss_curve=o.losses.tolist(),
            val_curve=self.validation_and_stop.curve(),
            best_checkpoint=best_record(self.state, ckpt_dir, per_epoch),
            top_checkpoints=top_records(self.state, ckpt_dir, per_epoch),
            early_stop=o.early_stop,
            fine_tune=self.fine_tune,
        )

    def _compiles(self, o: Outcome) -> Compiles:
        return Compiles(
            compile_count=o.compiles,
            **self.shapes.metrics(o.compiles),
            padding=self.data.padding,
            skipped_samples=self.data.skipped_samples,
            augment=self.data.augment,
            label_smoothing=self.cfg.loss.label_smoothing,
        )

    def _precision(self, o: Outcome) -> Precision:
        from runner.amp.guard import guard_metrics

        used, checks = self.trainer.used, self.step_checks
        return Precision(
            amp_level_used=used.amp_level_used,
            amp_dtype_used=used.amp_dtype_used,
            amp_compute=used.amp_compute or {},
            loss_scale_type_used=used.loss_scale_type_used,
            native_loss_scale_cell=used.native_loss_scale_cell,
            keep_fp32=used.keep_fp32,
            loss_scale=checks.trace.summary(),
            nan_guard=guard_metrics(o.postmortem),
            diagnose=checks.grad_stats.summary() if checks.grad_stats else None,
        )

    def _setup(self) -> Setup:
        from runner.training.optim import decay_record

        cfg, env, optimizer = self.cfg, self.env, self.trainer.step_cell.optimizer
        return Setup(
            mode=env.mode,
            jit_level=env.jit_level,
            device_target=env.target,
            cpu_isa=env.isa,
            conv=env.conv,
            seed=cfg.seed,
            batch_size=cfg.batch_size,
            effective_batch_size=cfg.batch_size * cfg.optim.accumulate_steps,
            optimizer_updates=int(optimizer.global_step.asnumpy().reshape(-1)[0]),
            weight_decay=decay_record(optimizer, cfg.optim),
            ema_decay=cfg.ema.decay or None,
            sink={
                "requested": cfg.sink.enabled,
                "effective": self.plan.sink,
                "sink_size_requested": cfg.sink.sink_size,
                # -1 (a whole epoch per sink) when sink is off, or when sink_size is one epoch anyway
                "sink_size": self.plan.sink_size,
            },
            distributed={"workers": env.world, "per_rank_batch": env.batch, "threads_per_rank": env.threads},
            train_samples=self.data.train_size,
            val_samples=self.data.val_size,
            versions=outputs.versions(),
        )

    def _files(self) -> Files:
        env = self.env
        return Files(
            run_dir=env.run_dir,
            resumed_from=self.start.get("path"),
            resume_changes=resume_check.changes_this_resume_applied(env.run_dir) if self.start else {},
            loggers=chosen(self.cfg.logger),
            profile=self.profiler.record() if self.profiler is not None else None,
        )

    def report(self, o: Outcome) -> RunMetrics:
        """metrics.json (written before the plot, again when the plot raised the peak), curves.png, model.ckpt,
        the logger's record and the final line."""
        cfg, env = self.cfg, self.env
        m = self.collect(o)
        if self.cache is not None:
            m.compiles.compile_cache = self.finish_cache(m.timing.compile_seconds, complete=not o.failure)
            said = compile_cache.line(m.compiles.compile_cache)
            if said:
                log.info(said)
        if env.world > 1:
            distributed.write_rank_record(env.run_dir, env.rank, self.net, m.results.final_loss)
            if env.rank != 0:
                return m  # rank 0 writes the run's outputs
        scales = (
            self.step_checks.trace.scales if m.precision.loss_scale_type_used != "none" else None
        )  # no flat "scale = 1" panel
        series = {**self.state.series(), "loss_scale": scales}
        title = f"{cfg.model.name} {m.setup.mode} {m.precision.amp_level_used} batch {cfg.batch_size}: {env.run_dir}"
        save = cfg.save_checkpoint and not o.failure
        outputs.measure(m, self.net, self.data, series, _pynative_step_ms(cfg, env.conv["path"]))
        unsaved = self._save_model(m) if save else None
        # Read after the FLOP count's forward pass and the checkpoint's serialisation, and again after the plot:
        # the peak of the whole run, as /usr/bin/time reports it (before, the later steps' memory was missed,
        # then matplotlib's: 655 MiB recorded, 681 MiB by /usr/bin/time for a TINY run).
        m.resources.peak_host_memory_mb = outputs.peak_rss_mb()
        try:  # the numbers first: a plot that cannot be written must not take them with it
            m.write(RunDir(env.run_dir).metrics)
            if unsaved is not None:
                raise unsaved
            outputs.plot(m, series, title, self.data.steps_per_epoch)
            if outputs.peak_rss_mb() > m.resources.peak_host_memory_mb:
                m.resources.peak_host_memory_mb = outputs.peak_rss_mb()
                m.write(RunDir(env.run_dir).metrics)
            outputs.publish(m, self.logger, advise=not o.failure)  # no advice on how to speed up a failed run
            if not o.failure:
                write_json(RunDir(env.run_dir).complete, {"steps": m.timing.steps, "epochs": cfg.epochs})
                record_speed(  # for plan=true
                    cfg, env.conv["path"], m.timing.step_time_median_ms, m.timing.compile_seconds, m.resources.flops
                )
        except OSError as e:
            kept = (
                "metrics.json and the files already there are complete"
                if os.path.exists(RunDir(env.run_dir).metrics)
                else "the files already there are complete; metrics.json could not be written"
            )
            raise UserError(
                f"Could not write the run's outputs in {env.run_dir}: {e}. Free space or choose another "
                f"hydra.run.dir; {kept}."
            ) from None
        screen.end_status()
        if o.failure:
            raise o.failure
        print(outputs.summary_line(m) + outputs.warnings_recap(), flush=True)
        return m

    def _save_model(self, m: RunMetrics) -> Optional[OSError]:
        """Write the final weights (model.ckpt, or model.safetensors by checkpoint.format) atomically and name them
        in the metrics; the error when they could not be written, so metrics.json never names a checkpoint that
        does not exist (a full disk). A resume that changed the format leaves one file of final weights."""
        run = RunDir(self.env.run_dir)
        path = run.final_weights(str(self.cfg.checkpoint.format))
        try:
            save_checkpoint(self.net, path)
            for other in (run.final_weights(f) for f in ("ckpt", "safetensors")):
                if other != path and os.path.exists(other):
                    os.remove(other)
        except OSError as e:
            return e
        m.files.checkpoint = path
        return None

    def interrupted_after_training(self, signum: int) -> NoReturn:
        """The final phase was interrupted: keep the end of training resumable, say how to finish, raise Interrupted
        (the command line exits 128+signal)."""
        state = self.state
        step = state.start_step + (state.call_ends[-1] if state.call_ends else 0)
        if state.guard_tripped:
            log.warning(
                "%s while reporting a stopped (non-finite) run; its outputs are incomplete", signal_name(signum)
            )
            raise Interrupted(signum, os.path.abspath(self.env.run_dir))
        path = self.checkpointer.save_final(self.trainer.step_cell, step) if self.env.rank == 0 else None
        log.warning(
            "%s during the final phase (evaluation and report): training is complete at step %d%s; "
            "resume=true with hydra.run.dir=%s redoes only the evaluation and report.",
            signal_name(signum),
            step,
            f" and checkpointed in {path}" if path else " and checkpointed",
            self.env.run_dir,
        )
        raise Interrupted(signum, os.path.abspath(self.env.run_dir))


def _pynative_step_ms(cfg, conv_path: str) -> Optional[float]:
    """This machine's recorded steady step of cfg in pynative mode (runner/report/speed.py), or None."""
    from runner.report.speed import speed_key, speed_records

    if str(cfg.mode.name) == "pynative":
        return None
    record = speed_records().get(speed_key(OmegaConf.merge(cfg, {"mode": {"name": "pynative"}}), conv_path))
    step = record.get("step_ms") if isinstance(record, dict) else None
    return float(step) if isinstance(step, (int, float)) else None


def _profiler(profile_cfg, env: Env) -> Optional["ProfileWindow"]:
    """MindSpore's profiler over profile.steps steps (rank 0 only), or None."""
    if profile_cfg.steps <= 0 or env.rank != 0:
        return None
    from runner.report.profiling import ProfileWindow

    return ProfileWindow(profile_cfg.start_step, profile_cfg.steps, env.run_dir, env.target)
