"""MindSpore (this project's ResNets and MindCV's zoo, graph mode) against PyTorch on the same CPU, same workload.

Models: ImageNet-style ResNet-18 at 64 px and 224 px and ResNet-50 at 64 px (models/resnet.py), batch 64,
SGD momentum 0.9 (lr 0.1), FP32, training steps on fixed random tensors (no data pipeline: the runner's
pipeline overhead is measured by bench/overhead.py). Variants: the runner's default (model.conv=best:
per-layer oneDNN / im2col+MatMul / dense matmul, oneDNN max pool), PyTorch eager, and PyTorch
torch.compile + channels_last (the strongest fp32 PyTorch a CPU-tuning user would bring). `--zoo`
adds MindCV models (a ResNet and a MobileNet) with their convolutions native and through oneDNN.

Each measurement is a fresh process; variants alternate within each repetition (and their order flips
every repetition) so that load from other jobs on the machine hits all of them alike. Prints each
repetition's img/s with the load average beside it, the median, and the median of per-repetition ratios
to PyTorch eager; then the CPU's flags. Only numbers from a quiet machine (others < 10% CPU) compare
frameworks fairly: under load PyTorch's OpenMP threads degrade more than MindSpore's.

    python bench/vs_torch.py --reps 5 --torch-python .venv-bench/bin/python
    python bench/vs_torch.py --reps 5 --models resnet18@64 --conv best,native --torch-python ...
    python bench/vs_torch.py --reps 3 --models resnet18@64 --conv best,best-plain  # blocked body or not
    python bench/vs_torch.py --zoo resnet18,mobilenet_v3_small_100 --models none
    python bench/vs_torch.py --layers-only
    python bench/vs_torch.py --reps 3 --models resnet18@64 --conv best,best-plain --torch-python none

PyTorch is not a dependency: install it into a separate venv (python -m venv .venv-bench &&
.venv-bench/bin/pip install torch) and pass its interpreter as --torch-python. Not part of the runner.
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
DEPTHS = {18: ("basic", [2, 2, 2, 2]), 50: ("bottleneck", [3, 4, 6, 3])}
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


def ms_train(conv: str, steps: int, threads: int, jit_level: str = "", depth: int = 18, size: int = SIZE) -> dict:
    body = {}
    if conv.endswith("-plain"):  # e.g. best-plain: the body plain NCHW between layers, as before blocked bodies
        conv = conv.removesuffix("-plain")
        body["blocked_body"] = False
    ms = ms_setup(threads, conv)
    if jit_level:  # graph compile level: O0 (kernel by kernel) or O1 (with fusion); default: MindSpore's choice
        ms.set_context(jit_config={"jit_level": jit_level})
    from runner.models.resnet import resnet

    ms.set_seed(0)
    t = time.perf_counter()
    net = resnet("imagenet", depth, 64, CLASSES, 3, size, conv=conv, **body)
    build_s = time.perf_counter() - t  # includes model.conv=auto/best's one-time timing on a cache miss
    return _ms_steps(ms, net, steps, size, build_s)


def ms_zoo(arch: str, conv: str, steps: int, threads: int, size: int = SIZE) -> dict:
    """A MindCV model trained as ms_train does; conv "onednn" swaps its convolutions (models/conv.py)."""
    ms = ms_setup(threads, conv)
    from runner.models.zoo import mindcv_model

    ms.set_seed(0)
    t = time.perf_counter()
    net = mindcv_model(arch, CLASSES, 3, conv="onednn" if conv in ("onednn", "best") else "native")
    return _ms_steps(ms, net, steps, size, time.perf_counter() - t)


def _ms_steps(ms, net, steps: int, size: int, build_s: float) -> dict:
    import numpy as np
    from mindspore import Tensor, nn

    from runner.models.blocked import body_layout

    paths = {}
    blocked = getattr(net, "blocked_body", False)
    for _, cell in net.cells_and_names():
        if isinstance(cell, nn.Conv2d):
            # In a blocked body, what its operator there runs (the dense matmul, or oneDNN's convolution).
            path = (blocked and getattr(cell, "bk_path", None)) or getattr(cell, "path", "native")
            paths[path] = paths.get(path, 0) + 1
    paths["body " + body_layout(net)] = 1  # the layout kept between layers (models/blocked.py)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    step.set_train()
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((BATCH, 3, size, size), dtype=np.float32))
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
def torch_resnet(depth: int = 18):
    import torch.nn as tnn

    class Block(tnn.Module):
        expansion = 1

        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width
            self.conv1 = tnn.Conv2d(cin, width, 3, stride, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(width)
            self.conv2 = tnn.Conv2d(width, cout, 3, 1, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(cout)
            self.relu = tnn.ReLU()
            self.down = None
            if stride != 1 or cin != cout:
                self.down = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout))

        def forward(self, x):
            identity = x if self.down is None else self.down(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + identity)

    class Bottleneck(tnn.Module):
        expansion = 4

        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.conv1 = tnn.Conv2d(cin, width, 1, 1, 0, bias=False)
            self.bn1 = tnn.BatchNorm2d(width)
            self.conv2 = tnn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(width)
            self.conv3 = tnn.Conv2d(width, cout, 1, 1, 0, bias=False)
            self.bn3 = tnn.BatchNorm2d(cout)
            self.relu = tnn.ReLU()
            self.down = None
            if stride != 1 or cin != cout:
                self.down = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout))

        def forward(self, x):
            identity = x if self.down is None else self.down(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            return self.relu(self.bn3(self.conv3(out)) + identity)

    kind, blocks = DEPTHS[depth]
    block = Block if kind == "basic" else Bottleneck
    layers = [tnn.Conv2d(3, 64, 7, 2, 3, bias=False), tnn.BatchNorm2d(64), tnn.ReLU(), tnn.MaxPool2d(3, 2, 1)]
    cin = 64
    for i, n in enumerate(blocks):
        w = 64 * 2**i
        for j in range(n):
            layers.append(block(cin, w, 2 if (i > 0 and j == 0) else 1))
            cin = w * block.expansion
    layers += [tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(cin, CLASSES)]
    return tnn.Sequential(*layers)


def torch_resnet18():
    return torch_resnet(18)


def torch_train(steps: int, threads: int, depth: int = 18, size: int = SIZE, compiled: bool = False) -> dict:
    torch = torch_setup(threads)

    torch.manual_seed(0)
    net = torch_resnet(depth)
    x = torch.randn(BATCH, 3, size, size)
    if compiled:  # torch.compile (inductor) on channels_last memory: PyTorch's strongest fp32 CPU setup
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    model = torch.compile(net) if compiled else net
    y = torch.randint(0, CLASSES, (BATCH,))
    net.train()
    times = []
    for _ in range(steps + (2 if compiled else 1)):  # the first step (two compiled: the backward too) warms up
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        times.append(time.perf_counter() - t)
    warm = 2 if compiled else 1
    return {"step_s": times[warm:], "compile_s": sum(times[:warm]), "build_s": 0.0, "paths": {}}


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
def load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def cpu_line() -> str:
    from runner.models.conv import _cpu_model

    return f"{_cpu_model()}, {os.cpu_count()} CPUs visible"


def cpu_flags() -> frozenset:
    from runner.models.onednn import cpu_flags as flags

    return flags() or frozenset()


def compare(args, title: str, variants: list) -> None:
    """Fresh-process alternation of `variants` (the first PyTorch eager one is the reference); a table."""
    results = {v: [] for v in variants}
    loads = []
    for rep in range(args.reps):
        for v in variants if rep % 2 == 0 else variants[::-1]:
            before = load()
            r = spawn(v, args)
            ips = BATCH / statistics.median(r["step_s"])
            results[v].append(ips)
            loads.append(before)
            extra = f" paths {r['paths']}, build {r['build_s']:.1f} s" if r["paths"] else ""
            print(f"rep {rep + 1} {v:28s} {ips:7.1f} img/s  (load {before}){extra}", flush=True)
    ref_key = next((v for v in variants if v.startswith("torch@")), variants[0])
    ref = results[ref_key]
    print(f"\n{title}, batch {BATCH}, fp32 training img/s (median of steady steps per process)")
    print("| variant | " + " | ".join(f"rep {i + 1}" for i in range(args.reps)) + f" | median | vs {ref_key} |")
    print("|---|" + "---|" * (args.reps + 2))
    for v in variants:
        ratios = [a / b for a, b in zip(results[v], ref)]  # each rep's own reference run: same load
        print(
            f"| {v} | "
            + " | ".join(f"{x:.1f}" for x in results[v])
            + f" | {statistics.median(results[v]):.1f} | {statistics.median(ratios):.2f}x |"
        )
    print(f"load averages (1/5/15 min) before each process: {'; '.join(loads)}")


def worker(args):
    kind, _, model = args.worker.partition("@")  # train variants: <variant>@<depth>x<size>
    depth, size = (int(v) for v in model.split("x")) if model else (18, SIZE)
    if kind in ("torch", "torch-compile-cl"):
        res = torch_train(args.steps, args.threads, depth, size, compiled=kind == "torch-compile-cl")
    elif kind.startswith("zoo:"):  # zoo:<arch>:<conv>
        _, arch, conv = kind.split(":")
        res = ms_zoo(arch, conv, args.steps, args.threads, size)
    elif args.worker == "torch-layers":
        res = {"layers": torch_layers(args.layer_repeats, args.threads), "profile": torch_profile(3)}
    elif args.worker.startswith("ms-layers:"):
        res = ms_layers(args.worker.split(":", 1)[1], args.layer_repeats, args.threads)
    else:  # ms:<conv>[:<jit_level>]
        _, conv, *level = kind.split(":")
        res = ms_train(conv, args.steps, args.threads, level[0] if level else "", depth, size)
    print("RESULT " + json.dumps(res))


def spawn(kind: str, args) -> dict:
    python = args.torch_python if kind.startswith("torch") else sys.executable
    cmd = [python, os.path.abspath(__file__), "--worker", kind, "--steps", str(args.steps)]
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
    p.add_argument("--models", default="resnet18@64,resnet18@224,resnet50@64", help="resnet<depth>@<px>, or none")
    p.add_argument("--zoo", default="", help="MindCV architectures to train native and with oneDNN convolutions")
    p.add_argument(
        "--torch-python",
        default=sys.executable,
        help="the interpreter with PyTorch (a bench venv); none: MindSpore variants only, against the first",
    )
    p.add_argument("--layers-only", action="store_true", help="only the per-layer table")
    p.add_argument("--layers", action="store_true", help="also the per-layer table (resnet18 at 64 px)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    if not args.layers_only:
        for model in [m for m in args.models.split(",") if m and m != "none"]:
            name, size = model.split("@")
            depth = int(name.removeprefix("resnet"))
            variants = [f"ms:{c}" for c in args.conv.split(",")]
            if args.torch_python != "none":
                variants += ["torch", "torch-compile-cl"]
            compare(args, f"{name} (imagenet stem) {size}x{size}", [f"{v}@{depth}x{size}" for v in variants])
        for arch in [a for a in args.zoo.split(",") if a]:
            compare(args, f"MindCV {arch} {SIZE}x{SIZE}", [f"zoo:{arch}:native", f"zoo:{arch}:onednn"])
        print("\nCPU:", cpu_line())
        print("flags:", " ".join(sorted(cpu_flags())))
    if args.layers or args.layers_only:
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
