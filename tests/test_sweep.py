"""Every multirun: a fresh process per job, a summary in the sweep directory, failed jobs shown as failed."""

import csv
import json

import pytest
from conftest import cli_in_process, metrics, run_cli, run_in_process

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


def test_fail_fast_stops_the_sweep_at_the_first_failed_job(tmp_path):
    # optim.lr=-1 fails in its job (a sweep's jobs are checked one by one); the two after it are never started.
    args = ["optim.lr=-1,0.1,0.2", "dry_run=true", "hydra.launcher.fail_fast=true"]
    proc = run_in_process(tmp_path / "fast", *args, multirun=True, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]  # a job failed
    rows = _summary(tmp_path / "fast")
    assert [(r["job"], r["label"], r["status"]) for r in rows] == [
        ("0", "optim.lr=-1", "failed"),
        ("1", "optim.lr=0.1", "not run"),
        ("2", "optim.lr=0.2", "not run"),
    ]
    assert "fail_fast=true" in rows[1]["error"] and not (tmp_path / "fast" / "1").exists()
    assert "Sweep stopped at the first failed job (#0; hydra.launcher.fail_fast=true): not run #1, #2." in proc.stdout
    assert "| #2 | optim.lr=0.2 | not run: an earlier job failed" in (tmp_path / "fast" / "summary.md").read_text()
    # Without it (the default) every job runs (test_a_failed_job_is_summarised_and_the_others_run); another
    # launcher has no such setting, and says so before anything.
    proc = run_in_process(tmp_path / "basic", *args, "hydra/launcher=basic", multirun=True, check=False)
    assert proc.returncode == 2 and "hydra.launcher.fail_fast" in proc.stderr and not (tmp_path / "basic").exists()


def _seed_sweep(root, jobs):
    """A sweep directory as the runner leaves it: [(overrides, val_accuracy, val_loss, status)] per job."""
    import json

    from omegaconf import OmegaConf

    from runner.report.metrics import RunMetrics

    for num, (over, acc, loss, ok) in enumerate(jobs):
        job = root / str(num)
        (job / ".hydra").mkdir(parents=True)
        OmegaConf.save(OmegaConf.create(over), job / ".hydra" / "overrides.yaml")
        OmegaConf.save(OmegaConf.create({"hydra": {"job": {"num": num}}}), job / ".hydra" / "hydra.yaml")
        if not ok:
            (job / "failed.json").write_text(json.dumps({"error": "boom", "error_type": "RuntimeError"}))
            continue
        curve = [{"epoch": e, "step": 10 * e, "accuracy": acc - 0.1 / e, "loss": loss + 0.5 / e} for e in (1, 2, 3)]
        RunMetrics(
            val_accuracy=acc,
            val_loss=loss,
            final_loss=loss,
            loss_curve=[2.0 / (1 + s) for s in range(30)],
            val_curve=curve,
            steps=30,
            mode="graph",
            throughput_samples_per_s=500.0,
        ).write(str(job / "metrics.json"))


def test_a_sweep_over_seeds_reports_mean_and_standard_deviation_per_combination(tmp_path):
    from runner.report.sweep import collect, markdown, summarize

    jobs = [
        (["optim.lr=0.01", "seed=0"], 0.90, 0.30, True),
        (["optim.lr=0.01", "seed=1"], 0.92, 0.20, True),
        (["optim.lr=0.01", "seed=2"], 0.94, 0.10, True),
        (["optim.lr=0.05", "seed=0"], 0.97, 0.05, True),
        (["optim.lr=0.05", "seed=1"], 0.0, 0.0, False),
    ]
    _seed_sweep(tmp_path, jobs)
    rows = collect(tmp_path)
    table = markdown(rows, summarize(rows, tmp_path, "seeds"))
    by = {r["combination"]: r for r in csv.DictReader(open(tmp_path / "summary_seeds.csv"))}
    low, high = by["optim.lr=0.01"], by["optim.lr=0.05"]
    assert (low["seeds"], low["finished"], high["seeds"], high["finished"]) == ("0 1 2", "3", "0 1", "1")
    assert float(low["val_accuracy_mean"]) == pytest.approx(0.92) and float(low["val_accuracy_std"]) == pytest.approx(
        0.02
    )  # the sample standard deviation (n-1) of 0.90, 0.92, 0.94
    assert float(low["val_loss_std"]) == pytest.approx(0.1) and high["val_accuracy_std"] == ""  # one finished seed
    assert "| optim.lr=0.01 | 0, 1, 2 | 3/3 | 0.9200 ± 0.0200 | 0.2000 ± 0.1000 |" in table
    assert "| optim.lr=0.05 | 0, 1 | 1/2 | 0.9700 (one seed) |" in table
    assert (tmp_path / "summary.png").stat().st_size > 0
    # seed alone: one combination, every job; a sweep without seed has no such table.
    _seed_sweep(tmp_path / "alone", [(["seed=0"], 0.9, 0.3, True), (["seed=1"], 0.8, 0.5, True)])
    rows = collect(tmp_path / "alone")
    assert "| (every job) | 0, 1 | 2/2 | 0.8500 ± 0.0707 |" in markdown(rows, summarize(rows, tmp_path / "alone", "s"))
    _seed_sweep(tmp_path / "lr", [(["optim.lr=0.1"], 0.9, 0.3, True), (["optim.lr=0.2"], 0.8, 0.5, True)])
    rows = collect(tmp_path / "lr")
    assert "over the seeds" not in markdown(rows, summarize(rows, tmp_path / "lr", "lr"))
    assert not (tmp_path / "lr" / "summary_seeds.csv").exists()


def _texts(fig):
    """Every visible, non-empty text of a drawn figure: (text, its box in display pixels)."""
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [
        (t.get_text(), t.get_window_extent(renderer)) for t in fig.findobj(Text) if t.get_visible() and t.get_text()
    ]


def test_the_sweep_chart_compares_what_varies_with_its_labels_inside_the_figure(tmp_path):
    from runner.report.plots import sweep_figure
    from runner.report.sweep import collect, seed_groups, speed_varies

    long = "optim.lr=0.0123456789 optim.weight_decay=0.0001 augment=randaugment augment.randaugment_magnitude=9"
    _seed_sweep(tmp_path / "lr", [([long], 0.91, 0.3, True), (["optim.lr=0.2"], 0.93, 0.2, True)])
    rows = collect(tmp_path / "lr")
    fig = sweep_figure(rows, seed_groups(rows), speed_varies(rows), f"lr: {tmp_path / 'lr'}")
    titles = {ax.get_title() for ax in fig.axes}
    assert {"val accuracy", "val loss"} <= titles and not any("throughput" in t for t in titles)  # not varied
    fig.canvas.draw()
    drawn, page = fig.get_tightbbox(fig.canvas.get_renderer()), fig.bbox_inches  # what was drawn, in inches
    assert page.x0 - 0.01 <= drawn.x0 and drawn.x1 <= page.x1 + 0.01, (drawn, page)  # every label inside the figure
    assert page.y0 - 0.01 <= drawn.y0 and drawn.y1 <= page.y1 + 0.01, (drawn, page)
    # A speed sweep compares throughput and compile time; PyNative compiles no graph, and says so.
    _seed_sweep(tmp_path / "mode", [(["mode=pynative"], 0.9, 0.3, True), (["mode=graph"], 0.9, 0.3, True)])
    for num, (mode, seconds) in enumerate((("pynative", 1.83), ("graph", 4.0))):
        path = tmp_path / "mode" / str(num) / "metrics.json"
        m = json.loads(path.read_text())
        m.update(mode=mode, compile_seconds=seconds, compile_count=int(mode == "graph"))
        path.write_text(json.dumps(m))
    rows = collect(tmp_path / "mode")
    assert rows[0].value("compile_seconds") is None and rows[1].value("compile_seconds") == 4.0
    fig = sweep_figure(rows, [], speed_varies(rows), "mode")
    texts = [t for t, _ in _texts(fig)]
    assert any("throughput" in ax.get_title() for ax in fig.axes)
    assert "no graph compile (pynative)" in " ".join(texts) and not any("1.83" in t for t in texts)
    assert "| #0 | mode=pynative | ok | 0.9000 | 0.3000 | - |" in __import__(
        "runner.report.sweep"
    ).report.sweep.markdown(rows, [])


def test_a_dry_run_sweep_checks_its_jobs_in_the_sweeps_process_and_records_the_failed_one(tmp_path):
    # A dry run measures nothing, so its jobs skip the fresh process a measured job gets (~4 s each).
    proc = cli_in_process("-m", f"hydra.sweep.dir={tmp_path}", "optim.min_lr=0.05", "optim.lr=0.01,0.1", "dry_run=true")
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert "Launching 2 jobs, in this process (dry run)" in proc.stdout + proc.stderr
    failed = json.loads((tmp_path / "0" / "failed.json").read_text())
    assert failed["error_type"] == "ConfigError" and "optim.min_lr must be at least 0 and below" in failed["error"]
    rows = {r["label"]: r["status"] for r in csv.DictReader(open(tmp_path / "summary.csv"))}
    assert rows["optim.lr=0.1"] == "validated" and rows["optim.lr=0.01"].startswith("failed")
