"""RunMetrics: the one record a run measures, written once as metrics.json (docs/outputs.md: "metrics.json").

The record is grouped into typed sections, one per block of metrics.json's keys (results, timing, compiles,
resources, precision, setup, files); metrics.json itself stays one flat object, the sections' fields in
order. Each metrics.json key is also an attribute of RunMetrics (`m.val_accuracy` is `m.results.val_accuracy`),
and RunMetrics(val_accuracy=0.9) fills the section that holds it: the flat names of earlier versions keep
working.
"""

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from runner.rundir.atomic import finite_or_str, write_json


@dataclass
class Results:
    """The outcome: accuracy and losses, the best checkpoints, the early stop and the fine-tuning record."""

    val_accuracy: Optional[float] = None  # top-1 on the validation set, 0..1; None with eval=false or after a NaN stop
    val_loss: Optional[float] = None  # mean cross-entropy on the validation set
    val_top5_accuracy: Optional[float] = None  # 0..1; None with 5 classes or fewer, or without evaluation
    val_per_class_accuracy: Optional[List[Optional[float]]] = None  # per class index, 0..1; None where unseen
    final_loss: float = float("nan")  # training loss of the last step
    loss_curve: List[float] = field(default_factory=list)  # training loss of every step, across resumes
    lr_curve: List[float] = field(default_factory=list)  # learning rate of every step (per step call), across resumes
    val_curve: List[dict] = field(default_factory=list)  # {epoch, step, accuracy, loss} per validation while training
    best_checkpoint: Optional[dict] = None  # monitor, value, epoch, step, file of the best checkpoint
    top_checkpoints: List[dict] = field(default_factory=list)  # the checkpoint.top_k kept best ones, best first
    early_stop: Optional[dict] = None  # stopped, monitor, patience, min_delta, epoch, step, reason, restored
    fine_tune: Optional[dict] = None  # init_from, loaded, reinitialised, unused, frozen, frozen_parameters


@dataclass
class Timing:
    """Time of this process's steps and of its start-up; None where too few steps ran to tell compile from
    steady state (timing_note says why), never the compile step taken for a steady one or an earlier process's
    numbers."""

    compile_seconds: Optional[float] = None  # first step call minus a steady one: graph compilation, s
    first_call_seconds: Optional[float] = None  # s
    step_time_median_ms: Optional[float] = None  # steady steps (the first excluded), ms per step
    step_time_p90_ms: Optional[float] = None  # ms per step
    throughput_samples_per_s: Optional[float] = None  # steady steps, samples/s
    train_seconds: float = 0.0  # this process's steps, s
    host_fraction: Optional[float] = None  # share of steady time between steps (data, callbacks, Python)
    timing_note: Optional[str] = None  # why a timing field above is None
    # seconds from the command to the first training step, by phase: import, compose, build, first_step
    # (compilation and the step), total; None for a phase this process did not go through (runner.train)
    startup: dict = field(default_factory=dict)
    steps: int = 0  # global step at the end
    step_time_ms_curve: List[float] = field(default_factory=list)  # ms per step, per step call


@dataclass
class Compiles:
    """Compiles, the compile cache, and the shapes and data the network saw."""

    compile_count: int = 0  # training-graph compiles (0 in PyNative)
    # MindSpore's compile cache: state (hit, miss, off), dir, key, graphs, compile_seconds_without_cache
    # (the run that filled it), compile_seconds_with_cache (a hit); reason when off
    compile_cache: dict = field(default_factory=dict)
    distinct_input_shapes: int = 0
    input_shapes: Dict[str, int] = field(default_factory=dict)  # "NxCxHxW" -> batches
    padding: dict = field(default_factory=dict)  # the padding plan: sizes, padded pixels, dropped samples
    skipped_samples: List[str] = field(default_factory=list)  # unreadable files left out
    augment: Optional[dict] = None  # what training applied: name, image_ops, hflip, batch_ops, soft_labels
    label_smoothing: float = 0.0  # of the training loss


@dataclass
class Resources:
    """Memory and FLOPs."""

    peak_host_memory_mb: float = 0.0  # peak RSS of the process, MiB
    peak_device_memory_mb: Optional[float] = None  # MiB; None where the device reports none (CPU)
    flops: dict = field(default_factory=dict)  # per-sample FLOPs, GFLOP/s, matmul peak, utilization, conv paths


@dataclass
class Precision:
    """Mixed precision as run: the level, the loss scale, the NaN guard, the gradient statistics."""

    amp_level_used: str = "O0"
    amp_dtype_used: str = "float32"  # float32 (O0), float16, bfloat16
    amp_compute: dict = field(default_factory=dict)  # body, batchnorm, head, loss: what each computes in
    loss_scale_type_used: str = "none"
    native_loss_scale_cell: bool = False  # MindSpore's TrainOneStepWithLossScaleCell (GPU/Ascend)
    keep_fp32: List[str] = field(default_factory=list)
    loss_scale: dict = field(default_factory=dict)  # type, initial/final/min, overflow and skipped steps
    loss_scale_curve: Optional[List[float]] = None  # scale each step used; None without a loss scale
    nan_guard: dict = field(default_factory=dict)  # tripped, and why/where when it did
    diagnose: Optional[dict] = None  # diagnose=on: gradient statistics file and counts


@dataclass
class Setup:
    """What ran: mode, device, CPU ISA, seed, batch, optimizer, sink, ranks, data sizes, versions."""

    mode: str = ""
    jit_level: str = "auto"  # mode.jit_level: O0, O1, O2, or auto (MindSpore's default; always auto in pynative)
    device_target: str = ""
    cpu_isa: dict = field(default_factory=dict)  # ONEDNN_MAX_CPU_ISA and who set it
    conv: dict = field(default_factory=dict)  # model.conv: asked, path (as run), reason, cost of a fallback
    seed: int = 0
    batch_size: int = 0  # global batch
    effective_batch_size: int = 0  # samples per optimizer update: batch_size x optim.accumulate_steps
    optimizer_updates: int = 0  # optimizer steps taken, across resumes (its global_step at the end)
    # value, filter_bias_and_bn, and the tensors (and values) the optimizer decays or exempts
    weight_decay: dict = field(default_factory=dict)
    ema_decay: Optional[float] = None  # ema.decay when the evaluated and saved weights are the EMA; None: off
    sink: dict = field(default_factory=dict)  # requested, effective, sink_size_requested, sink_size (effective)
    distributed: dict = field(default_factory=dict)  # workers, per_rank_batch
    train_samples: int = 0
    val_samples: int = 0
    versions: Dict[str, str] = field(default_factory=dict)
    pid: int = 0


@dataclass
class Files:
    """Where things are: the run directory, its resume, profile, loggers, model.ckpt, curves.png, advice."""

    run_dir: str = ""
    resumed_from: Optional[str] = None  # the checkpoint this run continued from
    resume_changes: Dict[str, list] = field(default_factory=dict)  # key -> [saved, new] applied on resume
    profile: Optional[dict] = None  # profile.steps > 0: dir, start_step, steps, recorded, trace (trace_view.json)
    loggers: List[str] = field(default_factory=list)  # where the metrics also went: csv (always), then the chosen
    checkpoint: Optional[str] = None  # model.ckpt, the final FP32 weights; None when not saved
    plot: Optional[str] = None  # curves.png
    advice: List[str] = field(default_factory=list)  # notes grounded in these numbers


# The sections in metrics.json's order: attribute -> its dataclass.
SECTIONS = {
    "results": Results,
    "timing": Timing,
    "compiles": Compiles,
    "resources": Resources,
    "precision": Precision,
    "setup": Setup,
    "files": Files,
}
# metrics.json key -> the section that holds it.
HOME = {f.name: section for section, kind in SECTIONS.items() for f in dataclasses.fields(kind)}


@dataclass(init=False)
class RunMetrics:
    """Every key of metrics.json, with its unit, in typed sections; advice, loggers and the sweep read these."""

    results: Results
    timing: Timing
    compiles: Compiles
    resources: Resources
    precision: Precision
    setup: Setup
    files: Files

    def __init__(self, **values: Any) -> None:
        """Sections by name (timing=Timing(...)), and/or metrics.json keys (val_accuracy=0.9), each put into its
        section; an unknown name is a TypeError, as a dataclass's would be."""
        for name, kind in SECTIONS.items():
            section = values.pop(name, None)
            object.__setattr__(self, name, section if section is not None else kind())
        unknown = set(values) - set(HOME)
        if unknown:
            raise TypeError(f"RunMetrics has no field {', '.join(sorted(unknown))}")
        for key, value in values.items():
            setattr(getattr(self, HOME[key]), key, value)

    def __getattr__(self, name: str) -> Any:
        # Only names not found the usual way arrive here: a metrics.json key is read from its section.
        if name in HOME:
            return getattr(object.__getattribute__(self, HOME[name]), name)
        raise AttributeError(f"RunMetrics has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in HOME:
            setattr(getattr(self, HOME[name]), name, value)
        elif name in SECTIONS:
            object.__setattr__(self, name, value)
        else:
            raise AttributeError(f"RunMetrics has no attribute {name!r}")

    @staticmethod
    def keys() -> List[dataclasses.Field]:
        """metrics.json's keys as the sections' fields (name, type), in the file's order."""
        return [f for kind in SECTIONS.values() for f in dataclasses.fields(kind)]

    def to_dict(self) -> dict:
        """metrics.json's content: one flat object, section after section."""
        return {k: v for name in SECTIONS for k, v in dataclasses.asdict(getattr(self, name)).items()}

    def write(self, path: str) -> None:
        write_json(path, finite_or_str(self.to_dict()))

    @classmethod
    def read(cls, path: str) -> "RunMetrics":
        """A metrics.json written by this or an earlier version; keys it does not know are ignored."""
        with open(path) as f:
            data = json.load(f)
        return cls(**{k: v for k, v in data.items() if k in HOME})
