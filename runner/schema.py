"""Typed schema of the whole configuration, registered in Hydra's ConfigStore.

The data and model settings belong to their layers (datasets/settings.py, models/settings.py); the
rest is the runner's own.

Every config group's YAML merges into one of these dataclasses, so an unknown key or a value of
the wrong type fails while Hydra composes, before MindSpore is imported.
"""

from dataclasses import dataclass, field
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from datasets.settings import AugmentConfig, Choice, DataConfig, PaddingConfig
from models.settings import ModelConfig

# Enum-typed fields make OmegaConf reject a misspelt value at composition, listing the choices. The
# enums compare equal to their names as strings (`cfg.mode.name == "graph"`).


class Mode(Choice):
    graph = "graph"
    pynative = "pynative"
    jit = "jit"


class AmpLevel(Choice):
    O0 = "O0"
    O1 = "O1"
    O2 = "O2"
    O3 = "O3"
    auto = "auto"


class LossScaleType(Choice):
    none = "none"
    fixed = "fixed"
    dynamic = "dynamic"


class OptimName(Choice):
    momentum = "momentum"
    adam = "adam"


class Schedule(Choice):
    constant = "constant"
    cosine = "cosine"


class Target(Choice):
    auto = "auto"
    cpu = "cpu"
    gpu = "gpu"
    ascend = "ascend"


class DistMode(Choice):
    none = "none"
    dp = "dp"


class LoggerName(Choice):
    csv = "csv"
    tensorboard = "tensorboard"
    mlflow = "mlflow"


@dataclass
class ModeConfig:
    name: Mode = MISSING


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
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    # Cell names kept FP32 under O1-O3 (dotted, prefix or glob; see runner/fp32_islands.py).
    keep_fp32: List[str] = field(default_factory=list)


@dataclass
class SinkConfig:
    enabled: bool = False
    sink_size: int = -1  # steps per sink; -1 = the whole epoch


@dataclass
class OptimConfig:
    name: OptimName = MISSING
    lr: float = 0.1
    momentum: float = 0.9  # SGD momentum; Adam's beta1
    weight_decay: float = 1e-4
    schedule: Schedule = Schedule.cosine
    warmup_epochs: float = 0.0
    min_lr: float = 0.0


@dataclass
class DeviceConfig:
    target: Target = MISSING
    id: int = 0
    cpu_isa_cap: str = "AVX2"  # ONEDNN_MAX_CPU_ISA on CPU; "" leaves oneDNN's own choice


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
    keep_last: int = 2  # resumable checkpoints kept besides the best one
    keep_best: bool = True  # also keep the checkpoint with the lowest epoch-mean training loss
    on_signal: bool = True  # SIGINT/SIGTERM save a checkpoint at the next step end, then exit


@dataclass
class DiagnoseConfig:
    enabled: bool = False  # per-cell gradient statistics and input checks (grad_stats.jsonl)
    every: Optional[int] = None  # steps between gradient statistics; None: log_every
    # NaN guard (always on): stop after this many consecutive overflowing steps that the loss scale
    # can no longer answer (dynamic scale at its floor of 1, or a fixed scale). A non-finite loss stops at once.
    patience: int = 10
    max_islands: int = 4  # FP32 islands the diagnosis may add while it searches for a fix


@dataclass
class LoggerConfig:
    name: LoggerName = MISSING
    tracking_uri: Optional[str] = None  # mlflow only; None: file store in outputs/mlruns
    experiment: Optional[str] = None  # mlflow experiment; None: the run's experiment_name


@dataclass
class LadderConfig:
    batch_size: int = 32  # the rungs before "larger batch"
    large_batch_size: int = 128  # the "larger batch" rung and after


@dataclass
class LossConfig:
    label_smoothing: float = 0.0  # training loss only; evaluation reports plain cross entropy


@dataclass
class Config:
    mode: ModeConfig = MISSING
    amp: AmpConfig = MISSING
    sink: SinkConfig = MISSING
    padding: PaddingConfig = MISSING
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    device: DeviceConfig = MISSING
    diagnose: DiagnoseConfig = field(default_factory=DiagnoseConfig)
    seed: int = 0
    epochs: int = 10
    batch_size: int = 64
    log_every: int = 20
    eval: bool = True
    save_checkpoint: bool = True
    experiment_name: str = "default"
    dry_run: bool = False  # compose and validate, print nothing but the verdict, train nothing
    distributed: DistributedConfig = MISSING
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: Optional[str] = None  # true: this run directory's last checkpoint, if any; or a run dir / .ckpt path
    logger: LoggerConfig = MISSING
    ladder: Optional[LadderConfig] = None  # set by +experiment=ladder
    augment: AugmentConfig = MISSING  # datasets/settings.py; consumed by datasets/augment.py
    loss: LossConfig = field(default_factory=LossConfig)


def register() -> None:
    """Register the schema so conf/config.yaml can name it in its defaults list."""
    ConfigStore.instance().store(name="base_config", node=Config)
