"""The compatibility subset's own tests (`make test-compat` runs every test marked compat on each MindSpore
release the package index offers): what a user does with one run, end to end, on the installed MindSpore.

The pinned graph run and the pynative/jit runs are tests/test_train.py's, marked compat there.
"""

import csv
import json
import math
from pathlib import Path

import pytest
from conftest import TINY, compose_cfg, metrics, outputs_of, run_cli, run_module

pytestmark = pytest.mark.compat


def _mindspore_lib() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("mindspore")
    assert spec is not None and spec.submodule_search_locations
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


def test_the_default_config_composes_and_validates():
    from runner.config.checks import validate

    cfg = compose_cfg("amp=o2", "amp.loss_scale.type=dynamic")
    validate(cfg)
    assert (cfg.mode.name, cfg.amp.level, cfg.amp.loss_scale.type, cfg.model.conv) == ("graph", "O2", "dynamic", "best")


@pytest.mark.slow
def test_amp_o2_with_a_dynamic_loss_scale_trains(tmp_path):
    run_cli(tmp_path, *TINY, "amp=o2", "amp.loss_scale.type=dynamic", "amp.loss_scale.init=256", "eval=false")
    m = metrics(tmp_path)
    assert (m["amp_level_used"], m["loss_scale"]["type"]) == ("O2", "dynamic")
    assert math.isfinite(m["final_loss"]) and m["final_loss"] < m["loss_curve"][0]


@pytest.mark.slow
def test_resume_then_evaluate_and_export_mindir(tmp_path):
    run = tmp_path / "run"
    first = run_cli(run, *TINY, "eval=false")
    # model.conv=best says in one line which convolutions run (a warning: repeated under the summary line);
    # where this MindSpore lacks the oneDNN 3.x library the onednn path links (2.7 ships libdnnl.so.2), that
    # line names the version and cites no file.
    said = {
        ln.split("model.conv=best runs", 1)[1] for ln in (first.stdout + first.stderr).splitlines() if "best runs" in ln
    }
    if not (_mindspore_lib() / "libdnnl.so.3").is_file():
        from runner.models.onednn import mindspore_version

        assert len(said) == 1 and f"MindSpore {mindspore_version()} ships" in said.pop(), said
        assert "BENCHMARKS.md" not in first.stdout + first.stderr
    run_cli(run, *[a.replace("epochs=1", "epochs=2") for a in TINY], "resume=true")
    m = metrics(run)
    assert m["steps"] == 88 and m["resumed_from"] and m["val_accuracy"] > 0.5
    ev = outputs_of(run_module("runner.evaluate", f"run={run}"))
    assert json.loads((ev / "metrics.json").read_text())["top1"] == pytest.approx(m["val_accuracy"], abs=1e-6)
    out = outputs_of(run_module("runner.export", f"run={run}", "format=mindir", "parity_samples=8"))
    record = json.loads((out / "export.json").read_text())
    assert (out / "model.mindir").stat().st_size > 0 and record["parity_ok"]


@pytest.mark.slow
def test_a_tiny_sweep(tmp_path):
    run_cli(tmp_path, *TINY, "eval=false", "mode=graph,pynative", multirun=True)
    rows = list(csv.DictReader(open(tmp_path / "summary.csv")))
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert [metrics(tmp_path / str(i))["mode"] for i in (0, 1)] == ["graph", "pynative"]
