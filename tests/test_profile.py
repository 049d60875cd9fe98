"""profile.steps: MindSpore's profiler over a window of training steps."""

import csv
import glob
import logging
import os

import numpy as np
import pytest
from conftest import compose_cfg

from runner.config.checks import validate
from runner.errors import ConfigError


def _train(tmp_path, start_step, steps, total=8):
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Model

    from runner.report.profiling import ProfileWindow

    ms.set_context(mode=ms.GRAPH_MODE)
    rng = np.random.RandomState(0)
    data = ds.NumpySlicesDataset(
        {"x": rng.rand(total * 4, 6).astype(np.float32), "y": rng.randint(0, 3, total * 4).astype(np.int32)},
        shuffle=False,
    ).batch(4)
    net = nn.Dense(6, 3)
    model = Model(
        net,
        nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
        nn.Momentum(net.trainable_params(), 0.1, 0.9),
    )
    window = ProfileWindow(start_step, steps, str(tmp_path), "CPU")
    model.train(1, data, callbacks=[window], dataset_sink_mode=False)
    return window


def test_the_window_is_recorded_into_the_run_directory(tmp_path):
    record = _train(tmp_path, start_step=3, steps=2).record()
    assert (
        record["recorded"]
        and record["dir"] == str(tmp_path / "profile")
        and (record["start_step"], record["steps"]) == (3, 2)
    )
    assert os.path.isfile(record["trace"]) and record["trace"].startswith(record["dir"])
    # Exactly the window's steps: every training op ran twice in the recorded part.
    (table,) = glob.glob(str(tmp_path / "profile" / "*" / "FRAMEWORK" / "cpu_op_detail_info_0.csv"))
    counts = {int(row["op_occurrences"]) for row in csv.DictReader(open(table))}
    assert counts == {2}


def test_a_window_longer_than_the_run_records_the_steps_profiled(tmp_path):
    # profile.steps=1000000 on an 8-step run: the profile holds steps 3-8, and metrics.json says so.
    record = _train(tmp_path, start_step=3, steps=1_000_000).record()
    assert record["recorded"] and (record["steps"], record["steps_requested"]) == (6, 1_000_000)


def test_a_window_the_run_does_not_reach_is_reported_not_recorded(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="runner"):
        record = _train(tmp_path, start_step=20, steps=2).record()
    assert not record["recorded"] and record["trace"] is None
    assert "the run took 8 steps, so the window of steps 20-21 was not recorded" in caplog.text


def test_the_summary_line_names_the_profile():
    from runner.report.metrics import RunMetrics
    from runner.report.outputs import summary_line

    line = summary_line(RunMetrics(run_dir="/r", profile={"dir": "/r/profile", "recorded": True}))
    assert line.endswith("| profile: /r/profile | outputs: /r")
    assert "profile:" not in summary_line(RunMetrics(run_dir="/r"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["profile.steps=-1"], "profile.steps must be >= 0"),
        (["profile.steps=2", "profile.start_step=0"], "profile.start_step >= 1"),
        (["profile.start_step=5"], "profile.start_step=5 does nothing while profile.steps=0"),
    ],
)
def test_profile_settings_it_cannot_honour_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_cfg(*overrides))
