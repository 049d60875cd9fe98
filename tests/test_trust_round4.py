"""Round 4 of the trust issue: checkpoints kept, the API's run directory, refusals quoting MindSpore."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import TINY, compose_cfg


def test_top_1_keep_last_1_keeps_one_file_when_the_best_is_the_last(tmp_path):
    from mindspore import nn

    from runner.training.checkpoints import Checkpointer
    from runner.training.validation import Score

    cfg = SimpleNamespace(every_epochs=1, keep_last=1, keep_best=True, top_k=1, on_signal=True)
    ck = Checkpointer(cfg, str(tmp_path), 10, {}, Score("train_loss", lambda: None), lambda: np.zeros(0))
    net = nn.Dense(2, 2)
    for step, loss in ((10, 1.0), (20, 0.5), (30, 0.4)):  # every epoch the best so far
        ck.save(SimpleNamespace(train_network=net, cur_step_num=step), loss)
    assert sorted(p.name for p in tmp_path.glob("step_*.ckpt")) == ["step_00000030.ckpt"]
    ck.save(SimpleNamespace(train_network=net, cur_step_num=40), 0.9)  # worse: the best and the last, two files
    assert sorted(p.name for p in tmp_path.glob("step_*.ckpt")) == ["step_00000030.ckpt", "step_00000040.ckpt"]
    state = json.loads((tmp_path / "latest.json").read_text())
    assert state["kept"] == ["step_00000030.ckpt", "step_00000040.ckpt"] and state["best"]["global_step"] == 30


def test_the_api_refuses_a_file_as_run_dir_as_the_cli_does(tmp_path):
    import runner

    run_dir = tmp_path / "a-file"
    run_dir.write_text("mine")
    with pytest.raises(runner.UserError, match="a-file.*not a directory"):
        runner.train(compose_cfg(*TINY), str(run_dir))
    assert run_dir.read_text() == "mine"
    with pytest.raises(runner.UserError, match="not a directory"):
        runner.train(compose_cfg(*TINY), str(run_dir / "below"))
