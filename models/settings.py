"""Typed settings of the model layer: what `build_model` reads (the runner's `model` group)."""

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from omegaconf import MISSING


class ModelStyle(str, Enum):  # a str: `style == "cifar"` holds for a typed config and a plain string
    cifar = "cifar"
    imagenet = "imagenet"


class ConvPath(str, Enum):  # the convolution algorithm on CPU (models/conv.py)
    auto = "auto"  # per layer shape, the faster of the two, timed once per machine and cached
    native = "native"  # MindSpore's Conv2D
    gemm = "gemm"  # im2col + one MatMul over the batch


@dataclass
class ModelConfig:
    name: str = MISSING
    style: ModelStyle = MISSING
    depth: int = MISSING
    width: int = 16  # channels of the first stage
    num_classes: Optional[int] = None  # None: take it from the data
    # native by default: `auto` picks per layer from timings, so two machines (or a noisy one) may pick
    # differently and train to slightly different numbers. CPU only: GPU/Ascend always run native.
    conv: ConvPath = ConvPath.native
