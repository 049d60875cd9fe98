"""Typed settings of the model layer: what `build_model` reads (the runner's `model` group)."""

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from omegaconf import MISSING


class Choice(str, Enum):
    """An option name that prints and formats as its value (`f"{kind}"` gives 'fixed')."""

    __str__ = str.__str__
    __format__ = str.__format__


class ModelStyle(Choice):
    cifar = "cifar"
    imagenet = "imagenet"


@dataclass
class ModelConfig:
    name: str = MISSING
    style: ModelStyle = MISSING
    depth: int = MISSING
    width: int = 16  # channels of the first stage
    num_classes: Optional[int] = None  # None: take it from the data
