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


# Hydra instantiates its own nodes (launcher, sweeper, callbacks) before the runner sees the config.
# Hydra 1.3 blocklists a few targets (os.system, shutil.rmtree) with a traceback; others, such as
# logging.FileHandler (creates or truncates any file), pass. Here everything outside is refused.
HYDRA_TARGET_PREFIXES = ("hydra._internal.", "hydra.experimental.callbacks.", "hydra_plugins.")


def _option(argv, names):
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg[len(name) + 1 :]
    return None


def check_config_file(argv) -> None:
    """Exit 2 when a config named by --config-path (a saved run's, say) names a callable outside the
    project, MindSpore and Hydra's own plugins: its `hydra:` block would be instantiated before any check."""
    import yaml

    from runner.validate import ALLOWED_TARGET_PREFIXES, targets

    path = _option(argv, ("--config-path", "-cp"))
    if path is None:
        return
    name = _option(argv, ("--config-name", "-cn")) or "config"
    file = os.path.join(path, name if name.endswith(".yaml") else name + ".yaml")
    if not os.path.isfile(file):
        return  # Hydra says which file is missing
    try:
        with open(file) as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        print(f"Error: {file!r} is not valid YAML ({e}).", file=sys.stderr)
        sys.exit(2)
    allowed = ALLOWED_TARGET_PREFIXES + HYDRA_TARGET_PREFIXES
    for where, target in targets(data):
        if not isinstance(target, str) or not target.startswith(allowed):
            print(
                f"Error: {file!r} sets {where}={target!r}, which is refused: configs may only name classes of "
                f"this project, MindSpore or Hydra's plugins (targets starting with {', '.join(allowed)}).",
                file=sys.stderr,
            )
            sys.exit(2)
