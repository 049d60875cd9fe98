"""Compile time and step time per mode.jit_level, and the compile cache's first run against a second
identical one, for ResNet-18 and ResNet-50 in graph mode on small synthetic images.

Each run is its own process (`python -m runner`), the cache in a fresh directory per invocation, so the
first run of each model fills it and the second identical run reads it. Prints a markdown table.

    .venv/bin/python bench/compile.py [--models resnet18 resnet50] [--size 32] [--samples 160]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (label, overrides): O0 fills the cache, the identical second run reads it, O1 fills its own key.
RUNS = [
    ("O0, cache filled", ["mode.jit_level=O0"]),
    ("O0, identical rerun", ["mode.jit_level=O0"]),
    ("O1, cache filled", ["mode.jit_level=O1"]),
    ("auto, compile_cache off", ["compile_cache.enabled=false"]),
]


def run(model: str, overrides: list, size: int, samples: int, cache: Path, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "runner",
        f"model={model}",
        "data=synthetic",
        f"data.num_samples={samples}",
        f"padding.height={size}",
        f"padding.width={size}",
        "batch_size=16",
        "epochs=1",
        "eval=false",
        "save_checkpoint=false",
        "log_every=1000",
        f"hydra.run.dir={out}",
        *overrides,
    ]
    if "compile_cache.enabled=false" not in overrides:  # a dir with the cache off is refused
        cmd.append(f"compile_cache.dir={cache}")
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True)
    return json.loads((out / "metrics.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    p.add_argument("--runs", type=int, default=len(RUNS), help="the first N runs of RUNS per model")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--samples", type=int, default=160)
    a = p.parse_args()
    print("| model | run | jit_level | cache | compile s | step ms (median) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models:
            for i, (label, overrides) in enumerate(RUNS[: a.runs]):
                m = run(model, overrides, a.size, a.samples, Path(tmp) / "cache", Path(tmp) / f"{model}-{i}")
                state = m["compile_cache"].get("state", "")
                print(
                    f"| {model} | {label} | {m['jit_level']} | {state} | {m['compile_seconds']:.1f} | "
                    f"{m['step_time_median_ms']:.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
