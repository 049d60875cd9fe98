"""mode.jit_level: MindSpore's compilation level where a mode compiles, refused where it would do nothing."""

import pytest
from conftest import TINY, cli_in_process, metrics, run_in_process

REFUSED = [
    (["mode=pynative", "mode.jit_level=O1"], "mode.name=pynative does not use mode.jit_level=O1"),
    (["mode=jit", "mode.jit_level=O2"], "mindspore.jit (mode=jit) compiles at O0 or O1 only"),
    (["mode=graph", "mode.jit_level=O2", "device=cpu"], "mode.jit_level=O2 (whole-graph sinking) runs on Ascend only"),
    (["mode.jit_level=o1"], "Invalid value 'o1'"),
]


@pytest.mark.parametrize("overrides,message", REFUSED)
def test_a_level_that_would_do_nothing_or_cannot_run_is_one_line(tmp_path, overrides, message):
    proc = cli_in_process(f"hydra.run.dir={tmp_path}", *overrides, "dry_run=true")
    assert proc.returncode == 2 and message in " ".join(proc.stderr.split()), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.cpu_only
@pytest.mark.slow
def test_o2_on_a_device_found_at_run_time_is_refused_before_training(tmp_path):
    # device=auto resolves to the CPU only once MindSpore's context is set: the refusal comes from there.
    proc = cli_in_process(f"hydra.run.dir={tmp_path}", *TINY, "mode.jit_level=O2")
    assert proc.returncode == 2 and "this run's device is CPU" in " ".join(proc.stderr.split()), proc.stderr
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["graph", "jit"])
def test_o1_trains_and_is_recorded(tmp_path, mode):
    proc = run_in_process(tmp_path, *TINY, f"mode={mode}", "mode.jit_level=O1", "eval=false")
    m = metrics(tmp_path)
    assert (m["mode"], m["jit_level"], m["compile_count"]) == (mode, "O1", 1)
    assert m["final_loss"] < m["loss_curve"][0]
    assert f"{mode} (jit_level O1) O0 on" in proc.stdout
