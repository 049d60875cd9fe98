"""Training FLOPs counted from the network's own layers, and a large-matmul peak to compare them with."""

import logging
import time

import numpy as np

# MindSpore is imported in the functions: this module is loaded (through report/outputs.py) by the recipe
# and the data-parallel launcher before the CPU ISA cap is set.

log = logging.getLogger("runner")

# Backward costs about twice the forward (gradients with respect to inputs and to weights).
TRAIN_FLOPS_PER_FORWARD = 3


def forward_flops_per_sample(net, channels: int, height: int, width: int) -> dict:
    """Multiply-add FLOPs (2 per MAC) of one sample's forward pass through every Conv2d and Dense.

    Shapes come from forward hooks on a one-sample PyNative forward pass. Hooks do not fire in
    graph mode, so this switches to PyNative; call it after training, when the mode no longer
    matters to the measurements (docs/mindspore-notes.md#warm-caches).
    """
    import mindspore as ms
    from mindspore import Tensor, nn

    counts = {"conv": 0, "dense": 0}
    paths = {}  # convolution algorithm (models/conv.py) -> layers and forward FLOPs it ran

    def conv_hook(cell, inputs, output):
        _, cout, hout, wout = output.shape
        cin = inputs[0].shape[1] // cell.group
        kh, kw = cell.kernel_size
        flops = 2 * cout * hout * wout * cin * kh * kw
        counts["conv"] += flops
        path = conv_path(cell, inputs[0].shape)
        entry = paths.setdefault(path, {"layers": 0, "forward_flops_per_sample": 0})
        entry["layers"] += 1
        entry["forward_flops_per_sample"] += flops

    def dense_hook(cell, inputs, output):
        counts["dense"] += 2 * cell.in_channels * cell.out_channels

    mode, training = ms.get_context("mode"), net.training
    ms.set_context(mode=ms.PYNATIVE_MODE)
    handles = []
    for _, cell in net.cells_and_names():
        if isinstance(cell, nn.Conv2d):
            handles.append(cell.register_forward_hook(conv_hook))
        elif isinstance(cell, nn.Dense):
            handles.append(cell.register_forward_hook(dense_hook))
    try:
        net.set_train(False)  # BatchNorm must not update its statistics from this probe
        net(Tensor(np.zeros((1, channels, height, width), np.float32)))
    finally:
        for h in handles:
            h.remove()
        net.set_train(training)
        ms.set_context(mode=mode)
    return {
        "conv": counts["conv"],
        "dense": counts["dense"],
        "total": counts["conv"] + counts["dense"],
        "conv_paths": dict(sorted(paths.items())),
    }


def conv_path(cell, input_shape) -> str:
    """The algorithm a convolution cell runs on this input: "native", "gemm" or "onednn" (models/conv.py).

    A gemm cell built for another input size compiles to the native convolution, so it counts as such.
    """
    path = getattr(cell, "path", "native")
    if path != "gemm":
        return path
    if getattr(cell, "select", None) is not None and tuple(input_shape[2:]) != (cell.size, cell.size):
        return "native"
    return "gemm"


def matmul_peak_gflops(n: int = 2048, repeats: int = 3) -> float:
    """Best FLOP/s of an n x n float32 MindSpore matmul in this process: the practical CPU ceiling.

    n=1024 measured below what ResNet-18 convolutions reached here (utilization over 100%); 2048 is
    closer to the ceiling and costs about a second.
    """
    import mindspore as ms
    from mindspore import Tensor, ops

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        rng = np.random.default_rng(0)
        a = Tensor(rng.random((n, n), dtype=np.float32))
        b = Tensor(rng.random((n, n), dtype=np.float32))
        ops.matmul(a, b).asnumpy()  # warm-up: kernel selection and allocation
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            ops.matmul(a, b).asnumpy()
            best = min(best, time.perf_counter() - t)
    finally:
        ms.set_context(mode=mode)
    return 2 * n**3 / best / 1e9


def device_peak_memory_mb(target: str):
    """Peak device memory MindSpore allocated, where the device reports it (not on CPU)."""
    if target == "CPU":
        return None
    import mindspore as ms

    try:
        return ms.runtime.max_memory_allocated() / 2**20
    except Exception:  # a backend without the counter: report nothing rather than a wrong number
        return None


def measure(net, data, throughput: float, target: str):
    """(the `flops` block of metrics.json, peak device memory in MiB or None)."""
    fwd = forward_flops_per_sample(net, data.channels, data.height, data.width)
    train_per_sample = TRAIN_FLOPS_PER_FORWARD * fwd["total"]
    if fwd["conv_paths"]:
        log.info(
            "convolutions: %s",
            ", ".join(
                f"{p} {e['layers']} layers ({e['forward_flops_per_sample'] / max(fwd['conv'], 1):.0%} of conv FLOPs)"
                for p, e in fwd["conv_paths"].items()
            ),
        )
    achieved = train_per_sample * throughput / 1e9
    flops = {
        "forward_per_sample": fwd["total"],
        "forward_conv_per_sample": fwd["conv"],
        "forward_dense_per_sample": fwd["dense"],
        # Which convolution algorithm ran (model.conv, models/conv.py): layers and forward FLOPs per path.
        "conv_paths": fwd["conv_paths"],
        "train_per_sample": train_per_sample,
        "achieved_gflops_per_s": achieved,
        "matmul_peak_gflops_per_s": None,
        "utilization": None,
    }
    if target == "CPU":
        peak = matmul_peak_gflops()
        flops["matmul_peak_gflops_per_s"] = peak
        flops["utilization"] = achieved / peak
    return flops, device_peak_memory_mb(target)
