"""Convolution cells with a choice of CPU algorithm: MindSpore's native Conv2D or im2col + one MatMul.

On CPU MindSpore 2.10 runs every convolution as oneDNN `gemm:jit` on plain NCHW memory: a per-image
im2col + GEMM, starved when an image's output is only a few pixels (the last ResNet stages), while
MindSpore's own MatMul reaches ~180 GFLOP/s on large problems. `PathConv2d(path="gemm")` computes the
same convolution as one large MatMul over the whole batch: the input goes channels-last, a constant
0/1 matrix gathers each output pixel's k*k window (im2col as a MatMul, which also pads), and the
(N*OH*OW, k*k*C) window matrix is multiplied by the (Cout, k*k*C) weight. Which algorithm is faster depends
on the layer's shape, so `path="auto"` times both (forward + backward) once per shape and machine,
caching the winner in a JSON file, as cuDNN's benchmark mode does.

`path="onednn"` calls MindSpore's own oneDNN library directly, on the blocked memory formats its fast
kernels need (models/onednn.py): on an AVX-512 CPU the fastest of the three on every ResNet layer.

The cell is an `nn.Conv2d` with the same single `weight` parameter whatever the path, so
checkpoints load across choices and FLOP counters that look for `nn.Conv2d` still see it.
"""

import json
import logging
import os
import platform
import time
from pathlib import Path

import numpy as np
from mindspore import Tensor, nn, ops
from mindspore import dtype as mstype

log = logging.getLogger(__name__)

PATHS = ("best", "native", "gemm", "auto", "onednn")
CELL_PATHS = ("native", "gemm", "onednn", "dense")  # what a cell runs, once auto and best are resolved
# A handful of timed fwd+bwd repeats after one warm-up; the minimum is the least noisy estimate on a
# shared machine. The batch is the runner's default batch size (the model is built before the batch
# size is known to it); the winner can differ with the batch for shapes where both paths are close.
BENCH_BATCH = 32
BENCH_REPEATS = 5
GEMM_MARGIN = 0.9  # an alternative to the default path is chosen only when at least 10% faster
# Largest im2col selection matrix (elements) the gemm path builds: 16 MB. Larger inputs (the 7x7 stem
# at 64 px would need 800 MB) are where the native convolution wins anyway; they stay native.
GEMM_MAX_SELECT = 2**22


class PathConv2d(nn.Conv2d):
    """A bias-free square-kernel `nn.Conv2d` (zero padding `padding`), computed by `path`.

    `path` is "native" (MindSpore's Conv2D), "gemm" (im2col + MatMul) or "onednn" (oneDNN's blocked
    kernels, models/onednn.py); resolve "auto" with `choose_path` before building. Parameters, their
    names and the numbers computed are the same under every path (up to float32 summation order).

    Not named `Conv2d`: amp=o1's rewrite (MindSpore 2.10) generates one class per class name, and two
    classes called Conv2d (this one and its base) made it call the wrong constructor (a TypeError).
    """

    def __init__(self, cin, cout, kernel_size, stride=1, padding=0, path="native", size=None, weight_init=None):
        if path not in CELL_PATHS:
            raise ValueError(
                f"PathConv2d path must be one of {', '.join(CELL_PATHS)} (resolve 'auto' and 'best' first), "
                f"got {path!r}"
            )
        super().__init__(
            cin,
            cout,
            kernel_size,
            stride=stride,
            pad_mode="pad" if padding else "valid",
            padding=padding,
            has_bias=False,
            **({} if weight_init is None else {"weight_init": weight_init}),
        )
        self.path = path
        self.use_gemm = path == "gemm"
        self.k, self.s, self.p, self.size = kernel_size, stride, padding, size
        self.select = None
        if self.use_gemm and not (kernel_size == 1 and stride == 1 and padding == 0):
            if size is None:
                raise ValueError("PathConv2d(path='gemm') needs the input size (its im2col matrix depends on it)")
            # A plain Tensor attribute, not a Parameter: a constant of the graph, absent from checkpoints.
            self.select = Tensor(selection_matrix(size, kernel_size, stride, padding))
        self.matmul_bt = ops.MatMul(transpose_b=True)
        self.taps = None
        if path == "dense":
            if size is None or not dense_feasible(kernel_size, stride, padding, size):
                raise ValueError(
                    "PathConv2d(path='dense') needs an input size on which every output pixel's window covers "
                    f"the whole input; k{kernel_size} s{stride} p{padding} @{size} is not one"
                )
            # Which tap joins each (output pixel, input pixel) pair: a constant of the graph, not a Parameter.
            self.taps = Tensor(tap_matrix(size, kernel_size, stride, padding))
        self.use_onednn = path == "onednn"
        if self.use_onednn:
            from runner.models import onednn

            k, s, p = (kernel_size,) * 2, (stride,) * 2, (padding,) * 4
            self.onednn = onednn.forward_op(k, s, p)
            # A constant of the graph, not a Parameter: absent from checkpoints.
            self.onednn_geometry = onednn.geometry(s, p)

    def construct(self, x):
        if self.use_gemm:
            return self._gemm(x)
        if self.taps is not None:
            return self._dense(x)
        if self.use_onednn:
            # float16 (AMP) tensors are converted to float32 inside, as MindSpore's CPU Conv2D does.
            return self.onednn(x, self.weight, self.onednn_geometry)
        return self.conv2d(x, self.weight)

    def blocked(self, x):
        """This convolution on a blocked body's tensor (models/blocked.py; `attach_blocked` made the operators):
        oneDNN on the blocked memory (a convolution, or the dense matmul), or (a gemm layer) the cell's own
        path between reorders."""
        if self.bk_via_plain:
            return self.bk_to(self.construct(self.bk_from(x, self.bk_cin)), self.bk_cout)
        if self.bk_dense is not None and x.shape[2] == self.size and x.shape[3] == self.size:
            # Another input size (padding=none, bucket) would make the dense matrix grow with the square of
            # its pixels: it runs the convolution, as _dense runs the native one.
            return self.bk_dense(x, self.weight, self.bk_geometry)
        return self.bk_conv(x, self.weight, self.bk_geometry)

    def attach_blocked(self, b: int, via_plain: bool, choose_dense: bool = False) -> None:
        """Make the operators `blocked` runs for block size b; via_plain: keep this layer's own path.

        choose_dense (model.conv=best, which picks each layer's algorithm; not an explicit onednn, which asks
        for oneDNN's convolution in every layer): a layer on which the convolution is one dense matmul
        (`dense_feasible`) runs it on the blocked tensors as they lie (blocked.dense_op), whatever best's
        per-layer choice (onednn, gemm or dense) was: no choice is timed for it (a gemm or dense layer would
        run between two reorders). Its matmuls compute only the taps that read the input (4 of 9 on a 2x2
        map) at oneDNN's matmul speed and need no activation reorders. Measured on ResNet-18's layer4 3x3
        (512 channels, 2x2, batch 64, forward + both backward passes; 2-core EPYC Zen 4, machine loaded):
        26-36 ms against oneDNN's direct kernels' 33-62 with AVX-512, 27 against 64-79 under the AVX2 cap.
        The plain dense path (MindSpore's matmul, timed against plain oneDNN by `_measured`) is what runs
        outside blocked bodies. Likewise a layer that `winograd_feasible` names (layer3's 3x3 convolutions on
        4x4 maps) computes its weight gradient by Winograd on the blocked tensors ("winograd-dw": oneDNN's
        forward and backward-data kernels, blocked.conv_op(winograd_dw=True)), and one that
        `winograd_all_feasible` names (3x3 stride-1 layers on maps of 8x8 and more) all three passes
        ("winograd", blocked.conv_op(winograd=True); the weight gradient where `winograd_dw_runs`)."""
        from runner.models import blocked

        chosen = choose_dense
        dense = chosen and dense_feasible(self.k, self.s, self.p, self.size)
        winograd = chosen and winograd_feasible(self.k, self.s, self.p, self.size)
        winograd_all = chosen and winograd_all_feasible(self.k, self.s, self.p, self.size)
        self.bk_via_plain = via_plain and not (dense or winograd or winograd_all)
        self.bk_dense = None
        self.bk_block = b
        self.bk_path = self.path if self.bk_via_plain else "onednn"
        if self.bk_via_plain:
            _, self.bk_from, self.bk_cin = blocked.converters(self.in_channels, b)
            self.bk_to, _, self.bk_cout = blocked.converters(self.out_channels, b)
            return
        self.bk_conv, self.bk_geometry = blocked.conv_op(
            self.k, self.s, self.p, b, winograd_dw=winograd, winograd=winograd_all
        )
        if winograd:
            self.bk_path = "winograd-dw"
        if winograd_all:
            self.bk_path = "winograd"
        if dense:
            self.bk_dense, _ = blocked.dense_op(self.k, self.s, self.p, b)
            self.bk_path = "dense"

    def _gemm(self, x):
        n, c, h, w = x.shape
        if self.select is not None and (h != self.size or w != self.size):
            # The im2col matrix is built for the planned input size; shapes are static per graph, so
            # an input of another size (padding=none or bucket) compiles to the native convolution.
            return self.conv2d(x, self.weight)
        oh, ow = conv_output_size(h, self.k, self.s, self.p), conv_output_size(w, self.k, self.s, self.p)
        kk, pixels = self.k * self.k, oh * ow
        # Channels-last, so that each output pixel's (tap, channel) window is one contiguous row and the
        # whole batch is one GEMM. Measured alternatives (BENCHMARKS.md) were slower: k*k StridedSlices
        # of a (C, N, H, W) tensor (nine 3x3 taps of a (256, 64, 6, 6) tensor: StridedSlice 62 ms,
        # Slice 10 ms, this im2col MatMul 2 ms), or the im2col MatMul in (C, N, H, W) order, whose
        # inflated k*k*C x N*OH*OW matrix then needs a transpose.
        cols = ops.reshape(ops.transpose(x, (0, 2, 3, 1)), (n, h * w, c))
        if self.select is not None:
            # (N, OH*OW*k*k, C): im2col as a MatMul with a 0/1 matrix, in the input's precision (AMP casts
            # the cell's inputs, not this constant).
            cols = ops.matmul(ops.cast(self.select, x.dtype), cols)
        cols = ops.reshape(cols, (n * pixels, kk * c))
        wmat = ops.reshape(ops.transpose(ops.cast(self.weight, x.dtype), (0, 2, 3, 1)), (self.out_channels, kk * c))
        out = self.matmul_bt(cols, wmat)  # (N*OH*OW, Cout)
        return ops.transpose(ops.reshape(out, (n, oh, ow, self.out_channels)), (0, 3, 1, 2))

    def _dense(self, x):
        n, c, h, w = x.shape
        if h != self.size or w != self.size:  # as _gemm: another input size runs the native convolution
            return self.conv2d(x, self.weight)
        oh = conv_output_size(h, self.k, self.s, self.p)
        o, kk = self.out_channels, self.k * self.k
        # Every output pixel reads every input pixel, each pair through exactly one tap: output pixel q is
        # one (N, C*H*W) x (C*H*W, O) matmul over the plain NCHW memory: no im2col, no padding taps, no
        # transpose of activations or weights. Its (O, C*H*W) weight is the kernel's taps gathered by a
        # small matmul with a constant 0/1 matrix (whose backward sums each tap's gradient back).
        flat = ops.reshape(x, (n, c * h * w))
        wk = ops.reshape(ops.cast(self.weight, x.dtype), (o * c, kk))
        taps = ops.cast(self.taps, x.dtype)
        outs = []
        for q in range(oh * oh):
            wq = ops.reshape(ops.matmul(wk, taps[q]), (o, c * h * w))
            outs.append(self.matmul_bt(flat, wq))
        return ops.reshape(ops.stack(outs, axis=2), (n, o, oh, oh))


class OneDNNConv2d(nn.Conv2d):
    """An `nn.Conv2d` whose convolution runs oneDNN's blocked kernels (models/onednn.py): what a zoo
    model's convolutions become (`use_onednn`). Any kernel, stride, dilation, padding mode and group
    count (grouped and depthwise convolutions included), bias as nn.Conv2d adds it. Made from an existing
    cell by `use_onednn`, which keeps its parameters, their names and values."""

    def construct(self, x):
        output = self.onednn(x, self.weight, self.onednn_geometry)
        if self.has_bias:
            output = self.bias_add(output, self.bias)
        return output


def _pads(padding) -> tuple:
    """nn.Conv2d's padding (an int, or (top, bottom, left, right)) as four values."""
    return (padding,) * 4 if isinstance(padding, int) else tuple(padding)


def use_onednn(net: nn.Cell) -> int:
    """Turn every NCHW `nn.Conv2d` cell of `net` into an `OneDNNConv2d` in place; return how many.

    The cells stay the same objects (their class changes), so parameters keep their names and values and
    checkpoints load as before. Cells already taking another path (the runner's own PathConv2d) are left.
    """
    from runner.models import onednn

    onednn.library()  # a missing compiler fails here, before anything changed
    swapped = 0
    for _, cell in net.cells_and_names():
        if type(cell) is not nn.Conv2d or cell.data_format != "NCHW":
            continue
        same = cell.pad_mode == "same"
        pads = (0,) * 4 if cell.pad_mode != "pad" else _pads(cell.padding)
        cell.onednn = onednn.forward_op(cell.kernel_size, cell.stride, pads, cell.dilation, same)
        cell.onednn_geometry = onednn.geometry(cell.stride, pads, cell.dilation, cell.group, same)
        cell.path = "onednn"
        cell.__class__ = OneDNNConv2d
        swapped += 1
    return swapped


class OneDNNMaxPool2d(nn.Cell):
    """`nn.MaxPool2d(kernel_size, stride, pad_mode="same")` computed by oneDNN with a workspace (the stem's
    pool on the onednn and best paths): MindSpore's CPU pool runs oneDNN's `simple_nchw` kernel and its
    backward recomputes the forward; this one runs a jit kernel and reads the saved argmax. The same
    numbers (a maximum is a maximum; ties send the gradient to one of the equal inputs). Not named
    MaxPool2d, for the reason PathConv2d is not named Conv2d."""

    def __init__(self, kernel_size: int, stride: int):
        super().__init__()
        from runner.models import onednn

        self.kernel_size, self.stride = kernel_size, stride
        self.pool, self.params = onednn.max_pool_op(kernel_size, stride)
        self.native = nn.MaxPool2d(kernel_size, stride=stride, pad_mode="same")

    def construct(self, x):
        if x.dtype != mstype.float32:  # AMP O2/O3 hand float16: MindSpore's own pool takes it
            return self.native(x)
        return self.pool(x, self.params)[0]


def max_pool(kernel_size: int, stride: int, path: str) -> nn.Cell:
    """The stem's max pool ("same" padding): oneDNN's with a workspace where the convolutions run oneDNN."""
    import mindspore as ms

    if ms.get_context("device_target") == "CPU" and (path == "onednn" or (path == "best" and _onednn_available())):
        return OneDNNMaxPool2d(kernel_size, stride)
    return nn.MaxPool2d(kernel_size, stride=stride, pad_mode="same")


def tap_matrix(size: int, kernel_size: int, stride: int, padding: int) -> np.ndarray:
    """(OH*OW, k*k, H*W) 0/1: for output pixel q, which kernel tap reads each input pixel."""
    out = conv_output_size(size, kernel_size, stride, padding)
    taps = np.zeros((out * out, kernel_size * kernel_size, size * size), np.float32)
    for y in range(out):
        for x in range(out):
            for i in range(kernel_size):
                for j in range(kernel_size):
                    sy, sx = y * stride + i - padding, x * stride + j - padding
                    if 0 <= sy < size and 0 <= sx < size:
                        taps[y * out + x, i * kernel_size + j, sy * size + sx] = 1.0
    return taps


def dense_feasible(kernel_size: int, stride: int, padding: int, size) -> bool:
    """Whether every output pixel's window covers the whole input (layer4's 3x3 convs on 2x2 maps): then
    the convolution is one dense matmul that multiplies no padding. Bounded to small inputs, whose
    dense weight (C*H*W x O*OH*OW) is no larger than a few times the kernel."""
    if not size or size * size > 16:
        return False
    return bool((tap_matrix(size, kernel_size, stride, padding).sum(axis=1) == 1).all())


def winograd_feasible(kernel_size: int, stride: int, padding: int, size) -> bool:
    """Whether a blocked body computes this layer's weight gradient by Winograd's F(2x2, 3x3) (csrc
    WinogradBackwardWeights): 3x3, stride 1, pad 1 on 4x4 maps, where oneDNN's direct backward-weights
    kernel is slowest. Measured on ResNet-18's layer3 (256 channels, batch 64, 2 threads, 2-core EPYC Zen 4,
    AVX-512): 4.6-5.5 ms against 5.5-7.2 alone, ~4.5 against 9.4-10.4 in training. Layers on larger maps
    take all three passes by Winograd (`winograd_all_feasible`), and 2x2 maps are dense."""
    return kernel_size == 3 and stride == 1 and padding == 1 and size == 4


def winograd_dw_runs(height: int, width: int, cin: int, cout: int, b: int) -> bool:
    """Whether csrc WinogradBackwardWeights computes a 3x3 stride-1 weight gradient on these maps and channels
    (blocks of b) by Winograd, else oneDNN's kernel: even sides up to 8x8 (every tile at once), or any map
    where one thread's transformed gradient (16 x C x O, padded to blocks) fits 512 KB (in chunks)."""
    whole = height % 2 == 0 and width % 2 == 0 and height * width <= 64
    return whole or 16 * (-(-cin // b) * b) * (-(-cout // b) * b) * 4 <= 512 * 1024


def winograd_all_feasible(kernel_size: int, stride: int, padding: int, size) -> bool:
    """Whether a blocked body runs all three passes of this layer by Winograd's F(2x2, 3x3) (csrc
    WinofForward; the weight gradient where `winograd_dw_runs`, else oneDNN's kernel): 3x3,
    stride 1, pad 1 on maps of 8x8 and more, where oneDNN's direct kernels already run at the machine's peak
    and only fewer multiplications are faster. On 4x4 maps (four tiles per image) only the weight gradient
    pays (`winograd_feasible`)."""
    return kernel_size == 3 and stride == 1 and padding == 1 and bool(size) and size >= 8


def selection_matrix(size: int, kernel_size: int, stride: int, padding: int) -> np.ndarray:
    """(OH*OW*k*k, H*W) 0/1 matrix: row (output pixel, tap) picks the input pixel it reads (none: padding).

    Multiplied with one image's (H*W, C) channels-last pixels it yields each output pixel's window as
    k*k*C consecutive values in (tap, channel) order, matching a (Cout, kh, kw, C) weight.
    """
    out = conv_output_size(size, kernel_size, stride, padding)
    sel = np.zeros((out * out * kernel_size * kernel_size, size * size), np.float32)
    for y in range(out):
        for x in range(out):
            for i in range(kernel_size):
                for j in range(kernel_size):
                    sy, sx = y * stride + i - padding, x * stride + j - padding
                    if 0 <= sy < size and 0 <= sx < size:
                        sel[((y * out + x) * kernel_size + i) * kernel_size + j, sy * size + sx] = 1.0
    return sel


def gemm_feasible(kernel_size: int, stride: int, padding: int, size: int) -> bool:
    """Whether the im2col matrix for this shape is small enough to hold (and cheap enough to multiply)."""
    out = conv_output_size(size, kernel_size, stride, padding)
    return size * size * kernel_size * kernel_size * out * out <= GEMM_MAX_SELECT


def conv_output_size(size: int, kernel_size: int, stride: int, padding: int) -> int:
    """Output side of a convolution (or pool) with this kernel, stride and zero padding."""
    return (size + 2 * padding - kernel_size) // stride + 1


class _FwdBwd(nn.Cell):
    """Forward and backward (input and weight gradients) of one convolution: what a train step runs."""

    def __init__(self, conv):
        super().__init__()
        self.conv = conv
        self.grad = ops.GradOperation(get_all=True, get_by_list=True, sens_param=True)
        self.params = conv.trainable_params()

    def construct(self, x, dy):
        return self.grad(self.conv, self.params)(x, dy)


def _timer(path, cin, cout, k, stride, padding, size):
    """A compiled, warmed-up forward + backward of one convolution: call it to time one step."""
    rng = np.random.default_rng(0)
    # Weights from numpy, not MindSpore's initializer: timing must not draw from the seeded stream the
    # network's own initial weights come from, or a run that measured would train from other weights
    # than one that read the cache.
    weight = Tensor(rng.standard_normal((cout, cin, k, k), dtype=np.float32))
    conv = PathConv2d(cin, cout, k, stride, padding, path, size, weight_init=weight)
    step = _FwdBwd(conv)
    out = conv_output_size(size, k, stride, padding)
    x = Tensor(rng.standard_normal((BENCH_BATCH, cin, size, size), dtype=np.float32))
    dy = Tensor(rng.standard_normal((BENCH_BATCH, cout, out, out), dtype=np.float32))
    _sync(step(x, dy))  # compile and warm up

    def once():
        t = time.perf_counter()
        _sync(step(x, dy))
        return time.perf_counter() - t

    return once


def time_paths(cin, cout, k, stride, padding, size, paths=("native", "gemm")) -> dict:
    """Best forward + backward seconds of each path, repeats interleaved so that load hits all alike."""
    timers = {p: _timer(p, cin, cout, k, stride, padding, size) for p in paths}
    best = {p: float("inf") for p in timers}
    for i in range(BENCH_REPEATS):
        for p, once in timers.items():
            best[p] = min(best[p], once())
        if i >= 1 and max(best.values()) > 2 * min(best.values()) and len(best) == 2:
            break  # two paths and a clear winner: spare the remaining repeats
    return best


def _sync(outputs):
    for o in outputs:
        if isinstance(o, (tuple, list)):
            _sync(o)
        else:
            o.asnumpy()


def cache_path() -> Path:
    """Where `auto` keeps its measured choices: $XDG_CACHE_HOME (or ~/.cache)/mindspore-runner/."""
    from runner.models.onednn import cache_dir

    return cache_dir() / "conv-paths.json"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key() -> str:
    """What a measured choice depends on besides the shape: CPU, MindSpore version, ISA cap, mode."""
    import mindspore as ms

    mode = "graph" if ms.get_context("mode") == ms.GRAPH_MODE else "pynative"
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "default")
    return f"{_cpu_model()} | mindspore {ms.__version__} | isa {isa} | {mode}"


def _load_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):  # absent or corrupt: measure again and rewrite it
        return {}


# Under model.conv=best, im2col + MatMul is timed against oneDNN only for outputs of at most 4x4 pixels:
# on larger ones oneDNN's direct kernels won every ResNet shape measured (AVX2 EPYC, AVX-512 Xeon), and
# timing them would only lengthen the first run on a machine.
SMALL_OUTPUT = 16
# Nor is a layer timed under best whose forward pass at BENCH_BATCH is under 100 MFLOP: it takes a
# millisecond or two whatever runs it, and measuring it (compiling a graph per candidate) costs seconds.
MIN_TIMED_FLOPS = 1e8
_best: dict = {}  # model.conv=best's process-wide decision (onednn.choose), per ISA cap


def candidates(path: str, kernel_size: int, stride: int, padding: int, size) -> tuple:
    """The algorithms `path` ("auto": native first, "best" with oneDNN available: onednn first) times for
    this shape; the first is the default, which an alternative must beat by a margin."""
    found = ["onednn" if path == "best" else "native"]
    if size and gemm_feasible(kernel_size, stride, padding, size):
        out = conv_output_size(size, kernel_size, stride, padding)
        if path == "auto" or out * out <= SMALL_OUTPUT:
            found.append("gemm")
    if dense_feasible(kernel_size, stride, padding, size):
        found.append("dense")
    return tuple(found)


def _onednn_available() -> bool:
    from runner.models.onednn import choose

    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    if cap not in _best:
        _best[cap] = choose(cap).path == "onednn"
    return _best[cap]


def best_path() -> str:
    """model.conv=best for a model whose layers cannot be timed one by one (a zoo model): "onednn" on a
    CPU where it pays and builds, else "native"."""
    import mindspore as ms

    return "onednn" if ms.get_context("device_target") == "CPU" and _onednn_available() else "native"


def choose_path(path: str, cin: int, cout: int, kernel_size: int, stride: int, padding: int, size: int) -> str:
    """The algorithm one convolution runs: "native", "gemm", "dense" or "onednn".

    Off CPU it is always "native" (GPU/Ascend convolutions are fast). "onednn" is taken as asked, "gemm"
    unless the shape's im2col matrix would be too large (`gemm_feasible`). "auto" (native, gemm, dense)
    and "best" (onednn, gemm on small outputs, dense; native where oneDNN is unavailable) look the layer
    shape up in the per-machine cache and, on a miss, time their candidates forward + backward in this
    process and record the winner, as cuDNN's benchmark mode does.
    """
    import mindspore as ms

    if path not in PATHS:
        raise ValueError(f"model.conv must be one of {', '.join(PATHS)}, got {path!r}")
    if ms.get_context("device_target") != "CPU":
        return "native"
    if path == "best" and not _onednn_available():
        return "native"
    if path == "onednn":
        from runner.models.onednn import library

        library()  # compiled (or found) now: a missing compiler fails the build, not the first step
        return "onednn"
    if path == "native" or (path == "gemm" and not gemm_feasible(kernel_size, stride, padding, size)):
        return "native"
    if path == "gemm":
        return "gemm"
    if size is None:  # no planned input size: nothing but the default can be built
        return candidates(path, kernel_size, stride, padding, size)[0]
    return _measured(path, cin, cout, kernel_size, stride, padding, size)


def _measured(path: str, cin: int, cout: int, kernel_size: int, stride: int, padding: int, size: int) -> str:
    paths = candidates(path, kernel_size, stride, padding, size)
    out = conv_output_size(size, kernel_size, stride, padding)
    if path == "best" and 2 * BENCH_BATCH * out * out * cout * cin * kernel_size**2 < MIN_TIMED_FLOPS:
        return paths[0]
    if len(paths) == 1:
        return paths[0]
    shape = f"{cin}->{cout} k{kernel_size} s{stride} p{padding} @{size}x{size} batch {BENCH_BATCH}"
    key = f"{shape} among {'/'.join(paths)}"
    file = cache_path()
    cache = _load_cache(file)
    entry = cache.get(machine_key(), {}).get(key)
    if isinstance(entry, dict) and entry.get("path") in paths:
        return entry["path"]
    times = time_paths(cin, cout, kernel_size, stride, padding, size, paths)
    default, fastest = paths[0], min(paths, key=lambda p: times[p])
    # An alternative must win clearly: where paths are close, timing noise would decide.
    best = fastest if times[fastest] < GEMM_MARGIN * times[default] else default
    log.info(
        "model.conv=%s: %s %s -> %s",
        path,
        shape,
        ", ".join(f"{p} {t * 1e3:.2f} ms" for p, t in times.items()),
        best,
    )
    cache = _load_cache(file)  # another process may have written meanwhile
    cache.setdefault(machine_key(), {})[key] = {"path": best, "ms": {p: round(t * 1e3, 3) for p, t in times.items()}}
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        os.replace(tmp, file)  # atomic: a concurrent reader never sees half a file
    except OSError as e:  # a read-only home must not stop training; the choice is just not remembered
        log.warning("could not write the convolution choice cache %s: %s", file, e)
    return best


def conv(cin, cout, kernel_size, stride, padding, size, path="native") -> PathConv2d:
    """A convolution cell on a `size` x `size` input, running the algorithm `path` resolves to."""
    chosen = choose_path(path, cin, cout, kernel_size, stride, padding, size)
    return PathConv2d(cin, cout, kernel_size, stride, padding, chosen, size)
