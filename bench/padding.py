"""Compile counts, step times, padding cost and accuracy of each `padding` choice on one folder.

Renders scikit-learn's digits as PNGs at a dozen sizes (8..32 px a side, mixed aspect ratios, mixed
grayscale/RGB/RGBA), then trains the same network on it once per padding choice, each in its own
process (so no run inherits another's warm caches), and prints a markdown table.

    .venv/bin/python bench/padding.py [--epochs 6] [--per-class 100]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from imagegen import digit_folder  # noqa: E402

CHOICES = {
    "fixed resize 16x16": ["padding=fixed", "padding.method=resize"],
    "fixed resize_pad 16x16": ["padding=fixed", "padding.method=resize_pad"],
    "bucket [16,24,32]": ["padding=bucket", "padding.buckets=[16,24,32]"],
    "none": ["padding=none"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--sizes", type=int, default=12, help="distinct image sizes in the folder")
    args = ap.parse_args()
    rng = np.random.RandomState(0)
    sizes = [tuple(int(v) for v in rng.randint(8, 33, 2)) for _ in range(args.sizes)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        digit_folder(Path(tmp) / "data", sizes, per_class=args.per_class, val_per_class=args.per_class // 4)
        for i, (name, overrides) in enumerate(CHOICES.items()):
            out = Path(tmp) / f"run{i}"
            data = ["data=imagefolder", f"data.root={Path(tmp) / 'data'}"]
            cmd = [sys.executable, "-m", "runner", f"hydra.run.dir={out}", *data, f"epochs={args.epochs}", *overrides]
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
            m = json.loads((out / "metrics.json").read_text())
            rows.append((name, m))
    print(f"{len(sizes)} sizes, {rows[0][1]['train_samples']} train / {rows[0][1]['val_samples']} val images, "
          f"resnet8, batch {rows[0][1]['batch_size']}, {args.epochs} epochs, graph mode, CPU\n")  # fmt: skip
    print(
        "| padding | compiles | distinct shapes | padded pixels | dropped/epoch | step median ms | train s | val acc |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, m in rows:
        p = m["padding"]
        print(
            f"| {name} | {m['compile_count']} | {m['distinct_input_shapes']} | {p['padded_pixel_fraction']:.0%} | "
            f"{p['dropped_samples_per_epoch']} | {m['step_time_median_ms']:.0f} | {m['train_seconds']:.1f} | "
            f"{m['val_accuracy']:.3f} |"
        )


if __name__ == "__main__":
    main()
