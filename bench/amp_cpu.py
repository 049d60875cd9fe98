"""amp=o2 float16 on a CPU against O0: the train step's cost of FP16 numerics on the FP32 fast path.

ResNet-18 (ImageNet style) at 64 px, batch 64, 10 classes, SGD momentum, fixed random tensors, graph mode,
model.conv=best (the runner's default: blocked oneDNN body, Winograd, dense layer4), built and wrapped as
the runner builds them (runner.amp.build_loss_net, the runner's ScaledTrainStep: no loss scale at O0, the
dynamic scale at O2). Variants:

    o0       FP32 (the default on a CPU)
    o2       amp=o2 amp.dtype=float16 on a CPU: the FP32 body with activations and gradients rounded to
             float16 at each operator's edges (models/fp16.py)
    o2-cast  as o2, the rounding by MindSpore Cast pairs fp32 -> fp16 -> fp32 instead of the library's
             RoundF16 (one F16C pass; models/fp16.py)
    o2-ms    the old path: MindSpore's auto_mixed_precision O2 float16 kernels, plain body (slow: one rep)

Each measurement is a fresh process; the variants alternate and their order flips every repetition.
Prints each repetition's step time with the load average, the medians, the median of per-pair ratios to
O0, and the CPU's flags.

    PYTHONPATH=$PWD .venv/bin/python bench/amp_cpu.py --reps 5 --steps 8
    PYTHONPATH=$PWD .venv/bin/python bench/amp_cpu.py --reps 1 --steps 3 --variants o2-ms
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


def worker(variant: str, steps: int) -> dict:
    sys.path.insert(0, REPO)
    from runner.models.onednn import choose

    conv = choose(os.environ.get("ONEDNN_MAX_CPU_ISA")).path
    if conv != "onednn":
        os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn

    from runner.amp import build_loss_net
    from runner.amp.train_step import ScaledTrainStep
    from runner.models.blocked import body_layout
    from runner.models.resnet import resnet

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = resnet("imagenet", 18, 64, CLASSES, 3, SIZE, conv=conv)
    level = "O0" if variant == "o0" else "O2"
    target = "" if variant == "o2-ms" else "CPU"  # "": MindSpore's auto_mixed_precision
    fused = False if variant == "o2-cast" else None  # o2-cast: Cast pairs where RoundF16 would round
    _, loss_net = build_loss_net(net, level, [], "/tmp", dtype="float16", device_target=target, fused=fused)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    scale = "none" if level == "O0" else "dynamic"
    step = ScaledTrainStep(loss_net, opt, scale, 1024.0, 2.0, 1000, False)
    step.set_train()
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((BATCH, 3, SIZE, SIZE), dtype=np.float32))
    y = Tensor(rng.integers(0, CLASSES, BATCH).astype(np.int32))
    times = []
    for _ in range(steps + 1):  # the first step compiles
        t = time.perf_counter()
        out = step(x, y)
        out[0].asnumpy()
        times.append(time.perf_counter() - t)
    return {"step_s": statistics.median(times[1:]), "compile_s": times[0], "layout": body_layout(net)}


def run(variant: str, steps: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", variant, "--steps", str(steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
    if proc.returncode:
        raise SystemExit(f"{variant} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["load"] = os.getloadavg()[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--variants", default="o0,o2")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.steps)))
        return
    variants = a.variants.split(",")
    got = {v: [] for v in variants}
    for rep in range(a.reps):
        for v in variants if rep % 2 == 0 else variants[::-1]:
            r = run(v, a.steps)
            got[v].append(r)
            print(
                f"rep {rep + 1} {v}: step {r['step_s'] * 1e3:.1f} ms ({BATCH / r['step_s']:.1f} img/s), "
                f"compile {r['compile_s']:.1f} s, body {r['layout']}, load {r['load']:.2f}",
                flush=True,
            )
    print("\n| variant | " + " | ".join(f"rep {i + 1} ms" for i in range(a.reps)) + " | median ms | img/s | vs O0 |")
    print("|---" * (a.reps + 4) + "|")
    for v in variants:
        ms_ = [r["step_s"] * 1e3 for r in got[v]]
        med = statistics.median(ms_)
        ratio = ""
        if "o0" in got and v != "o0" and len(got["o0"]) == len(ms_):
            ratio = f"{statistics.median(m / o['step_s'] / 1e3 for m, o in zip(ms_, got['o0'])):.2f}x"
        elif v == "o0":
            ratio = "1.00x"
        print(f"| {v} | " + " | ".join(f"{m:.1f}" for m in ms_) + f" | {med:.1f} | {BATCH / med * 1e3:.1f} | {ratio} |")
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    keys = ["avx2", "f16c", "fma", "avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16"]
    print(f"\nCPU: {model}, {os.cpu_count()} CPUs; " + ", ".join(f"{k}={'yes' if k in flags else 'no'}" for k in keys))


if __name__ == "__main__":
    main()
