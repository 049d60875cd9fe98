"""The compile cache: one directory per key of what makes the graphs and of the sequence a process compiles;
hit, miss, invalidation, a resume that only reports, fallbacks. The CLI runs are subprocesses: in a
pytest-xdist worker MindSpore has no entry script and the cache is off (compile_cache._entry_script)."""

import shutil
from pathlib import Path

import pytest
from conftest import TINY, cli_in_process, compose_cfg, metrics, run_cli

from runner.training import compile_cache

TRAIN = {"graph": "train", "input": [32, 1, 8, 8], "classes": 10, "soft_labels": False, "steps_per_epoch": 44}
EVAL = {"graph": "eval", "samples": 359, "batch": 32, "classes": 10}


def _key(*overrides, **where):
    place = {"purpose": "train", "target": "CPU", "rank": 0, "world": 1, "conv": "onednn", "isa": "None", **where}
    place.setdefault("graphs", [TRAIN, EVAL])
    return compile_cache.key(compose_cfg(*TINY, *overrides), **place)


def test_the_key_changes_with_what_makes_the_graph_and_only_with_it():
    base = _key()
    # Each of these reaches a graph (shapes, operators, constants, the device or the command)...
    changed = {
        "batch_size": _key("batch_size=16"),
        "model": _key("model=resnet20"),
        "amp": _key("amp=o2"),
        "loss scale": _key("amp.loss_scale.type=fixed"),
        "jit_level": _key("mode.jit_level=O1"),
        "padding": _key("padding.height=12"),
        "epochs (the schedule's constants)": _key("epochs=2"),
        "conv path": _key(conv="native"),
        "rank": _key(rank=1, world=2),
        "device": _key(target="GPU"),
        "command": _key(purpose="evaluate"),
        # MindSpore hands a process its n-th cached graph for its n-th compile: a resume that only reports
        # compiles the evaluation first, and must not be handed the train step.
        "a resume that only reports": _key(graphs=[EVAL]),
        "no evaluation": _key(graphs=[TRAIN]),
        "the data's size (the schedule's constants)": _key(graphs=[{**TRAIN, "steps_per_epoch": 40}, EVAL]),
        "soft labels (mixup)": _key(graphs=[{**TRAIN, "soft_labels": True}, EVAL]),
        "another validation set": _key(graphs=[TRAIN, {**EVAL, "samples": 300}]),
        # Settings that change the operators (a cached graph names the ones it was compiled with).
        "the plain body": _key("model.blocked_body=false"),
        "every layer on oneDNN's convolution": _key("model.blocked_layers=onednn"),
    }
    assert base not in changed.values() and len(set(changed.values())) == len(changed), changed
    # ...these do not: a sweep over them, or a resume with another log interval, reuses the graphs.
    assert _key("seed=3", "optim.lr=0.05", "log_every=7", "experiment_name=x", "save_checkpoint=false") == base


def test_a_dir_with_the_cache_disabled_is_refused(tmp_path):
    proc = cli_in_process(
        f"hydra.run.dir={tmp_path}", "compile_cache.enabled=false", "compile_cache.dir=/x", "dry_run=true"
    )
    assert proc.returncode == 2 and "compile_cache.dir=/x does nothing" in " ".join(proc.stderr.split())


@pytest.mark.slow
def test_miss_then_hit_then_a_changed_field_misses_and_a_corrupt_graph_is_recompiled(tmp_path):
    cache = tmp_path / "cache"
    args = [*TINY, "eval=false", f"compile_cache.dir={cache}"]  # on by default
    first = run_cli(tmp_path / "a", *args)
    second = run_cli(tmp_path / "b", *args)
    # MindSpore's own warnings about the cache's files (a missing hash file, "correctness risks") stay off the
    # default path's screen: the run's one line says what the cache did.
    assert "[WARNING] PIPELINE" not in first.stderr + second.stderr, first.stderr[-2000:]
    a, b = metrics(tmp_path / "a"), metrics(tmp_path / "b")
    assert a["compile_cache"]["state"] == "miss" and b["compile_cache"]["state"] == "hit"
    assert a["compile_cache"]["dir"] == b["compile_cache"]["dir"]
    assert "compile cache hit" in second.stdout + second.stderr and ", cache hit)" in second.stdout
    assert b["compile_cache"]["compile_seconds_without_cache"] == pytest.approx(a["compile_seconds"])
    assert b["compile_cache"]["compile_seconds_with_cache"] == pytest.approx(b["compile_seconds"])
    assert b["loss_curve"] == a["loss_curve"]  # the cached graph computes what the compiled one did
    # One graph-relevant field changed: another directory, filled anew; the first one is not read.
    run_cli(tmp_path / "c", *args, "batch_size=16")
    c = metrics(tmp_path / "c")
    assert c["compile_cache"]["state"] == "miss" and c["compile_cache"]["dir"] != a["compile_cache"]["dir"]
    # A graph file cut short: MindSpore cannot load it, compiles anew, and the run says so.
    (graph,) = Path(a["compile_cache"]["dir"]).glob("rank_0/graph_cache/compile_cache_0.mindir")
    graph.chmod(0o600)
    graph.write_bytes(graph.read_bytes()[:3000])
    fourth = run_cli(tmp_path / "d", *args, env={"MS_SUBMODULE_LOG_v": "{PIPELINE:2}"})  # the user's level wins
    assert "[WARNING] PIPELINE" in fourth.stderr
    d = metrics(tmp_path / "d")
    assert d["compile_cache"]["state"] == "miss" and d["compile_cache"]["unusable"]
    assert "MindSpore could not use the graphs there" in fourth.stdout + fourth.stderr
    assert d["loss_curve"] == a["loss_curve"]
    assert not list(cache.glob("*/.filling-*"))  # every fill was moved into place


@pytest.mark.slow
def test_a_sweep_shares_the_graphs_and_a_resume_that_only_reports_gets_its_own(tmp_path):
    cache = tmp_path / "cache"
    # Two sweep jobs (each its own process, the default launcher) differing in what never reaches a graph.
    run_cli(tmp_path / "sweep", *TINY, "seed=0,1", f"compile_cache.dir={cache}", multirun=True)
    first, second = metrics(tmp_path / "sweep" / "0"), metrics(tmp_path / "sweep" / "1")
    assert first["compile_cache"]["state"] == "miss" and first["compile_cache"]["sequence"] == ["train", "eval"]
    assert second["compile_cache"]["state"] == "hit" and second["compile_cache"]["dir"] == first["compile_cache"]["dir"]
    assert second["compile_count"] == 1  # the train step's graph, loaded from the cache instead of compiled
    # A run interrupted after its last step, resumed: that process compiles the evaluation's graphs only. The
    # cache filled by training (train step first) must not serve it: it gets a directory of its own, and the
    # numbers are those of the run that evaluated after compiling everything itself (no cache).
    for name, state in (("only-reports", "miss"), ("again", "hit")):
        run = tmp_path / name
        shutil.copytree(
            tmp_path / "sweep" / "0", run, ignore=shutil.ignore_patterns(".runner.complete", "metrics.json")
        )
        proc = run_cli(run, *TINY, "seed=0", "resume=true", f"compile_cache.dir={cache}")
        assert "finishing the evaluation and report" in proc.stdout + proc.stderr
        m = metrics(run)
        assert m["compile_cache"]["state"] == state and m["compile_cache"]["sequence"] == ["eval"], m["compile_cache"]
        assert m["compile_cache"]["dir"] != first["compile_cache"]["dir"]
        assert (m["val_accuracy"], m["val_loss"]) == (first["val_accuracy"], first["val_loss"])
    assert not list(cache.glob("*/.filling-*"))


@pytest.mark.slow
def test_an_unwritable_cache_dir_is_one_line_and_the_run_trains(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = run_cli(tmp_path / "run", *TINY, "eval=false", f"compile_cache.dir={blocker}")
    # One line (a warning: the summary repeats it under the last line).
    said = {
        ln.split("compile cache off: ", 1)[1] for ln in (proc.stdout + proc.stderr).splitlines() if "cache off: " in ln
    }
    assert len(said) == 1 and str(blocker) in said.pop()
    m = metrics(tmp_path / "run")
    assert m["compile_cache"]["state"] == "off" and m["final_loss"] < m["loss_curve"][0]


# Two cells MindSpore cannot tell apart in its cache: it checks neither the cell nor the input shapes.
_ORDER_SCRIPT = """
import os, sys
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

class Double(nn.Cell):
    def construct(self, x):
        return x * 2

class Plus100(nn.Cell):
    def construct(self, x):
        return x + 100

ms.set_context(mode=ms.GRAPH_MODE)
for step in sys.argv[2]:
    if step == "+":  # the cache on from here, as the runner sets it just before its keyed sequence
        os.environ.update(MS_COMPILER_CACHE_ENABLE="1", MS_COMPILER_CACHE_PATH=sys.argv[1])
        continue
    cell = Double() if step == "d" else Plus100()
    print(step, float(cell(Tensor(np.ones(2, np.float32))).asnumpy()[0]))
"""


@pytest.mark.slow
def test_mindspore_hands_out_cached_graphs_by_the_order_of_cached_compiles(tmp_path):
    """What the runner's key must cover (docs/mindspore-notes.md#compile-cache), asserted on the MindSpore
    installed: a later process gets its n-th cached graph from the n-th compile of the process that filled
    the directory, whatever the cell; compiles before the cache is switched on are not counted."""
    import subprocess
    import sys

    script = tmp_path / "order.py"
    script.write_text(_ORDER_SCRIPT)

    def run(cache, steps):
        out = subprocess.run([sys.executable, str(script), str(cache), steps], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        return [line for line in out.stdout.splitlines() if line[:2] in ("d ", "p ")]

    assert run(tmp_path / "a", "+dp") == ["d 2.0", "p 101.0"]
    assert run(tmp_path / "a", "+p") == ["p 2.0"]  # handed Double's graph: the wrong answer, no warning
    # Compiled before the cache was on: not numbered (the runner's suspended() relies on this). Plus100 fills
    # file 0; a process that compiles Plus100 uncached, then Double cached, is handed file 0 for Double.
    assert run(tmp_path / "b", "d+p") == ["d 2.0", "p 101.0"]
    assert run(tmp_path / "b", "p+d") == ["p 101.0", "d 101.0"]
    assert [f.name for f in (tmp_path / "b").glob("rank_0/graph_cache/*.mindir")] == ["compile_cache_0.mindir"]
