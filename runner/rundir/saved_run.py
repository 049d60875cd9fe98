"""A finished run as a model to use: its saved config, its network and data, its checkpoints.

Shared by `runner.evaluate`, `runner.predict` and `runner.export`. Everything is rebuilt from the run's
`config.yaml` through the builders training uses (datasets.build_data, models.build_model), so the
network and the preprocessing are those of the run. MindSpore is imported only inside the functions
that need it: the CPU ISA cap must be set before it loads (runner/training/environment.py).
"""

import logging
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, fields, make_dataclass
from typing import Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runner.config.schema import Config
from runner.datasets.settings import DataConfig
from runner.errors import ConfigError, UserError, print_user_error, user_errors
from runner.models.errors import ModelError

log = logging.getLogger("runner")

CONFIG = "config.yaml"

# `data.<field>=...` overrides on the commands: every data field, optional, None = the run's value.
# Generated from DataConfig so the commands type-check overrides exactly as training does.
DataOverrides = make_dataclass("DataOverrides", [(f.name, Optional[f.type], None) for f in fields(DataConfig)])


@contextmanager
def reported_errors():
    """A user's mistake (the runner's, datasets' or models' error types) ends the command with one
    paragraph and exit status 2, never a traceback."""
    try:
        yield
    except user_errors() as e:
        print_user_error(e)
        sys.exit(2)


def run_arguments(argv) -> list:
    """The run directories `run=` names on a command line (several under -m, comma-separated)."""
    multirun = "-m" in argv or "--multirun" in argv
    for arg in argv:
        if arg.startswith("run="):
            value = arg[len("run=") :]
            return value.split(",") if multirun else [value]
    return []


def check_run_argument(argv, command: str) -> None:
    """Before Hydra starts (it would create `<run>/<command>-<time>/` even under a mistyped path):
    exit 2 with one paragraph when run= is missing or names no saved run."""
    runs = run_arguments(argv)
    if not runs and not any(a in ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info") for a in argv):
        print_user_error(UserError(f"{command} needs the run to use: python -m runner.{command} run=<run directory>."))
        sys.exit(2)
    elsewhere = any(a.startswith(("hydra.run.dir=", "hydra.sweep.dir=")) for a in argv)
    for run in runs:
        try:
            config_path(run)
            if not elsewhere and not os.access(run, os.W_OK):
                raise ConfigError(
                    f"{command} writes its outputs into the run directory, and {run} is not writable; "
                    f"choose another place with hydra.run.dir=<dir>."
                )
        except UserError as e:
            print_user_error(e)
            sys.exit(2)


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
    """The run's configuration, typed by the runner's schema, with `data.*` overrides applied and validated.

    data_overrides: a DataOverrides node; its fields that are not None replace the run's.
    """
    from runner.config.checks import validate
    from runner.rundir.resume_check import read_saved_config

    path = config_path(run_dir)
    saved = read_saved_config(path)
    try:
        body = {k: v for k, v in saved.items() if k not in ("defaults", "hydra")}
        cfg = OmegaConf.merge(OmegaConf.structured(Config), body)
        if data_overrides is not None:
            changes = {k: v for k, v in OmegaConf.to_container(data_overrides).items() if v is not None}
            cfg = OmegaConf.merge(cfg, {"data": changes})
        validate(cfg)
    except (OmegaConfBaseException, ValueError) as e:  # a value missing, of another type, or unknown
        raise ConfigError(
            f"{path} cannot be read as a runner configuration ({' '.join(str(e).split())[:200]}); "
            "was it written by this version of the runner?"
        ) from None
    return cfg


def set_up_device(cfg) -> str:
    """Environment and MindSpore context as the run had them (CPU ISA cap, mode, device, seed); the target."""
    from runner.training.environment import setup

    before_mindspore(cfg)
    return setup(cfg.device, cfg.mode, cfg.seed)


def before_mindspore(cfg) -> None:
    """What must happen before MindSpore loads: oneDNN reads its ISA cap once (runner/training/environment.py)."""
    from runner.config.checks import check_tools
    from runner.training.environment import cap_cpu_isa

    try:
        check_tools(cfg)
    except ModelError as e:
        # A run trained with model.conv=onednn, used on a machine without a compiler: MindSpore's own
        # Conv2D computes the same numbers (to 1e-5) from the same parameters.
        log.warning("The run trained with model.conv=onednn; here: %s Using MindSpore's own Conv2D instead.", e)
        cfg.model.conv = "native"
    cap_cpu_isa(cfg.device, cfg.model.conv)


def build(cfg, batch_size: Optional[int] = None):
    """(Data, network) through the training builders; batch_size None = the run's (its global batch)."""
    from runner.datasets import build_data
    from runner.models import build_model

    data = build_data(cfg.data, cfg.padding, batch_size or cfg.batch_size, cfg.seed)
    net = build_model(cfg.model, data.num_classes, data.channels, min(data.height, data.width))
    return data, net


def checkpoint_path(run_dir: str, ckpt: str) -> str:
    """The file `ckpt=` names: final (model.ckpt), last or best (checkpoints/latest.json), or a path."""
    from runner.training.checkpoints import STATE

    ckpt = str(ckpt)
    if ckpt == "final":
        path = os.path.join(run_dir, "model.ckpt")
        if not os.path.isfile(path):
            raise ConfigError(f"ckpt=final: {run_dir} has no model.ckpt. {_available(run_dir)}")
        return path
    if ckpt in ("last", "best"):
        state = os.path.join(run_dir, "checkpoints", STATE)
        if not os.path.isfile(state):
            raise ConfigError(f"ckpt={ckpt}: {run_dir} has no checkpoints/{STATE}. {_available(run_dir)}")
        info = read_latest(state, f"ckpt={ckpt}", _available(run_dir))
        name = info["latest"] if ckpt == "last" else (info.get("best") or {}).get("file")
        if not name:
            raise ConfigError(f"ckpt=best: {state} records no best checkpoint. {_available(run_dir)}")
        path = os.path.join(run_dir, "checkpoints", name)
        if not os.path.isfile(path):
            raise ConfigError(f"ckpt={ckpt}: {state} names {name}, which is missing. {_available(run_dir)}")
        return path
    for cand in (ckpt, os.path.join(run_dir, ckpt), os.path.join(run_dir, "checkpoints", ckpt)):
        if os.path.isfile(cand):
            return cand
    raise ConfigError(f"ckpt={ckpt}: no such checkpoint file. {_available(run_dir)}")


def read_latest(state: str, option: str, hint: str) -> dict:
    """checkpoints/latest.json as training wrote it ({"latest": file name, "best": {"file"...} or None});
    a ConfigError naming `option` and the file when it is not JSON or not of that form."""
    import json

    try:
        with open(state) as f:
            info = json.load(f)
        best = info.get("best") or {}
        names = [info["latest"]] + ([best["file"]] if best else [])
        if not all(isinstance(n, str) and n and os.path.basename(n) == n for n in names):
            raise ValueError(f"checkpoint names {names} are not file names")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # JSONDecodeError is a ValueError
        raise ConfigError(
            f"{option}: {state} is unreadable ({type(e).__name__}: {' '.join(str(e).split())[:120]}), so it does "
            f"not say which checkpoint that is. {hint}"
        ) from None
    return info


def _available(run_dir: str) -> str:
    found = [n for n in ("model.ckpt", "last_good.ckpt") if os.path.isfile(os.path.join(run_dir, n))]
    ckdir = os.path.join(run_dir, "checkpoints")
    if os.path.isdir(ckdir):
        found += sorted(f"checkpoints/{n}" for n in os.listdir(ckdir) if n.endswith(".ckpt"))
    if not found:
        return "The run saved no checkpoint (save_checkpoint=false, or it stopped before saving)."
    return (
        f"Checkpoints in the run: {', '.join(found)} (ckpt=final|last|best, or a path; a path relative "
        "to the run directory works too)."
    )


def read_checkpoint(path: str) -> dict:
    """MindSpore's own checkpoint reader (never pickle); a ConfigError when the file is not a checkpoint."""
    import mindspore as ms

    try:
        return ms.load_checkpoint(path)
    except (ValueError, RuntimeError, OSError, TypeError) as e:
        raise ConfigError(
            f"{path} cannot be read as a MindSpore checkpoint ({str(e).strip().splitlines()[0]})."
        ) from None


def load_weights(net, params: dict, path: str, cfg) -> dict:
    """Load a checkpoint's parameters into net; a ConfigError naming what does not fit. Returns a record.

    Resumable checkpoints hold the whole train cell (optimizer moments, loss scale, step); only the
    network's own parameters are taken from them. Shapes are compared here first: MindSpore's
    load_param_into_net stops at the first mismatch with a RuntimeError and a CRITICAL log line
    (docs/mindspore-notes.md#load-param-shape), while the user needs every misfit named.
    """
    import mindspore as ms

    own = {p.name: p for p in net.get_parameters()}
    averaged = cfg.ema.decay > 0 and all(f"ema.{n}" in params for n in own)
    if averaged:
        # A resumable checkpoint of a run with ema.decay: its weights are the average (ema.*), as the
        # run's model.ckpt and its evaluation are, not the raw weights of the step.
        params = {**params, **{n: params[f"ema.{n}"] for n in own}}
    missing = [n for n in own if n not in params]
    wrong = [
        f"{n} {tuple(own[n].shape)} in the network, {tuple(params[n].shape)} in the checkpoint"
        for n in own
        if n in params and tuple(own[n].shape) != tuple(params[n].shape)
    ]
    if missing or wrong:
        what = []
        if wrong:
            what.append(f"{len(wrong)} parameter(s) of another shape ({'; '.join(wrong[:3])})")
        if missing:
            what.append(f"{len(missing)} of the network's {len(own)} parameters missing ({', '.join(missing[:3])})")
        raise ConfigError(
            f"{path} does not fit the network of this run ({cfg.model.name}, width {cfg.model.width}, "
            f"{cfg.data.channels} input channel(s)): {' and '.join(what)}. Use a checkpoint of this run, or "
            "pass the run directory the checkpoint was trained in."
        )
    values = usable_weights({n: params[n] for n in own}, own, path)
    ms.load_param_into_net(net, values, strict_load=True)
    return {"path": os.path.abspath(path), "parameters": len(own), "ema": averaged}


EVALUATE_HINT = "Use another checkpoint of the run (ckpt=last|best|final, or a step_*.ckpt in its checkpoints/)."


def _nptype(param):
    import mindspore as ms
    import numpy as np

    return np.dtype(ms.dtype_to_nptype(param.dtype))


def usable_weights(values: dict, own: dict, path: str, hint: str = EVALUATE_HINT) -> dict:
    """values (name -> the checkpoint's tensor) in the dtypes of own (name -> the network's Parameter).

    Refused (ConfigError naming the parameters): NaN or infinity anywhere, as resume refuses it (a result
    of such a model is no result), and integer or boolean data where the network holds floats. Floats of
    another width (a float16 checkpoint of a float32 network) are cast, as MindSpore's own loader would
    fail on them with a traceback.
    """
    import mindspore as ms
    import numpy as np

    from runner.training.checkpoints import nonfinite_params

    arrays = {n: v.asnumpy() for n, v in values.items()}
    nonfloat = [
        f"{n} ({a.dtype})"
        for n, a in arrays.items()
        if np.issubdtype(_nptype(own[n]), np.floating) and not np.issubdtype(a.dtype, np.floating)
    ]
    bad = nonfinite_params(values)
    if nonfloat or bad:
        what = f"{len(bad)} parameter(s) hold NaN or infinity ({', '.join(bad[:3])})" if bad else ""
        if nonfloat:
            what += (" and " if what else "") + f"{len(nonfloat)} hold non-float data ({', '.join(nonfloat[:3])})"
        raise ConfigError(
            f"{path} cannot be used: {what}; a model with such weights gives no meaningful result. {hint}"
        )
    out = {}
    for n, a in arrays.items():
        want = _nptype(own[n])
        out[n] = ms.Parameter(ms.Tensor(a.astype(want)), name=n) if a.dtype != want else values[n]
    return out


@dataclass
class SavedRun:
    """A run rebuilt for use: its config, MindSpore's device target, data, network with weights loaded."""

    cfg: object
    target: str
    data: object
    net: object
    checkpoint: dict  # {"path", "parameters"}


def open_run(run_dir: str, ckpt: str, cfg, batch_size: Optional[int] = None) -> SavedRun:
    """Context, data and network of a run whose config load_config returned, with the checkpoint `ckpt`
    names loaded; cheapest checks first: the checkpoint's name and file before the data is scanned."""
    path = checkpoint_path(run_dir, ckpt)
    target = set_up_device(cfg)
    params = read_checkpoint(path)
    data, net = build(cfg, batch_size)
    record = load_weights(net, params, path, cfg)
    return SavedRun(cfg, target, data, net, record)


def class_names(data, outputs: int) -> list:
    """Names of the network's `outputs` classes in index order: the training data's names where it had
    them (an image folder's class folders), else the indices (also for outputs beyond the data's classes)."""
    names = list(getattr(data, "class_names", None) or [])
    return [names[i] if i < len(names) else str(i) for i in range(outputs)]


def inference_net(net, cfg, amp: bool, target: str, out_dir: str):
    """(net returning FP32 logits, AMP level): at the run's AMP level when amp, else FP32 throughout.

    The run's val_accuracy was measured at its AMP level (O0 on CPU under amp=auto), so amp=True
    reproduces it; the exported network is the FP32 one.
    """
    from runner.amp import build_loss_net, resolve_level

    level = resolve_level(cfg.amp.level, target) if amp else "O0"
    out, _ = build_loss_net(net, level, list(cfg.amp.keep_fp32), out_dir)  # as training builds it
    out.set_train(False)
    return out, level


def num_outputs(cfg, data) -> int:
    """Classes the network predicts: model.num_classes, or the data's count."""
    return cfg.model.num_classes or data.num_classes


def padding_record(padding) -> dict:
    """The `padding` group's fields that its chosen option reads, as plain values."""
    from runner.config.checks import fields_read

    kind = str(padding.name)
    plain = OmegaConf.to_container(padding, enum_to_str=True)
    return {"name": kind, **{k: plain[k] for k in sorted(fields_read("padding", kind))}}


def own_new_dir(command: str):
    """The before_run check (runner/cli/app.py entry_point) of evaluate, predict and export: they write
    only into a new directory of their own, never into a training run's or anyone's files."""
    from runner.rundir.claim import check_new_dir

    def before_run(cfg, out_dir: str, overrides, in_sweep: bool) -> None:
        check_new_dir(out_dir, command)

    return before_run
