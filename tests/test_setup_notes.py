"""What a run says about its set-up: a model wider than the data's classes, a very long plan."""

import signal

import pytest
from conftest import TINY, run_in_process, start_cli, wait_for


@pytest.mark.slow
def test_more_model_classes_than_the_data_has_warns(tmp_path):
    proc = run_in_process(tmp_path, *TINY, "model.num_classes=100", "eval=false", "save_checkpoint=false")
    text = " ".join((proc.stdout + proc.stderr).split())
    assert "model.num_classes=100 but the data has 10 classes" in text and "90 extra outputs" in text


@pytest.mark.slow
def test_a_very_long_plan_is_announced_before_its_set_up(tmp_path):
    proc = start_cli(tmp_path, *[o for o in TINY if not o.startswith("epochs=")], "epochs=100000", "log_every=20")
    log = tmp_path / "runner.log"
    try:
        # Announced, and training starts without minutes of set-up: the learning-rate schedule is a
        # cell computed from the step, not a list of 4.4M rates.
        wait_for(proc, lambda: log.exists() and "step 20/4400000" in log.read_text(), timeout=120)
        assert "100000 epochs of 44 steps: 4400000 steps" in log.read_text()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
