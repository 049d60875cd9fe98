"""What may change when a run resumes: the saved config.yaml against the new configuration.

A resumed run continues the saved weights, optimizer moments, data order and schedule position, so
anything that defines those must stay as it was; a changed value there would either be silently
ignored (the checkpoint wins) or silently break the run. Those differences are refused, all listed
at once. What only says how long to train, how to log, checkpoint and evaluate may change, and is
applied: the learning-rate schedule is rebuilt from the new config on every start (restore() does
not load the stored one), so more epochs or an explicit optim.lr=... take effect from the resumed step.
"""

import io
import json
import logging
import os
import shutil
from typing import Dict, Iterable, List, Optional, Tuple

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runner.config.schema import Config
from runner.config.tree import flat
from runner.datasets.errors import error_reason
from runner.errors import ConfigError
from runner.rundir import layout
from runner.rundir.atomic import write_json

log = logging.getLogger("runner")

# Dotted keys (or prefixes) that may differ from the saved config on resume.
CHANGEABLE = (
    "epochs",  # extends (or shortens, if not yet reached) the run; a cosine schedule re-spans it
    "log_every",
    "logger",
    "checkpoint",
    "eval",
    "validation",  # when to validate and when to stop: neither adds parameters or state
    "early_stop",
    "save_checkpoint",
    "diagnose",
    "profile",  # MindSpore's profiler over a window of steps: no parameter or state
    "experiment_name",
    "device.id",
    "distributed.timeout_s",
    "distributed.master_addr",
    "distributed.master_port",
    "ladder",
    # The fix a NaN stop names: FP32 islands add no parameter or state, they change where FP16 computes.
    "amp.keep_fp32",
    # How convolutions compute on CPU: the same parameters and, up to float summation order, the same numbers.
    "model.conv",
    "device.cpu_isa_cap",
)
EXPLICIT_ONLY = ("optim.lr",)  # may change only when given on the command line
# init_from: a resume loads every weight from its checkpoint, so the starting weights no longer matter.
IGNORED = ("resume", "dry_run", "plan", "hydra", "defaults", "init_from")
# history.json (layout.HISTORY): every resume of the run, in order ({"from", "changes", "step"} each; "step", the
# global step resumed from, since runner-runs replay: absent in earlier runs). config.yaml
# stays the configuration the run started with, so re-running it gives the same result whatever happened
# since; the run's current settings are config.yaml with these changes applied (config_after_resumes()).

# Where a resume starts from, found without loading MindSpore (the run directory is claimed first).


def wants_resume(resume) -> bool:
    """Whether `resume` asks to continue something (true/last, a path), not a fresh start."""
    return resume is not None and str(resume).lower() not in ("false", "none", "")


def in_place(resume) -> bool:
    """resume=true or last: this run directory's own checkpoints."""
    return str(resume).lower() in ("true", "last")


def resume_source(resume, run_dir: str) -> Optional[str]:
    """The run directory a resume continues (where its config.yaml is), or None (fresh, or a foreign .ckpt)."""
    if not wants_resume(resume):
        return None
    if in_place(resume):
        return os.path.abspath(run_dir)
    path = os.path.abspath(str(resume))
    if os.path.isfile(path):
        path = os.path.dirname(path)
    if os.path.basename(path) == layout.CHECKPOINTS:
        path = os.path.dirname(path)
    return path if os.path.isfile(layout.RunDir(path).config) else None


def _under(key: str, prefixes: Iterable[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def override_keys(overrides: Iterable[str]) -> set:
    """The dotted keys a Hydra command line sets (`optim.lr=0.05`, `+x=1`, `~y`)."""
    keys = set()
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        keys.add(key)
    return keys


def compare(saved: dict, new: dict, explicit: set) -> Tuple[Dict[str, list], List[str]]:
    """(changes applied as {key: [saved, new]}, refused differences as 'key: saved -> new')."""
    a, b = flat(saved), flat(new)
    changes, refused = {}, []
    for key in sorted(set(a) | set(b)):
        if _under(key, IGNORED):
            continue
        old, now = a.get(key), b.get(key)
        if old == now:
            continue
        if _under(key, CHANGEABLE) or (key in EXPLICIT_ONLY and key in explicit):
            changes[key] = [old, now]
        else:
            refused.append(f"{key}: {old!r} -> {now!r}")
    return changes, refused


def _with_defaults(saved: dict) -> dict:
    """The saved config with the schema's defaults for keys it lacks: a run saved before a setting
    existed ran with that setting's default, so resuming it with the default is no change."""
    body = {k: v for k, v in saved.items() if k not in ("defaults", "hydra")}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), body)
        return OmegaConf.to_container(merged, resolve=False, enum_to_str=True)
    except OmegaConfBaseException:  # a key this version no longer has: compare as saved, and refuse it
        return saved


def read_saved_config(path: str) -> dict:
    """A run's saved config.yaml as a plain dict (interpolations unresolved); a ConfigError naming the
    file when it is not YAML, empty, or not a mapping of settings (evaluate, predict, export, resume)."""
    try:
        text = layout.read_record(path)  # never opens a FIFO or follows a symlink loop
        if text is None:
            raise FileNotFoundError(f"no such file: {path}")
        saved = OmegaConf.to_container(OmegaConf.load(io.StringIO(text)), resolve=False)
    except (yaml.YAMLError, OmegaConfBaseException, ValueError, OSError, UnicodeDecodeError) as e:
        detail = error_reason(e)
        raise ConfigError(
            f"{path} cannot be read as a runner configuration ({type(e).__name__}: {detail}); it is the run's saved "
            "configuration, written when the run started: restore it, or pass another run."
        ) from None
    if not isinstance(saved, dict) or not saved:
        what = "is empty" if not saved else f"holds a {type(saved).__name__}, not a mapping of settings"
        raise ConfigError(
            f"{path} {what}; it is the run's saved configuration, written when the run started: restore it, "
            "or pass another run."
        )
    return _upgraded(saved)


def _upgraded(saved: dict) -> dict:
    """A config saved by an earlier version, in today's shape: `logger` was one logger,
    `{name: mlflow, tracking_uri: ..., experiment: ...}`; it is a list of them keyed by name now."""
    logger = saved.get("logger")
    if isinstance(logger, dict) and isinstance(logger.get("name"), str):
        name = logger["name"]
        settings = {k: v for k, v in logger.items() if k != "name" and v is not None} if name == "mlflow" else {}
        saved = {**saved, "logger": {name: settings}}
    return saved


def check_against_saved(
    cfg, source_dir: str, run_dir: str, overrides: Iterable[str], record: bool = True
) -> Dict[str, list]:
    """cfg against source_dir's saved configuration (as its resumes left it): refuse a resume whose
    configuration differs where it cannot; return the changes applied, and record them (run_dir/resume.json)
    unless record=False (the check before Hydra starts)."""
    path = layout.RunDir(source_dir).config
    if not os.path.isfile(path):  # a run from before config.yaml was written at the start
        log.warning("resume: %s has no config.yaml, so the configuration cannot be checked against it", source_dir)
        return {}
    saved = _with_defaults(config_after_resumes(source_dir))
    new = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    changes, refused = compare(saved, new, override_keys(overrides))
    if refused:
        lr_hint = (
            " A new learning rate is accepted when given explicitly on the command line (optim.lr=...)."
            if any(r.startswith("optim.lr:") for r in refused)
            else ""
        )
        raise ConfigError(
            f"resume: this configuration differs from the one the run was trained with ({path}) in what "
            f"cannot change mid-run: {'; '.join(refused)}. Resume with the saved values (for example "
            f"--config-path {source_dir} --config-name config), or start a new run.{lr_hint} What may "
            "change on resume: epochs, log_every, logger, checkpoint.*, eval, validation.*, early_stop.*, "
            "save_checkpoint, diagnose.*, profile.*, "
            "amp.keep_fp32, model.conv, device.cpu_isa_cap."
        )
    if record:
        history = _history(source_dir)
        if os.path.abspath(source_dir) != os.path.abspath(
            run_dir
        ):  # a branch into a new directory: its start is the source's
            os.makedirs(run_dir, exist_ok=True)
            shutil.copyfile(path, layout.RunDir(run_dir).config)
        entry = {"from": source_dir, "changes": changes, "step": resume_step(cfg.resume, source_dir)}
        write_json(layout.RunDir(run_dir).history, history + [entry])
        write_json(layout.RunDir(run_dir).resume_record, {"from": source_dir, "changes": changes})
    return changes


def resume_step(resume, source_dir: str) -> Optional[int]:
    """The global step a resume continues from, as the checkpoint's name or latest.json records it (None: not
    known). history.json keeps it, so a replay (runner-runs replay) can tell a resume at a leg's end from one
    mid-leg."""
    import re

    path = os.path.abspath(str(resume))
    named = re.fullmatch(r"step_(\d+)\.ckpt", os.path.basename(path)) if os.path.isfile(path) else None
    if named:
        return int(named.group(1))
    ckpt_dir = layout.RunDir(source_dir).checkpoints
    try:
        return int(layout.read_state(ckpt_dir)["global_step"])
    except layout.StateProblem:
        steps = layout.step_files(ckpt_dir)
        return int(steps[0][len("step_") : -len(".ckpt")]) if steps else None


def _history(run_dir: str) -> list:
    """history.json (layout.read_history); a ConfigError naming it when it cannot be read."""
    try:
        return layout.read_history(run_dir)
    except layout.RecordProblem as e:
        raise ConfigError(
            f"{layout.RunDir(run_dir).history} is unreadable ({e}); it records the run's resumes, so the run's "
            "configuration now cannot be known. Restore it, or pass another run."
        ) from None


def config_after_resumes(run_dir: str) -> dict:
    """The run's configuration now (as a plain dict): its config.yaml with every resume's changes applied."""
    body = read_saved_config(layout.RunDir(run_dir).config)
    for entry in _history(run_dir):
        for key, (_, new) in (entry.get("changes") or {}).items():
            node = body
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise ConfigError(
                        f"{layout.RunDir(run_dir).history} records a change of {key}, and {part} is no section "
                        "of the run's configuration. Restore history.json, or pass another run."
                    )
            node[leaf] = new
    return body


def changes_this_resume_applied(run_dir: str) -> Dict[str, list]:
    """The changes the resume that started this process applied (resume.json), {} when there is none."""
    try:
        with open(layout.RunDir(run_dir).resume_record) as f:
            return json.load(f).get("changes", {})
    except (OSError, ValueError):
        return {}
