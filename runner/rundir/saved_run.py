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
from runner.rundir.layout import (
    CHECKPOINTS,
    CONFIG,
    LAST_GOOD,
    MODEL,
    RunDir,
    StateProblem,
    read_checkpoint,
    read_state,
)

log = logging.getLogger("runner")


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
    if len(runs) > 1 and not any(a.startswith("hydra.sweep.dir=") for a in argv):
        # The sweep's own directory is one for all its jobs: inside one run it would hold the others' outputs.
        print_user_error(
            UserError(
                f"{command} -m over several runs ({', '.join(runs)}) needs hydra.sweep.dir=<new directory> for "
                f"its outputs (with one run they go into <run>/{command}-multirun-<time>/)."
            )
        )
        sys.exit(2)
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
    """The run's configuration now (config.yaml and what its resumes changed, runner/rundir/resume_check.py),
    typed by the runner's schema, with `data.*` overrides applied and validated.

    data_overrides: a DataOverrides node; its fields that are not None replace the run's.
    """
    from runner.config.checks import validate
    from runner.rundir.resume_check import current

    path = config_path(run_dir)
    saved = current(run_dir)  # config.yaml with what the run's resumes changed
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


def set_up_device(cfg, purpose: Optional[str] = None, extra: Optional[dict] = None) -> str:
    """Environment and MindSpore context as the run had them (CPU ISA cap, mode, device, seed); the target.

    purpose (evaluate, export): the command, whose graphs get a compile-cache directory of their own,
    keyed on the run's config and the command's settings in `extra` (runner/training/compile_cache.py)."""
    from runner.training import compile_cache
    from runner.training.environment import setup

    before_mindspore(cfg)
    target = setup(cfg.device, cfg.mode, cfg.seed, training=False)
    if purpose is not None:
        isa = os.environ.get("ONEDNN_MAX_CPU_ISA")
        _cache[purpose] = compile_cache.prepare(
            cfg, purpose=purpose, target=target, conv=str(cfg.model.conv), isa=str(isa), extra=extra
        )
    return target


_cache: dict = {}  # purpose -> compile_cache.prepare's record, for cache_done


def cache_done(purpose: str) -> dict:
    """What the compile cache did for this command's graphs (said in one line); {} when it was not set up."""
    from runner.training import compile_cache

    record = _cache.pop(purpose, None)
    if record is None:
        return {}
    state = compile_cache.finish(record, None, "")
    said = compile_cache.line(state)
    if said:
        log.info(said)
    return state


def before_mindspore(cfg) -> None:
    """What must happen before MindSpore loads: oneDNN reads its ISA cap once (runner/training/environment.py)."""
    from runner.config.checks import check_tools
    from runner.training.environment import cap_cpu_isa, choose_conv

    cfg.model.conv = choose_conv(cfg)["path"]  # best: decided on this machine, as training decides it
    try:
        check_tools(cfg)
    except ModelError as e:
        # A run trained with model.conv=onednn, used on a machine without a compiler: MindSpore's own
        # Conv2D computes the same numbers (to 1e-5) from the same parameters.
        log.warning("The run trained with model.conv=onednn, which runs native convolutions here: %s", e)
        cfg.model.conv = "native"
    cap_cpu_isa(cfg.device, cfg.model.conv)


def build(cfg, batch_size: Optional[int] = None, num_classes: Optional[int] = None):
    """(Data, network) through the training builders; batch_size None = the run's (its global batch);
    num_classes: the classes the run trained on (classes.json), None = the data's count."""
    from runner.datasets import build_data
    from runner.models import build_model

    data = build_data(cfg.data, cfg.padding, batch_size or cfg.batch_size, cfg.seed)
    net = build_model(cfg.model, num_classes or data.num_classes, data.channels, min(data.height, data.width))
    return data, net


def checkpoint_path(run_dir: str, ckpt: str) -> str:
    """The file `ckpt=` names: final (model.ckpt), last or best (checkpoints/latest.json), or a path."""
    run = RunDir(run_dir)
    ckpt = str(ckpt)
    if ckpt == "final":
        if not os.path.isfile(run.model):
            raise ConfigError(f"ckpt=final: {run_dir} has no {MODEL}. {_available(run)}")
        return run.model
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


def _available(run: RunDir) -> str:
    found = [n for n in (MODEL, LAST_GOOD) if os.path.isfile(os.path.join(run.path, n))]
    if os.path.isdir(run.checkpoints):
        found += sorted(f"{CHECKPOINTS}/{n}" for n in os.listdir(run.checkpoints) if n.endswith(".ckpt"))
    if not found:
        return "The run saved no checkpoint (save_checkpoint=false, or it stopped before saving)."
    return (
        f"Checkpoints in the run: {', '.join(found)} (ckpt=final|last|best, or a path; a path relative "
        "to the run directory works too)."
    )


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


def usable_weights(values: dict, own: dict, path: str, hint: str = EVALUATE_HINT) -> dict:
    """values (name -> the checkpoint's tensor) in the dtypes of own (name -> the network's Parameter).

    Refused (ConfigError naming the parameters): NaN or infinity anywhere, as resume refuses it (a result
    of such a model is no result), and integer or boolean data where the network holds floats. Floats of
    another width (a float16 checkpoint of a float32 network) are cast, as MindSpore's own loader would
    fail on them with a traceback.
    """
    import mindspore as ms
    from mindspore.common.dtype import float_type

    from runner.training.checkpoints import nonfinite_params

    nonfloat = [
        f"{n} ({v.dtype})" for n, v in values.items() if own[n].dtype in float_type and v.dtype not in float_type
    ]
    bad = nonfinite_params(values)
    if nonfloat or bad:
        what = f"{len(bad)} parameter(s) hold NaN or infinity ({', '.join(bad[:3])})" if bad else ""
        if nonfloat:
            what += (" and " if what else "") + f"{len(nonfloat)} hold non-float data ({', '.join(nonfloat[:3])})"
        raise ConfigError(
            f"{path} cannot be used: {what}; a model with such weights gives no meaningful result. {hint}"
        )
    return {
        n: v if v.dtype == own[n].dtype else ms.Parameter(v.astype(own[n].dtype), name=n) for n, v in values.items()
    }


@dataclass
class SavedRun:
    """A run rebuilt for use: its config, MindSpore's device target, data, network with weights loaded."""

    cfg: object
    target: str
    data: object
    net: object
    checkpoint: dict  # {"path", "parameters"}


def open_run(
    run_dir: str, ckpt: str, cfg, batch_size: Optional[int] = None, purpose: Optional[str] = None, extra=None
) -> SavedRun:
    """Context, data and network of a run whose config load_config returned, with the checkpoint `ckpt`
    names loaded; cheapest checks first: the checkpoint's name and file before the data is scanned.
    purpose, extra: set_up_device's (the command's compile-cache directory)."""
    path = checkpoint_path(run_dir, ckpt)
    target = set_up_device(cfg, purpose, extra)
    params = read_checkpoint(path)
    data, net = build(cfg, batch_size, (read_classes(run_dir) or {}).get("num_classes"))
    record = load_weights(net, params, path, cfg)
    return SavedRun(cfg, target, data, net, record)


def class_names(data, outputs: int, recorded: Optional[list] = None) -> list:
    """Names of the network's `outputs` classes in index order: those the run recorded when it trained
    (classes.json), else the data's names where it has them (an image folder's class folders), else
    the indices (also for outputs beyond the named classes)."""
    names = list(recorded or getattr(data, "class_names", None) or [])
    return [names[i] if i < len(names) else str(i) for i in range(outputs)]


CLASSES = "classes.json"  # beside config.yaml: the class names the network's outputs stand for


def write_classes(run_dir: str, data) -> None:
    """Record the training data's class names in label order (null where the data names none)."""
    from runner.rundir.atomic import write_json

    names = getattr(data, "class_names", None)
    write_json(
        os.path.join(run_dir, CLASSES),
        {"names": [str(n) for n in names] if names else None, "num_classes": int(data.num_classes)},
    )


def read_classes(run_dir: str) -> Optional[dict]:
    """The run's classes.json ({"names": list or None, "num_classes": int}), or None for a run of an older
    version. A ConfigError when the file is there but unreadable."""
    import json

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
            f"{path} is unreadable ({type(e).__name__}: {' '.join(str(e).split())[:120]}); it records which class "
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
    import numpy as np

    names = [str(n) for n in (getattr(data, "class_names", None) or [])]
    if not recorded or not names or names == list(recorded):
        return None
    if by_name and not set(names) - set(recorded):
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


def num_outputs(cfg, data, run_dir: Optional[str] = None) -> int:
    """Classes the network predicts: model.num_classes, or the count the run trained on (its classes.json),
    or the data's count."""
    recorded = (read_classes(run_dir) or {}).get("num_classes") if run_dir else None
    return cfg.model.num_classes or recorded or data.num_classes


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
