"""MindSpore's compile cache, one directory per key of what makes the graphs (docs/compile-cache.md).

MindSpore saves the n-th graph a process compiles while MS_COMPILER_CACHE_ENABLE=1 as
`rank_<id>/graph_cache/compile_cache_<n>.mindir` under MS_COMPILER_CACHE_PATH, and a later process loads its
n-th such graph from the n-th file, checking only the hashes of the Python files it depends on: not the
cell, not the input shapes (docs/mindspore-notes.md#compile-cache). A process that compiles another graph
first is handed the wrong one and computes garbage. So the runner keys the directory on everything that
goes into the graphs AND on the sequence of graphs the process compiles through the cache (`graphs`: train
then eval, eval only, one command's), lets exactly those compiles through (suspended() for any other), and
publishes a directory only once its whole sequence compiled (finish(complete=True)).
"""

import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
from pathlib import Path
from typing import Iterator, List, Optional

from runner.config.optim_options import OPTIMIZERS, SCHEDULES
from runner.config.schema import outside_graph

log = logging.getLogger("runner")

ENABLE_VAR = "MS_COMPILER_CACHE_ENABLE"
PATH_VAR = "MS_COMPILER_CACHE_PATH"
RECORD = "compile.json"  # in the key's directory: the compile time of the run that filled it
# Config keys that do not reach a graph by themselves, as the schema marks them (runner/config/schema.py GRAPH):
# naming, logging, files, the seed of the data order and
# the initial weights (parameters), optim.lr (the schedule's `learning_rate` Parameter: runner/training/optim.py).
# The data's location, size and augmentation reach the graphs only through what the sequence records
# (`graphs`: input shape, classes, soft labels, steps per epoch, validation batches). Everything else is in the
# key, and so are the constants the built cells hold (graph_constants): where one of these keys does reach a
# graph after all (min_lr/lr inside a cosine schedule, the seed inside a Dropout), it is there as a constant.
NOT_IN_GRAPH = outside_graph()
_first_in_process: dict = {}


def training_graphs(data, batch: int, total_steps: int, trains: bool, evaluates: bool) -> List[dict]:
    """The graphs a training process compiles, in order: the train step (unless a resume only reports), then
    the evaluation's (one per batch shape of the validation set). What the data decides about them is here:
    input shape and labels, the schedule's constants (steps per epoch and in all), the validation batches."""
    graphs: List[dict] = []
    if trains:
        graphs.append(
            {
                "graph": "train",
                "input": [batch, data.channels, data.height, data.width],
                "classes": data.num_classes,
                "soft_labels": bool((data.augment or {}).get("soft_labels")),
                "steps_per_epoch": data.steps_per_epoch,
                "total_steps": total_steps,
            }
        )
    if evaluates and data.val_size:
        graphs.append({"graph": "eval", "samples": data.val_size, "batch": batch, "classes": data.num_classes})
    return graphs


def source_digest() -> str:
    """A digest of the runner's own Python files (runner, models, datasets): they build the graphs; of the
    operators' C++ source (models/csrc), whose library each cached graph names; and of the packages whose
    optimizers and schedules are installed (runner/config/options.py): their builders build graphs too."""
    digest = hashlib.sha256()
    # runner/ is two folders up from here (not `import runner`: the package's __init__ is above every layer)
    roots = [Path(__file__).resolve().parents[1], *(Path(m.__file__).parent for m in _layers())]
    for root in [*roots, *OPTIMIZERS.installed_sources(), *SCHEDULES.installed_sources()]:
        if root.is_file():  # an installed option's single-module package
            digest.update(f"{root.name}\0".encode() + root.read_bytes())
            continue
        for f in sorted([*root.rglob("*.py"), *root.glob("csrc/*.cc"), *root.glob("csrc/*.h")]):
            digest.update(f"{f.relative_to(root)}\0".encode() + f.read_bytes())
    return digest.hexdigest()


def _layers():
    import runner.datasets
    import runner.models

    return [runner.models, runner.datasets]


_SCALARS = (int, float, bool, str, type(None))
# Cell attributes MindSpore itself sets as a cell is called or wrapped, not constants of its graph (the train
# and eval graphs' difference is the sequence's `graph`).
_BOOKKEEPING = frozenset({"training", "arguments_key", "is_top_cell", "grad_ops_label", "cell_type"})
# Primitive attributes that hold a random seed: a graph with one depends on the run's seed.
_SEED_ATTRS = ("seed", "seed2", "Seed0", "Seed1")


def _plain(value, depth: int = 0):
    """`value` if it is a scalar or a (nested) sequence of them, else None."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (tuple, list)) and depth < 3:
        items = [_plain(v, depth + 1) for v in value]
        return items if all(i is not None or v is None for i, v in zip(items, value)) else None
    return None


def graph_constants(*cells) -> list:
    """What the built cells put into their graphs as constants: for every cell (network, optimizer and its
    schedule, the train step's wrappers), its class and its public scalar attributes (a conv's chosen path,
    a schedule's min_lr/lr, a BatchNorm's momentum), and every primitive it holds with its attributes (a
    Dropout's seeds, a Custom operator's library path). The key hashes this list: a setting that changes a
    graph's constant changes the key without being listed anywhere."""
    from mindspore.ops.primitive import Primitive

    out: list = []
    seen: set = set()
    for root_cell in cells:
        if root_cell is None:
            continue
        for name, cell in root_cell.cells_and_names():
            if id(cell) in seen:
                continue
            seen.add(id(cell))
            attrs, prims = {}, []
            for k, v in sorted(vars(cell).items()):
                if k.startswith("_") or k in _BOOKKEEPING:
                    continue
                if isinstance(v, Primitive):
                    func = getattr(v, "func", None)  # a Custom operator's "library.so:Function"
                    prims.append([k, type(v).__name__, {a: str(x) for a, x in sorted(v.attrs.items())}, str(func)])
                elif _plain(v) is not None or v is None:
                    attrs[k] = _plain(v)
            out.append([name, f"{type(cell).__module__}.{type(cell).__qualname__}", attrs, prims])
    return out


def holds_seeds(constants: list) -> bool:
    """Whether a primitive among `constants` (graph_constants) takes a random seed."""
    return any(any(a in p[2] for a in _SEED_ATTRS) for entry in constants for p in entry[3])


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


def key(
    cfg,
    *,
    purpose: str,
    graphs: list,
    target: str,
    rank: int,
    world: int,
    conv: str,
    isa: str,
    extra=None,
    constants: Optional[list] = None,
) -> str:
    """The directory name for these graphs: MindSpore's version, the runner's source, the graph-relevant
    config, the command (`purpose`, with its own settings in `extra`), the sequence of graphs the process
    compiles through the cache (`graphs`), device, rank, conv path, ISA cap and the
    built cells' constants (graph_constants). The seed joins it where a primitive takes a seed, and for a zoo
    model, whose construct (not ours to read) may call a random function that bakes one in."""
    import mindspore as ms

    seeded = holds_seeds(constants or []) or cfg.model.get("style") == "mindcv"
    parts = {
        "mindspore": ms.__version__,
        "source": source_digest(),
        "config": graph_config(cfg),
        "purpose": purpose,
        "graphs": graphs,
        "extra": extra or {},
        "target": target,
        "rank": [rank, world],
        "conv": conv,
        "isa": isa,
        "constants": constants or [],
        "seed": cfg.get("seed") if seeded else None,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def root(cfg) -> Path:
    """compile_cache.dir, else the user cache directory's compile-cache/ (models/onednn.py cache_dir)."""
    from runner.models.onednn import cache_dir

    return Path(cfg.compile_cache.dir).expanduser() if cfg.compile_cache.dir else cache_dir() / "compile-cache"


def unsafe_reason(top: Path) -> Optional[str]:
    """Why another user could change what the cache directory `top` holds, or None. A cached graph names the
    operator library it loads: whoever can write an entry (or swap the directory) chooses the code the next
    run executes. So `top` must be this user's and writable by no one else, and no directory above it may
    let others replace it (writable by others without the sticky bit that /tmp has)."""
    uid = os.getuid()
    st = top.stat()
    if st.st_uid != uid:
        return f"{top} belongs to another user (uid {st.st_uid}), who could put graphs there that load their code"
    if st.st_mode & 0o022:
        return (
            f"{top} is writable by other users (mode {st.st_mode & 0o777:o}): a graph there names the library it "
            f"loads, so they could make this run execute their code; make it private (chmod 700 {top}) or set "
            "compile_cache.dir to a directory of your own"
        )
    for parent in top.resolve().parents:
        pst = parent.stat()
        if pst.st_mode & 0o002 and not pst.st_mode & 0o1000:
            return f"{parent}, above {top}, is writable by everyone without the sticky bit: anyone could replace it"
    return None


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


LOG_VAR = "MS_SUBMODULE_LOG_v"
# MindSpore's PIPELINE module warns on every compile through the cache, on stderr and in its own words: on a
# first run "Open the hash file ... failed ... No such file" and "Check the consistency of dependency files
# hash failed", on a hit "Use the compilation cache ... Be aware of correctness risks". The run's own line
# says what the cache did (hit, miss, why), so the default path keeps MindSpore's pipeline to its errors.
QUIET_PIPELINE = "{PIPELINE:3}"


def quiet_messages(cfg) -> bool:
    """Lower MindSpore's PIPELINE log to errors when the cache may be used; whether it did. Before MindSpore
    loads (its logger reads MS_SUBMODULE_LOG_v once); a log level the user set (MS_SUBMODULE_LOG_v, GLOG_v)
    wins."""
    import sys

    if not cfg.compile_cache.enabled or cfg.mode.name == "pynative" or "mindspore" in sys.modules:
        return False
    if LOG_VAR in os.environ or "GLOG_v" in os.environ:
        return False
    os.environ[LOG_VAR] = QUIET_PIPELINE
    return True


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


def _filling_name() -> str:
    # The host too: compile_cache.dir may be a disk the nodes of a cluster share, where pids are per node.
    return f".filling-{socket.gethostname()}-{os.getpid()}"


def _sweep_abandoned(where: Path) -> None:
    """Remove what killed processes of this host left half-filled under `where` (never published)."""
    prefix = f".filling-{socket.gethostname()}-"
    for d in where.glob(prefix + "*"):
        pid = d.name[len(prefix) :]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass  # alive, another user's


def _jobs_share_this_process() -> bool:
    """A multirun whose jobs run one after another in this process (Hydra's basic launcher)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hydra = HydraConfig.get()
    except (ImportError, ValueError):  # no Hydra job: the Python API
        return False
    return str(hydra.mode) == "RunMode.MULTIRUN" and "BasicLauncher" in str(hydra.launcher.get("_target_", ""))


def _refusal(cfg, graphs: list) -> Optional[str]:
    """Why this process cannot use the cache, or None (the silent cases say '' and are not logged)."""
    if not cfg.compile_cache.enabled:
        return ""
    if cfg.mode.name == "pynative":
        return ""  # nothing compiles
    if not graphs:
        return "this process compiles no graph"
    if _jobs_share_this_process():
        return (
            "hydra/launcher=basic runs every job in this one process, and after MindSpore loaded graphs from its "
            "cache the next job's train step compiles twice (seen: compile_count 2); the default launcher "
            "(isolated) runs each job in its own process, with the cache"
        )
    if _first_in_process:
        return (
            "an earlier run in this Python process used it, and MindSpore fixes the cache's directory and numbers "
            "its graphs once per process (run it in its own process to use the cache)"
        )
    entry = _entry_script()
    if entry is not None:
        return entry
    if cfg.padding.name != "fixed":
        return (
            f"padding={cfg.padding.name} compiles one graph per input shape in the order the data brings them, "
            "and MindSpore matches cached graphs by order; padding=fixed uses it"
        )
    return None


def prepare(
    cfg,
    *,
    purpose: str,
    graphs: list,
    target: str,
    rank: int = 0,
    world: int = 1,
    conv: str = "",
    isa: str = "",
    extra=None,
    cells=(),
):
    """Point MindSpore's compile cache at this key's directory just before the first of `graphs` compiles
    (nothing compiled earlier in the process goes through it); the record finish() completes
    ({"state": "off"|"filling"|"reusing", "dir", "key", ...}). `cells`: the built cells whose graphs these are
    (network, train step), whose constants join the key."""
    why = _refusal(cfg, graphs)
    if why is not None:
        return _off(why or "compile_cache.enabled=false or mode=pynative", quiet=not why)
    constants = graph_constants(*cells)
    k = key(
        cfg,
        purpose=purpose,
        graphs=graphs,
        target=target,
        rank=rank,
        world=world,
        conv=conv,
        isa=isa,
        extra=extra,
        constants=constants,
    )
    top = root(cfg)
    where = top / k
    refused = _open_entry(cfg, top, where)
    if refused is not None:
        return refused
    _sweep_abandoned(where)
    graphs_dir = where / "graphs"
    before = _graphs(graphs_dir)
    # A run that fills the cache writes into a directory of its own, moved into place once its whole
    # sequence compiled: a run started meanwhile with the same key never reads a half-written or partial one.
    target_dir = graphs_dir if before else where / _filling_name()
    _first_in_process["purpose"] = purpose
    os.environ[ENABLE_VAR] = "1"
    os.environ[PATH_VAR] = str(target_dir)
    return {
        "state": "reusing" if before else "filling",
        "dir": str(graphs_dir),
        "into": str(target_dir),
        "key": k,
        "before": before,
        "sequence": [g.get("graph") for g in graphs],
    }


def _open_entry(cfg, top: Path, where: Path) -> dict | None:
    """Make the key's directory, private and writable; the off record saying why where it cannot be used."""
    try:
        top.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not cfg.compile_cache.dir and top.stat().st_uid == os.getuid():
            top.chmod(0o700)  # the runner's own directory, made private (an older runner made it with the umask)
        unsafe = unsafe_reason(top)
        if unsafe:
            log.warning(
                "compile cache off: %s; compiling without it (docs/compile-cache.md#a-private-directory).", unsafe
            )
            return _off(unsafe, quiet=True)
        where.mkdir(mode=0o700, exist_ok=True)
        probe = where / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        log.warning("compile cache off: cannot write %s (%s); compiling without it.", where, e.strerror or e)
        return _off(f"cannot write {where}", quiet=True)
    return None


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Compiles in this block bypass the cache (MindSpore reads MS_COMPILER_CACHE_ENABLE at every compile and
    numbers only the cached ones): graphs outside the keyed sequence, such as the NaN diagnosis's."""
    was = os.environ.pop(ENABLE_VAR, None)
    try:
        yield
    finally:
        if was is not None:
            os.environ[ENABLE_VAR] = was


def _publish(record: dict, complete: bool) -> bool:
    """Move a filled directory into place when its whole sequence compiled (`complete`, returned); else drop it."""
    filled, where = Path(record["into"]), Path(record["dir"])
    if complete and _graphs(filled):
        try:
            os.rename(filled, where)  # fails when another run filled it first: keep theirs
        except OSError:
            pass
    shutil.rmtree(filled, ignore_errors=True)
    return complete


def finish(record: dict, compile_seconds: Optional[float], device_target: str, complete: bool = True) -> dict:
    """What the cache did, for metrics.json: state hit | miss | off, with the compile time with and without it.
    Later compiles of this process no longer go through the cache.

    A hit: the graphs were there and MindSpore loaded them (left them unchanged). A miss: none were
    there (they are saved now, when `complete`: the process compiled its whole sequence), or MindSpore found
    them stale and compiled anew (it rewrites them)."""
    for var in (ENABLE_VAR, PATH_VAR):
        os.environ.pop(var, None)
    if record["state"] == "off":
        return {"state": "off", "reason": record["reason"]}
    where = Path(record["dir"])
    saved = _publish(record, complete) if record["state"] == "filling" else True
    after = _graphs(where)
    hit = bool(record["before"]) and all(after.get(p) == v for p, v in record["before"].items())
    out = {
        "state": "hit" if hit else "miss",
        "dir": record["dir"],
        "key": record["key"],
        "graphs": len(after),
        "sequence": record.get("sequence", []),
    }
    if not saved:
        out["saved"] = False  # the run stopped before its sequence compiled: nothing was kept
    if record["before"] and not hit:
        out["unusable"] = True  # MindSpore could not use them (stale or unreadable) and compiled anew
    if compile_seconds is None:  # evaluate, predict, export, a resume that only reports: no step timing
        return out
    if hit:
        out["compile_seconds_without_cache"] = _read_record(where.parent).get("compile_seconds")
        out["compile_seconds_with_cache"] = compile_seconds
    else:
        out["compile_seconds_without_cache"] = compile_seconds
        if after and saved:
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
    if state.get("state") == "miss" and not state.get("graphs") and state.get("saved") is not False:
        return f"compile cache miss ({state['dir']}): no graph was compiled through it."
    if state.get("state") == "miss" and state.get("saved") is False:
        return f"compile cache miss ({state['dir']}): the run ended before all its graphs compiled; none are kept."
    if state.get("state") == "miss":
        return f"compile cache miss ({state['dir']}): the graphs compiled now are saved there for the next run."
    return None
