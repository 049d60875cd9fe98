"""Typed schema of the whole configuration, registered in Hydra's ConfigStore.

Every config group's YAML merges into one of these dataclasses, so an unknown key or a value of
the wrong type fails while Hydra composes, before MindSpore is imported.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

# Enum-typed fields make OmegaConf reject a misspelt value at composition, listing the choices.
Mode = Enum("Mode", {n: n for n in ["graph", "pynative", "jit"]})
AmpLevel = Enum("AmpLevel", {n: n for n in ["O0", "O1", "O2", "O3", "auto"]})
LossScaleType = Enum("LossScaleType", {n: n for n in ["none", "fixed", "dynamic"]})
PaddingKind = Enum("PaddingKind", {n: n for n in ["fixed", "bucket", "none"]})
PadMethod = Enum("PadMethod", {n: n for n in ["resize", "pad", "resize_pad", "crop"]})
ModelStyle = Enum("ModelStyle", {n: n for n in ["cifar", "imagenet"]})
BadSample = Enum("BadSample", {n: n for n in ["error", "skip"]})
DataSource = Enum("DataSource", {n: n for n in ["digits", "synthetic", "imagefolder", "cifar10"]})
OptimName = Enum("OptimName", {n: n for n in ["momentum", "adam"]})
Schedule = Enum("Schedule", {n: n for n in ["constant", "cosine"]})
Target = Enum("Target", {n: n for n in ["auto", "cpu", "gpu", "ascend"]})


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
class PaddingConfig:
    name: PaddingKind = MISSING
    height: int = 16  # fixed
    width: int = 16  # fixed
    method: PadMethod = PadMethod.resize  # fixed: resize | pad | resize_pad | crop (conf/padding/fixed.yaml)
    fill: int = 0  # fixed (pad, resize_pad), bucket: pixel value 0..255 of padded pixels
    buckets: List[int] = field(default_factory=lambda: [8, 16, 24, 32])  # bucket: square sides, increasing


@dataclass
class ModelConfig:
    name: str = MISSING
    style: ModelStyle = MISSING
    depth: int = MISSING
    width: int = 16  # channels of the first stage
    num_classes: Optional[int] = None  # None: take it from the data


@dataclass
class DataConfig:
    name: DataSource = MISSING
    root: Optional[str] = None  # imagefolder, cifar10
    channels: int = 1  # channels the network sees (images are converted)
    num_classes: int = 10  # synthetic only; other sources count their classes
    num_samples: int = 512  # synthetic only
    image_size: int = 32  # synthetic only (square)
    val_fraction: float = 0.2  # digits, synthetic
    num_parallel_workers: int = 2
    mean: List[float] = field(default_factory=lambda: [0.5])
    std: List[float] = field(default_factory=lambda: [0.5])
    input_scale: float = 1.0  # multiplies the normalised images (a fault to test AMP: 1e5 overflows FP16)
    on_bad_sample: BadSample = (
        BadSample.error
    )  # imagefolder: a file that cannot be decoded stops the run, or is skipped
    mirrorable: bool = True  # false: a horizontal flip changes what an image means (digits); augment.hflip is refused


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


# --- issue 6: distributed (msrun data parallel), checkpoints and resume --------------------------
DistMode = Enum("DistMode", {n: n for n in ["none", "dp"]})


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


# ---- issue 3: mixed precision you can trust (loss-scale trace, NaN guard, diagnosis) ----
@dataclass
class DiagnoseConfig:
    enabled: bool = False  # per-cell gradient statistics and input checks (grad_stats.jsonl)
    every: Optional[int] = None  # steps between gradient statistics; None: log_every
    # NaN guard (always on): stop after this many consecutive overflowing steps that the loss scale
    # can no longer answer (dynamic scale at its floor of 1, or a fixed scale). A non-finite loss stops at once.
    patience: int = 10
    max_islands: int = 4  # FP32 islands the diagnosis may add while it searches for a fix


# ---- end issue 3 ----


# ---- Measurement, loggers and the tuning ladder (issue 4) ----------------------------------------

LoggerName = Enum("LoggerName", {n: n for n in ["csv", "tensorboard", "mlflow"]})


@dataclass
class LoggerConfig:
    name: LoggerName = MISSING
    tracking_uri: Optional[str] = None  # mlflow only; None: file store in outputs/mlruns
    experiment: Optional[str] = None  # mlflow experiment; None: the run's experiment_name


@dataclass
class LadderConfig:
    batch_size: int = 32  # the rungs before "larger batch"
    large_batch_size: int = 128  # the "larger batch" rung and after


# ---- augmentation and the training loss's labels -------------------------------------------------
class AugmentName(str, Enum):
    none = "none"
    basic = "basic"
    randaugment = "randaugment"
    autoaugment = "autoaugment"
    trivialaugment = "trivialaugment"


class AutoAugmentPolicy(str, Enum):
    imagenet = "imagenet"
    cifar10 = "cifar10"
    svhn = "svhn"


@dataclass
class MixConfig:
    alpha: float = 0.0  # Beta(alpha, alpha) mixing strength; 0 = off
    prob: float = 1.0  # share of training batches mixed


@dataclass
class AugmentConfig:
    """Training-only augmentation (datasets/augment.py); evaluation data is never augmented."""

    name: AugmentName = MISSING
    crop_padding: int = 0  # random crop back to the input size after padding each side this many pixels
    hflip: Optional[bool] = None  # null: on where data.mirrorable, except augment=none
    affine_degrees: float = 0.0  # random rotation within +-degrees
    affine_translate: float = 0.0  # random shift within +-this fraction of the side
    affine_scale: float = 0.0  # random zoom within 1 +- this
    randaugment_num_ops: int = 2  # randaugment only
    randaugment_magnitude: int = 9  # randaugment only, 0..num_magnitude_bins-1
    num_magnitude_bins: int = 31  # randaugment, trivialaugment
    autoaugment_policy: AutoAugmentPolicy = AutoAugmentPolicy.imagenet  # autoaugment only
    erasing_prob: float = 0.0  # random erasing: the chance that an image gets a rectangle set to 0
    mixup: MixConfig = field(default_factory=MixConfig)
    cutmix: MixConfig = field(default_factory=MixConfig)


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
    # issue 6: see DistributedConfig / CheckpointConfig above.
    distributed: DistributedConfig = MISSING
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: Optional[str] = None  # true: this run directory's last checkpoint, if any; or a run dir / .ckpt path
    # issue 4 (measurement): see the block above.
    logger: LoggerConfig = MISSING
    ladder: Optional[LadderConfig] = None  # set by +experiment=ladder
    augment: AugmentConfig = MISSING
    loss: LossConfig = field(default_factory=LossConfig)


def register() -> None:
    """Register the schema so conf/config.yaml can name it in its defaults list."""
    ConfigStore.instance().store(name="base_config", node=Config)
