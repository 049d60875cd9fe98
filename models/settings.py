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


class StemPool(str, Enum):
    # MindSpore's pad_mode="same" pads a 3x3/2 max pool on the bottom/right only; PyTorch's ResNets pad one
    # pixel on every side. On an even input the windows differ, so weights converted from torchvision or
    # timm (runner-convert) give PyTorch's logits only with `torch`.
    same = "same"
    torch = "torch"


class ConvPath(str, Enum):  # the convolution algorithm on CPU (models/conv.py)
    best = "best"  # onednn where it pays and builds (AVX2 or better, a compiler or a built library), else native
    auto = "auto"  # per layer shape, the faster of the two, timed once per machine and cached
    native = "native"  # MindSpore's Conv2D
    gemm = "gemm"  # im2col + one MatMul over the batch
    onednn = "onednn"  # oneDNN's blocked kernels called directly (needs a C++ compiler; no AVX2 cap)


class BlockedLayers(str, Enum):  # what each layer of a blocked body runs (models/resnet.py attach_blocked)
    # each layer's chosen path: model.conv=best's dense matmul and Winograd where they pay, gemm between reorders
    chosen = "chosen"
    onednn = "onednn"  # every layer oneDNN's convolution on the blocked tensor (what the others are measured against)


@dataclass
class ModelConfig:
    name: str = MISSING
    style: ModelStyle = MISSING
    depth: Optional[int] = None  # cifar, imagenet
    width: int = 16  # cifar, imagenet: channels of the first stage
    stem: Stem = Stem.auto  # imagenet: 7x7/2 + max pool (imagenet), 3x3/1 (cifar), or by input size (auto: < 64 px)
    stem_pool: StemPool = StemPool.same  # imagenet stem, mindcv resnets: the max pool's padding (same | torch)
    arch: Optional[str] = None  # mindcv: a mindcv.list_models() name
    checkpoint: Optional[str] = None  # mindcv: local pretrained weights (.ckpt); mismatched head/stem adapted
    num_classes: Optional[int] = None  # None: take it from the data
    # best: decided from the machine (models/onednn.py choose), not from timings, so the same machine and
    # config give the same numbers; `auto` picks per layer from timings. CPU only: GPU/Ascend run native.
    conv: ConvPath = ConvPath.best
    # model.conv=best or onednn on a CPU, graph mode: keep the ResNet body in oneDNN's blocked layout between
    # layers (false: plain NCHW between layers, a reorder at each convolution, as before blocked bodies).
    blocked_body: bool = True
    blocked_layers: BlockedLayers = BlockedLayers.chosen
