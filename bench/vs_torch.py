"""MindSpore (this project's ResNet, graph mode) against PyTorch eager on the same CPU, same workload.

ImageNet-style ResNet-18 (models/resnet.py: style=imagenet depth=18 width=64), 3x64x64 inputs, batch 64,
SGD momentum 0.9 (lr 0.1), FP32, training steps on fixed random tensors (no data pipeline: the runner's
pipeline overhead is measured by bench/overhead.py). MindSpore runs with ONEDNN_MAX_CPU_ISA=AVX2, as the
runner sets on CPU, except where the convolutions run onednn (model.conv=onednn, or best resolving to it),
where the runner sets no cap (runner/training/environment.py).
Each measurement is a fresh process; variants alternate within each repetition so that load from other
jobs on the machine hits all of them alike. Prints each repetition's img/s, the median ratio to PyTorch,
and a per-layer table: every distinct convolution shape of the network timed
forward + backward in each framework (and under each MindSpore convolution path).

    python bench/vs_torch.py --reps 5 --conv best,native      # the default run, and the pinned native path
    python bench/vs_torch.py --layers-only

Needs PyTorch: pip install -e '.[bench]'. Not part of the runner.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, SIZE, CLASSES = 64, 64, 10
# (cin, cout, kernel, stride, padding, input side, layers of this shape in ResNet-18 at 64 px)
LAYERS = [
    ("stem", 3, 64, 7, 2, 3, 64, 1),
    ("layer1 3x3", 64, 64, 3, 1, 1, 16, 4),
    ("layer2 3x3/2", 64, 128, 3, 2, 1, 16, 1),
    ("layer2 3x3", 128, 128, 3, 1, 1, 8, 3),
    ("layer2 1x1/2", 64, 128, 1, 2, 0, 16, 1),
    ("layer3 3x3/2", 128, 256, 3, 2, 1, 8, 1),
    ("layer3 3x3", 256, 256, 3, 1, 1, 4, 3),
    ("layer3 1x1/2", 128, 256, 1, 2, 0, 8, 1),
    ("layer4 3x3/2", 256, 512, 3, 2, 1, 4, 1),
    ("layer4 3x3", 512, 512, 3, 1, 1, 2, 3),
    ("layer4 1x1/2", 256, 512, 1, 2, 0, 4, 1),
]


# ---------------------------------------------------------------- MindSpore side
def ms_setup(threads: int, conv: str = "native"):
    sys.path.insert(0, REPO)
    if conv == "best":  # the runner's default: decided before MindSpore loads, as the runner does
        from runner.models.onednn import choose

        conv = choose(os.environ.get("ONEDNN_MAX_CPU_ISA")).path
    if conv != "onednn":  # what the runner does on CPU (runner/training/environment.py cap_cpu_isa)
        os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    if threads:
        ms.set_context(runtime_num_threads=threads)
    return ms


def torch_setup(threads: int):
    import torch

    if threads:
        torch.set_num_threads(threads)
    return torch


def ms_train(conv: str, steps: int, threads: int, jit_level: str = "") -> dict:
    ms = ms_setup(threads, conv)
    if jit_level:  # graph compile level: O0 (kernel by kernel) or O1 (with fusion); default: MindSpore's choice
        ms.set_context(jit_config={"jit_level": jit_level})
    import numpy as np
    from mindspore import Tensor, nn

    from runner.models.conv import PathConv2d
    from runner.models.resnet import resnet

    ms.set_seed(0)
    t = time.perf_counter()
    net = resnet("imagenet", 18, 64, CLASSES, 3, SIZE, conv=conv)
    build_s = time.perf_counter() - t  # includes model.conv=auto's one-time timing on a cache miss
    paths = {}
    for _, cell in net.cells_and_names():
        if isinstance(cell, PathConv2d):
            paths[cell.path] = paths.get(cell.path, 0) + 1
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    step.set_train()
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((BATCH, 3, SIZE, SIZE), dtype=np.float32))
    y = Tensor(rng.integers(0, CLASSES, BATCH).astype(np.int32))
    times = []
    for _ in range(steps + 1):  # the first step compiles
        t = time.perf_counter()
        step(x, y).asnumpy()
        times.append(time.perf_counter() - t)
    return {"step_s": times[1:], "compile_s": times[0], "build_s": build_s, "paths": paths}


def ms_layers(path: str, repeats: int, threads: int) -> dict:
    ms_setup(threads, path)
    from runner.models import conv as C

    C.BENCH_BATCH = BATCH
    out = {}
    for name, cin, cout, k, s, p, size, _ in LAYERS:
        if path == "gemm" and not C.gemm_feasible(k, s, p, size):
            out[name] = None
            continue
        once = C._timer(path, cin, cout, k, s, p, size)
        out[name] = min(once() for _ in range(repeats)) * 1e3
    return out


# ---------------------------------------------------------------- PyTorch side
def torch_resnet18():
    import torch.nn as tnn

    class Block(tnn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(cout)
            self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(cout)
            self.relu = tnn.ReLU()
            self.down = None
            if stride != 1 or cin != cout:
                self.down = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout))

        def forward(self, x):
            identity = x if self.down is None else self.down(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + identity)

    layers = [
        tnn.Conv2d(3, 64, 7, 2, 3, bias=False),
        tnn.BatchNorm2d(64),
        tnn.ReLU(),
        tnn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for i in range(4):
        w = 64 * 2**i
        for j in range(2):
            layers.append(Block(cin, w, 2 if (i > 0 and j == 0) else 1))
            cin = w
    layers += [tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(cin, CLASSES)]
    return tnn.Sequential(*layers)


def torch_train(steps: int, threads: int) -> dict:
    torch = torch_setup(threads)

    torch.manual_seed(0)
    net = torch_resnet18()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(BATCH, 3, SIZE, SIZE)
    y = torch.randint(0, CLASSES, (BATCH,))
    net.train()
    times = []
    for _ in range(steps + 1):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        loss.item()
        times.append(time.perf_counter() - t)
    return {"step_s": times[1:], "compile_s": 0.0, "build_s": 0.0, "paths": {}}


def torch_layers(repeats: int, threads: int) -> dict:
    torch = torch_setup(threads)

    out = {}
    for name, cin, cout, k, s, p, size, _ in LAYERS:
        conv = torch.nn.Conv2d(cin, cout, k, s, p, bias=False)
        x = torch.randn(BATCH, cin, size, size, requires_grad=True)
        o = (size + 2 * p - k) // s + 1
        dy = torch.randn(BATCH, cout, o, o)
        best = float("inf")
        for i in range(repeats + 1):
            t = time.perf_counter()
            conv(x).backward(dy)
            if i:
                best = min(best, time.perf_counter() - t)
        out[name] = best * 1e3
    return out


def torch_profile(steps: int) -> list:
    """torch.profiler's per-operator self CPU time over a few training steps (ms per step)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    net = torch_resnet18()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(BATCH, 3, SIZE, SIZE), torch.randint(0, CLASSES, (BATCH,))

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    rows = [(e.key, e.self_cpu_time_total / 1e3 / steps) for e in prof.key_averages()]
    return sorted(rows, key=lambda r: -r[1])[:12]


# ---------------------------------------------------------------- driver
def worker(args):
    if args.worker == "torch":
        res = torch_train(args.steps, args.threads)
    elif args.worker == "torch-layers":
        res = {"layers": torch_layers(args.layer_repeats, args.threads), "profile": torch_profile(3)}
    elif args.worker.startswith("ms-layers:"):
        res = ms_layers(args.worker.split(":", 1)[1], args.layer_repeats, args.threads)
    else:  # ms:<conv>[:<jit_level>]
        _, conv, *level = args.worker.split(":")
        res = ms_train(conv, args.steps, args.threads, level[0] if level else "")
    print("RESULT " + json.dumps(res))


def spawn(kind: str, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--steps", str(args.steps)]
    cmd += ["--layer-repeats", str(args.layer_repeats), "--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{kind} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="alternating repetitions")
    p.add_argument("--steps", type=int, default=8, help="timed training steps per process (after compile)")
    p.add_argument(
        "--conv",
        default="best,native",
        help="MindSpore variants: model.conv values (best: the runner's default), each optionally :jit_level",
    )
    p.add_argument("--layer-repeats", type=int, default=5)
    p.add_argument(
        "--threads", type=int, default=0, help="intra-op threads for both frameworks (0: each one's default)"
    )
    p.add_argument("--layers-only", action="store_true", help="only the per-layer table")
    p.add_argument("--no-layers", action="store_true", help="skip the per-layer table")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    variants = [f"ms:{c}" for c in args.conv.split(",")] + ["torch"]
    if not args.layers_only:
        results = {v: [] for v in variants}
        for rep in range(args.reps):
            for v in variants if rep % 2 == 0 else variants[::-1]:  # alternate the order too
                r = spawn(v, args)
                ips = BATCH / statistics.median(r["step_s"])
                results[v].append(ips)
                extra = f" paths {r['paths']}, build {r['build_s']:.1f} s" if r["paths"] else ""
                print(f"rep {rep + 1} {v:12s} {ips:7.1f} img/s{extra}", flush=True)
        print(f"\nresnet18 (imagenet stem) {SIZE}x{SIZE} batch {BATCH}, training img/s (median of steady steps)")
        print("| variant | " + " | ".join(f"rep {i + 1}" for i in range(args.reps)) + " | median | vs PyTorch |")
        print("|---|" + "---|" * (args.reps + 2))
        ref = [r for r in results["torch"]]
        for v in variants:
            ratios = [a / b for a, b in zip(results[v], ref)]  # each rep's own PyTorch run: same load
            print(
                f"| {v} | "
                + " | ".join(f"{x:.1f}" for x in results[v])
                + f" | {statistics.median(results[v]):.1f} | {statistics.median(ratios):.2f}x |"
            )
    if not args.no_layers:
        ms_paths = ["native", "gemm", "onednn"]
        tables = {}
        for pth in ms_paths:
            tables[pth] = spawn(f"ms-layers:{pth}", args)
        tl = spawn("torch-layers", args)
        tables["torch"] = tl["layers"]
        print(f"\nper-layer convolution forward + backward, batch {BATCH}, ms (best of {args.layer_repeats})")
        print(
            "| layer | shape | count | MindSpore native | MindSpore gemm | MindSpore onednn | PyTorch | "
            "native/PyTorch | onednn/PyTorch |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        tot = {"native": 0.0, "gemm": 0.0, "onednn": 0.0, "torch": 0.0}
        for name, cin, cout, k, _, _, size, count in LAYERS:
            n, g, o, t = (tables[p][name] for p in ("native", "gemm", "onednn", "torch"))
            tot["native"] += n * count
            tot["gemm"] += min(n, g if g is not None else n) * count  # auto's best case: the faster per layer
            tot["onednn"] += o * count
            tot["torch"] += t * count
            gs = f"{g:.1f}" if g is not None else "-"
            print(
                f"| {name} | {cin}->{cout} k{k} @{size} | {count} | {n:.1f} | {gs} | {o:.1f} | {t:.1f} | "
                f"{n / t:.2f} | {o / t:.2f} |"
            )
        print(
            f"| all convolutions (x count) | | 20 | {tot['native']:.0f} | best of native/gemm {tot['gemm']:.0f} | "
            f"{tot['onednn']:.0f} | {tot['torch']:.0f} | "
            f"{tot['native'] / tot['torch']:.2f} | {tot['onednn'] / tot['torch']:.2f} |"
        )
        print("\nPyTorch whole training step, torch.profiler self CPU time per step (top operators):")
        print("| operator | ms/step |\n|---|---|")
        for k, ms_ in tl["profile"]:
            print(f"| {k} | {ms_:.1f} |")


if __name__ == "__main__":
    main()
