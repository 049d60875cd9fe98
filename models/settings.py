"""Typed settings of the model layer: what `build_model` reads (the runner's `model` group)."""

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from omegaconf import MISSING


class ModelStyle(str, Enum):  # a str: `style == "cifar"` holds for a typed config and a plain string
    cifar = "cifar"
    imagenet = "imagenet"


@dataclass
class ModelConfig:
    name: str = MISSING
    style: ModelStyle = MISSING
    depth: int = MISSING
    width: int = 16  # channels of the first stage
    num_classes: Optional[int] = None  # None: take it from the data
