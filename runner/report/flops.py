"""Training FLOPs counted from the network's own layers, and a large-matmul peak to compare them with."""

import hashlib
import json
import logging
import math
import os
import platform
import subprocess
import sys
import time
from typing import Optional

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
    counter = _LayerCounter(net)
    layout = _probe_one_sample(net, counter, channels, height, width)
    return {
        "conv": counter.conv,
        "dense": counter.dense,
        "total": counter.conv + counter.dense,
        "conv_paths": dict(sorted(counter.paths.items())),
        "body_layout": layout,
        "activations": counter.activations,  # output values of every layer, one sample
        "layers": counter.layers,
    }


class _LayerCounter:
    """Forward hooks that add up each layer's FLOPs, output values and convolution path."""

    def __init__(self, net):
        self.conv = self.dense = self.activations = self.layers = 0
        self.paths: dict = {}  # convolution algorithm (models/conv.py) -> layers and forward FLOPs it ran
        self.names = {id(cell): name for name, cell in net.cells_and_names()}  # which layer took which path
        self.blocked = False  # whether the body runs blocked (its cells are probed plain: plain_bodies)

    def hook(self, net) -> list:
        """Register the hooks on net's cells; their handles."""
        from mindspore import nn

        handles = []
        for _, cell in net.cells_and_names():
            if isinstance(cell, nn.Conv2d):
                handles.append(cell.register_forward_hook(self.on_conv))
            elif isinstance(cell, nn.Dense):
                handles.append(cell.register_forward_hook(self.on_dense))
            if not cell.name_cells():
                handles.append(cell.register_forward_hook(self.on_leaf))
        return handles

    def on_conv(self, cell, inputs, output):
        _, cout, hout, wout = output.shape
        cin = inputs[0].shape[1] // cell.group
        kh, kw = cell.kernel_size
        flops = 2 * cout * hout * wout * cin * kh * kw
        self.conv += flops
        entry = self.paths.setdefault(
            conv_path(cell, inputs[0].shape, self.blocked), {"layers": 0, "forward_flops_per_sample": 0, "names": []}
        )
        entry["layers"] += 1
        entry["forward_flops_per_sample"] += flops
        entry["names"].append(self.names.get(id(cell), "?"))

    def on_dense(self, cell, inputs, output):
        self.dense += 2 * cell.in_channels * cell.out_channels

    def on_leaf(self, cell, inputs, output):
        # Every layer's output is kept for the backward pass: the activations of one sample (plan=true).
        for out in output if isinstance(output, (tuple, list)) else (output,):
            self.activations += int(np.prod(out.shape))
        self.layers += 1


def _probe_one_sample(net, counter: _LayerCounter, channels: int, height: int, width: int) -> str:
    """One zero sample through net in PyNative inference, the hooks on; the mode and net's state restored.
    Returns the layout the network body keeps between layers (models/blocked.py)."""
    import mindspore as ms
    from mindspore import Tensor

    from runner.models.blocked import body_layout, plain_bodies

    layout = body_layout(net)
    counter.blocked = layout != "nchw"
    mode, training = ms.get_context("mode"), net.training
    ms.set_context(mode=ms.PYNATIVE_MODE)
    handles = counter.hook(net)
    try:
        net.set_train(False)  # BatchNorm must not update its statistics from this probe
        with plain_bodies(net):  # the hooks must see each cell called (a blocked body calls none)
            net(Tensor(np.zeros((1, channels, height, width), np.float32)))
    finally:
        for h in handles:
            h.remove()
        net.set_train(training)
        ms.set_context(mode=mode)
    return layout


def conv_path(cell, input_shape, blocked: bool = False) -> str:
    """The algorithm a convolution cell runs on this input: "native", "gemm", "dense" or "onednn"
    (models/conv.py); in a blocked body (`blocked`) what its blocked operator runs (PathConv2d.bk_path; also
    "winograd-dw": oneDNN's convolution with the weight gradient by Winograd; "winograd": all three passes
    by Winograd, the weight gradient where csrc WinogradBackwardWeights takes the shape, else oneDNN's).

    A gemm or dense cell built for another input size compiles to the native convolution (in a blocked
    body: to oneDNN's), so it counts as such.
    """
    path = getattr(cell, "path", "native")
    if blocked and hasattr(cell, "bk_path"):
        path = cell.bk_path
        if path == "dense":
            return path if tuple(input_shape[2:]) == (cell.size, cell.size) else "onednn"
        if path == "winograd-dw":  # where the operator takes the shape, else oneDNN's kernel
            from runner.models.conv import winograd_dw_runs

            h, w = input_shape[2:]
            return path if winograd_dw_runs(h, w, cell.in_channels, cell.out_channels, cell.bk_block) else "onednn"
    if path == "dense" and tuple(input_shape[2:]) != (cell.size, cell.size):
        return "native"
    if path != "gemm":
        return path
    if getattr(cell, "select", None) is not None and tuple(input_shape[2:]) != (cell.size, cell.size):
        return "native"
    return "gemm"


# The peak is measured with the fastest float32 kernel this machine offers the runner: numpy's BLAS
# sgemm (OpenBLAS in the wheel). MindSpore's own matmul reached only 39 GFLOP/s where OpenBLAS reached
# 67-72 and the convolutions themselves 64-75 (2-core AMD EPYC, AVX2): dividing by MindSpore's matmul
# overstated utilization. It runs in a child process, once per machine: it neither adds ~2 s to every
# run nor counts in the run's own peak memory.
PEAK_N = 2048
PEAK_REPEATS = 5
PEAK_FILE = "peak.json"  # in the cache directory (models/onednn.cache_dir)
_PEAK_SCRIPT = """
import json, sys, time
import numpy as np
n, repeats = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
a = rng.random((n, n), dtype=np.float32)
b = rng.random((n, n), dtype=np.float32)
a @ b
best = float("inf")
for _ in range(repeats):
    t = time.perf_counter()
    a @ b
    best = min(best, time.perf_counter() - t)
print(json.dumps({"gflops_per_s": 2 * n**3 / best / 1e9}))
"""


def machine_key(threads: Optional[int]) -> str:
    """What the peak depends on: the CPU (model and flags), the threads the run may use, numpy's version."""
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:  # not Linux: the processor's name alone
        pass
    model = model or platform.processor() or platform.machine()
    digest = hashlib.sha256(f"{model}\0{flags}\0{threads}\0{np.__version__}".encode()).hexdigest()[:16]
    return f"{model} | {threads} threads | {digest}"


def measure_peak(threads: Optional[int]) -> Optional[float]:
    """GFLOP/s of the best of PEAK_REPEATS n x n float32 numpy matmuls in a child process (None: it failed)."""
    env = dict(os.environ)
    if threads:
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[name] = str(threads)
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PEAK_SCRIPT, str(PEAK_N), str(PEAK_REPEATS)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return float(json.loads(out.stdout.strip().splitlines()[-1])["gflops_per_s"])
    except (OSError, ValueError, KeyError, IndexError, subprocess.SubprocessError) as e:
        log.warning("could not measure this machine's matmul peak (%s): utilization is not reported", e)
        return None


def machine_peak(threads: Optional[int] = None, at_least: float = 0.0) -> dict:
    """This machine's float32 peak: measured once per machine (machine_key) and cached, re-measured when
    a run achieved more than the cached value (a first measurement taken under load), the larger kept.

    Returns {gflops_per_s (None when it could not be measured), kernel, key, cached, file}.
    """
    from runner.models.onednn import cache_dir

    key = machine_key(threads)
    path = cache_dir() / PEAK_FILE
    try:
        known = json.loads(path.read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):  # absent or corrupt: measured again and rewritten
        known = {}
    entry = known.get(key)
    value = entry.get("gflops_per_s") if isinstance(entry, dict) else None
    record = {"kernel": f"numpy sgemm {PEAK_N}^3, best of {PEAK_REPEATS}", "key": key, "file": str(path)}
    if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 and value >= at_least:
        return {"gflops_per_s": float(value), **record, "cached": True}
    measured = measure_peak(threads)
    if measured is None:
        return {"gflops_per_s": value if isinstance(value, (int, float)) else None, **record, "cached": False}
    best = max(measured, value) if isinstance(value, (int, float)) and math.isfinite(value) else measured
    known[key] = {"gflops_per_s": best, "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        from runner.rundir.atomic import write_json

        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(str(path), known)
    except OSError as e:  # a read-only cache: measured again next time, nothing else changes
        log.warning("could not cache the matmul peak in %s (%s)", path, e)
    return {"gflops_per_s": best, **record, "cached": False}


def device_peak_memory_mb(target: str):
    """Peak device memory MindSpore allocated, where the device reports it (not on CPU)."""
    if target == "CPU":
        return None
    import mindspore as ms

    try:
        return ms.runtime.max_memory_allocated() / 2**20
    except Exception:  # a backend without the counter: report nothing rather than a wrong number
        return None


def measure(net, data, throughput: Optional[float], target: str, threads: Optional[int] = None):
    """(the `flops` block of metrics.json, peak device memory in MiB or None).

    throughput None (too few steps to measure one): FLOPs per sample only."""
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
    achieved = train_per_sample * throughput / 1e9 if throughput else None
    flops = {
        "forward_per_sample": fwd["total"],
        "forward_conv_per_sample": fwd["conv"],
        "forward_dense_per_sample": fwd["dense"],
        # Which convolution algorithm ran (model.conv, models/conv.py): layers and forward FLOPs per path.
        "conv_paths": fwd["conv_paths"],
        # The format the network body kept between layers (models/blocked.py): nChw16c (AVX-512) or nChw8c
        # (AVX2) when it ran on oneDNN's blocked memory, nchw when every layer read and wrote plain NCHW.
        "body_layout": fwd["body_layout"],
        "train_per_sample": train_per_sample,
        "layers": fwd["layers"],  # leaf cells the forward pass runs (plan=true's host cost per step scales with it)
        "achieved_gflops_per_s": achieved,
        "matmul_peak_gflops_per_s": None,
        "peak": None,  # how the peak was measured: kernel, cache key, cached or measured by this run
        "utilization": None,
    }
    if target == "CPU" and achieved is not None:
        peak = machine_peak(threads, at_least=achieved)
        flops["peak"] = peak
        if peak["gflops_per_s"]:
            flops["matmul_peak_gflops_per_s"] = peak["gflops_per_s"]
            flops["utilization"] = achieved / peak["gflops_per_s"]
    return flops, device_peak_memory_mb(target)
