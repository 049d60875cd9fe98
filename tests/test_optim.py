"""The `optim` group: every optimizer and schedule, their settings, and what a checkpoint stores."""

import math
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, TINY, compose_cfg, metrics, run_in_process

from runner.config.checks import validate
from runner.training.optim import StepRates, build_optimizer, build_schedule, host_rates, schedule_rates


def rates(*overrides, per_epoch=10, total=100):
    cfg = compose_cfg(*overrides)
    validate(cfg)
    return schedule_rates(build_schedule(cfg.optim, per_epoch, total), total)


def test_constant_schedule():
    assert rates("optim.schedule=constant", "optim.lr=0.05", total=30) == pytest.approx([0.05] * 30)


def test_cosine_schedule_decays_to_min_lr():
    lrs = rates("optim.lr=0.1", "optim.min_lr=0.01")
    assert lrs[0] == pytest.approx(0.1)
    assert all(a >= b - 1e-7 for a, b in zip(lrs, lrs[1:]))
    assert lrs[50] == pytest.approx(0.01 + 0.5 * 0.09 * (1 + math.cos(math.pi * 0.5)), rel=1e-5)
    assert lrs[-1] == pytest.approx(0.01, abs=1e-3)


def test_warmup_ramps_linearly_then_the_schedule_starts():
    lrs = rates(
        "optim.lr=0.1", "optim.warmup_epochs=2", "optim.schedule=step", "optim.step_epochs=3", "optim.gamma=0.5"
    )
    assert lrs[:20] == pytest.approx([0.1 * (i + 1) / 20 for i in range(20)], rel=1e-5)
    assert lrs[20:50] == pytest.approx([0.1] * 30) and lrs[50:80] == pytest.approx([0.05] * 30)


@pytest.mark.slow
def test_step_multistep_exponential_onecycle():
    step = rates("optim.schedule=step", "optim.step_epochs=2", "optim.gamma=0.1")
    assert step[19] == pytest.approx(0.1) and step[20] == pytest.approx(0.01) and step[40] == pytest.approx(0.001)
    multi = rates("optim.schedule=multistep", "optim.milestones=[3,7]", "optim.gamma=0.5", "epochs=10")
    assert multi[29] == pytest.approx(0.1) and multi[30] == pytest.approx(0.05) and multi[70] == pytest.approx(0.025)
    expo = rates("optim.schedule=exponential", "optim.gamma=0.5")
    assert expo[10] == pytest.approx(0.05, rel=1e-5) and expo[5] == pytest.approx(0.1 * 0.5**0.5, rel=1e-5)
    one = rates("optim.schedule=onecycle", "optim.pct_start=0.25", "optim.div_factor=10", "optim.min_lr=0.001")
    assert one[0] == pytest.approx(0.01, rel=1e-5) and max(one) == pytest.approx(0.1) and one.index(max(one)) == 25
    assert one[-1] == pytest.approx(0.001, abs=1e-4)


@pytest.mark.parametrize(
    "overrides",
    [
        ["optim.schedule=constant"],
        ["optim.schedule=cosine", "optim.min_lr=0.01", "optim.warmup_epochs=1.5"],
        ["optim.schedule=step", "optim.step_epochs=2", "optim.gamma=0.3"],
        ["optim.schedule=exponential", "optim.gamma=0.5", "optim.warmup_epochs=1"],
        ["optim.schedule=multistep", "optim.milestones=[2,5]", "optim.gamma=0.5", "epochs=10"],
        ["optim.schedule=onecycle", "optim.pct_start=0.25", "optim.div_factor=10", "optim.min_lr=0.001"],
    ],
)
def test_the_recorded_learning_rate_is_the_schedules_own(overrides):
    # What metrics.csv, metrics.json and curves.png record is computed on the host (no graph compiled):
    # it must be what the schedule cell gives the optimizer at each update.
    cfg = compose_cfg(*overrides)
    validate(cfg)
    schedule = build_schedule(cfg.optim, 10, 100)
    assert host_rates(schedule, range(100)).tolist() == pytest.approx(schedule_rates(schedule, 100), rel=1e-5)


def test_each_steps_rate_follows_the_optimizers_updates():
    from mindspore import nn

    cfg = compose_cfg("optim.schedule=step", "optim.step_epochs=1", "optim.gamma=0.5")
    validate(cfg)
    optimizer = build_optimizer(cfg.optim, nn.Dense(2, 2).trainable_params(), 2, 8)  # an update halves it
    plain = StepRates(optimizer, 8, accumulate=1, skips_overflow=True)
    assert [plain.at(s) for s in range(1, 7)] == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
    # Two steps a window: the rate halves every 2 windows, 4 steps. A skipped update (overflow) delays it.
    accum = StepRates(build_optimizer(cfg.optim, nn.Dense(2, 2).trainable_params(), 2, 8), 8, 2, True)
    assert [accum.at(s) for s in range(1, 10)] == pytest.approx([0.1] * 4 + [0.05] * 4 + [0.025])
    skip = StepRates(build_optimizer(cfg.optim, nn.Dense(2, 2).trainable_params(), 2, 8), 8, 1, True)
    assert [skip.at(s, overflowed_before=s == 2) for s in range(1, 6)] == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.05])
    sink = StepRates(build_optimizer(cfg.optim, nn.Dense(2, 2).trainable_params(), 2, 8), 8, 1, True)
    assert [sink.at(s) for s in (2, 4, 6)] == pytest.approx([0.1, 0.05, 0.025])  # a data-sink call of 2 steps


def test_optimizers_take_their_settings():
    from mindspore import nn

    params = nn.Dense(3, 2).trainable_params()
    sgd = build_optimizer(compose_cfg("optim.momentum=0.8", "optim.weight_decay=0.01").optim, params, 4, 8)
    assert isinstance(sgd, nn.Momentum) and float(sgd.momentum.asnumpy()) == pytest.approx(0.8)
    assert [float(w.asnumpy()) for w in sgd.weight_decay] == pytest.approx([0.01, 0.0]) and not sgd.use_nesterov
    nesterov = build_optimizer(compose_cfg("optim=sgd").optim, params, 4, 8)
    assert isinstance(nesterov, nn.SGD) and nesterov.nesterov
    adam = build_optimizer(compose_cfg("optim=adam", "optim.momentum=0.85", "optim.beta2=0.99").optim, params, 4, 8)
    assert isinstance(adam, nn.Adam) and float(adam.beta1.asnumpy()) == pytest.approx(0.85)
    assert float(adam.beta2.asnumpy()) == pytest.approx(0.99)
    assert isinstance(build_optimizer(compose_cfg("optim=adamw").optim, params, 4, 8), nn.AdamWeightDecay)
    from mindcv.optim.lion import Lion

    assert isinstance(build_optimizer(compose_cfg("optim=lion").optim, params, 4, 8), Lion)


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "optim=sgd",
            "optim.schedule=multistep",
            "optim.milestones=[0.5]",
            "optim.warmup_epochs=0.2",
            "optim.filter_bias_and_bn=false",
        ],
        ["optim=adamw", "optim.schedule=onecycle"],
        ["optim=lion", "optim.lr=1e-3", "optim.schedule=exponential", "optim.gamma=0.9"],
        ["optim=adam", "optim.schedule=step", "optim.step_epochs=0.5"],
    ],
)
@pytest.mark.slow
def test_each_optimizer_trains_through_the_cli(tmp_path, overrides):
    run_in_process(tmp_path, *TINY, *overrides)
    m = metrics(tmp_path)
    assert m["val_accuracy"] > 0.5 and m["optimizer_updates"] == 44
    assert m["weight_decay"]["filter_bias_and_bn"] is ("optim.filter_bias_and_bn=false" not in overrides)


@pytest.mark.slow
def test_checkpoint_holds_the_schedule_not_a_rate_per_step(tmp_path):
    import mindspore as ms

    # epochs=100000 is 4.4M steps: a per-step list of rates made each checkpoint 18 MB. Stop the run
    # with SIGTERM once its first checkpoint exists.
    small = [o for o in TINY if not o.startswith("epochs=")]
    cmd = [sys.executable, "-m", "runner", f"hydra.run.dir={tmp_path}", *small, "epochs=100000"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = tmp_path / "checkpoints" / "step_00000044.ckpt"
    deadline = time.time() + 300
    try:
        while not (tmp_path / "checkpoints" / "latest.json").exists():
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    ckpt = ms.load_checkpoint(str(first))
    assert ckpt["learning_rate"].shape == () and float(ckpt["learning_rate"].asnumpy()) == pytest.approx(0.1)
    assert first.stat().st_size < 400_000  # the weights of a width-8 resnet8 and their moments


def _conv_bn_dense():
    from mindspore import nn

    return nn.SequentialCell(
        nn.Conv2d(1, 2, 3, has_bias=True), nn.BatchNorm2d(2), nn.Flatten(), nn.Dense(2 * 4 * 4, 3, has_bias=True)
    )


# One per code path that applies decay: the base Optimizer's (momentum; sgd and adam share it),
# AdamWeightDecay's decoupled one, MindCV Lion's own.
@pytest.mark.parametrize("name", ["momentum", "adamw", "lion"])
@pytest.mark.slow
def test_weight_decay_skips_biases_and_batchnorm_unless_told(name):
    import numpy as np
    from mindspore import ops

    from runner.training.optim import decay_record

    for filtered in (True, False):
        net = _conv_bn_dense()
        cfg = compose_cfg(f"optim={name}", "optim.weight_decay=0.1", f"optim.filter_bias_and_bn={filtered}").optim
        opt = build_optimizer(cfg, net.trainable_params(), 4, 8)
        decayed = {p.name for p, f in zip(opt.parameters, opt.decay_flags) if f}
        kernels = {"0.weight", "3.weight"}  # the conv and dense kernels; biases, gamma, beta are 1-D
        assert decayed == (kernels if filtered else {p.name for p in net.trainable_params()}), (name, filtered)
        record = decay_record(opt, cfg)
        assert record["filter_bias_and_bn"] is filtered and record["value"] == pytest.approx(0.1)
        assert record["decayed_tensors"] == len(decayed) and record["exempt_tensors"] == 6 - len(decayed)
        # What the update does, not only its flags: with zero gradients only weight decay moves a
        # parameter (unfiltered, MindSpore's own name filter would have left BatchNorm's gamma and beta alone).
        for p in opt.parameters:
            p.set_data(ops.ones_like(p))  # biases and beta start at 0, which decay would not move
        opt(tuple(ops.zeros_like(p) for p in opt.parameters))
        moved = {p.name for p in opt.parameters if not np.allclose(p.asnumpy(), 1.0)}
        assert moved == decayed, (name, filtered, moved)


def test_default_run_records_its_weight_decay(tiny_run):
    record = metrics(tiny_run)["weight_decay"]
    # resnet8: its 10 kernels (stem, 6 convs, 2 shortcuts, the head) decayed; 18 BatchNorm gamma/beta
    # and the head's bias not.
    assert record == {
        "value": pytest.approx(1e-4),
        "filter_bias_and_bn": True,
        "decayed_tensors": 10,
        "exempt_tensors": 19,
        "decayed_values": 19464,
    }


def test_resume_refuses_a_changed_weight_decay_filter():
    from runner.rundir.resume_check import compare

    saved = {"optim": {"weight_decay": 1e-4, "filter_bias_and_bn": True}}
    _, refused = compare(saved, {"optim": {"weight_decay": 1e-4, "filter_bias_and_bn": False}}, set())
    assert refused == ["optim.filter_bias_and_bn: True -> False"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optim.schedule=constant", "optim.min_lr=0.01"], "does not use optim.min_lr=0.01"),
        (["optim.schedule=cosine", "optim.gamma=0.5"], "does not use optim.gamma=0.5"),
        (["optim.schedule=onecycle", "optim.warmup_epochs=1"], "does not use optim.warmup_epochs=1"),
        (["optim=adam", "optim.nesterov=true"], "optim.name=adam does not use optim.nesterov=True"),
        (["optim=momentum", "optim.beta2=0.9"], "does not use optim.beta2=0.9"),
        (["optim.schedule=multistep"], "needs optim.milestones"),
        (["optim.schedule=multistep", "optim.milestones=[5,3]"], "needs optim.milestones"),
        (["optim=sgd", "optim.momentum=0"], "optim.nesterov=true needs optim.momentum above 0"),
        (["optim.schedule=onecycle", "optim.pct_start=1.5"], "optim.pct_start"),
        (["optim.schedule=step", "optim.gamma=0"], "optim.gamma"),
        (["optim.min_lr=0.1"], "optim.min_lr"),
        (["optim=adam", "optim.filter_bias_and_bn=false"], "optim.filter_bias_and_bn=false has no effect"),
    ],
)
def test_conflicting_optim_settings_are_refused(overrides, message):
    from runner.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(*overrides))
    assert message in str(err.value)
