"""Typed settings of the data layer: what `build_data` reads (the runner's `data` and `padding` groups).

Enums subclass `str`, so `padding.name == "fixed"` holds for a typed config and for a plain string.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import List, Optional

from omegaconf import MISSING

from runner.datasets.errors import DataConfigError


class Choice(str, Enum):
    """An option name that prints and formats as its value (`f"{kind}"` gives 'fixed')."""

    __str__ = str.__str__
    __format__ = str.__format__


class DataSource(Choice):
    digits = "digits"
    synthetic = "synthetic"
    imagefolder = "imagefolder"
    cifar10 = "cifar10"
    cifar100 = "cifar100"
    mnist = "mnist"
    csv = "csv"
    mindrecord = "mindrecord"


class BadSample(Choice):
    error = "error"
    skip = "skip"


class PaddingKind(Choice):
    fixed = "fixed"
    bucket = "bucket"
    none = "none"


class PadMethod(Choice):
    resize = "resize"
    pad = "pad"
    resize_pad = "resize_pad"
    crop = "crop"


@dataclass
class PaddingConfig:
    name: PaddingKind = MISSING
    height: int = 16  # fixed
    width: int = 16  # fixed
    method: PadMethod = PadMethod.resize  # fixed: resize | pad | resize_pad | crop (conf/padding/fixed.yaml)
    fill: int = 0  # fixed (pad, resize_pad), bucket: pixel value 0..255 of padded pixels
    buckets: List[int] = field(default_factory=lambda: [8, 16, 24, 32])  # bucket: square sides, increasing


# Field metadata: the setting never reaches a compiled graph as a constant (runner/config/schema.py GRAPH; the
# compile cache leaves it out of its key). What the data decides about the graphs (image shape, steps per
# epoch, the validation batches) joins the key as the graphs' own description instead.
OUTSIDE_GRAPH = {"graph": False}


@dataclass
class DataConfig:
    name: DataSource = MISSING
    root: Optional[str] = field(
        default=None, metadata=OUTSIDE_GRAPH
    )  # imagefolder, cifar10, cifar100, mnist, csv, mindrecord
    channels: int = 1  # channels the network sees (images are converted)
    num_classes: int = 10  # synthetic only; other sources count their classes
    num_samples: int = field(default=512, metadata=OUTSIDE_GRAPH)  # synthetic only
    image_size: int = 32  # synthetic only (square)
    val_fraction: float = field(default=0.2, metadata=OUTSIDE_GRAPH)  # digits, synthetic
    num_parallel_workers: int = field(default=2, metadata=OUTSIDE_GRAPH)
    mean: List[float] = field(default_factory=lambda: [0.5])
    std: List[float] = field(default_factory=lambda: [0.5])
    input_scale: float = 1.0  # multiplies the normalised images (a fault to test AMP: 1e5 overflows FP16)
    on_bad_sample: BadSample = field(
        default=BadSample.error, metadata=OUTSIDE_GRAPH
    )  # imagefolder, csv: an undecodable file stops the run, or is skipped
    mirrorable: bool = True  # false: a horizontal flip changes what an image means (digits); augment.hflip is refused


class AugmentName(Choice):
    none = "none"
    basic = "basic"
    imagenet = "imagenet"
    randaugment = "randaugment"
    autoaugment = "autoaugment"
    trivialaugment = "trivialaugment"


class AutoAugmentPolicy(Choice):
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
    # Random-resized crop (Szegedy et al. 2015; MindCV's and timm's ImageNet training crop): a random
    # area share `crop_scale` and aspect `crop_ratio` of the decoded image, resized to the input size.
    # It replaces padding.method's resize in training; validation keeps padding.method.
    resized_crop: bool = False
    crop_scale: List[float] = field(default_factory=lambda: [0.08, 1.0])  # resized_crop only
    crop_ratio: List[float] = field(default_factory=lambda: [0.75, 4 / 3])  # resized_crop only
    # Colour jitter: brightness, contrast and saturation each scaled by a factor in [1 - x, 1 + x]
    # (timm's and MindCV's scalar color_jitter); hue shifted within +-color_jitter_hue (0..0.5). 0: off.
    color_jitter: float = 0.0
    color_jitter_hue: float = 0.0
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


def check_padding(padding) -> None:
    """Raise DataConfigError for padding values no pipeline can be built from."""
    if padding.name == "fixed" and (padding.height < 1 or padding.width < 1):
        raise DataConfigError(
            f"padding.height and padding.width must be positive, got {padding.height}x{padding.width}."
        )
    if padding.name == "bucket":
        b = list(padding.buckets)
        if not b or b[0] < 1 or any(x >= y for x, y in zip(b, b[1:])):
            raise DataConfigError(f"padding.buckets must be positive, strictly increasing square sizes, got {b}.")
    if not 0 <= padding.fill <= 255:
        raise DataConfigError(f"padding.fill is a pixel value 0..255, got {padding.fill}.")
