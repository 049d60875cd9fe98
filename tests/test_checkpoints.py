"""runner/training/checkpoints.py: resumable checkpoints, exact resume at an epoch boundary and after a signal,
rotation (keep_last, keep_best), errors."""

import json
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import REPO, TINY, metrics, run_cli, run_in_process

SMALL = [o for o in TINY if not o.startswith("epochs=")]


def _weights(path):
    import mindspore as ms

    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items()}


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


@pytest.mark.slow
def test_resume_from_epoch_checkpoint_matches_uninterrupted(tmp_path):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run_cli(full, "epochs=2", *SMALL)
    state = json.loads((full / "checkpoints" / "latest.json").read_text())
    assert state["kept"] == ["step_00000044.ckpt", "step_00000088.ckpt"] and state["global_step"] == 88
    first = _weights(full / "checkpoints" / "step_00000044.ckpt")
    # Optimizer state (momentum, global_step = LR position) and the loss-scale Parameters travel too.
    assert {"global_step", "learning_rate", "loss_scale", "loss_scale_good_steps", "loss_scale_skipped_steps"} <= set(
        first
    )
    assert any(k.startswith("moments.") for k in first) and int(first["global_step"].reshape(-1)[0]) == 44

    run_cli(resumed, "epochs=2", *SMALL, f"resume={full}/checkpoints/step_00000044.ckpt")
    a, b = metrics(full), metrics(resumed)
    # Same seed, same data order from step 44 on (set_init_step), same state: bit-identical here.
    assert _max_diff(_weights(full / "model.ckpt"), _weights(resumed / "model.ckpt")) == 0.0
    assert b["val_loss"] == a["val_loss"] and b["val_accuracy"] == a["val_accuracy"]
    assert b["loss_curve"][44:] == a["loss_curve"][44:] and b["steps"] == len(b["loss_curve"]) == 88
    # A .ckpt carries no curve: the earlier steps come from its run's loss_scale.csv (6 significant digits).
    assert np.allclose(b["loss_curve"][:44], a["loss_curve"][:44], rtol=1e-5)


@pytest.mark.slow
def test_signal_saves_and_resume_matches_uninterrupted(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    args = ["epochs=3", *SMALL]
    run_cli(full, *args)
    cmd = [sys.executable, "-m", "runner", f"hydra.run.dir={cut}", *args]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while not (cut / "checkpoints" / "step_00000044.ckpt").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.05)
    time.sleep(0.3)  # land mid-epoch 2
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    state = json.loads((cut / "checkpoints" / "latest.json").read_text())
    assert 44 < state["global_step"] < 132 and not (cut / "metrics.json").exists()

    run_cli(cut, *args, "resume=true")
    a, b = metrics(full), metrics(cut)
    assert _max_diff(_weights(full / "model.ckpt"), _weights(cut / "model.ckpt")) <= 1e-6
    assert abs(b["val_loss"] - a["val_loss"]) <= 1e-6 and b["val_accuracy"] == a["val_accuracy"]
    assert np.allclose(b["loss_curve"], a["loss_curve"], atol=1e-6)  # the curve continues across the resume
    assert b["resumed_from"].endswith(state["latest"])


def test_rotation_keeps_last_n_and_best(tmp_path):
    from mindspore import nn

    from runner.rundir.run_state import RunState
    from runner.training.checkpoints import Checkpointer
    from runner.training.validation import Score

    cfg = SimpleNamespace(every_epochs=1, keep_last=2, keep_best=True, top_k=1, on_signal=True)
    ck = Checkpointer(cfg, str(tmp_path), 10, RunState(), Score("train_loss"))
    net = nn.Dense(2, 2)
    for step, loss in zip((10, 20, 30, 40), (1.0, 0.5, 0.7, 0.8)):
        ck.save(SimpleNamespace(train_network=net, cur_step_num=step), loss)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["latest.json", "step_00000020.ckpt", "step_00000030.ckpt", "step_00000040.ckpt"]
    state = json.loads((tmp_path / "latest.json").read_text())
    assert state["latest"] == "step_00000040.ckpt" and state["best"]["file"] == "step_00000020.ckpt"
    assert state["epoch"] == 4 and state["step_in_epoch"] == 0


def test_resume_from_nothing_is_a_user_error(tmp_path):
    proc = run_in_process(tmp_path / "run", *TINY, f"resume={tmp_path}/nowhere", check=False)
    assert proc.returncode == 2 and "resume=" in proc.stderr and "Traceback" not in proc.stderr


def test_keep_best_off_keeps_only_the_last(tmp_path):
    from mindspore import nn

    from runner.rundir.run_state import RunState
    from runner.training.checkpoints import Checkpointer
    from runner.training.validation import Score

    cfg = SimpleNamespace(every_epochs=1, keep_last=1, keep_best=False, top_k=1, on_signal=True)
    ck = Checkpointer(cfg, str(tmp_path), 10, RunState(), Score("train_loss"))
    for step, loss in zip((10, 20, 30), (0.1, 0.5, 0.7)):
        ck.save(SimpleNamespace(train_network=nn.Dense(2, 2), cur_step_num=step), loss)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "step_00000030.ckpt"]


@pytest.mark.slow
def test_every_epochs_zero_saves_no_periodic_checkpoint(tmp_path):
    run_in_process(tmp_path, *TINY, "eval=false", "checkpoint.every_epochs=0")
    assert not (tmp_path / "checkpoints").exists() and (tmp_path / "model.ckpt").exists()


def test_top_1_keep_last_1_keeps_one_file_when_the_best_is_the_last(tmp_path):
    from mindspore import nn

    from runner.rundir.run_state import RunState
    from runner.training.checkpoints import Checkpointer
    from runner.training.validation import Score

    cfg = SimpleNamespace(every_epochs=1, keep_last=1, keep_best=True, top_k=1, on_signal=True)
    ck = Checkpointer(cfg, str(tmp_path), 10, RunState(), Score("train_loss"))
    net = nn.Dense(2, 2)
    for step, loss in ((10, 1.0), (20, 0.5), (30, 0.4)):  # every epoch the best so far
        ck.save(SimpleNamespace(train_network=net, cur_step_num=step), loss)
    assert sorted(p.name for p in tmp_path.glob("step_*.ckpt")) == ["step_00000030.ckpt"]
    ck.save(SimpleNamespace(train_network=net, cur_step_num=40), 0.9)  # worse: the best and the last, two files
    assert sorted(p.name for p in tmp_path.glob("step_*.ckpt")) == ["step_00000030.ckpt", "step_00000040.ckpt"]
    state = json.loads((tmp_path / "latest.json").read_text())
    assert state["kept"] == ["step_00000030.ckpt", "step_00000040.ckpt"] and state["best"]["global_step"] == 30
