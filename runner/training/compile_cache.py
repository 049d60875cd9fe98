"""MindSpore's compile cache, one directory per key of what makes the graphs (docs/compile-cache.md).

MindSpore saves each graph it compiles as `rank_<id>/graph_cache/compile_cache_<n>.mindir` under
MS_COMPILER_CACHE_PATH and loads the n-th graph of a later process from the n-th file, checking only the
hashes of the Python files it depends on: a changed batch size, AMP level or schedule would load the old
graph (docs/mindspore-notes.md#compile-cache). So the runner keys the directory on everything that goes
into the graphs, and uses it only where graphs are compiled in a known order: the first run of a process,
with fixed input shapes.
"""

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Optional

log = logging.getLogger("runner")

ENABLE_VAR = "MS_COMPILER_CACHE_ENABLE"
PATH_VAR = "MS_COMPILER_CACHE_PATH"
RECORD = "compile.json"  # in the key's directory: the compile time of the run that filled it
# Config keys that do not reach a graph: naming, logging, files, the data's location and pipeline, the
# seed of the data order and the initial weights (parameters, not graph constants), optim.lr (the
# schedule's `learning_rate` Parameter: runner/training/optim.py). Everything else is in the key.
NOT_IN_GRAPH = (
    "experiment_name",
    "logger",
    "save_checkpoint",
    "checkpoint",
    "dry_run",
    "resume",
    "init_from",
    "profile",
    "log_every",
    "early_stop",
    "validation",
    "ladder",
    "compile_cache",
    "seed",
    "optim.lr",
    "data.root",
    "data.num_parallel_workers",
    "data.on_bad_sample",
    "data.val_fraction",
    "data.num_samples",
    "augment",
)
_first_in_process: dict = {}


def source_digest() -> str:
    """A digest of the runner's own Python files (runner, models, datasets): they build the graphs."""
    digest = hashlib.sha256()
    # runner/ is two folders up from here (not `import runner`: the package's __init__ is above every layer)
    roots = [Path(__file__).resolve().parents[1], *(Path(m.__file__).parent for m in _layers())]
    for root in roots:
        for f in sorted(root.rglob("*.py")):
            digest.update(f"{f.relative_to(root)}\0".encode() + f.read_bytes())
    return digest.hexdigest()


def _layers():
    import runner.datasets
    import runner.models

    return [runner.models, runner.datasets]


def graph_config(cfg) -> dict:
    """The resolved config less NOT_IN_GRAPH: what the key hashes."""
    from omegaconf import OmegaConf

    tree: dict = dict(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))  # type: ignore[arg-type]
    for dotted in NOT_IN_GRAPH:
        *parents, last = dotted.split(".")
        node: dict = tree
        for p in parents:
            node = node.get(p) or {}
        node.pop(last, None)
    return tree


def key(cfg, *, purpose: str, target: str, rank: int, world: int, conv: str, isa: str, extra=None) -> str:
    """The directory name for these graphs: MindSpore's version, the runner's source, the graph-relevant
    config, the command (`purpose`, with its own settings in `extra`), device, rank, conv path and ISA cap."""
    import mindspore as ms

    parts = {
        "mindspore": ms.__version__,
        "source": source_digest(),
        "config": graph_config(cfg),
        "purpose": purpose,
        "extra": extra or {},
        "target": target,
        "rank": [rank, world],
        "conv": conv,
        "isa": isa,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def root(cfg) -> Path:
    """compile_cache.dir, else the user cache directory's compile-cache/ (models/onednn.py cache_dir)."""
    from runner.models.onednn import cache_dir

    return Path(cfg.compile_cache.dir).expanduser() if cfg.compile_cache.dir else cache_dir() / "compile-cache"


def _graphs(where: Path) -> dict:
    """{relative path: (size, mtime_ns)} of the compiled graphs MindSpore saved under `where`."""
    try:
        return {
            str(p.relative_to(where)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in where.glob("rank_*/graph_cache/compile_cache_*.mindir")
        }
    except OSError:
        return {}


def _off(reason: str, quiet: bool = False) -> dict:
    for var in (ENABLE_VAR, PATH_VAR):
        os.environ.pop(var, None)
    if not quiet:
        log.info("compile cache off: %s.", reason)
    return {"state": "off", "reason": reason}


def _entry_script():
    """Why MindSpore's cache cannot work in this process, or None. MindSpore lists the graph's source files
    from the entry script it noted when it loaded (sys.argv[0]) and reads that file at every compile: under
    `python -c`, a pytest-xdist worker or an embedding program it is no file, and the compile fails with
    FileNotFoundError (seen: '<cwd>/-c')."""
    from mindspore.graph import api

    path = getattr(api, "entry_script_path", None)
    if path is None or not os.path.isfile(path):
        return f"MindSpore's compile cache reads the entry script of this process ({path}), which is not a file"
    return None


def prepare(
    cfg, *, purpose: str, target: str, rank: int = 0, world: int = 1, conv: str = "", isa: str = "", extra=None
):
    """Point MindSpore's compile cache at this key's directory before the first graph compiles; the record
    finish() completes ({"state": "off"|"filling"|"reusing", "dir", "key", ...})."""
    first = not _first_in_process
    _first_in_process.setdefault("purpose", purpose)
    if not cfg.compile_cache.enabled:
        return _off("compile_cache.enabled=false", quiet=True)
    if cfg.mode.name == "pynative":
        return _off("mode=pynative compiles no graph", quiet=True)
    if not first:
        return _off(
            "an earlier run in this Python process compiled graphs, and MindSpore numbers the cached graphs per "
            "process (run it in its own process to use the cache)"
        )
    entry = _entry_script()
    if entry is not None:
        return _off(entry)
    if cfg.padding.name != "fixed":
        return _off(
            f"padding={cfg.padding.name} compiles one graph per input shape in the order the data brings them, "
            "and MindSpore matches cached graphs by order; padding=fixed uses it"
        )
    k = key(cfg, purpose=purpose, target=target, rank=rank, world=world, conv=conv, isa=isa, extra=extra)
    where = root(cfg) / k
    try:
        where.mkdir(parents=True, exist_ok=True)
        probe = where / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        log.warning("compile cache off: cannot write %s (%s); compiling without it.", where, e.strerror or e)
        return _off(f"cannot write {where}", quiet=True)
    graphs = where / "graphs"
    before = _graphs(graphs)
    # A run that fills the cache writes into a directory of its own, moved into place once it is done: a
    # run started meanwhile with the same key never reads a half-written graph.
    target_dir = graphs if before else where / f".filling-{os.getpid()}"
    os.environ[ENABLE_VAR] = "1"
    os.environ[PATH_VAR] = str(target_dir)
    return {
        "state": "reusing" if before else "filling",
        "dir": str(graphs),
        "into": str(target_dir),
        "key": k,
        "before": before,
    }


def finish(record: dict, compile_seconds: Optional[float], device_target: str) -> dict:
    """What the cache did, for metrics.json: state hit | miss | off, with the compile time with and without it.

    A hit: the graphs were there and MindSpore loaded them (left them unchanged). A miss: none were
    there (they are saved now), or MindSpore found them stale and compiled anew (it rewrites them)."""
    if record["state"] == "off":
        return {"state": "off", "reason": record["reason"]}
    where = Path(record["dir"])
    if record["state"] == "filling":
        filled = Path(record["into"])
        try:
            os.rename(filled, where)  # fails when another run filled it first: keep theirs
        except OSError:
            import shutil

            shutil.rmtree(filled, ignore_errors=True)
    after = _graphs(where)
    saved = _read_record(where.parent)
    hit = bool(record["before"]) and all(after.get(p) == v for p, v in record["before"].items())
    out = {"state": "hit" if hit else "miss", "dir": record["dir"], "key": record["key"], "graphs": len(after)}
    if record["before"] and not hit:
        out["unusable"] = True  # MindSpore could not use them (stale or unreadable) and compiled anew
    if compile_seconds is None:  # evaluate, predict, export: no step timing
        return out
    if hit:
        out["compile_seconds_without_cache"] = saved.get("compile_seconds")
        out["compile_seconds_with_cache"] = compile_seconds
    else:
        out["compile_seconds_without_cache"] = compile_seconds
        if after:
            _write_record(where.parent, {"compile_seconds": compile_seconds, "device_target": device_target})
    return out


def _read_record(where: Path) -> dict:
    try:
        return json.loads((where / RECORD).read_text())
    except (OSError, ValueError):
        return {}


def _write_record(where: Path, record: dict) -> None:
    try:
        (where / RECORD).write_text(json.dumps(record))
    except OSError as e:
        log.warning("compile cache: cannot record the compile time in %s (%s)", where, e.strerror or e)


def line(state: dict) -> Optional[str]:
    """The run's one line about the cache, or None when it was off."""
    if state.get("state") == "hit":
        without = state.get("compile_seconds_without_cache")
        was = f", {without:.1f} s when it was filled" if without is not None else ""
        took = state.get("compile_seconds_with_cache")
        return f"compile cache hit ({state['dir']})" + (
            f": compiling took {took:.1f} s{was}." if took is not None else "."
        )
    if state.get("state") == "miss" and state.get("unusable"):
        return (
            f"compile cache miss ({state['dir']}): MindSpore could not use the graphs there (unreadable or stale) "
            "and compiled anew; they are replaced."
        )
    if state.get("state") == "miss":
        return f"compile cache miss ({state['dir']}): the graphs compiled now are saved there for the next run."
    return None
