"""What fine-tuning buys: validation accuracy per epoch from scratch vs `init_from` a digits run (docs/fine-tuning.md).

A digits run (default config, resnet8 at 16x16) of --source-epochs epochs, then a 5-class image folder of
digit renderings (tests/imagegen.py `digit_folder(root, [(8, 8), (16, 16), (12, 10)], per_class=60, classes=5,
val_per_class=30, seed=7)`: 300 training and 150 validation images, RGB, gray and RGBA at three sizes) trained
three ways for --epochs epochs each with `validation.every_epochs=1`: from scratch, `init_from` the digits run,
and the same with `optim.freeze=[stem,layer1]`. Each run in its own process; prints docs/fine-tuning.md's table.

    .venv/bin/python bench/finetune.py [--epochs 10] [--source-epochs 5]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def train(run_dir: Path, *overrides: str) -> dict:
    cmd = [sys.executable, "-m", "runner", f"hydra.run.dir={run_dir}", "log_every=1000", *overrides]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads((run_dir / "metrics.json").read_text())


def main():
    from imagegen import digit_folder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--source-epochs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = train(tmp / "digits", f"epochs={args.source_epochs}")
        root = tmp / "five"
        digit_folder(root, [(8, 8), (16, 16), (12, 10)], per_class=60, classes=5, val_per_class=30, seed=7)
        folder = ["data=imagefolder", f"data.root={root}", f"epochs={args.epochs}", "validation.every_epochs=1"]
        rows = [
            ("from scratch", train(tmp / "scratch", *folder)),
            ("`init_from` the digits run", train(tmp / "init", *folder, f"init_from={tmp / 'digits'}")),
            (
                "the same, `optim.freeze=[stem,layer1]`",
                train(tmp / "frozen", *folder, f"init_from={tmp / 'digits'}", "optim.freeze=[stem,layer1]"),
            ),
        ]
    m = rows[0][1]
    print(
        f"digits source run: {args.source_epochs} epochs, val accuracy {source['val_accuracy']:.3f}; folder: "
        f"{m['train_samples']} train / {m['val_samples']} val images, {args.epochs} epochs each"
    )
    print("| run | " + " | ".join(["epoch 1"] + [str(e) for e in range(2, args.epochs + 1)]) + " |")
    print("|---" * (args.epochs + 1) + "|")
    for name, m in rows:
        print(f"| {name} | " + " | ".join(f"{v['accuracy']:.3f}" for v in m["val_curve"]) + " |")


if __name__ == "__main__":
    main()
