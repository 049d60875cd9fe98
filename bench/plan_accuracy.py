"""How close plan=true's estimates come to the runs they plan: step time and peak host memory, estimated / measured.

    .venv/bin/python bench/plan_accuracy.py [--configs resnet8-digits resnet18-64px resnet50-64px] [--repeats 1]

For each configuration, in a copy of this machine's cache without its step-time records (so the plan estimates
instead of reading the answer) plus one calibration run of another configuration (the host cost per layer is
learned from it, as from any earlier run on a user's machine): the plan, then the run, side by side. The step
time depends on the machine's load (an identical run measured 1.4 s and 18 s a step on a shared 2-core machine),
which is why this is a benchmark and not a test: tests/test_plan.py checks the memory estimate and that a finished
run's step time is what the next plan of that configuration quotes.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = ["epochs=1", "padding.height=8", "padding.width=8", "model.width=8", "log_every=1000"]
OFF = ["eval=false", "save_checkpoint=false"]
CALIBRATION = [*TINY, "batch_size=16", *OFF]


def at_64px(model: str) -> list:
    return [f"model={model}", "data=synthetic", "data.image_size=64", "padding.height=64", "padding.width=64",
            "data.num_samples=320", "batch_size=64", "epochs=1"]  # fmt: skip


CONFIGS = {"resnet8-digits": TINY, "resnet18-64px": at_64px("resnet18"), "resnet50-64px": at_64px("resnet50")}


def runner(where: Path, env: dict, *args: str) -> str:
    cmd = [sys.executable, "-m", "runner", f"hydra.run.dir={where}", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, text=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mindspore-runner"
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        if user.is_dir():
            shutil.copytree(
                user, cache / "mindspore-runner", ignore=shutil.ignore_patterns("speed.json", "*.tmp", "compile-cache")
            )
        env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
        runner(Path(tmp) / "calibration", env, *CALIBRATION)
        speed = cache / "mindspore-runner" / "speed.json"
        calibrated = speed.read_text()
        print("| configuration | step ms estimated | measured | ratio | peak MB estimated | measured | ratio |")
        print("|---|---|---|---|---|---|---|")
        for name in args.configs:
            for i in range(args.repeats):
                speed.write_text(calibrated)  # the plan estimates: no record of this configuration yet
                over = [*CONFIGS[name], *OFF]
                plan = " ".join(runner(Path(tmp) / f"plan-{name}-{i}", env, *over, "plan=true").split())
                step = float(re.search(r"~([\d.]+) ms a step", plan).group(1))
                rss = float(re.search(r"peak host RSS ~(\d+) MB", plan).group(1))
                run = Path(tmp) / f"run-{name}-{i}"
                runner(run, env, *over)
                m = json.loads((run / "metrics.json").read_text())
                ms, mb = m["step_time_median_ms"], m["peak_host_memory_mb"]
                print(f"| {name} | {step:.1f} | {ms:.1f} | {step / ms:.2f} | {rss:.0f} | {mb:.0f} | {rss / mb:.2f} |")


if __name__ == "__main__":
    main()
