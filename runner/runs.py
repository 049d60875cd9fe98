"""`runner-runs`: the run directories as a collection: list them, compare two, replay one.

    runner-runs [DIR ...] [--sort FIELD] [--where KEY=VALUE ...] [--json]
    runner-runs diff A B [--json]
    runner-runs replay RUN [--out DIR]

Everything is read from the runs' own records (runner/rundir/status.py); nothing here loads MindSpore,
and a replay trains through `python -m runner`, one leg after another.

A plain argparse command, not a Hydra app: it composes no configuration, and Hydra's completion completes
overrides, which this command has none of. Its shell completion is `runner-runs --completion bash`
(a bash function that completes the subcommands, the options and directories; docs/runs.md).
"""

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from runner.config.schema import LABEL, changes_graph, is_training_setting, setting_kind
from runner.config.tree import flat
from runner.errors import UserError
from runner.rundir import layout, status
from runner.rundir.status import RunInfo

DEFAULT_ROOTS = ("outputs", "multirun")
SUBCOMMANDS = ("diff", "replay")


# ---------------------------------------------------------------------------------------------------
# Fields: what --sort and --where name.


def fields_of(info: RunInfo) -> Dict[str, object]:
    """Every field of a run by name: the table's columns, metrics.json's numbers and strings, and the
    configuration's dotted keys (optim.lr, model.name)."""
    out: Dict[str, object] = {}
    for key, value in flat({k: v for k, v in info.config.items() if k not in ("hydra", "defaults")}).items():
        out[key] = value
    for key, value in info.metrics.items():
        if isinstance(value, (int, float, str, bool)) or value is None:
            out[key] = value
    out.update(
        {
            "path": info.path,
            "when": status.when(info),
            "experiment": info.experiment,
            "status": info.status,
            "epochs_done": info.epochs_done,
            "steps": info.steps,
            "monitor": info.monitor,
            "monitor_value": info.monitor_value,
            "throughput": info.throughput,
            "resumes": info.resumes,
        }
    )
    return out


def _matches(value, wanted: str) -> bool:
    if value is None:
        return wanted.lower() in ("none", "null")
    if isinstance(value, bool):
        return str(value).lower() == wanted.lower()
    try:
        return float(value) == float(wanted)
    except (TypeError, ValueError):
        return str(value) == wanted


def select(runs: List[RunInfo], where: Sequence[str], sort: Optional[str]) -> List[RunInfo]:
    """The runs --where keeps (every KEY=VALUE holds), in --sort order (a leading - sorts descending; runs
    without the field last). UserError for a field no listed run has."""
    known = set().union(*(fields_of(r).keys() for r in runs)) if runs else set()

    def check(key: str, option: str) -> None:
        if runs and key not in known:
            close = sorted(k for k in known if key.split(".")[-1] in k)[:6]
            raise UserError(
                f"{option} {key}: no listed run has a field {key!r}"
                + (f" (similar: {', '.join(close)})" if close else "")
                + ". Fields are the table's columns (when, experiment, status, epochs_done, steps, monitor_value, "
                "throughput), metrics.json's keys (val_accuracy, val_loss, final_loss, ...) and the configuration's "
                "dotted keys (model.name, optim.lr, ...)."
            )

    for condition in where:
        key, sep, wanted = condition.partition("=")
        if not sep or not key:
            raise UserError(f"--where {condition!r}: write it as KEY=VALUE, for example --where model.name=resnet18.")
        check(key, "--where")
        runs = [r for r in runs if _matches(fields_of(r).get(key), wanted)]
    if sort:
        key, descending = sort.lstrip("-"), sort.startswith("-")
        check(key, "--sort")
        present = [r for r in runs if fields_of(r).get(key) is not None]
        absent = [r for r in runs if fields_of(r).get(key) is None]

        def order(r):
            v = fields_of(r)[key]
            return (0, float(v), "") if isinstance(v, (int, float)) else (1, 0.0, str(v))

        runs = sorted(present, key=order, reverse=descending) + absent
    return runs


def differing(runs: List[RunInfo]) -> List[str]:
    """The configuration keys whose value is not the same in every listed run that has a configuration."""
    configs = [flat(r.config) for r in runs if r.config]
    if len(configs) < 2:
        return []
    keys = sorted(set().union(*configs))
    out = []
    for key in keys:
        if not is_training_setting(key):  # what names, places or reports a run (runner/config/schema.py KIND)
            continue
        if len({json.dumps(c.get(key), sort_keys=True, default=str) for c in configs}) > 1:
            out.append(key)
    return out


# ---------------------------------------------------------------------------------------------------
# runner-runs [DIR ...]


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e4 else f"{value:.0f}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)


def _console():
    """A terminal's own width; into a pipe or file, wide enough that no cell is folded (grep finds it whole)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=400)


def _shown_path(path: str) -> str:
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else path


def record(info: RunInfo, keys: List[str]) -> dict:
    """One run as --json prints it."""
    config = flat(info.config) if info.config else {}
    return {
        "path": info.path,
        "status": info.status,
        "detail": info.detail,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(info.started)) if info.started else None,
        "experiment": info.experiment,
        "epochs_done": info.epochs_done,
        "epochs": info.epochs,
        "steps": info.steps,
        "resumable": info.resumable,
        "resumes": info.resumes,
        "monitor": info.monitor,
        "monitor_value": info.monitor_value,
        "val_accuracy": info.metrics.get("val_accuracy"),
        "throughput_samples_per_s": info.throughput,
        "config": {k: config.get(k) for k in keys},
    }


def runs_under(*roots: str, where: Sequence[str] = (), sort: Optional[str] = None) -> List[RunInfo]:
    """The runs under roots (default: outputs/ and multirun/ where they exist), as `runner-runs` lists them:
    --where conditions ("KEY=VALUE") and --sort field ("-FIELD" descending). UserError for a missing root or
    a field no run has."""
    for root in roots:
        if not os.path.isdir(root):
            try:
                os.stat(root)
                why = "not a directory"
            except OSError as e:
                why = "no such directory" if isinstance(e, FileNotFoundError) else f"cannot be read ({e.strerror})"
            raise UserError(f"{root}: {why}. Name directories that hold runs (default: outputs/ multirun/).")
    chosen = list(roots) or [r for r in DEFAULT_ROOTS if os.path.isdir(r)]
    return select(status.find_runs(chosen), where, sort)


def list_runs(roots: List[str], sort: Optional[str], where: Sequence[str], as_json: bool) -> int:
    """Print the table (or JSON) of the runs under roots; 0."""
    runs = runs_under(*roots, where=where, sort=sort)
    roots = roots or [r for r in DEFAULT_ROOTS if os.path.isdir(r)]
    keys = differing(runs)
    if as_json:
        print(json.dumps([record(r, keys) for r in runs], indent=2, default=str))
        return 0
    if not runs:
        where_text = ", ".join(roots) if roots else "outputs/ or multirun/ (neither exists here)"
        print(f"No runs under {where_text}.")
        return 0
    from rich.table import Table

    table = Table(title=f"{len(runs)} run(s) under {', '.join(roots)}", title_justify="left")
    for head in ("when", "run", "experiment", "status", "epochs", "val_accuracy", "monitored", "samples/s", *keys):
        table.add_column(head, overflow="fold")
    table.add_column("note", overflow="fold")
    for r in runs:
        config = flat(r.config) if r.config else {}
        epochs = f"{_fmt(r.epochs_done)}/{_fmt(r.epochs)}" if r.epochs is not None else _fmt(r.epochs_done)
        metric = f"{r.monitor} {_fmt(r.monitor_value)}" if r.monitor else "-"
        note = "" if r.status == status.FINISHED else r.detail
        accuracy = r.metrics.get("val_accuracy")  # of the weights the run ended with (what --sort=-val_accuracy orders)
        accuracy = _fmt(accuracy, 4) if isinstance(accuracy, (int, float)) else "-"
        cells = [status.when(r), _shown_path(r.path), r.experiment or "-", r.status, epochs, accuracy, metric]
        cells += [_fmt(r.throughput, 4), *[_fmt(config.get(k)) for k in keys], note]
        table.add_row(*cells)
    _console().print(table)
    return 0


# ---------------------------------------------------------------------------------------------------
# runner-runs diff A B

# metrics.json: what describes the machine and software a run ran on (compared, a difference counts) ...
ENVIRONMENT = ("versions", "cpu_isa", "conv", "device_target", "mode", "amp_level_used", "distributed")
# ... what it computed (compared, a difference counts) ...
OUTCOME = (
    "val_accuracy",
    "val_loss",
    "val_top5_accuracy",
    "final_loss",
    "steps",
    "optimizer_updates",
    "train_samples",
    "val_samples",
    "loss_curve",
)
# ... and how fast (shown with the ratio, never counted: two runs of one configuration never time alike).
SPEED = (
    "throughput_samples_per_s",
    "step_time_median_ms",
    "step_time_p90_ms",
    "compile_seconds",
    "train_seconds",
    "peak_host_memory_mb",
    "flops.achieved_gflops_per_s",
)


def _open(run_dir: str) -> RunInfo:
    if not os.path.isdir(run_dir):
        raise UserError(f"{run_dir}: no such directory. Name two run directories: runner-runs diff A B.")
    info = status.read_run(run_dir)
    if info.status in (status.FOREIGN, status.HALF_WRITTEN) or not info.config:
        raise UserError(f"{run_dir} is not a run of this runner that can be compared ({info.status}: {info.detail}).")
    return info


def _environment(info: RunInfo) -> dict:
    picked = {k: info.metrics[k] for k in ENVIRONMENT if k in info.metrics}
    env = dict(flat(picked))  # conv.reason names the CPU feature the convolution path was chosen by
    paths = (info.metrics.get("flops") or {}).get("conv_paths")
    if isinstance(paths, dict):
        env["conv paths"] = ", ".join(f"{p}: {d.get('layers')} layers" for p, d in sorted(paths.items()))
    return env


def _with_defaults(info: RunInfo) -> dict:
    from runner.rundir.resume_check import _with_defaults as merged

    return {k: v for k, v in flat(merged(info.config)).items() if setting_kind(k) is not None}


def _curve_note(a, b) -> Optional[str]:
    if not isinstance(a, list) or not isinstance(b, list):
        return None if a == b else "differs"
    if a == b:
        return None
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"{len(a)} vs {len(b)} steps, first difference at step {first + 1}"


def diff_runs(a_dir: str, b_dir: str) -> dict:
    """Two runs' differences: {"a", "b" (paths), "config", "environment", "metrics", "speed": [{"key", "a",
    "b"}], "differ": whether config, environment or metrics differ (speed never counts)}. UserError when a
    directory is not a run of this runner."""
    a, b = _open(a_dir), _open(b_dir)
    sections: Dict[str, List[tuple]] = {}
    ca, cb = _with_defaults(a), _with_defaults(b)
    differ = [(k, ca.get(k), cb.get(k)) for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)]
    # What trains is compared; what names or reports a run (experiment_name, logger, compile_cache) is shown.
    sections["config"] = [d for d in differ if is_training_setting(d[0])]
    sections["bookkeeping"] = [d for d in differ if not is_training_setting(d[0])]
    ea, eb = _environment(a), _environment(b)
    sections["environment"] = [(k, ea.get(k), eb.get(k)) for k in sorted(set(ea) | set(eb)) if ea.get(k) != eb.get(k)]
    outcome: List[tuple] = []
    for key in OUTCOME:
        va, vb = a.metrics.get(key), b.metrics.get(key)
        if key == "loss_curve":
            note = _curve_note(va, vb)
            if note:
                outcome.append((key, note, ""))
        elif va != vb:
            outcome.append((key, va, vb))
    sections["metrics"] = outcome
    fa, fb = flat(a.metrics), flat(b.metrics)
    sections["speed"] = [(k, fa.get(k), fb.get(k)) for k in SPEED if fa.get(k) is not None or fb.get(k) is not None]
    differs = any(sections[s] for s in ("config", "environment", "metrics"))
    rows = {s: [{"key": k, "a": x, "b": y} for k, x, y in found] for s, found in sections.items()}
    for row in rows["config"]:  # whether this difference alone compiles other graphs (the schema's GRAPH)
        row["graph"] = changes_graph(row["key"])
    return {"a": a.path, "b": b.path, "a_status": a.status, "b_status": b.status, "differ": differs, **rows}


def diff(a_dir: str, b_dir: str, as_json: bool) -> int:
    """Print the differences of two runs side by side; 0 same, 1 different (as diff(1))."""
    report = diff_runs(a_dir, b_dir)
    differs = report["differ"]
    if as_json:
        print(json.dumps(report, indent=2, default=str))
        return 1 if differs else 0
    from rich.table import Table

    console = _console()
    console.print(f"A: {report['a']} ({report['a_status']})\nB: {report['b']} ({report['b_status']})")
    for name in ("config", "environment", "metrics"):
        rows = report[name]
        if not rows:
            console.print(f"{name}: same")
            continue
        table = Table(title=f"{name}: {len(rows)} difference(s)", title_justify="left")
        graph = name == "config"  # a column saying which differences compile other graphs
        for head in ("key", "A", "B", *(["changes the graph"] if graph else [])):
            table.add_column(head, overflow="fold")
        for row in rows:
            table.add_row(
                row["key"], _fmt(row["a"], 6), _fmt(row["b"], 6), *(["yes" if row["graph"] else "no"] if graph else [])
            )
        console.print(table)
    if report["bookkeeping"]:
        table = Table(
            title="names and reporting (shown, not compared: they do not change what trains)", title_justify="left"
        )
        for head in ("key", "A", "B"):
            table.add_column(head, overflow="fold")
        for row in report["bookkeeping"]:
            table.add_row(row["key"], _fmt(row["a"], 6), _fmt(row["b"], 6))
        console.print(table)
    if report["speed"]:
        table = Table(title="speed (shown, not compared: timings differ between any two runs)", title_justify="left")
        for head in ("key", "A", "B", "B/A"):
            table.add_column(head)
        for row in report["speed"]:
            x, y = row["a"], row["b"]
            ratio = f"x{y / x:.2f}" if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x else "-"
            table.add_row(row["key"], _fmt(x), _fmt(y), ratio)
        console.print(table)
    console.print("The runs differ." if differs else "The runs are the same (config, environment, metrics).")
    return 1 if differs else 0


# ---------------------------------------------------------------------------------------------------
# runner-runs replay RUN


def override(key: str, value) -> str:
    """key=value in Hydra's override grammar, the value as the run's record holds it."""

    def lit(v) -> str:
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, list):
            return "[" + ",".join(lit(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ",".join(f"{k}:{lit(x)}" for k, x in v.items()) + "}"
        return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"

    return f"{key}={lit(value)}"


def _history(run_dir: str) -> list:
    from runner.rundir.resume_check import _history as read

    return read(run_dir)  # a ConfigError naming history.json when it cannot be read


def training_settings(config: dict) -> dict:
    """The part of a saved configuration that defines what the run computes (runner/config/schema.py KIND):
    everything but Hydra's keys, what names the run kept as a label, and no command, resume or reporting."""
    return {k: v for k, v in config.items() if is_training_setting(k) or setting_kind(k) == LABEL}


def replay_source(run_dir: str, where: str) -> str:
    """Write the run's config.yaml as a replay runs it into where/config.yaml: its training settings only,
    Hydra's record of the original (its run directory, logging) and its loggers and cache settings left to
    the replay's defaults (metrics.csv, the user's own cache), so the replay writes only its own directory."""
    from omegaconf import OmegaConf

    from runner.rundir.resume_check import read_saved_config

    body = training_settings(read_saved_config(layout.RunDir(run_dir).config))
    source = {
        "defaults": ["base_config", "_self_"],
        "hydra": {"job": {"name": "runner", "chdir": False}},
        **body,
        "logger": {"csv": {}},
    }
    path = os.path.join(where, layout.CONFIG)
    with open(path, "w") as f:
        f.write(OmegaConf.to_yaml(OmegaConf.create(source)))
    return where


def legs(run_dir: str, out: str, source: Optional[str] = None) -> List[tuple]:
    """[(`python -m runner` arguments, the history.json entry or None, the entry's keys left out)] that
    reproduce the run in out: its training settings (source: where replay_source wrote them; default the
    run's own directory), then each resume with every change to a training setting recorded up to it (a
    resume is checked against the saved config with the earlier resumes applied, as the run's own was). A
    change of anything else (hydra.run.dir, resume, a logger) is left out and named: a history says what
    trained, never where a replay writes. A leg's `resume=` is decided when it starts (resume_from)."""
    base = ["--config-path", os.path.abspath(source or run_dir), "--config-name", "config", f"hydra.run.dir={out}"]
    commands: List[tuple] = [(base, None, [])]
    changed: Dict[str, object] = {}
    for entry in _history(run_dir):
        changes = entry.get("changes") or {}
        left_out = sorted(k for k in changes if not is_training_setting(k))
        for key, pair in changes.items():
            if key not in left_out:
                changed[key] = pair[1]
        commands.append((base + [override(k, v) for k, v in changed.items()], entry, left_out))
    return commands


def resume_from(out: str, entry: dict) -> tuple:
    """(the resume= value for a leg, a note or ""): the replay's own checkpoint of the step the run resumed
    from when that was before the end of the previous leg and the checkpoint is kept; else its latest."""
    step = entry.get("step")
    try:
        end = layout.read_state(layout.RunDir(out).checkpoints)["global_step"]
    except layout.StateProblem:
        end = None
    if not isinstance(step, int) or end is None or step >= end:
        return "true", "" if isinstance(step, int) else "history.json records no step (an earlier version): "
    kept = layout.RunDir(out).checkpoint(f"step_{step:08d}.ckpt")
    if os.path.isfile(kept):
        return kept, ""
    return "true", f"the run resumed at step {step}, whose checkpoint the replay did not keep (it resumes at {end}): "


def _off_by(x, y) -> float:
    """|x - y| for two recorded numbers: 0 for the same value (two NaNs at one step too, as a bit-identical
    replay gives), inf where only one is NaN or either is not a number."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
    if not numeric:
        return 0.0 if x == y else math.inf
    if math.isnan(x) or math.isnan(y):
        return 0.0 if math.isnan(x) and math.isnan(y) else math.inf
    return 0.0 if x == y else abs(x - y)  # inf == inf: the same


def check_atol(atol) -> float:
    """atol as a tolerance: a finite number >= 0, else UserError (NaN or a negative one would pass any run)."""
    try:
        value = float(atol)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise UserError(
            f"--atol {atol}: a tolerance is a finite number >= 0 (the largest difference a reproduced loss or "
            "metric may have; default 1e-6). NaN or a negative tolerance would make every comparison pass or fail "
            "whatever the numbers."
        )
    return value


def replay_differences(original: dict, replayed: dict, atol: float) -> List[str]:
    """What differs between two metrics.json beyond atol: the loss curve, val_accuracy, val_loss, steps."""
    atol = check_atol(atol)
    problems = []
    a, b = original.get("loss_curve") or [], replayed.get("loss_curve") or []
    if len(a) != len(b):
        problems.append(f"loss curve of {len(a)} steps, the replay's {len(b)}")
    else:
        worst = max((_off_by(x, y) for x, y in zip(a, b)), default=0.0)
        if not worst <= atol:
            problems.append(f"loss curve differs by up to {worst:.3g} (tolerance {atol:g})")
    for key in ("val_accuracy", "val_loss", "steps"):
        x, y = original.get(key), replayed.get(key)
        if not _off_by(x, y) <= atol:
            problems.append(f"{key} {x} vs {y}")
    return problems


def replay_run(run_dir: str, out: Optional[str] = None, atol: float = 1e-6) -> int:
    """Re-run the run's config.yaml, then each recorded resume in order, into out; compare the result.
    0 when it reproduces the run's loss curve and metrics within atol, 1 when not, the leg's exit status
    when a leg fails."""
    atol = check_atol(atol)
    info = status.read_run(run_dir)
    if info.status in (status.FOREIGN, status.HALF_WRITTEN, status.TOO_OLD) or not info.config:
        raise UserError(f"{run_dir} cannot be replayed: it is {info.status} ({info.detail}).")
    if info.status == status.RUNNING:
        raise UserError(f"{run_dir} is still running ({info.detail}); replay it when it has ended.")
    out = os.path.abspath(out or os.path.join(run_dir, f"replay-{time.strftime('%Y-%m-%d_%H-%M-%S')}"))
    if os.path.lexists(out) and not (os.path.isdir(out) and not os.path.islink(out) and not os.listdir(out)):
        raise UserError(f"--out {out} already exists and is not an empty directory; a replay writes into a new one.")
    with tempfile.TemporaryDirectory(prefix="runner-replay-") as where:
        code = _replay_legs(legs(run_dir, out, replay_source(run_dir, where)), out)
    if code is not None:
        return code
    if info.status != status.FINISHED or not info.metrics:
        print(f"replay: done in {out}; {run_dir} is {info.status}, so there is nothing of its own to compare.")
        return 0
    try:
        replayed = layout.read_metrics(out)
        if not isinstance(replayed, dict):
            raise layout.RecordProblem("missing" if replayed is None else "not an object")
    except layout.RecordProblem as e:
        print(f"replay: {out} has no readable metrics.json ({e}).", flush=True)
        return 1
    problems = replay_differences(info.metrics, replayed, atol)
    if problems:
        print(f"replay: {out} differs from {run_dir}: {'; '.join(problems)}.", flush=True)
        return 1
    print(
        f"replay: {out} reproduces {run_dir}: {len(replayed.get('loss_curve') or [])} losses, val_accuracy "
        f"{replayed.get('val_accuracy')} and val_loss {replayed.get('val_loss')} within {atol:g}.",
        flush=True,
    )
    return 0


def _replay_legs(commands: List[tuple], out: str) -> Optional[int]:
    """Run each leg into out; the exit status of the first that fails, None when all ran."""
    for i, (args, entry, left_out) in enumerate(commands):
        what = "its config.yaml (training settings)" if i == 0 else f"resume {i} of {len(commands) - 1}"
        if left_out:
            print(
                f"replay: {what}: history.json records {', '.join(left_out)}, which "
                f"{'is' if len(left_out) == 1 else 'are'} no training setting: left out (a replay writes only {out}).",
                flush=True,
            )
        if entry is not None:
            target, note = resume_from(out, entry)
            args = args + [override("resume", target) if target != "true" else "resume=true"]
            if note:
                print(f"replay: {what}: {note}the result may differ from the run's.", flush=True)
        print(f"replay: {what}: python -m runner {' '.join(args)}", flush=True)
        proc = subprocess.run([sys.executable, "-m", "runner", *args])
        if proc.returncode != 0:
            print(f"replay: {what} ended with exit status {proc.returncode}; {out} holds the legs so far.", flush=True)
            return proc.returncode
    return None


# ---------------------------------------------------------------------------------------------------
# The command line.

if __name__ == "__main__":  # `python -m runner.runs`: the console script's function (runner/cli/commands.py)
    from runner.cli.commands import runs

    runs()
