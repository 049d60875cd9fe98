"""Blocked bodies (models/blocked.py): every operator on oneDNN's blocked memory matches MindSpore's own
forward and backward, BatchNorm's running statistics follow MindSpore's, and a whole ResNet's loss,
gradients and evaluation on the blocked body equal the plain path's with the same parameters."""

import json
import os
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest
from conftest import compose_cfg, metrics, needs_compiler, outputs_of, run_module
from mindspore import Tensor, nn, ops

from runner.models import blocked
from runner.models.resnet import resnet

pytestmark = [
    pytest.mark.cpu_only,
    needs_compiler(),  # blocked bodies run the oneDNN library built with a compiler
]


@pytest.fixture(autouse=True, scope="module")
def graph_and_block(tmp_path_factory):
    """Graph mode (as training runs) and a private cache for the library; yields the CPU's block size."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        mode = ms.get_context("mode")
        ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
        b = blocked.block_size()
        if not b:
            pytest.skip("oneDNN runs no fast convolution kernels on a blocked format on this CPU")
        yield b
        ms.set_context(mode=mode)


def rand(*shape, seed=0):
    return Tensor(np.random.RandomState(seed).randn(*shape).astype(np.float32))


def grads_of(cell, *inputs):
    """(output, input gradients, parameter gradients) for a fixed upstream gradient."""
    out = cell(*inputs)
    dy = rand(*out.shape, seed=9)
    grad = ops.GradOperation(get_all=True, get_by_list=True, sens_param=True)
    ins, params = grad(cell, cell.trainable_params())(*inputs, dy)
    return [out.asnumpy()] + [g.asnumpy() for g in (*ins, *params)]


def assert_close(a, b, tol=1e-4):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        scale = max(1.0, float(np.abs(y).max()))
        assert np.abs(x - y).max() <= tol * scale, (i, float(np.abs(x - y).max()), scale)


class Around(nn.Cell):
    """A plain tensor converted to blocked, `body` on it, converted back: what a blocked body does."""

    def __init__(self, body, cin, cout, b):
        super().__init__()
        self.body = body
        self.to, _, self.cin = blocked.converters(cin, b)
        _, self.back, self.cout = blocked.converters(cout, b)

    def construct(self, *xs):
        return self.back(self.body(*[self.to(x, self.cin) for x in xs]), self.cout)


class BnRelu(nn.Cell):
    def __init__(self, c, relu, b=0):
        super().__init__()
        self.bn, self.relu, self.blocked = nn.BatchNorm2d(c), relu, b > 0
        if b:
            blocked.attach_bn(self.bn, b)

    def construct(self, x):
        if self.blocked:
            return blocked.bn_blocked(self.bn, x, self.relu)
        y = self.bn(x)
        return ops.relu(y) if self.relu else y


# 20 channels: not a multiple of any block, so the padded channels are exercised too.
@pytest.mark.parametrize("relu", [True, False], ids=["relu", "no-relu"])
@pytest.mark.parametrize("train", [True, False], ids=["batch-stats", "running-stats"])
def test_batchnorm_relu_matches_mindspore_forward_backward_and_running_stats(graph_and_block, relu, train):
    b, c = graph_and_block, 20
    mine, native = Around(BnRelu(c, relu, b), c, c, b), BnRelu(c, relu)
    gamma, beta = rand(c, seed=1).asnumpy() * 0.5 + 1, rand(c, seed=2).asnumpy()
    for net in (mine.body, native):
        net.bn.gamma.set_data(Tensor(gamma))
        net.bn.beta.set_data(Tensor(beta))
        net.bn.moving_mean.set_data(Tensor(gamma - 1))
        net.bn.moving_variance.set_data(Tensor(np.abs(gamma) + 0.5))
    mine.set_train(train)
    native.set_train(train)
    x = rand(4, c, 5, 3)
    for _ in range(3):  # each call with batch statistics updates the running ones
        assert_close(grads_of(mine, x), grads_of(native, x))
    for name in ("moving_mean", "moving_variance"):
        got, want = getattr(mine.body.bn, name).asnumpy(), getattr(native.bn, name).asnumpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
    if train:  # the statistics moved: the test compared updates, not initial values
        assert not np.allclose(native.bn.moving_mean.asnumpy(), gamma - 1)


def test_a_frozen_batchnorm_uses_running_stats_and_passes_gradients_in_training(graph_and_block):
    b, c = graph_and_block, 16
    mine, native = Around(BnRelu(c, True, b), c, c, b), BnRelu(c, True)
    for net in (mine.body, native):
        net.bn.use_batch_statistics = False  # what optim.freeze does
        net.bn.moving_variance.set_data(Tensor(np.full(c, 2.0, np.float32)))
    mine.set_train(True)
    native.set_train(True)
    assert_close(grads_of(mine, rand(2, c, 4, 4)), grads_of(native, rand(2, c, 4, 4)))
    assert np.allclose(mine.body.bn.moving_variance.asnumpy(), 2.0)


class AddRelu(nn.Cell):
    def __init__(self, b=0):
        super().__init__()
        self.op = blocked.add_relu_op() if b else None

    def construct(self, a, c):
        return self.op(a, c) if self.op is not None else ops.relu(a + c)


def test_add_relu_matches_mindspore_forward_and_both_input_gradients(graph_and_block):
    b = graph_and_block
    x, y = rand(3, 24, 5, 5, seed=3), rand(3, 24, 5, 5, seed=4)
    assert_close(grads_of(Around(AddRelu(b), 24, 24, b), x, y), grads_of(AddRelu(), x, y))


def test_add_relu_is_exact_on_lengths_its_vector_loops_do_not_divide(graph_and_block):
    # 3 x 4099 floats: no vector width divides the length or the threads' shares, so each loop's tail runs.
    # A NaN passes through relu(a + b) (as std::max and PyTorch's relu pass it; MindSpore's CPU Relu gives 0),
    # and the gradient is dy where y > 0.
    a, c = np.random.RandomState(1).randn(2, 3, 4099).astype(np.float32)
    a[0, :5] = [np.nan, -0.0, 0.0, np.inf, -np.inf]
    y, da, dc = grads_of(AddRelu(graph_and_block), Tensor(a), Tensor(c))
    want = np.maximum(a + c, 0)  # NaN propagates, as in np.maximum
    assert np.array_equal(y, want, equal_nan=True)
    dy = rand(3, 4099, seed=9).asnumpy()
    assert np.array_equal(da, np.where(want > 0, dy, 0)) and np.array_equal(dc, da)


class Pool(nn.Cell):
    def __init__(self, b=0):
        super().__init__()
        self.native = nn.MaxPool2d(3, stride=2, pad_mode="same")
        self.op, self.params = blocked.max_pool_op(3, 2, b) if b else (None, None)

    def construct(self, x):
        return self.op(x, self.params)[0] if self.op is not None else self.native(x)


@pytest.mark.parametrize("shape", [(2, 20, 9, 9), (2, 16, 8, 8), (1, 8, 2, 2)], ids=str)
def test_blocked_max_pool_matches_mindspores_forward_and_backward(graph_and_block, shape):
    b = graph_and_block
    x = rand(*shape, seed=5)
    assert_close(grads_of(Around(Pool(b), shape[1], shape[1], b), x), grads_of(Pool(), x))


class Conv(nn.Cell):
    """A convolution with a blocked output: from a plain input (the stem) or a blocked one."""

    def __init__(self, cin, cout, k, s, p, b, plain_in, dense=False, winograd_dw=False, winograd=False):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride=s, pad_mode="pad" if p else "valid", padding=p, has_bias=False)
        if dense:
            self.op, self.geometry = blocked.dense_op(k, s, p, b)
        else:
            self.op, self.geometry = blocked.conv_op(k, s, p, b, winograd_dw=winograd_dw, winograd=winograd)
        self.to, _, self.cin = blocked.converters(cin, b)
        _, self.back, self.cout = blocked.converters(cout, b)
        self.plain_in = plain_in

    def construct(self, x):
        if not self.plain_in:
            x = self.to(x, self.cin)
        return self.back(self.op(x, self.conv.weight, self.geometry), self.cout)


@pytest.mark.parametrize("plain_in", [False, True], ids=["blocked-in", "plain-in"])
@pytest.mark.parametrize(
    "shape", [(20, 24, 3, 1, 1, 6), (16, 8, 3, 2, 1, 7), (24, 32, 1, 2, 0, 6), (3, 16, 7, 2, 3, 9)], ids=str
)
def test_blocked_convolution_matches_nn_conv2d_forward_and_both_backward_passes(graph_and_block, shape, plain_in):
    cin, cout, k, s, p, size = shape
    mine = Conv(cin, cout, k, s, p, graph_and_block, plain_in)
    x = rand(2, cin, size, size, seed=6)
    assert_close(grads_of(mine, x), grads_of(mine.conv, x))


# (operator, (cin, cout, k, stride, pad, size, batch)). dense: 12 and 20 channels are no multiple of a block;
# 3x3 on 2x2 maps (layer4's), a strided one to 1x1, a 1x1 map; and 3x3 on 3x3, where the dense matrix is not
# dense (corner pixels share no tap): the operator is exact for any geometry, dense_feasible only decides where
# it pays. winograd-dw (the weight gradient): 4x4 maps (layer3's), with channels no multiple of a block and
# more tiles than threads (in chunks), and 2x2; 96 x 100 channels, whose dU (16 x 96 x 104 floats) is too
# large for a thread's chunked sum (every tile at once); an odd map of few channels (in chunks); where the
# operator's shapes rule it out (a stride, a 1x1 kernel) oneDNN's kernel computes it, and must give the same.
# winograd (all three passes): channels no multiple of a block, a map no multiple of the 2x2 tile (9x9: edge
# tiles cut), more tiles than a thread's chunk (16x16, 64 channels, batch 8: chunks that end inside an image,
# the weight gradient in chunks), a 2x2 map; a stride or a 1x1 kernel go to oneDNN's kernels.
@pytest.mark.parametrize(
    "kind,shape",
    [
        ("dense", (12, 20, 3, 1, 1, 2, 3)),
        ("dense", (32, 16, 3, 1, 1, 2, 2)),
        ("dense", (20, 12, 3, 2, 1, 2, 3)),
        ("dense", (8, 24, 3, 1, 1, 1, 2)),
        ("dense", (12, 8, 3, 1, 1, 3, 3)),
        ("winograd-dw", (12, 20, 3, 1, 1, 4, 3)),
        ("winograd-dw", (40, 24, 3, 1, 1, 4, 5)),
        ("winograd-dw", (16, 16, 3, 1, 1, 2, 2)),
        ("winograd-dw", (96, 100, 3, 1, 1, 4, 3)),
        ("winograd-dw", (8, 12, 3, 1, 1, 3, 2)),
        ("winograd-dw", (8, 12, 3, 2, 1, 4, 2)),
        ("winograd-dw", (8, 12, 1, 1, 0, 4, 2)),
        ("winograd", (12, 20, 3, 1, 1, 8, 3)),
        ("winograd", (20, 12, 3, 1, 1, 9, 2)),
        ("winograd", (16, 16, 3, 1, 1, 6, 2)),
        ("winograd", (64, 64, 3, 1, 1, 16, 8)),
        ("winograd", (8, 12, 3, 1, 1, 2, 2)),
        ("winograd", (8, 12, 3, 2, 1, 8, 2)),
        ("winograd", (8, 12, 1, 1, 0, 8, 2)),
    ],
    ids=str,
)
def test_the_dense_and_winograd_operators_match_nn_conv2d_forward_and_both_backward_passes(
    graph_and_block, kind, shape
):
    cin, cout, k, s, p, size, batch = shape
    mine = Conv(
        cin,
        cout,
        k,
        s,
        p,
        graph_and_block,
        plain_in=False,
        dense=kind == "dense",
        winograd_dw=kind == "winograd-dw",
        winograd=kind == "winograd",
    )
    x = rand(batch, cin, size, size, seed=6)
    assert_close(grads_of(mine, x), grads_of(mine.conv, x))


def test_the_blocked_dense_convolution_leaves_padded_channels_zero(graph_and_block):
    # The next layer reads the padded channels of y (and the previous one those of dx) as zeros.
    b = graph_and_block
    cin, cout = b + 4, b + 3
    op, geometry = blocked.dense_op(3, 1, 1, b)
    to, _, like = blocked.converters(cin, b)
    w = rand(cout, cin, 3, 3, seed=2)

    class Net(nn.Cell):
        def construct(self, x):
            return op(x, w, geometry)

    class Blocked(nn.Cell):
        def construct(self, x):
            return to(x, like)

    x = Blocked()(rand(3, cin, 2, 2, seed=3))
    y = Net()(x).asnumpy()
    assert y.shape == (3, 2, 2, 2, b)
    assert np.abs(y[:, 1, :, :, cout - b :]).max() == 0 and np.abs(y[:, 1, :, :, : cout - b]).max() > 0
    dy = rand(*y.shape, seed=4)  # nonzero in the padded channels too, which must not reach dx
    dx = ops.GradOperation(sens_param=True)(Net())(x, dy).asnumpy()
    assert np.abs(dx[:, 1, :, :, cin - b :]).max() == 0 and np.abs(dx[:, 1, :, :, : cin - b]).max() > 0


def twins(depth, style, width, size, conv="onednn"):
    """The same ResNet twice with the same parameters: blocked body, and plain."""
    ms.set_seed(0)
    a = resnet(style, depth, width, 10, 3, size, conv=conv)
    b = resnet(style, depth, width, 10, 3, size, conv=conv)
    b.plain_body()
    assert a.blocked_body and not b.blocked_body
    assert [(p.name, p.shape) for p in a.get_parameters()] == [(p.name, p.shape) for p in b.get_parameters()]
    ms.load_param_into_net(b, {p.name: ms.Parameter(Tensor(p.asnumpy()), name=p.name) for p in a.get_parameters()})
    return a, b


@pytest.mark.parametrize(
    "depth,style,width,size",
    [  # widths 8 and 12: padded channel blocks; the ImageNet stem's 64 px (20 s) with the slow tests
        pytest.param(18, "imagenet", 8, 64, id="resnet18-imagenet-stem", marks=pytest.mark.slow),
        pytest.param(20, "cifar", 12, 8, id="resnet20-cifar"),
    ],
)
def test_a_whole_resnet_on_the_blocked_body_equals_the_plain_path(graph_and_block, depth, style, width, size):
    # model.conv=best (these widths are below what it times: every layer oneDNN, as without a timing cache).
    blocked_net, plain_net = twins(depth, style, width, size, conv="best")
    # The last stage's 3x3 convolutions on 2x2 maps (all but the strided one) run the blocked dense matmul.
    dense = [n for n, c in blocked_net.cells_and_names() if getattr(c, "bk_path", "") == "dense"]
    last = "layer4" if depth == 18 else "layer3"
    blocks = 2 if depth == 18 else 3
    assert dense == [f"{last}.0.conv2"] + [f"{last}.{i}.conv{j}" for i in range(1, blocks) for j in (1, 2)]
    # The stage before, on 4x4 maps, takes its stride-1 3x3 convolutions' weight gradients by Winograd.
    wino = [n for n, c in blocked_net.cells_and_names() if getattr(c, "bk_path", "") == "winograd-dw"]
    before = "layer3" if depth == 18 else "layer2"
    assert wino == [f"{before}.0.conv2"] + [f"{before}.{i}.conv{j}" for i in range(1, blocks) for j in (1, 2)]
    # Stride-1 3x3 convolutions on 8x8 maps and more run by Winograd F(2x2, 3x3): layer1 (16x16 and 8x8) and
    # ResNet-18's layer2 (8x8); not the CIFAR stem, which reads the plain image.
    wino_all = [n for n, c in blocked_net.cells_and_names() if getattr(c, "bk_path", "") == "winograd"]
    first = [f"layer1.{i}.conv{j}" for i in range(blocks) for j in (1, 2)]
    assert wino_all == (first + ["layer2.0.conv2", "layer2.1.conv1", "layer2.1.conv2"] if depth == 18 else first)
    # An explicit model.conv=onednn asks for oneDNN's convolution in every layer, and gets it.
    asked = resnet(style, depth, width, 10, 3, size, conv="onednn")
    assert asked.blocked_body and {getattr(c, "bk_path", "onednn") for _, c in asked.cells_and_names()} == {"onednn"}
    x, y = rand(4, 3, size, size, seed=7), Tensor(np.array([1, 2, 3, 4], np.int32))
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    steps = []
    for net in (blocked_net, plain_net):
        with_loss = nn.WithLossCell(net, loss)
        with_loss.set_train(True)
        grads = ops.GradOperation(get_by_list=True)(with_loss, with_loss.trainable_params())(x, y)
        steps.append(
            (net, [g.asnumpy() for g in grads], nn.TrainOneStepCell(with_loss, nn.SGD(net.trainable_params(), 0.1)))
        )
    assert_close(steps[0][1], steps[1][1])  # every parameter's gradient (BatchNorm's gamma and beta too)

    def state(net):
        return {p.name: p.asnumpy().copy() for p in net.get_parameters()}

    def load(net, values):
        ms.load_param_into_net(net, {k: ms.Parameter(Tensor(v), name=k) for k, v in values.items()})

    # Each step starts both from the blocked net's state, and one step is compared: two trajectories of
    # their own part at the first ReLU whose input the two summation orders put on either side of zero
    # (measured under ONEDNN_MAX_CPU_ISA=AVX2: states 7e-7 apart after two momentum steps, then a kink on the
    # line between them moved layer1.1.conv1's gradient by 0.08, where 1e-7 noise in any other direction
    # moved it by 4e-7). From one state the two differ by their rounding only (measured ~1e-6).
    for _ in range(3):  # the weights and running statistics move
        start = state(blocked_net)
        load(plain_net, start)
        losses = []
        for _, _, step in steps:
            step.set_train(True)
            losses.append(float(step(x, y).asnumpy()))
        np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
        after = state(blocked_net), state(plain_net)
        assert_close(list(after[0].values()), list(after[1].values()))  # parameters, moving means and variances
        assert any(not np.array_equal(after[0][k], start[k]) for k in start if "moving" in k)
    load(plain_net, state(blocked_net))
    for net, _, _ in steps:
        net.set_train(False)
    assert_close([blocked_net(x).asnumpy()], [plain_net(x).asnumpy()])  # evaluation: running statistics


def test_bottleneck_block_on_the_blocked_body_equals_its_plain_construct(graph_and_block):
    # Whole ResNet-50 gradients at random initialisation differ between any two convolution algorithms
    # by up to 20% on some layers (the native and the plain oneDNN path too): compared block by block.
    b = graph_and_block
    net = resnet("imagenet", 50, 16, 10, 3, 64, conv="onednn")
    block = net.layer2[0]  # a strided block with a projection shortcut

    class Blocked(nn.Cell):
        def __init__(self):
            super().__init__()
            self.block = block
            self.to, _, self.cin = blocked.converters(64, b)
            _, self.back, self.cout = blocked.converters(128, b)

        def construct(self, x):
            return self.back(self.block.blocked(self.to(x, self.cin)), self.cout)

    mine = Blocked()
    mine.set_train(True)
    block.set_train(True)
    x = rand(4, 64, 8, 8, seed=8)
    assert_close(grads_of(mine, x), grads_of(block, x))


def test_amp_and_the_hook_probes_see_the_plain_body(graph_and_block):
    net = resnet("cifar", 8, 8, 10, 3, 8, conv="onednn")
    assert blocked.body_layout(net) == f"nChw{graph_and_block}c"
    with blocked.plain_bodies(net):
        assert blocked.body_layout(net) == "nchw"
    assert net.blocked_body
    from runner.amp.precision import wrap_amp

    wrap_amp(net, "O2", [], ".")
    assert not net.blocked_body


def test_the_body_stays_plain_when_asked_or_when_the_stem_pool_pads_like_torch(graph_and_block):
    assert resnet("cifar", 8, 8, 10, 3, 8, conv="onednn").blocked_body
    assert not resnet("cifar", 8, 8, 10, 3, 8, conv="onednn", blocked_body=False).blocked_body  # model.blocked_body
    assert not resnet("imagenet", 18, 8, 10, 3, 64, conv="onednn", stem_pool="torch").blocked_body
    assert not resnet("cifar", 8, 8, 10, 3, 8, conv="native").blocked_body


@pytest.mark.parametrize(
    "overrides",
    [["model.conv=native", "model.blocked_layers=onednn"], ["model.conv=gemm", "model.blocked_body=false"]],
)
def test_a_body_setting_that_would_change_nothing_is_refused(overrides):
    from runner.config.checks import validate
    from runner.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(*overrides))
    assert f"{overrides[1]} has no effect" in str(err.value) and overrides[0] in str(err.value)
    validate(compose_cfg(overrides[1]))  # under the default model.conv=best it is what runs


@pytest.mark.slow
def test_a_default_run_records_its_blocked_body_and_evaluates_and_exports_to_its_numbers(tiny_run):
    m = metrics(tiny_run)
    assert m["flops"]["body_layout"].startswith("nChw")  # the default path ran the blocked body
    assert sum(e["layers"] for e in m["flops"]["conv_paths"].values()) == 9  # and still counts every layer
    # Evaluation builds the same network (blocked body, running statistics) from the checkpoint.
    proc = run_module("runner.evaluate", f"run={tiny_run}")
    evaluated = json.loads((outputs_of(proc) / "metrics.json").read_text())
    assert evaluated["top1"] == pytest.approx(m["val_accuracy"], abs=1e-9)
    # The exported file holds the plain body with MindSpore's own operators: the same numbers.
    proc = run_module("runner.export", f"run={tiny_run}", "format=mindir", "parity_samples=10")
    record = json.loads((outputs_of(proc) / "export.json").read_text())
    assert record["parity_ok"] and record["max_abs_diff"] <= 1e-4


def test_blocked_layers_onednn_keeps_every_layer_on_onednns_convolution(graph_and_block):
    def layers(path, blocked_layers="chosen"):
        net = resnet("imagenet", 18, 8, 10, 3, 64, conv="best", blocked_layers=blocked_layers)
        return [n for n, c in net.cells_and_names() if getattr(c, "bk_path", "") == path]

    assert layers("dense") == ["layer4.0.conv2", "layer4.1.conv1", "layer4.1.conv2"]
    assert layers("winograd-dw") == ["layer3.0.conv2", "layer3.1.conv1", "layer3.1.conv2"]
    assert len(layers("winograd")) == 7  # layer1's four, layer2's three stride-1 ones
    assert [layers(p, "onednn") for p in ("dense", "winograd-dw", "winograd")] == [[], [], []]
    assert len(layers("onednn", "onednn")) == 20  # every convolution but the stem's, on the blocked tensor


@pytest.mark.slow
def test_the_dense_and_winograd_operators_hold_on_blocks_of_8_channels(tmp_path):
    # Blocks are 16 channels on an AVX-512 CPU and 8 on an AVX2 one; every transform takes the block as a
    # parameter. On an AVX-512 CPU the operator tests run again in a process capped to AVX2, where oneDNN picks 8.
    from runner.models.onednn import cpu_flags

    if "avx512f" not in (cpu_flags() or ()):
        pytest.skip("this CPU's blocks are already the AVX2 ones: the default run tests them")
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", XDG_CACHE_HOME=str(tmp_path))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    block = "import mindspore as ms; from runner.models import blocked; print('block', blocked.block_size())"
    probe = subprocess.run(
        [sys.executable, "-c", block], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert "block 8" in probe.stdout, probe.stdout + probe.stderr[-2000:]
    tests = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", __file__]
    proc = subprocess.run(
        [*tests, "-k", "dense_and_winograd or whole_resnet"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-3000:]
