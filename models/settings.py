"""Typed settings of the model layer: what `build_model` reads (the runner's `model` group)."""

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from omegaconf import MISSING


class ModelStyle(str, Enum):  # a str: `style == "cifar"` holds for a typed config and a plain string
    cifar = "cifar"  # the built-in CIFAR-style ResNets (models/resnet.py)
    imagenet = "imagenet"  # the built-in ImageNet-style ResNets
    mindcv = "mindcv"  # MindCV's zoo (models/zoo.py)


class Stem(str, Enum):
    auto = "auto"
    imagenet = "imagenet"
    cifar = "cifar"


@dataclass
class ModelConfig:
    name: str = MISSING
    style: ModelStyle = MISSING
    depth: Optional[int] = None  # cifar, imagenet
    width: int = 16  # cifar, imagenet: channels of the first stage
    stem: Stem = Stem.auto  # imagenet: 7x7/2 + max pool (imagenet), 3x3/1 (cifar), or by input size (auto: < 64 px)
    arch: Optional[str] = None  # mindcv: a mindcv.list_models() name
    checkpoint: Optional[str] = None  # mindcv: local pretrained weights (.ckpt); mismatched head/stem adapted
    num_classes: Optional[int] = None  # None: take it from the data
