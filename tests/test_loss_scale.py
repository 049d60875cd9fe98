"""The CPU loss-scale train step: overflow skips the update and halves the scale; good steps grow it."""

import os

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

from runner.amp.train_step import FP32Logits, ScaledTrainStep  # noqa: E402


def _step(scale_type, init, window=1000, drop=False, mode=ms.GRAPH_MODE):
    ms.set_context(mode=mode)
    ms.set_seed(0)
    net = nn.Dense(4, 3)
    loss_net = nn.WithLossCell(FP32Logits(net), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)
    return net, ScaledTrainStep(loss_net, opt, scale_type, init, 2.0, window, drop)


# Inputs up to 10 give weight gradients of order 1, so a 3e38 scale overflows FP32.
X = Tensor((np.random.RandomState(0).rand(8, 4) * 10).astype(np.float32))
Y = Tensor(np.arange(8, dtype=np.int32) % 3)


def _weights(net):
    return net.weight.asnumpy().copy()


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
def test_dynamic_overflow_skips_step_and_halves_scale(mode):
    # A scale of 3e38 makes the scaled FP32 gradients overflow to inf.
    net, step = _step("dynamic", 3e38, mode=mode)
    before = _weights(net)
    loss, overflow, used = step(X, Y)
    assert bool(overflow.asnumpy()) is True
    assert float(used.asnumpy()) == pytest.approx(3e38)  # the step reports the scale it used
    assert float(step.scale.asnumpy()) == pytest.approx(1.5e38)  # and halves it for the next
    assert int(step.skipped.asnumpy()) == 1
    np.testing.assert_array_equal(_weights(net), before)  # the update was skipped
    assert np.isfinite(loss.asnumpy())


def test_dynamic_scale_grows_after_window_good_steps():
    net, step = _step("dynamic", 8.0, window=2)
    before = _weights(net)
    used = [float(step(X, Y)[2].asnumpy()) for _ in range(4)]
    assert used == [8.0, 8.0, 16.0, 16.0]  # doubled after every 2 good steps
    assert float(step.scale.asnumpy()) == 32.0
    assert int(step.skipped.asnumpy()) == 0
    assert not np.array_equal(_weights(net), before)


def test_fixed_scale_without_drop_applies_overflowed_update():
    net, step = _step("fixed", 3e38, drop=False)
    _, overflow, scale = step(X, Y)
    assert bool(overflow.asnumpy()) and float(scale.asnumpy()) == pytest.approx(3e38)
    assert not np.isfinite(_weights(net)).all()  # what drop_overflow_update=true protects against


def test_fixed_scale_with_drop_skips_overflowed_update():
    net, step = _step("fixed", 3e38, drop=True)
    before = _weights(net)
    _, overflow, scale = step(X, Y)
    assert bool(overflow.asnumpy()) and float(scale.asnumpy()) == pytest.approx(3e38)
    np.testing.assert_array_equal(_weights(net), before)


def test_no_scale_trains_like_plain_step():
    net, step = _step("none", 1024.0)
    losses = [float(step(X, Y)[0].asnumpy()) for _ in range(5)]
    assert float(step.scale.asnumpy()) == 1.0
    assert losses[-1] < losses[0]
