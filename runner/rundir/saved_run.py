"""A finished run's files as a model to use: its saved config, checkpoints and classes, the command line
that names it. Pure path and file logic: the network is rebuilt from them in runner/saved_model.py.

Shared by `runner.evaluate`, `runner.predict`, `runner.export` and fine-tuning (init_from).
"""

import json
import os
from dataclasses import fields, make_dataclass
from typing import Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runner.config.checks import fields_read, validate
from runner.config.schema import Config
from runner.datasets.errors import error_reason
from runner.datasets.settings import DataConfig
from runner.errors import ConfigError, UserError
from runner.rundir.atomic import write_json
from runner.rundir.claim import check_new_dir
from runner.rundir.layout import (
    CHECKPOINT_SUFFIXES,
    CHECKPOINTS,
    CONFIG,
    LAST_GOOD,
    MODEL,
    MODEL_SAFETENSORS,
    STATE,
    RunDir,
    StateProblem,
    read_state,
)
from runner.rundir.resume_check import config_after_resumes

# `data.<field>=...` overrides on the commands: every data field, optional, None = the run's value.
# Generated from DataConfig so the commands type-check overrides exactly as training does.
DataOverrides = make_dataclass("DataOverrides", [(f.name, Optional[f.type], None) for f in fields(DataConfig)])


def run_arguments(argv) -> list:
    """The run directories `run=` names on a command line (several under -m, comma-separated)."""
    multirun = "-m" in argv or "--multirun" in argv
    for arg in argv:
        if arg.startswith("run="):
            value = arg[len("run=") :]
            return value.split(",") if multirun else [value]
    return []


def check_run_argument(argv, command: str) -> None:
    """Before Hydra starts (it would create `<run>/<command>-<time>/` even under a mistyped path): a
    UserError when run= is missing or names no saved run."""
    runs = run_arguments(argv)
    if not runs and not any(a in ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info") for a in argv):
        raise UserError(f"{command} needs the run to use: python -m runner.{command} run=<run directory>.")
    elsewhere = any(a.startswith(("hydra.run.dir=", "hydra.sweep.dir=")) for a in argv)
    if len(runs) > 1 and not any(a.startswith("hydra.sweep.dir=") for a in argv):
        # The sweep's own directory is one for all its jobs: inside one run it would hold the others' outputs.
        raise UserError(
            f"{command} -m over several runs ({', '.join(runs)}) needs hydra.sweep.dir=<new directory> for "
            f"its outputs (with one run they go into <run>/{command}-multirun-<time>/)."
        )
    for run in runs:
        config_path(run)
        if not elsewhere and not os.access(run, os.W_OK):
            raise ConfigError(
                f"{command} writes its outputs into the run directory, and {run} is not writable; "
                f"choose another place with hydra.run.dir=<dir>."
            )


def config_path(run_dir: str) -> str:
    """The run's saved config.yaml; a UserError when run_dir is not a run directory."""
    if not os.path.isdir(run_dir):
        raise ConfigError(f"run={run_dir}: no such directory. Pass the directory of a finished training run.")
    path = os.path.join(run_dir, CONFIG)
    if not os.path.isfile(path):
        raise ConfigError(
            f"run={run_dir} has no {CONFIG}, so it is not a run directory of the runner (each run writes its "
            "resolved configuration there; for a sweep, pass one job's directory, e.g. <sweep dir>/0)."
        )
    return path


def load_config(run_dir: str, data_overrides=None):
    """The run's configuration now (config.yaml and what its resumes changed, runner/rundir/resume_check.py),
    typed by the runner's schema, with `data.*` overrides applied and validated.

    data_overrides: a DataOverrides node; its fields that are not None replace the run's.
    """
    path = config_path(run_dir)
    saved = config_after_resumes(run_dir)  # config.yaml with what the run's resumes changed
    try:
        body = {k: v for k, v in saved.items() if k not in ("defaults", "hydra")}
        cfg = OmegaConf.merge(OmegaConf.structured(Config), body)
        if data_overrides is not None:
            changes = {k: v for k, v in OmegaConf.to_container(data_overrides).items() if v is not None}
            cfg = OmegaConf.merge(cfg, {"data": changes})
        validate(cfg, init_from_problems)
    except (OmegaConfBaseException, ValueError) as e:  # a value missing, of another type, or unknown
        raise ConfigError(
            f"{path} cannot be read as a runner configuration ({error_reason(e)}); "
            "was it written by this version of the runner?"
        ) from None
    return cfg


def checkpoint_path(run_dir: str, ckpt: str) -> str:
    """The file `ckpt=` names: final (model.ckpt or model.safetensors), last or best (checkpoints/latest.json), or
    a path."""
    run = RunDir(run_dir)
    ckpt = str(ckpt)
    if ckpt == "final":
        final = run.saved_final()
        if final is None:
            raise ConfigError(f"ckpt=final: {run_dir} has no {MODEL} (nor {MODEL_SAFETENSORS}). {_available(run)}")
        return final
    if ckpt in ("last", "best"):
        try:
            state = read_state(run.checkpoints)
        except StateProblem as e:
            raise ConfigError(f"ckpt={ckpt}: {e}. {_available(run)}") from None
        if ckpt == "last":
            return state["path"]
        if not state.get("best"):
            raise ConfigError(f"ckpt=best: {run.state} records no best checkpoint. {_available(run)}")
        best = run.checkpoint(state["best"]["file"])
        if not os.path.isfile(best):
            raise ConfigError(
                f"ckpt=best: {run.state} names {state['best']['file']}, which is missing. {_available(run)}"
            )
        return best
    for cand in (ckpt, os.path.join(run_dir, ckpt), run.checkpoint(ckpt)):
        if os.path.isfile(cand):
            return cand
    raise ConfigError(f"ckpt={ckpt}: no such checkpoint file. {_available(run)}")


def source_path(init_from: str) -> str:
    """The checkpoint file init_from names: a .ckpt or .safetensors file, or a run directory's final weights (else
    its best or latest resumable checkpoint). Raises ConfigError when there is none."""
    path = os.path.abspath(os.path.expanduser(str(init_from)))
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        run = RunDir(path)
        if run.saved_final() is not None:
            return str(run.saved_final())
        if not os.path.exists(run.state):
            raise ConfigError(
                f"init_from={init_from}: the directory {path} holds no {MODEL} (or {MODEL_SAFETENSORS}) and no "
                f"checkpoints/{STATE}; name a .ckpt or .safetensors file or a finished run directory."
            )
        try:
            state = read_state(run.checkpoints)
        except StateProblem as e:
            raise ConfigError(f"init_from={init_from}: {e}; name a .ckpt file instead.") from None
        found = run.checkpoint(state["best"]["file"]) if state.get("best") else state["path"]
        if not os.path.isfile(found):
            raise ConfigError(
                f"init_from={init_from}: {run.state} names {os.path.basename(found)}, which is missing; "
                "name one of its checkpoints/step_*.ckpt files as init_from=<file>."
            )
        return found
    raise ConfigError(f"init_from={init_from}: {path} does not exist; name a .ckpt file or a run directory.")


def init_from_problems(cfg):
    """What is wrong with the config's init_from (one problem, for config/checks.py validate), if anything."""
    if cfg.init_from:
        try:
            source_path(cfg.init_from)
        except ConfigError as e:
            yield str(e).rstrip(".")


def _available(run: RunDir) -> str:
    found = [n for n in (MODEL, MODEL_SAFETENSORS, LAST_GOOD) if os.path.isfile(os.path.join(run.path, n))]
    if os.path.isdir(run.checkpoints):
        found += sorted(f"{CHECKPOINTS}/{n}" for n in os.listdir(run.checkpoints) if n.endswith(CHECKPOINT_SUFFIXES))
    if not found:
        return "The run saved no checkpoint (save_checkpoint=false, or it stopped before saving)."
    return (
        f"Checkpoints in the run: {', '.join(found)} (ckpt=final|last|best, or a path; a path relative "
        "to the run directory works too)."
    )


def class_names(data, outputs: int, recorded: Optional[list] = None) -> list:
    """Names of the network's `outputs` classes in index order: those the run recorded when it trained
    (classes.json), else the data's names where it has them (an image folder's class folders), else
    the indices (also for outputs beyond the named classes)."""
    names = list(recorded or getattr(data, "class_names", None) or [])
    return [names[i] if i < len(names) else str(i) for i in range(outputs)]


CLASSES = "classes.json"  # beside config.yaml: the class names the network's outputs stand for


def write_classes(run_dir: str, data) -> None:
    """Record the training data's class names in label order (null where the data names none)."""
    names = getattr(data, "class_names", None)
    write_json(
        os.path.join(run_dir, CLASSES),
        {"names": [str(n) for n in names] if names else None, "num_classes": int(data.num_classes)},
    )


def read_classes(run_dir: str) -> Optional[dict]:
    """The run's classes.json ({"names": list or None, "num_classes": int}), or None for a run of an older
    version. A ConfigError when the file is there but unreadable."""
    path = os.path.join(run_dir, CLASSES)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            info = json.load(f)
        names, count = info["names"], info["num_classes"]
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise ValueError(f"names is {type(names).__name__}, not a list of strings")
        if not isinstance(count, int) or count < 1 or (names and len(names) != count):
            raise ValueError(f"num_classes {count!r} is not the number of names")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{path} is unreadable ({type(e).__name__}: {error_reason(e)}); it records which class "
            "each output of the run's network stands for, so the run's classes cannot be checked. Restore it."
        ) from None
    return info


def recorded_classes(run_dir: str) -> Optional[list]:
    """The class names the run trained with (classes.json), or None: a run of an older version, or data
    without names."""
    return (read_classes(run_dir) or {}).get("names")


def match_classes(recorded: Optional[list], data, what: str, by_name: bool, hint: str):
    """None when the data's classes are the run's (or one side names none); with by_name, the index of each
    data label among the run's outputs. Otherwise a ConfigError: labels of other classes than the network
    was trained on make every number computed from them wrong (a renamed folder gives top-1 0.0)."""
    names = [str(n) for n in (getattr(data, "class_names", None) or [])]
    if not recorded or not names or names == list(recorded):
        return None
    if by_name and not set(names) - set(recorded):
        import numpy as np  # not at the top: a training run's checks (init_from_problems) need no numpy

        return np.asarray([recorded.index(n) for n in names], dtype=np.int64)
    unknown = [n for n in names if n not in recorded]
    lost = [n for n in recorded if n not in names]

    def few(xs):
        return ", ".join(xs[:6]) + (f" and {len(xs) - 6} more" if len(xs) > 6 else "")

    if unknown or lost:
        diff = f"the data has {few(unknown) or 'none'} that the run lacks and lacks {few(lost) or 'none'} of the run's"
    else:
        diff = "the same names in another order"
    raise ConfigError(
        f"{what} has other classes than the run was trained on ({CLASSES}: {few(list(recorded))}; the data: "
        f"{few(names)}): {diff}, so its labels do not mean the network's outputs. {hint}"
    )


def num_outputs(cfg, data, run_dir: Optional[str] = None) -> int:
    """Classes the network predicts: model.num_classes, or the count the run trained on (its classes.json),
    or the data's count."""
    recorded = (read_classes(run_dir) or {}).get("num_classes") if run_dir else None
    return cfg.model.num_classes or recorded or data.num_classes


def padding_record(padding) -> dict:
    """The `padding` group's fields that its chosen option reads, as plain values."""
    kind = str(padding.name)
    plain = OmegaConf.to_container(padding, enum_to_str=True)
    return {"name": kind, **{k: plain[k] for k in sorted(fields_read("padding", kind))}}


def own_new_dir(command: str):
    """The before_run check (runner/cli/app.py entry_point) of evaluate, predict and export: they write
    only into a new directory of their own, never into a training run's or anyone's files."""

    def before_run(cfg, out_dir: str, overrides, in_sweep: bool) -> None:
        check_new_dir(out_dir, command)

    return before_run
