"""ResNet family as MindSpore cells: CIFAR-style (6n+2 layers) and ImageNet-style (18/34/50)."""

import logging

import mindspore as ms
from mindspore import dtype as mstype
from mindspore import nn, ops

from runner.models.blocked import bn_blocked
from runner.models.conv import conv, conv_output_size, max_pool
from runner.models.fp16 import declare, edge

log = logging.getLogger(__name__)

CIFAR_DEPTHS = {8: 1, 20: 3, 56: 9}  # depth -> basic blocks per stage (depth = 6n + 2)
IMAGENET_DEPTHS = {18: ("basic", [2, 2, 2, 2]), 34: ("basic", [3, 4, 6, 3]), 50: ("bottleneck", [3, 4, 6, 3])}


# `size` is the side of the layer's (square) input, `path` the convolution algorithm (models/conv.py).
def conv3x3(cin, cout, stride=1, size=None, path="native"):
    return conv(cin, cout, 3, stride, 1, size, path)


def conv1x1(cin, cout, stride=1, size=None, path="native"):
    return conv(cin, cout, 1, stride, 0, size, path)


def shortcut(cin, cout, stride, size, path):
    """None (identity) when shapes match, else the 1x1 projection with BatchNorm."""
    if stride == 1 and cin == cout:
        return None
    return nn.SequentialCell([conv1x1(cin, cout, stride, size, path), nn.BatchNorm2d(cout)])


def _cbr(conv_cell, bn, x):
    """bn(conv(x)) with each output rounded where the cell has FP16 numerics (models/fp16.py)."""
    return edge(bn, bn(edge(conv_cell, conv_cell(x))))


def _identity(down, x):
    """The shortcut's output on a plain tensor: x, or the projection (rounded as `_cbr` where flagged)."""
    if down is None:
        return x
    if getattr(down[0], "fp16_edges", False):
        return _cbr(down[0], down[1], x)
    return down(x)  # through the SequentialCell itself: hooks and AMP's casts on it see the call


def _bk_cbr(conv_cell, bn, x, relu: bool):
    """`_cbr` on a blocked tensor, the ReLU fused into the BatchNorm when `relu`."""
    return edge(bn, bn_blocked(bn, edge(conv_cell, conv_cell.blocked(x)), relu))


class BasicBlock(nn.Cell):
    """Two 3x3 convolutions with an identity (or 1x1 projection) shortcut."""

    expansion = 1

    def __init__(self, cin, width, stride=1, size=None, path="native"):
        super().__init__()
        cout = width * self.expansion
        out = conv_output_size(size, 3, stride, 1) if size else None
        self.conv1 = conv3x3(cin, width, stride, size, path)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, cout, 1, out, path)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = shortcut(cin, cout, stride, size, path)

    def construct(self, x):
        identity = _identity(self.down, x)
        out = self.relu(_cbr(self.conv1, self.bn1, x))
        out = _cbr(self.conv2, self.bn2, out)
        return edge(self, self.relu(out + identity))

    def blocked(self, x):
        """construct on a blocked body's tensor (models/blocked.py): BatchNorm+ReLU and add+ReLU fused."""
        identity = x if self.down is None else _bk_cbr(self.down[0], self.down[1], x, False)
        out = _bk_cbr(self.conv1, self.bn1, x, True)
        out = _bk_cbr(self.conv2, self.bn2, out, False)
        return edge(self, self.bk_add_relu(out, identity))


class Bottleneck(nn.Cell):
    """1x1 reduce, 3x3, 1x1 expand (x4), as in ResNet-50."""

    expansion = 4

    def __init__(self, cin, width, stride=1, size=None, path="native"):
        super().__init__()
        cout = width * self.expansion
        out = conv_output_size(size, 3, stride, 1) if size else None
        self.conv1 = conv1x1(cin, width, 1, size, path)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride, size, path)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, cout, 1, out, path)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = shortcut(cin, cout, stride, size, path)

    def construct(self, x):
        identity = _identity(self.down, x)
        out = self.relu(_cbr(self.conv1, self.bn1, x))
        out = self.relu(_cbr(self.conv2, self.bn2, out))
        out = _cbr(self.conv3, self.bn3, out)
        return edge(self, self.relu(out + identity))

    def blocked(self, x):
        """construct on a blocked body's tensor, as BasicBlock.blocked."""
        identity = x if self.down is None else _bk_cbr(self.down[0], self.down[1], x, False)
        out = _bk_cbr(self.conv1, self.bn1, x, True)
        out = _bk_cbr(self.conv2, self.bn2, out, True)
        out = _bk_cbr(self.conv3, self.bn3, out, False)
        return edge(self, self.bk_add_relu(out, identity))


def stem_max_pool(padding: str = "same") -> nn.MaxPool2d:
    """The ImageNet stem's 3x3/2 max pool. "same": MindSpore's pad_mode, padding only the bottom/right
    where the input side is even; "torch": one pixel on every side, as torchvision and timm (whose
    weights runner-convert brings) pool. Both give ceil(side / 2)."""
    if padding == "torch":
        return nn.MaxPool2d(3, stride=2, pad_mode="pad", padding=1)
    return nn.MaxPool2d(3, stride=2, pad_mode="same")


def _stem(in_channels, width, size, conv_path, large_stem, stem_pool):
    """(the stem cell, the side of its output)."""
    if large_stem:  # ImageNet stem: 7x7/2 conv and 3x3/2 max pool, for inputs of 64 px and up
        cell = nn.SequentialCell(
            [
                conv(in_channels, width, 7, 2, 3, size, conv_path),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                stem_max_pool(stem_pool) if stem_pool == "torch" else max_pool(3, 2, conv_path),
            ]
        )
        return cell, -(-conv_output_size(size, 7, 2, 3) // 2)  # pad_mode="same" pool: ceil(size / 2)
    cell = nn.SequentialCell([conv3x3(in_channels, width, 1, size, conv_path), nn.BatchNorm2d(width), nn.ReLU()])
    return cell, size


def _stages(block, blocks_per_stage, width, size, conv_path):
    """(the stages, each a SequentialCell of blocks; the channels the last one gives out)."""
    cin, stages = width, []
    for i, n in enumerate(blocks_per_stage):
        w = width * 2**i
        layers = []
        for j in range(n):
            stride = 2 if (i > 0 and j == 0) else 1
            layers.append(block(cin, w, stride, size, conv_path))
            size = conv_output_size(size, 3, stride, 1)
            cin = w * block.expansion
        stages.append(nn.SequentialCell(layers))
    return stages, cin


class ResNet(nn.Cell):
    """stem -> layer1..layerN -> global average pool -> head (dense to num_classes)."""

    def __init__(
        self,
        block,
        blocks_per_stage,
        width,
        num_classes,
        in_channels,
        large_stem,
        size,
        conv_path,
        stem_pool="same",
        blocked_body=True,
        blocked_layers="chosen",
    ):
        super().__init__()
        self.stem, size = _stem(in_channels, width, size, conv_path, large_stem, stem_pool)
        stages, cin = _stages(block, blocks_per_stage, width, size, conv_path)
        # Named attributes (layer1, layer2, ...) give cells the names users pass to amp.keep_fp32.
        self.layer1 = stages[0]
        self.layer2 = stages[1]
        self.layer3 = stages[2]
        self.layer4 = stages[3] if len(stages) > 3 else None
        self.mean = ops.ReduceMean(keep_dims=False)
        self.head = nn.Dense(cin, num_classes)
        self.large_stem = large_stem
        self.body_layout = "nchw"  # or the blocked body's oneDNN format, e.g. nChw16c (attach_blocked)
        self._blocked = False
        # The cells models/fp16.py rounds at (off: FP32; amp.dtype=float16 on a CPU turns them on).
        declare(
            [self]
            + [
                c
                for _, c in self.cells_and_names()
                if isinstance(c, (nn.Conv2d, nn.BatchNorm2d, BasicBlock, Bottleneck))
            ]
        )
        if conv_path in ("onednn", "best") and any(
            getattr(c, "path", "") == "onednn" for _, c in self.cells_and_names()
        ):
            why = self.attach_blocked(stem_pool, conv_path == "best", blocked_body, blocked_layers == "onednn")
            if why:
                log.info("model.conv=%s: the network body runs plain NCHW between layers: %s", conv_path, why)

    def plain_body(self) -> None:
        """Run the body on plain NCHW tensors from now on (AMP levels above O0 cast inside it)."""
        self._blocked = False
        self.body_layout = "nchw"

    @property
    def blocked_body(self) -> bool:
        """Whether construct runs the body on blocked tensors (models/blocked.py plain_bodies switches it)."""
        return self._blocked

    def construct(self, x):
        # amp.dtype=float16 on a CPU (models/fp16.py): the image rounded as O2's cast at the root rounds it,
        # unless the stem is an FP32 island; the pooled features rounded as the FP16 head would read them.
        x = edge(self.stem[0], x)
        if self._blocked and x.dtype == mstype.float32:
            return self.head(edge(self, self.mean(self.body_blocked(x), (2, 3))))
        if getattr(self, "fp16_edges", False):
            x = self.stem_rounded(x)
        else:
            x = self.stem(x)
        x = self.layer3(self.layer2(self.layer1(x)))
        if self.layer4 is not None:
            x = self.layer4(x)
        return self.head(edge(self, self.mean(x, (2, 3))))

    def stem_rounded(self, x):
        """The stem on a plain tensor with its outputs rounded where flagged (models/fp16.py)."""
        x = self.stem[2](_cbr(self.stem[0], self.stem[1], x))
        if self.large_stem:
            x = self.stem[3](x)
        return x

    def body_blocked(self, x):
        """Stem to last stage on oneDNN's blocked memory: the image in (the stem convolution reads it
        plain), plain NCHW out, for the global pool."""
        x = _bk_cbr(self.stem[0], self.stem[1], x, True)
        if self.large_stem:
            x = self.bk_pool(x, self.bk_pool_params)[0]
        for block in self.layer1.cell_list:
            x = block.blocked(x)
        for block in self.layer2.cell_list:
            x = block.blocked(x)
        for block in self.layer3.cell_list:
            x = block.blocked(x)
        if self.layer4 is not None:
            for block in self.layer4.cell_list:
                x = block.blocked(x)
        return self.bk_from(x, self.bk_channels)

    def attach_blocked(
        self, stem_pool: str, choose_dense: bool = False, wanted: bool = True, all_onednn: bool = False
    ) -> str:
        """Make the blocked body's operators (models/blocked.py) and switch it on; "" when done, else why not.
        choose_dense: model.conv=best, whose layers may run the dense matmul (PathConv2d.attach_blocked).
        wanted: model.blocked_body; all_onednn: model.blocked_layers=onednn (every layer oneDNN's convolution)."""
        from runner.models import blocked
        from runner.models.conv import PathConv2d
        from runner.models.errors import ModelError

        if not wanted:
            return "model.blocked_body=false"
        if ms.get_context("mode") != ms.GRAPH_MODE:
            # Measured: a tiny ResNet's PyNative step took 2x longer blocked (each operator's bprop runs
            # from Python); mode=jit builds in PyNative too.
            return "the blocked operators pay only in graph mode"
        if self.large_stem and stem_pool != "same":
            return f"its stem pool pads as {stem_pool}, and the blocked max pool pads as pad_mode='same'"
        try:
            b = blocked.block_size()
        except ModelError as e:
            return str(e)
        if not b:
            return "oneDNN has no fast convolution kernels on a blocked format on this CPU"
        for _, cell in self.cells_and_names():
            if isinstance(cell, PathConv2d):
                # The stem reads the plain image: the dense and Winograd operators take blocked inputs only.
                chosen = choose_dense and cell is not self.stem[0]
                cell.attach_blocked(b, cell.path != "onednn" and not all_onednn, chosen and not all_onednn)
            elif isinstance(cell, nn.BatchNorm2d):
                blocked.attach_bn(cell, b)
            elif isinstance(cell, (BasicBlock, Bottleneck)):
                cell.bk_add_relu = blocked.add_relu_op()
        if self.large_stem:
            self.bk_pool, self.bk_pool_params = blocked.max_pool_op(3, 2, b)
        _, self.bk_from, self.bk_channels = blocked.converters(self.head.in_channels, b)
        self._blocked = True
        self.body_layout = f"nChw{b}c"
        return ""


def resnet(
    style: str,
    depth: int,
    width: int,
    num_classes: int,
    in_channels: int,
    image_size: int,
    conv: str = "native",
    stem: str = "auto",
    stem_pool: str = "same",
    blocked_body: bool = True,
    blocked_layers: str = "chosen",
) -> ResNet:
    """Build a ResNet of the given style and depth; unknown depths raise ValueError.

    `conv` is the convolution algorithm: "native", "gemm" or "auto" (per layer shape, models/conv.py);
    the parameters are the same under every choice. stem (ImageNet style): "imagenet" is the 7x7/2
    conv and max pool, "cifar" the 3x3 conv that keeps full resolution, "auto" the first from 64 px up
    and the second below. stem_pool: the ImageNet stem's max pool padding (stem_max_pool); a ValueError
    when it is asked of a CIFAR stem, which has no pool. blocked_body, blocked_layers: model.blocked_body and
    model.blocked_layers (ResNet.attach_blocked).
    """
    body = {"blocked_body": blocked_body, "blocked_layers": blocked_layers, "conv_path": conv, "size": image_size}
    if style == "cifar":
        if depth not in CIFAR_DEPTHS:
            raise ValueError(f"CIFAR-style ResNet depth must be one of {sorted(CIFAR_DEPTHS)}, got {depth}")
        return ResNet(BasicBlock, [CIFAR_DEPTHS[depth]] * 3, width, num_classes, in_channels, False, **body)
    if depth not in IMAGENET_DEPTHS:
        raise ValueError(f"ImageNet-style ResNet depth must be one of {sorted(IMAGENET_DEPTHS)}, got {depth}")
    kind, blocks = IMAGENET_DEPTHS[depth]
    block = BasicBlock if kind == "basic" else Bottleneck
    # Small inputs (CIFAR-size) keep full resolution in the stem, as the usual CIFAR adaptations do:
    # the ImageNet stem divides the side by 4, leaving 2x2 of an 8x8 digit before the first stage.
    large = image_size >= 64 if stem == "auto" else stem == "imagenet"
    if stem_pool != "same" and not large:
        raise ValueError(
            f"the stem at {image_size} px is the CIFAR one (3x3 conv, no max pool), so stem_pool={stem_pool} "
            "would change nothing; the ImageNet stem (stem=imagenet) has the pool it pads"
        )
    return ResNet(block, blocks, width, num_classes, in_channels, large, stem_pool=stem_pool, **body)
