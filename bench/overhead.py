"""Runner vs a hand-written MindSpore script doing the same training: the runner's overhead per step.

    .venv/bin/python bench/overhead.py [--repeats 3]

Alternates the two (A B A B ...), each in a fresh process, so machine load hits both alike, and
compares the medians of their steady-state step times. Same model (resnet8, CIFAR-style, width
16), synthetic 3x32x32 data, batch 32, graph mode, O0, no sink, one epoch of 1280 samples (80% train).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNNER = [
    "model=resnet8",
    "data=synthetic",
    "data.num_samples=1600",  # 1280 train samples after the 20% validation split, as the hand script
    "padding.height=32",
    "padding.width=32",
    "batch_size=32",
    "mode=graph",
    "amp=o0",
    "sink=off",
    "epochs=1",
    "eval=false",
    "save_checkpoint=false",
    "log_every=1000",
]


def runner_step_ms() -> float:
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "runner", f"hydra.run.dir={d}", *RUNNER]
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
        return json.loads((Path(d) / "metrics.json").read_text())["step_time_median_ms"]


def hand_step_ms() -> float:
    out = subprocess.run(
        [sys.executable, "bench/hand_written.py", "--samples", "1280"], cwd=REPO, check=True, capture_output=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["step_time_median_ms"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    n = p.parse_args().repeats
    runner, hand = [], []
    for i in range(n):
        hand.append(hand_step_ms())
        runner.append(runner_step_ms())
        print(f"pair {i + 1}/{n}: hand-written {hand[-1]:.2f} ms, runner {runner[-1]:.2f} ms", flush=True)
    r, h = statistics.median(runner), statistics.median(hand)
    print(f"median step: hand-written {h:.2f} ms, runner {r:.2f} ms, runner overhead {100 * (r / h - 1):+.1f}%")


if __name__ == "__main__":
    main()
