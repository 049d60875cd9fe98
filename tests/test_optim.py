"""The `optim` group: every setting changes the learning rates or the optimizer built."""

import math

import pytest
from conftest import compose_cfg

from runner.optim import build_optimizer, lr_schedule


def optim_cfg(*overrides):
    return compose_cfg(*overrides).optim


def test_constant_schedule():
    assert lr_schedule(optim_cfg("optim.schedule=constant", "optim.lr=0.05"), 10, 30) == [0.05] * 30


def test_cosine_schedule_decays_to_min_lr():
    lrs = lr_schedule(optim_cfg("optim.lr=0.1", "optim.min_lr=0.01"), 10, 100)
    assert lrs[0] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    assert lrs[50] == pytest.approx(0.01 + 0.5 * 0.09 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[-1] == pytest.approx(0.01, abs=1e-4)


def test_warmup_ramps_linearly_then_follows_the_schedule():
    lrs = lr_schedule(optim_cfg("optim.lr=0.1", "optim.warmup_epochs=2", "optim.schedule=constant"), 5, 20)
    assert lrs[:10] == pytest.approx([0.1 * (i + 1) / 10 for i in range(10)])
    assert lrs[10:] == [0.1] * 10


def test_optimizers_take_their_settings():
    from mindspore import nn

    params = nn.Dense(3, 2).trainable_params()
    sgd = build_optimizer(optim_cfg("optim.momentum=0.8", "optim.weight_decay=0.01"), params, 4, 8)
    assert isinstance(sgd, nn.Momentum) and float(sgd.momentum.asnumpy()) == pytest.approx(0.8)
    assert float(sgd.weight_decay.asnumpy()) == pytest.approx(0.01)
    adam = build_optimizer(optim_cfg("optim=adam", "optim.momentum=0.85"), params, 4, 8)
    assert isinstance(adam, nn.Adam) and float(adam.beta1.asnumpy()) == pytest.approx(0.85)
    assert adam.learning_rate.learning_rate.shape == (8,)  # one rate per step: the schedule is in the optimizer
