"""What every run measures: FLOPs from the layers, per-step curves, the plot, loggers, advice."""

import csv
import json
import math
import os
import subprocess
import sys

import pytest
from conftest import EVAL_OFF, REPO, TINY, compose_cfg, metrics, run_cli, run_in_process

from runner.report import advice
from runner.report.metrics import RunMetrics
from runner.report.sweep import JobRow


def test_the_peak_is_measured_once_per_machine_and_cached(tmp_path, monkeypatch):
    from runner.report.flops import machine_peak

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = machine_peak()
    # A measurement, not a speed: how fast this machine is (and how loaded) is the benchmarks' business.
    assert not first["cached"] and math.isfinite(first["gflops_per_s"]) and first["gflops_per_s"] > 0
    assert first["kernel"].startswith("numpy sgemm")
    again = machine_peak()
    assert again["cached"] and again["gflops_per_s"] == first["gflops_per_s"]
    # A run that achieved more than the cached peak (measured under load): measured again, the larger kept.
    higher = machine_peak(at_least=first["gflops_per_s"] * 1.01)
    assert not higher["cached"] and higher["gflops_per_s"] >= first["gflops_per_s"]
    # Another thread count is another machine; a corrupt cache file is measured again and rewritten.
    assert not machine_peak(threads=1)["cached"]
    (tmp_path / "mindspore-runner" / "peak.json").write_text("{not json")
    assert not machine_peak()["cached"] and machine_peak()["cached"]


def test_too_few_steps_record_no_compile_or_step_time():
    from runner.report.monitor import RunMonitor
    from runner.report.outputs import summary_line
    from runner.rundir.run_state import RunState

    # One step call (3.8 s: compile and step in one) cannot tell the compile from a steady step.
    mon = RunMonitor(log_every=1, total_steps=1, batch_size=64, state=RunState(call_ends=[1], call_seconds=[3.8]))
    t = mon.timing()
    assert t["compile_seconds"] is None and t["step_time_median_ms"] is None and t["throughput_samples_per_s"] is None
    assert t["first_call_seconds"] == 3.8 and t["steps"] == 1 and "one step call" in t["timing_note"]
    line = summary_line(RunMetrics(run_dir="/r", **t))
    assert "compile - (0x) | step - | - samples/s" in line
    # A resume that trained no step in this process reports none, not the earlier process's numbers.
    resumed = RunState({"global_step": 44, "step_time_ms": [900, 40]})
    mon = RunMonitor(log_every=1, total_steps=44, batch_size=64, state=resumed)
    t = mon.timing()
    assert t["compile_seconds"] is None and t["step_time_median_ms"] is None and "trained no step" in t["timing_note"]
    # Two calls: the second is the steady one.
    two = RunState(call_ends=[1, 2], call_seconds=[3.8, 0.5])
    mon = RunMonitor(log_every=1, total_steps=2, batch_size=64, state=two)
    t = mon.timing()
    assert t["compile_seconds"] == pytest.approx(3.3) and t["throughput_samples_per_s"] == pytest.approx(128)


@pytest.mark.slow
def test_a_command_in_a_long_lived_process_has_no_import_phase(tmp_path, tiny):
    # The command's function called in this test process (started long before it, for other things): its
    # age is not the command's import time, so that phase is None; the others are measured.
    proc = run_in_process(tmp_path, *tiny, *EVAL_OFF)
    s = metrics(tmp_path)["startup"]
    assert s["import"] is None and s["from"].startswith("command") and s["compose"] > 0 and s["build"] > 0
    assert s["total"] == pytest.approx(s["compose"] + s["build"] + s["first_step"], abs=0.01)
    assert f"first step after {s['total']:.1f} s" in proc.stdout


def test_flops_are_counted_from_layer_shapes():
    import mindspore as ms
    from mindspore import nn

    from runner.report.flops import forward_flops_per_sample

    ms.set_context(mode=ms.GRAPH_MODE)
    net = nn.SequentialCell(
        nn.Conv2d(2, 4, 3, stride=2, pad_mode="same"), nn.Conv2d(4, 4, 1, group=2), nn.Flatten(), nn.Dense(64, 10)
    )
    f = forward_flops_per_sample(net, 2, 8, 8)
    # 2 FLOPs per MAC: 4 out channels x 4x4 outputs x (2 in x 3x3), then grouped 1x1, then 64 -> 10.
    assert f["conv"] == 2 * 4 * 16 * 2 * 9 + 2 * 4 * 16 * 2 * 1
    assert f["dense"] == 2 * 64 * 10
    assert ms.get_context("mode") == ms.GRAPH_MODE  # the probe restores the mode it found


@pytest.mark.cpu_only
@pytest.mark.slow
def test_run_measures_curves_flops_and_writes_tensorboard(tmp_path, tiny):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # A loss scale that doubles every 2 good steps: its per-step curve must show the growth.
    over = ["amp=o2", "amp.loss_scale.window=2", "logger=tensorboard", "log_every=10", "eval=false"]
    run_in_process(tmp_path, *tiny, *over)
    m = metrics(tmp_path)
    assert m["compile_count"] == 1 and m["compile_seconds"] > 0
    assert m["step_time_p90_ms"] >= m["step_time_median_ms"] > 0
    assert 0 <= m["host_fraction"] < 1
    scales = m["loss_scale_curve"]
    # The scale each step used; window=2 doubles it after every 2 good steps.
    assert len(scales) == m["steps"] and scales[:5] == [1024, 1024, 2048, 2048, 4096]
    f = m["flops"]
    # resnet8, width 8, one 8x8 channel, by hand (2 FLOPs per MAC): stem 1->8 at 8x8; layer1 two 8->8
    # 3x3 at 8x8; layer2 8->16 and 16->16 3x3 at 4x4 plus the 1x1 projection; layer3 likewise at 2x2.
    stem, layer1 = 2 * 8 * 64 * 9, 2 * (2 * 8 * 64 * 8 * 9)
    layer2 = 2 * 16 * 16 * (8 * 9 + 16 * 9 + 8)
    layer3 = 2 * 32 * 4 * (16 * 9 + 32 * 9 + 16)
    assert f["forward_conv_per_sample"] == stem + layer1 + layer2 + layer3 == 386048
    assert f["forward_dense_per_sample"] == 2 * 32 * 10
    # Achieved FLOP/s excludes the compile, so it is at least the whole run's average rate.
    run_rate = f["train_per_sample"] * m["steps"] * m["batch_size"] / m["train_seconds"] / 1e9
    assert f["achieved_gflops_per_s"] >= run_rate > 0
    assert f["matmul_peak_gflops_per_s"] > 1 and f["utilization"] > 0  # may exceed 1: the peak is one sgemm
    assert f["peak"]["kernel"].startswith("numpy sgemm") and f["peak"]["gflops_per_s"] == f["matmul_peak_gflops_per_s"]
    assert m["peak_device_memory_mb"] is None  # the CPU reports none
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    loss = acc.Scalars("train_loss")
    assert [e.step for e in loss] == [s for s in range(10, m["steps"] + 1, 10)] + (
        [m["steps"]] if m["steps"] % 10 else []
    )
    assert acc.Scalars("final/throughput_samples_per_s")[0].value == pytest.approx(m["throughput_samples_per_s"])
    assert "curves.png" in acc.Tags()["images"]


@pytest.mark.slow
def test_csv_logger_is_the_default(eval_off_run):
    assert "log_every=20" in EVAL_OFF and not [o for o in EVAL_OFF if o.startswith("logger")]
    m = metrics(eval_off_run)
    rows = list(csv.DictReader(open(eval_off_run / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == [20, 40, m["steps"]]  # one row per logged step, none repeated
    assert [float(r["lr"]) for r in rows] == pytest.approx([m["lr_curve"][int(r["step"]) - 1] for r in rows])
    assert not (eval_off_run / "tensorboard").exists()


def test_metrics_csv_names_each_metric_once_and_records_the_learning_rate(tiny_run):
    # Issue 39: metrics.csv had both val/accuracy and val_accuracy, repeated the last step's row, and no lr.
    m = metrics(tiny_run)
    with open(tiny_run / "metrics.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == ["step", "epoch", "lr", "train_loss", "step_time_ms", "val_accuracy", "val_loss"]
    (row,) = rows  # TINY logs every 1000 steps: the last step's row, which the validation after it joined
    assert int(row["step"]) == m["steps"] == 44 and float(row["epoch"]) == 1.0
    assert (
        float(row["val_accuracy"]) == pytest.approx(m["val_accuracy"]) and float(row["train_loss"]) == m["final_loss"]
    )
    # The default cosine schedule from optim.lr=0.1 to 0 over the 44 updates, every step recorded.
    assert len(m["lr_curve"]) == 44 and m["lr_curve"][0] == pytest.approx(0.1)
    assert m["lr_curve"][22] == pytest.approx(0.05, rel=1e-5) and float(row["lr"]) == m["lr_curve"][-1]
    assert all(a > b for a, b in zip(m["lr_curve"], m["lr_curve"][1:]))


@pytest.mark.slow
def test_mlflow_and_tensorboard_at_once_beside_the_csv_and_a_profile(tmp_path, tiny, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # this reading client, as the logger does

    store = f"file:{tmp_path / 'mlruns'}"
    run_dir = tmp_path / "run"
    chosen = ["logger=[mlflow,tensorboard]", f"logger.mlflow.tracking_uri={store}", "logger.mlflow.experiment=t"]
    proc = run_cli(run_dir, *tiny, *chosen, "eval=false", "profile.steps=2")  # and the profiler, on the CLI
    assert metrics(run_dir)["loggers"] == ["csv", "tensorboard", "mlflow"]
    profile = metrics(run_dir)["profile"]
    assert profile["recorded"] and f"| profile: {run_dir / 'profile'} | outputs:" in proc.stdout
    assert (run_dir / "metrics.csv").exists() and any((run_dir / "tensorboard").iterdir())  # csv: always kept
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert run.data.params["amp.level"] == "auto" and run.data.params["model.name"] == "resnet8"
    assert run.data.metrics["throughput_samples_per_s"] == pytest.approx(metrics(run_dir)["throughput_samples_per_s"])
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"config.yaml", "metrics.json", "curves.png"}


def _wandb_records(run_dir):
    """(kind, {key: value}) of every record of the W&B offline run under run_dir/wandb.

    wandb 0.31 has no reader for its own .wandb files (its Go core writes them): a LevelDB-style log of
    32 KiB blocks whose chunks (7-byte header: crc, length, type 1 full / 2 first / 3 middle / 4 last)
    carry protobuf Records, after a 7-byte ":W&B" file header.
    """
    import json
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    data, pos, buf, out = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        buf = data[pos + 7 : pos + 7 + length] if kind in (1, 2) else buf + data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(buf)
            which = r.WhichOneof("record_type")
            if which == "history":
                items = r.history.item
            elif which == "summary":
                items = r.summary.update
            else:
                items = r.run.config.update if which == "run" else []
            values = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items}
            if which == "files":
                values = {f.path: True for f in r.files.files}
            if which == "run":
                values["_project"], values["_name"] = r.run.project, r.run.display_name
            out.append((which, values))
    return out


def test_wandb_logger_writes_an_offline_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from runner.report.loggers import build_logger, chosen

    monkeypatch.setenv("WANDB_MODE", "offline")  # no network, no login
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose_cfg("logger=[csv,wandb]", "logger.wandb.tags=[tiny]", "experiment_name=exp")
    assert chosen(cfg.logger) == ["csv", "wandb"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text("{}")
    logger = build_logger(cfg.logger, {"model": {"name": "resnet8"}, "lr": 0.1}, "exp", str(run_dir))
    logger.log_metrics({"train_loss": 2.0, "step_time_ms": 5.0, "lr": 0.1}, 10)
    logger.log_metrics({"train_loss": 1.0, "step_time_ms": 5.0, "lr": 0.05}, 20)
    logger.log_metrics({"val_accuracy": 0.5, "val_loss": 1.2}, 20)  # a validation at a logged step
    logger.finish(
        RunMetrics(steps=20, final_loss=1.0, val_accuracy=0.75, run_dir=str(run_dir)), [str(run_dir / "metrics.json")]
    )
    records = _wandb_records(run_dir)
    (run,) = [v for k, v in records if k == "run"]
    assert run["_project"] == "exp" and run["_name"] == "run" and run["model.name"] == "resnet8" and run["lr"] == 0.1
    history = [v for k, v in records if k == "history"]
    assert [(h["_step"], h["train_loss"], h["lr"]) for h in history] == [(10, 2.0, 0.1), (20, 1.0, 0.05)]
    assert history[-1]["val_accuracy"] == 0.5  # merged into step 20's row
    summary = {k: v for kind, values in records if kind == "summary" for k, v in values.items()}
    assert summary["final_loss"] == 1.0 and summary["val_accuracy"] == 0.75
    assert any("metrics.json" in v for k, v in records if k == "files")
    # metrics.csv kept too: one row per step, each metric under one name, no row of final values.
    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
    assert [(r["step"], r["train_loss"], r["val_accuracy"]) for r in rows] == [("10", "2.0", ""), ("20", "1.0", "0.5")]


def test_wandb_that_cannot_start_is_one_paragraph(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from runner.errors import UserError
    from runner.report.loggers import build_logger

    def refuse(**_):
        raise wandb.errors.UsageError("api_key not configured (no-tty). call wandb.login(key=[your_api_key])")

    monkeypatch.setattr(wandb, "init", refuse)
    with pytest.raises(UserError) as err:
        build_logger(compose_cfg("logger=wandb").logger, {}, "exp", str(tmp_path))
    assert "api_key not configured" in str(err.value) and "WANDB_MODE=offline" in str(err.value)


def test_a_logger_whose_package_is_missing_is_refused_before_training(monkeypatch):
    import importlib.util

    from runner.config.checks import check_loggers
    from runner.errors import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a))
    check_loggers(compose_cfg("logger=[csv]"))
    with pytest.raises(
        ConfigError,
        match=r"logger=wandb needs wandb, which is not installed. Install it: pip install -e '.\[loggers\]'",
    ):
        check_loggers(compose_cfg("logger=[csv,wandb]"))


def test_a_run_saved_with_one_logger_still_loads(tmp_path):
    from omegaconf import OmegaConf

    from runner.config.schema import Config
    from runner.rundir.resume_check import read_saved_config

    saved = OmegaConf.to_container(compose_cfg(), resolve=True, enum_to_str=True)
    saved["logger"] = {"name": "mlflow", "tracking_uri": "file:/x", "experiment": None}  # before logger was a list
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    loaded = read_saved_config(str(tmp_path / "config.yaml"))
    assert loaded["logger"] == {"mlflow": {"tracking_uri": "file:/x"}}
    cfg = OmegaConf.merge(OmegaConf.structured(Config), loaded)  # what evaluate, predict and export do
    assert cfg.logger.mlflow.tracking_uri == "file:/x" and cfg.logger.csv is None


def _m(**kw):
    base = {
        "compile_count": 1,
        "host_fraction": 0.05,
        "sink": {"requested": False, "effective": False},
        "device_target": "CPU",
        "mode": "graph",
        "compile_seconds": 1.0,
        "train_seconds": 20.0,
        "first_call_seconds": 1.1,
        "padding": {"kind": "fixed"},
    }
    return RunMetrics(**{**base, **kw})


def test_the_pynative_step_the_advice_weighs_is_this_machines_record_of_the_same_configuration(tmp_path, monkeypatch):
    from runner.report.speed import record_speed
    from runner.training.recipe import _pynative_step_ms

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    graph = compose_cfg(*TINY)
    assert _pynative_step_ms(graph, "onednn") is None  # nothing measured yet
    record_speed(compose_cfg(*TINY, "mode=pynative"), "onednn", 42.0, None)
    record_speed(compose_cfg(*TINY, "mode=pynative", "batch_size=64"), "onednn", 99.0, None)  # another config
    assert _pynative_step_ms(graph, "onednn") == 42.0 and _pynative_step_ms(graph, "native") is None
    assert _pynative_step_ms(compose_cfg(*TINY, "mode=pynative"), "onednn") is None  # a pynative run itself


def test_run_advice_only_from_what_was_measured():
    assert advice.run_notes(_m()) == []
    (note,) = advice.run_notes(_m(compile_count=4, padding={"kind": "bucket"}))
    assert "4 times" in note and "padding=bucket" in note
    (note,) = advice.run_notes(_m(host_fraction=0.6))
    assert "60%" in note and "does not sink on CPU" in note
    (note,) = advice.run_notes(_m(sink={"requested": True, "effective": False}))
    assert "sink=on changed nothing" in note
    # A compile longer than the training: pynative would pay only if its (slower) steps are fast enough. Issue 39:
    # "compare with mode=pynative" was said where the sweep beside it measured pynative far slower.
    short = {"compile_seconds": 9.0, "train_seconds": 12.0, "first_call_seconds": 9.5, "steps": 100}
    short["step_time_median_ms"] = 25.0  # graph: 9.0 s compile + 2.5 s of steps = 11.5 s
    (note,) = advice.run_notes(_m(**short))  # nothing measured: the note names the measurement that decides
    assert "Compiling took 9.0 s" in note and "not measured" in note and "-m mode=graph,pynative" in note
    assert advice.run_notes(_m(**short), in_sweep=True) == []  # the sweep's summary compares its jobs itself
    (note,) = advice.run_notes(_m(**short), pynative_step_ms=80.0)  # 8.0 s in pynative: it pays
    assert "stepped in 80.0 ms" in note and "~8.0 s against 11.5 s" in note and "mode=pynative is faster" in note
    assert advice.run_notes(_m(**short), pynative_step_ms=400.0) == []  # 40 s in pynative: the compile paid
    assert advice.run_notes(_m(mode="pynative", compile_seconds=9.0, first_call_seconds=9.5)) == []
    flops = {"conv_paths": {"native": {"layers": 3, "forward_flops_per_sample": 300}}}
    # model.conv=best fell back for a reason that costs speed: the reason and the cost, once.
    fell_back = {"asked": "best", "path": "native", "reason": "no C++ compiler", "cost": "2.2x slower"}
    (note,) = advice.run_notes(_m(flops=flops, conv=fell_back))
    assert note.startswith("100% of the convolution FLOPs ran MindSpore's own Conv2D: no C++ compiler; 2.2x slower")
    # Pinned to native where onednn pays: the default would be faster.
    pinned = {"asked": "native", "path": "native", "reason": "as configured", "cost": "", "onednn_pays": True}
    flops["conv_paths"]["gemm"] = {"layers": 1, "forward_flops_per_sample": 100}
    (note,) = advice.run_notes(_m(flops=flops, conv=pinned))
    assert note.startswith("75% of the convolution FLOPs") and "model.conv=native" in note and "model.conv=best" in note
    # Nothing to say where native is the faster path (an AVX2-only CPU), once no convolution runs
    # natively, or off the CPU (Conv2D is the fast path there).
    avx2 = {"asked": "best", "path": "native", "reason": "this CPU lacks AVX-512", "cost": ""}
    assert advice.run_notes(_m(flops=flops, conv=avx2)) == []
    assert advice.run_notes(_m(flops=flops, conv={**pinned, "onednn_pays": False})) == []
    onednn = {"conv_paths": {"onednn": {"layers": 3, "forward_flops_per_sample": 300}}}
    assert advice.run_notes(_m(flops=onednn, conv=pinned)) == []
    assert advice.run_notes(_m(flops=flops, conv=pinned, device_target="GPU")) == []


def _row(job, thr, step_ms, compile_s, steps, **config):
    cfg = {"mode.name": "graph", "amp.level": "O0", "batch_size": 32, **config}
    m = RunMetrics(
        amp_level_used=cfg["amp.level"],
        mode=cfg["mode.name"],
        device_target="CPU",
        throughput_samples_per_s=thr,
        step_time_median_ms=step_ms,
        compile_seconds=compile_s,
        steps=steps,
    )
    return JobRow(job, f"/sweep/{job}", [], metrics=m, config=cfg)


def test_sweep_advice_compares_jobs_that_differ_in_one_group():
    rows = [
        _row(0, 100, 320, 0.0, 10, **{"mode.name": "pynative"}),
        _row(1, 200, 160, 5.0, 10),  # saved 1.6 s of steps for 5 s of compile
        _row(2, 150, 210, 5.0, 10, **{"amp.level": "O2"}),
        _row(3, 300, 100, 5.0, 10, **{"amp.level": "O2", "batch_size": 64}),  # differs in two groups from #1
    ]
    notes = advice.sweep_notes(rows)
    assert any("AMP O2 (#2)" in n and "slower than O0 (#1" in n for n in notes)
    assert any("graph (#1) spent 5.0 s compiling to save 1.6 s" in n for n in notes)
    assert not any("#3" in n for n in notes)
    assert advice.sweep_notes([_row(0, 100, 10, 9.0, 10, **{"mode.name": "pynative"}), _row(1, 100, 5, 0.1, 100)]) == []


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/usr/bin/time"), reason="compares with GNU time's maximum resident set size")
def test_the_recorded_peak_memory_is_what_usr_bin_time_reports(tmp_path):
    # GNU time reports the peak of the whole process (its children's too, all smaller here): the recorded
    # peak missed what came after it was read (the plot: 655 MiB recorded, 681 MiB measured).
    run_dir = tmp_path / "run"
    cmd = ["/usr/bin/time", "-f", "maxrss_kb=%M", sys.executable, "-m", "runner", f"hydra.run.dir={run_dir}", *TINY]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = int(proc.stderr.rsplit("maxrss_kb=", 1)[1].split()[0]) / 1024
    recorded = json.loads((run_dir / "metrics.json").read_text())["peak_host_memory_mb"]
    assert 0.98 * measured <= recorded <= 1.01 * measured, (recorded, measured)  # VmHWM and %M differ by pages
