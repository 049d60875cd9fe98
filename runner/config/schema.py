"""Typed schema of the whole configuration, registered in Hydra's ConfigStore.

The data and model settings belong to their layers (datasets/settings.py, models/settings.py); the
rest is the runner's own.

Every config group's YAML merges into one of these dataclasses, so an unknown key or a value of
the wrong type fails while Hydra composes, before MindSpore is imported.
"""

from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass
from functools import cache
from typing import TYPE_CHECKING, List, Optional, Tuple, get_args, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from runner.config.optim_options import OPTIMIZERS, SCHEDULES
from runner.datasets.settings import OUTSIDE_GRAPH, AugmentConfig, Choice, DataConfig, PaddingConfig
from runner.models.settings import ModelConfig

# Enum-typed fields make OmegaConf reject a misspelt value at composition, listing the choices. The
# enums compare equal to their names as strings (`cfg.mode.name == "graph"`).


class Mode(Choice):
    graph = "graph"
    pynative = "pynative"
    jit = "jit"


class JitLevel(Choice):
    auto = "auto"  # MindSpore's own choice for the device (O0 on CPU and GPU)
    O0 = "O0"  # kernel by kernel
    O1 = "O1"  # with operator fusion
    O2 = "O2"  # the whole graph sunk to the device: Ascend only


class AmpLevel(Choice):
    O0 = "O0"
    O1 = "O1"
    O2 = "O2"
    O3 = "O3"
    auto = "auto"


class AmpDtype(Choice):
    auto = "auto"  # float16 on GPU/Ascend and, under an explicit level, on a CPU (runner/config/amp_dtype.py)
    float16 = "float16"
    bfloat16 = "bfloat16"  # GPU/Ascend; refused on a CPU (no bfloat16 kernels there yet)


class LossScaleType(Choice):
    none = "none"
    fixed = "fixed"
    dynamic = "dynamic"


# The optimizers and schedules are declared once, in runner/config/optim_options.py (installed packages'
# included); their enums follow from those registries.
if TYPE_CHECKING:
    OptimName = Choice
    Schedule = Choice
else:
    OptimName = Choice("OptimName", {n: n for n in OPTIMIZERS.names()}, module=__name__)
    Schedule = Choice("Schedule", {n: n for n in SCHEDULES.names()}, module=__name__)


class Target(Choice):
    auto = "auto"
    cpu = "cpu"
    gpu = "gpu"
    ascend = "ascend"


class DistMode(Choice):
    none = "none"
    dp = "dp"


class CheckpointFormat(Choice):
    ckpt = "ckpt"  # MindSpore's own (protobuf) checkpoint: model.ckpt
    safetensors = "safetensors"  # the safetensors layout MindSpore 2.4+ writes and reads: model.safetensors


class Monitor(Choice):
    auto = "auto"  # val_accuracy when validation runs during training, else train_loss
    val_accuracy = "val_accuracy"
    val_loss = "val_loss"
    train_loss = "train_loss"  # the epoch's mean training loss


class WandbMode(Choice):
    online = "online"
    offline = "offline"


@dataclass
class ModeConfig:
    name: Mode = MISSING
    # graph and jit: MindSpore's compilation level (jit_config / mindspore.jit's jit_level); pynative compiles nothing.
    jit_level: JitLevel = JitLevel.auto


@dataclass
class LossScaleConfig:
    type: LossScaleType = LossScaleType.none
    init: float = 1024.0
    factor: float = 2.0
    window: int = 1000
    drop_overflow_update: bool = False  # fixed only: skip the update of a step whose grads overflow


@dataclass
class AmpConfig:
    level: AmpLevel = MISSING
    # The 16-bit type of O1-O3 (docs/amp.md#dtype): auto, float16, bfloat16 (GPU/Ascend only).
    dtype: AmpDtype = AmpDtype.auto
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    # Cell names kept FP32 under O1-O3 (dotted, prefix or glob; see runner/fp32_islands.py).
    keep_fp32: List[str] = field(default_factory=list)


@dataclass
class SinkConfig:
    enabled: bool = False
    sink_size: int = -1  # steps per sink; -1 = the whole epoch


@dataclass
class OptimCommon:
    """What every optimizer and schedule reads; OptimConfig adds the fields of each (optim_options.py)."""

    name: OptimName = MISSING
    # the peak rate; the schedule is a factor of it, and a Parameter of the graph (a floor, min_lr/lr, is a constant)
    lr: float = field(default=0.1, metadata=OUTSIDE_GRAPH)
    momentum: float = 0.9  # SGD momentum; beta1 of adam, adamw, lion
    weight_decay: float = 1e-4  # L2 (momentum, sgd, adam); decoupled (adamw, lion)
    # No weight decay on biases and BatchNorm/LayerNorm gamma, beta (1-D parameters), as MindCV and timm
    # by default; false decays every parameter.
    filter_bias_and_bn: bool = True
    schedule: Schedule = Schedule.cosine
    # The train step (runner/amp/train_step.py), for every optimizer:
    clip_grad_norm: float = 0.0  # > 0: clip the unscaled gradients to this global L2 norm
    accumulate_steps: int = 1  # micro-batches whose mean gradient makes one optimizer update
    # Cells left out of the optimizer, BatchNorm statistics included (names, prefixes, globs, as amp.keep_fp32).
    freeze: List[str] = field(default_factory=list)


def _options_dataclass(name: str, base: type, *registries) -> type:
    """`base` plus every field an option of `registries` reads, each once (its declaration's default)."""
    own = {f.name for f in fields(base)}
    extra = [f for r in registries for f in r.fields() if f.name not in own]
    taken = [f.name for f in extra]
    if len(taken) != len(set(taken)):
        raise ValueError(f"{name}: an optimizer and a schedule both declare one of {taken}")
    return make_dataclass(
        name,
        [
            (f.name, f.type, field(default=f.default, default_factory=f.default_factory, metadata=f.metadata))
            for f in extra
        ],
        bases=(base,),
        namespace={"__module__": __name__},
    )


if TYPE_CHECKING:
    OptimConfig = OptimCommon
else:
    OptimConfig = _options_dataclass("OptimConfig", OptimCommon, OPTIMIZERS, SCHEDULES)


@dataclass
class EmaConfig:
    decay: float = 0.0  # > 0: keep an exponential moving average of the weights; it is evaluated and saved


@dataclass
class DeviceConfig:
    target: Target = MISSING
    id: int = 0
    # ONEDNN_MAX_CPU_ISA on CPU; "" leaves oneDNN's own choice; auto: AVX2, unless model.conv=onednn
    cpu_isa_cap: str = "auto"


@dataclass
class DistributedConfig:
    mode: DistMode = DistMode.none
    workers: int = 1  # total ranks (msrun --worker_num)
    local_workers: Optional[int] = None  # ranks on this node (msrun --local_worker_num); None = workers
    node_rank: int = 0  # this node's index when several nodes train together
    master_addr: str = "127.0.0.1"  # the address of node 0 (msrun's scheduler)
    master_port: int = 0  # 0: pick a free port (single node only)
    timeout_s: int = 120  # msrun --cluster_time_out: how long ranks wait for each other to join


@dataclass
class CheckpointConfig:
    every_epochs: int = 1  # save a resumable checkpoint every N epochs; 0 = only on a signal
    keep_last: int = 2  # the latest resumable checkpoints kept, besides the best (one that is both counts once)
    keep_best: bool = True  # also keep the best checkpoint by `monitor`
    top_k: int = 1  # with keep_best: keep the k best checkpoints by `monitor` (besides keep_last)
    # What "best" means; auto: early_stop.monitor when set, else val_accuracy while validation runs during
    # training (the default with eval=true), else train_loss.
    monitor: Monitor = Monitor.auto
    on_signal: bool = True  # SIGINT/SIGTERM save a checkpoint at the next step end, then exit
    # The final weights' file: model.ckpt or model.safetensors (resumable checkpoints/ stay .ckpt: they carry
    # the step and the optimizer's state, which the runner's resume reads from MindSpore's own format).
    format: CheckpointFormat = CheckpointFormat.ckpt


@dataclass
class ValidationConfig:
    # Validate every N epochs while training (and always after the last); 0 = only at the end; null (the
    # default): every epoch while eval=true (Lightning's and timm's habit). Not `eval.every_epochs`: the
    # top-level `eval` is a bool, and Hydra cannot give a bool children.
    every_epochs: Optional[int] = None


def validation_every(validation_cfg, evaluate: bool) -> int:
    """validation.every_epochs as a run uses it: null is 1 with eval=true, and nothing validates without eval."""
    every = validation_cfg.every_epochs
    if not evaluate:
        return 0
    return 1 if every is None else int(every)


@dataclass
class EarlyStopConfig:
    patience: int = 0  # stop after this many checks without improvement; 0 = off
    monitor: Monitor = Monitor.auto  # auto: checkpoint.monitor (the two are one monitor)
    min_delta: float = 0.0  # an improvement must beat the best by more than this


@dataclass
class DiagnoseConfig:
    enabled: bool = False  # per-cell gradient statistics and input checks (grad_stats.jsonl)
    every: Optional[int] = None  # steps between gradient statistics; None: log_every
    # NaN guard (always on): stop after this many consecutive overflowing steps that the loss scale
    # can no longer answer (dynamic scale at its floor of 1, or a fixed scale). A non-finite loss stops at once.
    patience: int = 10
    max_islands: int = 4  # FP32 islands the diagnosis may add while it searches for a fix


@dataclass
class CsvLoggerConfig:
    """metrics.csv: always written (the run's own record); `logger=csv` alone is the default."""


@dataclass
class TensorBoardLoggerConfig:
    """Event files in <run_dir>/tensorboard."""


@dataclass
class MlflowLoggerConfig:
    tracking_uri: Optional[str] = None  # None: file store in outputs/mlruns
    experiment: Optional[str] = None  # None: the run's experiment_name


@dataclass
class WandbLoggerConfig:
    project: Optional[str] = None  # None: the run's experiment_name
    entity: Optional[str] = None  # None: the logged-in user's default entity
    group: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    mode: Optional[WandbMode] = None  # None: WANDB_MODE, else W&B's default (online)


@dataclass
class LoggerConfig:
    """The loggers of a run, one key per chosen option of the `logger` group (`logger=[csv,wandb]`)."""

    csv: Optional[CsvLoggerConfig] = None
    tensorboard: Optional[TensorBoardLoggerConfig] = None
    mlflow: Optional[MlflowLoggerConfig] = None
    wandb: Optional[WandbLoggerConfig] = None


@dataclass
class ProfileConfig:
    steps: int = 0  # > 0: record this many training steps with MindSpore's profiler into <run_dir>/profile
    start_step: int = 3  # the first recorded step, counted from this process's first (1 compiles in graph mode)


@dataclass
class LadderConfig:
    batch_size: int = 32  # the rungs before "larger batch"
    large_batch_size: int = 128  # the "larger batch" rung and after


@dataclass
class CompileCacheConfig:
    # MindSpore's compile cache, one directory per key of what makes the graphs and of the sequence of graphs the
    # process compiles (runner/training/compile_cache.py): graph and jit modes with padding=fixed, the first run of
    # a process whose entry script is a file. Elsewhere it is off with one line saying why.
    enabled: bool = True
    dir: Optional[str] = None  # None: $XDG_CACHE_HOME (or ~/.cache)/mindspore-runner/compile-cache


@dataclass
class LossConfig:
    label_smoothing: float = 0.0  # training loss only; evaluation reports plain cross entropy


# What a top-level setting is, as field metadata of Config: every setting defines what the run computes
# (TRAINING) unless its field says otherwise. One declaration read by every command that compares or re-runs
# saved configurations (runner/runs.py: the listing's columns, `runner-runs diff`, `runner-runs replay`), so
# what counts as "the same training" is not kept by hand in each of them.
KIND = "kind"
TRAINING = "training"
LABEL = "label"  # names the run (experiment_name): a replay keeps it, a diff shows it without counting it
ACTION = "action"  # what this command does with the configuration (validate, plan, resume): each command decides
REPORTING = "reporting"  # where a run reports or caches, never what it computes: a replay uses the defaults
# Whether a setting can reach a compiled graph as a constant, as field metadata of any settings dataclass
# (OUTSIDE_GRAPH, {GRAPH: False}, says it cannot): the compile cache hashes every other setting, and
# `runner-runs diff` says which differences change the graphs. Declared once, beside each field.
GRAPH = "graph"


@dataclass
class Config:
    mode: ModeConfig = MISSING
    amp: AmpConfig = MISSING
    sink: SinkConfig = MISSING
    padding: PaddingConfig = MISSING
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    ema: EmaConfig = field(default_factory=EmaConfig)
    device: DeviceConfig = MISSING
    diagnose: DiagnoseConfig = field(default_factory=DiagnoseConfig)
    seed: int = field(default=0, metadata=OUTSIDE_GRAPH)  # a seeded primitive's seed joins the key apart
    epochs: int = 10
    batch_size: int = 64
    log_every: int = field(default=20, metadata=OUTSIDE_GRAPH)
    eval: bool = True
    validation: ValidationConfig = field(default_factory=ValidationConfig, metadata=OUTSIDE_GRAPH)
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig, metadata=OUTSIDE_GRAPH)
    save_checkpoint: bool = field(default=True, metadata=OUTSIDE_GRAPH)
    experiment_name: str = field(default="default", metadata={KIND: LABEL, **OUTSIDE_GRAPH})
    # compose and validate, print nothing but the verdict, train nothing
    dry_run: bool = field(default=False, metadata={KIND: ACTION, **OUTSIDE_GRAPH})
    # build the data, network and optimizer, print memory/FLOPs/compiles/time, train nothing
    plan: bool = field(default=False, metadata={KIND: ACTION})
    distributed: DistributedConfig = MISSING
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig, metadata=OUTSIDE_GRAPH)
    # true: this run directory's last checkpoint, if any; or a run dir / .ckpt path
    resume: Optional[str] = field(default=None, metadata={KIND: ACTION, **OUTSIDE_GRAPH})
    # fine-tune: a .ckpt file or run directory whose matching weights start this run
    init_from: Optional[str] = field(default=None, metadata=OUTSIDE_GRAPH)
    logger: LoggerConfig = field(default=MISSING, metadata={KIND: REPORTING, **OUTSIDE_GRAPH})
    ladder: Optional[LadderConfig] = field(default=None, metadata=OUTSIDE_GRAPH)  # set by +experiment=ladder
    # datasets/settings.py; consumed by datasets/augment.py. Soft labels (mixup) join the compile cache's key
    # through the train graph's description.
    augment: AugmentConfig = field(default=MISSING, metadata=OUTSIDE_GRAPH)
    loss: LossConfig = field(default_factory=LossConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig, metadata=OUTSIDE_GRAPH)
    compile_cache: CompileCacheConfig = field(
        default_factory=CompileCacheConfig, metadata={KIND: REPORTING, **OUTSIDE_GRAPH}
    )


def setting_kind(key: str) -> Optional[str]:
    """What the dotted key of a saved configuration is: TRAINING, the top-level field's KIND, or None for a key
    the schema does not have (Hydra's `hydra` and `defaults`, a retired setting)."""
    top = key.split(".", 1)[0].split("[", 1)[0]
    for f in fields(Config):
        if f.name == top:
            return str(f.metadata.get(KIND, TRAINING))
    return None


def is_training_setting(key: str) -> bool:
    """Whether the dotted key defines what a run computes (a replay takes it, `runner-runs diff` counts it)."""
    return setting_kind(key) == TRAINING


@cache
def outside_graph(cls=None, prefix: str = "") -> Tuple[str, ...]:
    """The dotted settings whose field says {GRAPH: False}, in Config (or cls) and the settings nested in it."""
    found: List[str] = []
    hints = get_type_hints(cls or Config)
    for f in fields(cls or Config):
        if f.metadata.get(GRAPH, True) is False:
            found.append(prefix + f.name)
            continue
        for t in (hints[f.name], *get_args(hints[f.name])):
            if is_dataclass(t):
                found += outside_graph(t, f"{prefix}{f.name}.")
    return tuple(found)


def changes_graph(key: str) -> bool:
    """Whether the dotted setting can change a compiled graph (not under a field marked {GRAPH: False})."""
    return not any(key == k or key.startswith(k + ".") for k in outside_graph())


def register() -> None:
    """Register the schema so conf/config.yaml can name it in its defaults list."""
    store = ConfigStore.instance()
    store.store(name="base_config", node=Config)
    # An installed package's optimizer has no YAML in conf/optim: its config group option is its defaults.
    for name in OPTIMIZERS.names():
        if OPTIMIZERS[name].defaults:
            store.store(group="optim", name=name, node={"name": name, **OPTIMIZERS[name].defaults})
