"""Checks made before Hydra starts, for failures Hydra would report as a traceback."""

import os
import sys


def _output_root(argv) -> str:
    """The literal part of the run (or sweep) directory these arguments ask for."""
    key = "hydra.sweep.dir=" if ("-m" in argv or "--multirun" in argv) else "hydra.run.dir="
    chosen = "outputs"
    for arg in argv:
        if arg.startswith(key):
            chosen = arg[len(key) :]
    return chosen.split("${", 1)[0] or "."


def check_output_dir(argv) -> None:
    """Exit 2 with one clear line when the output directory cannot be created or written."""
    root = _output_root(argv)
    try:
        os.makedirs(root, exist_ok=True)
        probe = os.path.join(root, f".write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        print(
            f"Error: cannot write the run's outputs under {os.path.abspath(root)!r} ({e.strerror}). "
            "Choose a writable place with hydra.run.dir=... (hydra.sweep.dir=... for -m).",
            file=sys.stderr,
        )
        sys.exit(2)
