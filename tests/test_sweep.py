"""Every multirun: a fresh process per job, a summary in the sweep directory, failed jobs shown as failed."""

import csv

import pytest
from conftest import metrics, run_cli, run_in_process

ISA = "device.cpu_isa_cap"


def _jobs(sweep_dir):
    return [metrics(sweep_dir / str(i)) for i in range(2)]


def _summary(sweep_dir):
    return list(csv.DictReader(open(sweep_dir / "summary.csv")))


@pytest.mark.slow
@pytest.mark.cpu_only
def test_jobs_do_not_depend_on_their_order(tmp_path, tiny):
    # oneDNN reads ONEDNN_MAX_CPU_ISA once per process: a job that shared a process with an
    # earlier capped job would inherit its cap (and its warm caches). Swap the two jobs' order.
    over = [*tiny, "data=synthetic", "data.num_samples=160", "eval=false", "save_checkpoint=false"]
    run_cli(tmp_path / "ab", f"{ISA}=AVX2,''", *over, multirun=True)
    run_cli(tmp_path / "ba", f"{ISA}='',AVX2", *over, multirun=True)
    capped, uncapped = {"value": "AVX2", "set_by": "runner"}, {"value": None, "set_by": None}
    ab, ba = _jobs(tmp_path / "ab"), _jobs(tmp_path / "ba")
    assert [m["cpu_isa"] for m in ab] == [capped, uncapped]
    assert [m["cpu_isa"] for m in ba] == [uncapped, capped]
    assert len({m["pid"] for m in ab + ba}) == 4  # four jobs, four processes
    for order in ("ab", "ba"):
        rows = _summary(tmp_path / order)
        assert [r["status"] for r in rows] == ["ok", "ok"] and float(rows[0]["speedup"]) == 1.0
        assert all((tmp_path / order / name).exists() for name in ("summary.md", "summary.png"))


@pytest.mark.slow
def test_the_basic_launcher_leaks_state_between_jobs(tmp_path, tiny):
    # Why the isolated launcher is the default: in one process the second job sees the first's cap.
    from runner.models.onednn import cpu_flags

    proc = run_cli(tmp_path, f"{ISA}=AVX2,''", *tiny, "eval=false", "hydra/launcher=basic", multirun=True, check=False)
    assert metrics(tmp_path / "0")["cpu_isa"]["value"] == "AVX2"
    if "avx512f" in (cpu_flags() or ()):
        # The two caps differ in effect: job 1 is refused rather than run under job 0's kernels.
        failed = _summary(tmp_path)[1]
        assert proc.returncode == 1 and "an earlier run in this Python process" in failed["error"], failed
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    ab = _jobs(tmp_path)
    assert ab[0]["pid"] == ab[1]["pid"]  # one process: oneDNN read job 0's cap once, for both jobs
    # runner.train puts ONEDNN_MAX_CPU_ISA back after each run, so job 1 no longer inherits job 0's variable.
    assert ab[1]["cpu_isa"]["set_by"] != "user"


@pytest.mark.slow
def test_a_failed_job_is_summarised_and_the_others_run(tmp_path, tiny):
    proc = run_in_process(
        tmp_path,
        "model.num_classes=5,null",  # job 0 fails at run time: digits has labels up to 9
        *tiny,
        "eval=false",
        multirun=True,
        check=False,
    )
    assert proc.returncode == 1  # the sweep finished, but not cleanly
    failed, ok = _summary(tmp_path)
    assert (
        failed["status"] == "failed"
        and "model.num_classes=5" in failed["error"]
        and failed["label"] == "model.num_classes=5"
    )
    assert ok["status"] == "ok" and float(ok["throughput_samples_per_s"]) > 0 and ok["speedup"] == ""
    assert "failed: " in (tmp_path / "summary.md").read_text()
    assert "| #1 | model.num_classes=null | ok |" in proc.stdout  # the table is printed too


@pytest.mark.slow
def test_ladder_is_one_command(tmp_path, tiny):
    proc = run_cli(tmp_path, "+experiment=ladder", *tiny, "eval=false", "ladder.large_batch_size=64", multirun=True)
    rows = _summary(tmp_path)
    rungs = ("baseline", "graph", "fusion", "amp", "batch", "sink")
    assert [r["label"] for r in rows] == [f"+ladder={r}" for r in rungs]
    assert all(r["status"] == "ok" and float(r["speedup"]) > 0 for r in rows)
    m = [metrics(tmp_path / str(i)) for i in range(6)]
    assert [(x["mode"], x["jit_level"], x["amp_level_used"], x["batch_size"]) for x in m] == [
        ("pynative", "auto", "O0", 32),
        ("graph", "auto", "O0", 32),
        ("graph", "O1", "O0", 32),
        ("graph", "auto", "O2", 32),
        ("graph", "auto", "O2", 64),
        ("graph", "auto", "O2", 64),
    ]
    # The rungs that differ only in mode.jit_level are compared, compile time included, in one note.
    assert proc.stdout.count("mode.jit_level=O1 (#2) compiled in") == 1
    assert m[5]["sink"] == {"requested": True, "effective": False, "sink_size_requested": -1, "sink_size": -1}
    assert "sink=on changed nothing" in proc.stdout


def _fake_sweep(root, overrides, advice):
    """Job directories as a sweep leaves them: Hydra's record and each job's metrics.json."""
    from omegaconf import OmegaConf

    from runner.report.metrics import RunMetrics

    for num, (over, notes) in enumerate(zip(overrides, advice)):
        job = root / str(num)
        (job / ".hydra").mkdir(parents=True)
        OmegaConf.save(OmegaConf.create(over), job / ".hydra" / "overrides.yaml")
        OmegaConf.save(OmegaConf.create({"hydra": {"job": {"num": num}}}), job / ".hydra" / "hydra.yaml")
        RunMetrics(val_accuracy=0.9, throughput_samples_per_s=100.0 + num, advice=notes).write(
            str(job / "metrics.json")
        )


def test_speedup_only_when_a_speed_setting_differs_and_each_note_once(tmp_path):
    from runner.report.sweep import collect, markdown, summarize

    note = "model.conv=onednn runs oneDNN's blocked kernels instead"
    _fake_sweep(tmp_path / "seeds", [["seed=0"], ["seed=1"], ["seed=2"]], [[note]] * 3)
    rows = collect(tmp_path / "seeds")
    table = markdown(rows, summarize(rows, tmp_path / "seeds", "seeds"))
    assert "speedup" not in table and all(r.speedup is None for r in rows)  # a seed sweep measures one speed
    assert table.count(note) == 1 and f"- all jobs: {note}" in table
    _fake_sweep(tmp_path / "amp", [["amp=o0"], ["amp=o2"]], [[note], []])
    rows = collect(tmp_path / "amp")
    table = markdown(rows, summarize(rows, tmp_path / "amp", "amp"))
    assert "| speedup |" in table and rows[1].speedup == pytest.approx(1.01)
    assert f"- #0: {note}" in table


def test_a_sweep_jobs_records_carry_its_number_once(tmp_path):
    # joblib runs jobs side by side in one console: each line says which job wrote it.
    import io
    import logging

    from runner.report.outputs import tag_job_records

    root = logging.getLogger()
    console, file = io.StringIO(), io.StringIO()
    handlers = [logging.StreamHandler(console), logging.StreamHandler(file)]
    for h in handlers:
        root.addHandler(h)
    try:
        tag_job_records(3)
        logging.getLogger("runner").warning("epoch %d done", 1)
    finally:
        for h in handlers:
            root.removeHandler(h)
    assert console.getvalue() == file.getvalue() == "#3 epoch 1 done\n"


def test_advice_is_printed_for_a_finished_single_run_only(tmp_path, caplog):
    import logging

    from runner.report.metrics import RunMetrics
    from runner.report.outputs import publish

    class Logger:
        def finish(self, m, artifacts):
            self.artifacts = artifacts

    m = RunMetrics(run_dir=str(tmp_path), advice=["model.conv=onednn runs oneDNN's blocked kernels"])
    with caplog.at_level(logging.INFO, logger="runner"):
        publish(m, Logger(), advise=False)  # a NaN-stopped run: how to make it faster is not the news
        assert "note:" not in caplog.text
        publish(m, Logger())
        assert caplog.text.count("note: model.conv=onednn") == 1
    assert m.advice  # metrics.json keeps the notes either way
