"""What augmentation buys on a small training set: `augment=none` vs `basic` vs `randaugment`.

resnet20 on scikit-learn's digits with only ~300 training images (the split's val_fraction leaves
the other ~1500 images for validation, which makes the accuracy estimate tight), label smoothing
0.1 in every run, the same epochs and schedule; each choice trains once per seed, each run in its
own process, and the table gives the validation accuracy per seed and its mean. The seed also
draws the train/validation split, so each seed's three runs share one split.

    .venv/bin/python bench/augment.py [--epochs 30] [--seeds 0 1 2] [--train-size 300]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DIGITS = 1797  # images in scikit-learn's digits
CHOICES = ["none", "basic", "randaugment"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--train-size", type=int, default=300)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    args = ap.parse_args()
    val_fraction = round(1 - args.train_size / DIGITS, 4)
    common = [
        "model=resnet20",
        f"epochs={args.epochs}",
        f"data.val_fraction={val_fraction}",
        f"loss.label_smoothing={args.label_smoothing}",
        "checkpoint.every_epochs=0",
        "save_checkpoint=false",
        "log_every=1000",
    ]
    acc = {c: [] for c in CHOICES}
    seconds = {c: [] for c in CHOICES}
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for choice in CHOICES:
                out = Path(tmp) / f"{choice}-{seed}"
                cmd = [sys.executable, "-m", "runner", f"hydra.run.dir={out}", f"augment={choice}", f"seed={seed}"]
                proc = subprocess.run(cmd + common, cwd=REPO, capture_output=True, text=True)
                if proc.returncode:
                    sys.exit(f"augment={choice} seed={seed} failed:\n{proc.stderr[-3000:]}")
                m = json.loads((out / "metrics.json").read_text())
                acc[choice].append(m["val_accuracy"])
                seconds[choice].append(m["train_seconds"])
                print(f"augment={choice} seed={seed}: val_acc {m['val_accuracy']:.4f}", file=sys.stderr, flush=True)
    print(
        f"resnet20 on digits, {m['train_samples']} train / {m['val_samples']} val images (16x16), batch "
        f"{m['batch_size']}, {args.epochs} epochs ({m['steps']} steps), label smoothing {args.label_smoothing}, "
        f"seeds {args.seeds}, graph mode, CPU; {time.time() - start:.0f} s in all\n"
    )
    print("| augment | " + " | ".join(f"seed {s}" for s in args.seeds) + " | mean | std | train s (mean) |")
    print("|---|" + "---|" * (len(args.seeds) + 3))
    for choice in CHOICES:
        a = acc[choice]
        std = statistics.stdev(a) if len(a) > 1 else 0.0
        cells = " | ".join(f"{v:.3f}" for v in a)
        print(f"| {choice} | {cells} | {statistics.mean(a):.3f} | {std:.3f} | {statistics.mean(seconds[choice]):.1f} |")


if __name__ == "__main__":
    main()
