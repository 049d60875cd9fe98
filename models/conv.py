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

log = logging.getLogger(__name__)

PATHS = ("best", "native", "gemm", "auto", "onednn")
CELL_PATHS = ("native", "gemm", "onednn", "dense")  # what a cell runs, once auto and best are resolved
# A handful of timed fwd+bwd repeats after one warm-up; the minimum is the least noisy estimate on a
# shared machine. The batch is the runner's default batch size (the model is built before the batch
# size is known to it); the winner can differ with the batch for shapes where both paths are close.
BENCH_BATCH = 32
BENCH_REPEATS = 5
GEMM_MARGIN = 0.9  # gemm is chosen only when at least 10% faster
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

    def __init__(self, cin, cout, kernel_size, stride=1, padding=0, path="native", size=None):
        if path not in CELL_PATHS:
            raise ValueError(
                f"PathConv2d path must be one of {', '.join(CELL_PATHS)} (resolve 'auto' and 'best' first), got {path!r}"
            )
        super().__init__(
            cin,
            cout,
            kernel_size,
            stride=stride,
            pad_mode="pad" if padding else "valid",
            padding=padding,
            has_bias=False,
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
            # (H*W*OH*OW, k*k) 0/1: which tap joins each (input pixel, output pixel) pair. A constant.
            self.taps = Tensor(tap_matrix(size, kernel_size, stride, padding))
        self.use_onednn = path == "onednn"
        if self.use_onednn:
            from runner.models import onednn

            self.onednn = onednn.forward_op(kernel_size, stride, padding)
            # Constants of the graph, not Parameters: absent from checkpoints.
            self.onednn_stride, self.onednn_padding = onednn.scalars(stride, padding)

    def construct(self, x):
        if self.use_gemm:
            return self._gemm(x)
        if self.taps is not None:
            return self._dense(x)
        if self.use_onednn:
            # float16 (AMP) tensors are converted to float32 inside, as MindSpore's CPU Conv2D does.
            return self.onednn(x, self.weight, self.onednn_stride, self.onednn_padding)
        return self.conv2d(x, self.weight)

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
        pixels, outs, o = h * w, oh * oh, self.out_channels
        # Every output pixel reads every input pixel, each pair through exactly one tap: the convolution
        # is one (N, C*H*W) x (C*H*W, O*OH*OW) matmul over the plain NCHW memory, no im2col, no padding
        # taps, no transposes of activations. The dense weight is gathered from the kernel by a small
        # matmul with the constant tap matrix (its backward sums each tap's gradient back).
        wk = ops.reshape(ops.cast(self.weight, x.dtype), (o * c, self.k * self.k))
        pairs = self.matmul_bt(wk, ops.cast(self.taps, x.dtype))  # (O*C, H*W*OH*OW)
        dense = ops.reshape(ops.transpose(ops.reshape(pairs, (o, c, pixels, outs)), (1, 2, 0, 3)), (c * pixels, o * outs))
        return ops.reshape(ops.matmul(ops.reshape(x, (n, c * pixels)), dense), (n, o, oh, oh))


def tap_matrix(size: int, kernel_size: int, stride: int, padding: int) -> np.ndarray:
    """(H*W*OH*OW, k*k) 0/1 matrix: row (input pixel, output pixel) marks the kernel tap joining them."""
    out = conv_output_size(size, kernel_size, stride, padding)
    taps = np.zeros((size * size, out * out, kernel_size * kernel_size), np.float32)
    for y in range(out):
        for x in range(out):
            for i in range(kernel_size):
                for j in range(kernel_size):
                    sy, sx = y * stride + i - padding, x * stride + j - padding
                    if 0 <= sy < size and 0 <= sx < size:
                        taps[sy * size + sx, y * out + x, i * kernel_size + j] = 1.0
    return taps.reshape(size * size * out * out, kernel_size * kernel_size)


def dense_feasible(kernel_size: int, stride: int, padding: int, size) -> bool:
    """Whether every output pixel's window covers the whole input (layer4's 3x3 convs on 2x2 maps): then
    the convolution is one dense matmul that multiplies no padding. Bounded to small inputs, whose
    dense weight (C*H*W x O*OH*OW) is no larger than a few times the kernel."""
    if not size or size * size > 16:
        return False
    pairs = tap_matrix(size, kernel_size, stride, padding).reshape(size * size, -1, kernel_size * kernel_size)
    return bool((pairs.sum(axis=2) == 1).all())


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
    conv = PathConv2d(cin, cout, k, stride, padding, path, size)
    step = _FwdBwd(conv)
    rng = np.random.default_rng(0)
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


def choose_path(path: str, cin: int, cout: int, kernel_size: int, stride: int, padding: int, size: int) -> str:
    """The algorithm one convolution runs: "native", "gemm" or "onednn".

    Off CPU it is always "native" (GPU/Ascend convolutions are fast). "onednn" is taken as asked, "gemm"
    unless the shape's im2col matrix would be too large (`gemm_feasible`). "auto" looks the layer shape up
    in the per-machine cache and, on a miss, times both paths forward + backward in this process and
    records the winner.
    """
    import mindspore as ms

    if path not in PATHS:
        raise ValueError(f"model.conv must be one of {', '.join(PATHS)}, got {path!r}")
    if ms.get_context("device_target") != "CPU":
        return "native"
    if path == "best":  # decided once per process by the runner; here for models built without it
        from runner.models.onednn import choose

        path = choose(os.environ.get("ONEDNN_MAX_CPU_ISA")).path
    if path == "onednn":
        from runner.models.onednn import library

        library()  # compiled (or found) now: a missing compiler fails the build, not the first step
        return "onednn"
    if path == "native" or not gemm_feasible(kernel_size, stride, padding, size):
        return "native"
    if path == "gemm":
        return "gemm"
    shape = f"{cin}->{cout} k{kernel_size} s{stride} p{padding} @{size}x{size} batch {BENCH_BATCH}"
    file = cache_path()
    cache = _load_cache(file)
    entry = cache.get(machine_key(), {}).get(shape)
    if isinstance(entry, dict) and entry.get("path") in ("native", "gemm"):
        return entry["path"]
    times = time_paths(cin, cout, kernel_size, stride, padding, size)
    # gemm must win clearly: where both are close, timing noise would decide, and native is the default.
    best = "gemm" if times["gemm"] < GEMM_MARGIN * times["native"] else "native"
    log.info(
        "model.conv=auto: %s native %.2f ms, gemm %.2f ms -> %s",
        shape,
        times["native"] * 1e3,
        times["gemm"] * 1e3,
        best,
    )
    cache = _load_cache(file)  # another process may have written meanwhile
    cache.setdefault(machine_key(), {})[shape] = {"path": best, "ms": {p: round(t * 1e3, 3) for p, t in times.items()}}
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
