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
class Config:
    mode: ModeConfig = MISSING
    amp: AmpConfig = MISSING
    sink: SinkConfig = MISSING
    padding: PaddingConfig = MISSING
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    device: DeviceConfig = MISSING
    seed: int = 0
    epochs: int = 10
    batch_size: int = 64
    log_every: int = 20
    eval: bool = True
    save_checkpoint: bool = True
    experiment_name: str = "default"


def register() -> None:
    """Register the schema so conf/config.yaml can name it in its defaults list."""
    ConfigStore.instance().store(name="base_config", node=Config)
