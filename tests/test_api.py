"""The Python API (runner/api.py): the example of docs/python-api.md as written, refusals raised, several runs
in one process."""

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY, compose_cfg
from docs_pages import page
from test_train import PINNED_LOSS, PINNED_VAL

import runner
from runner.rundir import lock
from runner.training import environment


def readme_example() -> str:
    """The first code block of docs/python-api.md ("From Python")."""
    return re.search(r"```python\n(.*?)```", page("python-api.md"), re.S).group(1)


@pytest.mark.cpu_only
@pytest.mark.slow
def test_the_readme_example_runs_as_written_and_leaves_the_process_as_it_found_it(tmp_path, monkeypatch, capsys):
    from imagegen import digit_folder

    monkeypatch.chdir(tmp_path)
    isa_before = os.environ.get(environment.ISA_VAR)
    handlers_before, level_before = list(logging.getLogger().handlers), logging.getLogger().level
    scope: dict = {}
    exec(compile(readme_example(), "docs/python-api.md", "exec"), scope)
    metrics, scores = scope["metrics"], scope["scores"]

    # The same numbers as the pinned command-line run (tests/test_train.py), typed.
    assert isinstance(metrics, runner.RunMetrics) and isinstance(scores, runner.EvalMetrics)
    for step, loss in PINNED_LOSS.items():
        assert metrics.loss_curve[step - 1] == pytest.approx(loss, abs=2e-4)
    assert metrics.val_accuracy == pytest.approx(PINNED_VAL["val_accuracy"], abs=2e-4)
    assert scores.top1 == metrics.val_accuracy and scores.loss_batch_mean == pytest.approx(metrics.val_loss)
    # What the page says the example prints.
    printed = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith(("val_acc", "top1"))]
    promised = [ln.split("# ", 1)[1] for ln in readme_example().splitlines() if ln.startswith("print(")]
    assert printed == promised

    run = tmp_path / "outputs/from-python"
    assert {"config.yaml", "metrics.json", "model.ckpt", "runner.log"} <= {p.name for p in run.iterdir()}
    assert "training (graph, O0) for 44 steps" in (run / "runner.log").read_text()
    assert (Path(scores.plot).parent / "evaluate.log").is_file()
    # The process is as before: no handler left behind, the ISA variable restored, the directory released.
    assert logging.getLogger().handlers == handlers_before and logging.getLogger().level == level_before
    assert os.environ.get(environment.ISA_VAR) == isa_before and os.getcwd() == str(tmp_path)
    assert str(run) not in lock._held

    # A second run into the same directory is refused as on the command line, raised (not sys.exit).
    with pytest.raises(runner.UserError, match="already holds a run"):
        runner.train(scope["cfg"], str(run))
    # Resuming the complete run has nothing to train.
    assert runner.train(runner.compose("resume=true", *TINY), str(run)) is None

    # predict and export of the same run, with the commands' settings as keyword arguments.
    digit_folder(tmp_path / "pngs", [(8, 8)], per_class=1)
    summary = runner.predict_run(str(run), str(tmp_path / "pngs"), topk=2, show=0)
    assert summary["images"] == 10 and summary["topk"] == 2 and Path(summary["predictions"]).is_file()
    exported = runner.export_run(str(run), parity_samples=8)
    assert exported["parity_ok"] and exported["files"][0]["parity"]["samples"] == 8
    assert Path(exported["files"][0]["path"]).parent.name.startswith("export-")


def test_refusals_are_raised_before_anything_is_written(tmp_path):
    with pytest.raises(runner.ConfigError, match="epochs"):
        runner.train(runner.compose("epochs=0"), str(tmp_path / "run"))
    with pytest.raises(runner.ConfigError, match="no such directory"):
        runner.evaluate_run(str(tmp_path / "missing"))
    with pytest.raises(runner.ConfigError, match="topk"):
        runner.predict_run(str(tmp_path), "x.png", topk="many")
    assert list(tmp_path.iterdir()) == []
    assert runner.train(runner.compose("dry_run=true"), str(tmp_path / "dry")) is None


def test_a_later_run_that_needs_another_isa_or_device_is_refused(monkeypatch, caplog):
    compose = runner.compose
    monkeypatch.setattr(environment, "_first_run", {})
    monkeypatch.setenv(environment.ISA_VAR, "SSE41")  # below AVX2: a cap that acts on any CPU the runner meets
    environment.check_same_process(compose("device=cpu").device)
    environment.check_same_process(compose("device=auto").device)  # auto: whatever the first bound
    monkeypatch.setenv(environment.ISA_VAR, "sse41")
    environment.check_same_process(compose().device)
    monkeypatch.delenv(environment.ISA_VAR)  # model.conv=onednn runs uncapped
    with pytest.raises(runner.ConfigError, match="oneDNN reads it only once per process"):
        environment.check_same_process(compose().device)
    # A finished run's evaluate/predict/export: the same results, maybe slower; said, not refused.
    environment.check_same_process(compose().device, training=False)
    assert "oneDNN in this process runs with SSE41" in caplog.text
    monkeypatch.setenv(environment.ISA_VAR, "SSE41")
    with pytest.raises(runner.ConfigError, match="cannot change its device target within a process"):
        environment.check_same_process(compose("device=gpu").device)
    # On an AVX2-only CPU the AVX2 cap (native convolutions) and no cap (onednn) are the same ISA.
    monkeypatch.setattr(environment, "cpu_flags", lambda: frozenset({"avx", "avx2", "fma"}))
    assert environment.effective_isa("AVX2") == environment.effective_isa(None) == ""
    assert environment.effective_isa("sse41") == "SSE41"
    monkeypatch.setattr(environment, "cpu_flags", lambda: frozenset({"avx", "avx2", "fma", "avx512f"}))
    assert environment.effective_isa("avx2") == "AVX2"


def test_the_api_loads_on_first_use():
    code = (
        "import sys, runner; assert 'runner.api' not in sys.modules and 'mindspore' not in sys.modules; "
        "assert callable(runner.train) and 'runner.api' in sys.modules; "
        "assert sorted(runner.__all__) == sorted(n for n in runner.__all__ if getattr(runner, n))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


@pytest.mark.slow
def test_a_signal_raises_interrupted_and_the_run_resumes(tmp_path):
    import signal
    import threading
    import time

    run = tmp_path / "run"
    first = run / "checkpoints" / "step_00000044.ckpt"  # the end of epoch 1

    def send_sigterm_after_epoch_1():
        deadline = time.time() + 300
        while not first.exists() and time.time() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # the checkpointer's handler takes it in the main thread

    threading.Thread(target=send_sigterm_after_epoch_1, daemon=True).start()
    with pytest.raises(runner.Interrupted) as stopped:
        runner.train(runner.compose(*TINY, "epochs=3"), str(run))
    assert stopped.value.signum == signal.SIGTERM and stopped.value.exit_code == 143
    assert str(run) not in lock._held and not (run / "metrics.json").exists()
    m = runner.train(runner.compose(*TINY, "epochs=3", "resume=true"), str(run))
    assert m.steps == 132 == len(m.loss_curve) and m.resumed_from


def test_the_api_refuses_a_file_as_run_dir_as_the_cli_does(tmp_path):
    import runner

    run_dir = tmp_path / "a-file"
    run_dir.write_text("mine")
    with pytest.raises(runner.UserError, match="a-file.*not a directory"):
        runner.train(compose_cfg(*TINY), str(run_dir))
    assert run_dir.read_text() == "mine"
    with pytest.raises(runner.UserError, match="not a directory"):
        runner.train(compose_cfg(*TINY), str(run_dir / "below"))


CELL_ALIVE_AT_EXIT = """
import os
{runner}
import numpy as np
import mindspore as ms
from mindspore import nn
net = nn.Dense(2, 2)
net(ms.Tensor(np.ones((1, 2), np.float32)))  # compiled: its __del__ releases the graphs
os.held_net = net  # held by a module imported before MindSpore: deleted after MindSpore's globals are None
"""


def test_a_cell_alive_at_exit_ends_the_process_without_mindspores_ignored_error():
    def stderr_of(code):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stderr

    # Without the runner MindSpore prints it (when this fails, MindSpore fixed it: remove runner/__init__.py's
    # _quiet_cell_teardown); with the runner imported it does not.
    assert "Exception ignored in: <function Cell.__del__" in stderr_of(CELL_ALIVE_AT_EXIT.format(runner=""))
    quiet = stderr_of(CELL_ALIVE_AT_EXIT.format(runner="import runner"))
    assert "Cell.__del__" not in quiet and "del_net_res" not in quiet, quiet[-2000:]
