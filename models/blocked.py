"""Blocked bodies: a ResNet's body (stem convolution to last stage) kept in oneDNN's blocked memory.

With model.conv=onednn (and best, where it picks oneDNN) every convolution reorders its plain NCHW input
into oneDNN's blocked nChw{b}c format and its output back, and BatchNorm, ReLU, the residual add and the
max pool run on plain memory between them. Here the body stays blocked from the stem convolution's output
to the last stage's: convolutions (forward, backward-data, backward-weights), BatchNorm with its ReLU
fused (batch or running statistics), the residual add with its ReLU, and the stem's max pool (with a
workspace) all run oneDNN (csrc/blocked.h, conv.h, pool.h) on the blocked tensors, and one reorder brings the result
back to plain NCHW before the global pool and the head.

A blocked tensor reaches MindSpore as float32 (N, ceil(C/b), H, W, b), channels past C zero; b is the
block oneDNN chose for this CPU (`block_size`: 16 with AVX-512, 8 with AVX2), never a constant here. Only
the operators made here read one: nothing outside the body (the head, AMP casts, hooks, export) sees it.
The body's cells keep their parameters (names, shapes), so checkpoints load across paths; `attach` only
adds operators beside them, and the network's `blocked_body` switch selects the path (models/resnet.py).
"""

import ctypes
import functools
from contextlib import contextmanager

import numpy as np
from mindspore import Tensor, nn, ops
from mindspore import dtype as mstype

from runner.models import onednn
from runner.models.errors import ModelError


@functools.cache
def _lib(so: str):
    lib = ctypes.CDLL(so)  # verified by onednn.library(): its digest matched before anything loaded it
    lib.BlockSize.restype = ctypes.c_int
    lib.BnWorkspaceBytes.restype = ctypes.c_int64
    lib.BnWorkspaceBytes.argtypes = [ctypes.c_int64] * 8
    lib.BlockedMaxPoolWorkspaceBytes.restype = ctypes.c_int64
    lib.BlockedMaxPoolWorkspaceBytes.argtypes = [ctypes.c_int64] * 7
    return lib


def block_size() -> int:
    """oneDNN's channel block for this CPU's convolutions (16 with AVX-512, 8 with AVX2); 0 where its fast
    kernels do not run on a blocked format (then bodies stay plain). Builds the library if need be."""
    return max(int(_lib(onednn.library()).BlockSize()), 0)


def blocks(channels: int, b: int) -> int:
    return -(-channels // b)


def converters(channels: int, b: int):
    """(to_blocked, from_blocked, like): operators between plain and blocked `channels`-channel tensors,
    each the other's backward, called as op(x, like). `like` (zeros, shape (channels,)) carries the
    channel count in its shape: a bprop is parsed once for all the closures of one function, so it must
    not read the count from a closure."""
    so = onednn.library()

    def plain(x, like):
        return [x[0], like[0], x[2], x[3]]

    def blocked(x, like):
        return [x[0], blocks(like[0], b), x[2], x[3], b]

    def same(x, like):
        return x

    back_to = onednn.custom(so, "ToBlocked", blocked, same, reads=(b,))
    back_from = onednn.custom(so, "FromBlocked", plain, same)

    def to_bprop(x, like, out, dout):
        return back_from(dout, like), ops.zeros_like(like)

    def from_bprop(x, like, out, dout):
        return back_to(dout, like), ops.zeros_like(like)

    to = onednn.custom(so, "ToBlocked", blocked, same, to_bprop, (b,))
    frm = onednn.custom(so, "FromBlocked", plain, same, from_bprop)
    return to, frm, Tensor(np.zeros(channels, np.float32))


def _conv_ops(
    kind: str, kernel_size: int, stride: int, padding: int, b: int, data_kind: str = "", weights_kind: str = ""
):
    """The forward operator `kind`Forward (x, w, geometry) -> blocked y, with (`data_kind` or
    `kind`)BackwardData and (`weights_kind` or `kind`)BackwardWeights as its backward, and the geometry
    tensor: "Conv", "Dense", "Winograd" or "Winof" (csrc)."""
    so = onednn.library()

    def y_shape(x, w, g):
        side = [(x[i] + 2 * padding - kernel_size) // stride + 1 for i in (2, 3)]
        return [x[0], blocks(w[0], b), side[0], side[1], b]

    backward_data = onednn.custom(so, f"{data_kind or kind}BackwardData", lambda dy, w, x, g: x, lambda dy, w, x, g: x)
    backward_weights = onednn.custom(
        so, f"{weights_kind or kind}BackwardWeights", lambda x, dy, w, g: w, lambda x, dy, w, g: w
    )

    def bprop(x, w, g, out, dout):
        return backward_data(dout, w, x, g), backward_weights(x, dout, w, g), ops.zeros_like(g)

    reads = (kernel_size, stride, padding, b)
    forward = onednn.custom(so, f"{kind}Forward", y_shape, lambda x, w, g: x, bprop, reads)
    return forward, onednn.geometry((stride,) * 2, (padding,) * 4)


def conv_op(kernel_size: int, stride: int, padding: int, b: int, winograd_dw: bool = False, winograd: bool = False):
    """A square convolution (x, w, geometry) -> blocked y, with its backward: x blocked, or plain (the stem,
    whose input is the image); w plain (O, C, k, k) as the cell holds it, its gradient likewise.
    winograd_dw: the weight gradient by Winograd's F(2x2, 3x3) where the call's shapes allow it (3x3, stride
    1, pad 1, even maps up to 4x4; models/conv.py winograd_feasible), oneDNN's kernel elsewhere (csrc
    WinogradBackwardWeights). winograd: the forward and backward-data passes by Winograd's F(2x2, 3x3) too,
    on blocked x and y (3x3, stride 1, pad 1; models/conv.py winograd_all_feasible; csrc WinofForward)."""
    if winograd:
        return _conv_ops("Winof", kernel_size, stride, padding, b, weights_kind="Winograd")
    if winograd_dw:
        # A forward of its own name (csrc WinogradForward is ConvForward): in graph mode MindSpore gives
        # Custom operators of one function one backward, so ConvForward's would run in its place.
        return _conv_ops("Winograd", kernel_size, stride, padding, b, data_kind="Conv")
    return _conv_ops("Conv", kernel_size, stride, padding, b)


def dense_op(kernel_size: int, stride: int, padding: int, b: int):
    """`conv_op` for a layer whose every output pixel's window covers the whole input (models/conv.py
    dense_feasible: layer4's 3x3 convolutions on 2x2 maps): one oneDNN matmul per pass on the blocked x and
    y as they lie, the weight gathered into the dense (C*H*W, O*OH*OW) matrix in the operator (csrc Dense).
    x blocked, w plain (O, C, k, k), its gradient likewise."""
    return _conv_ops("Dense", kernel_size, stride, padding, b)


def bn_ops(relu: bool, eps: float, b: int):
    """BatchNorm on a blocked tensor, ReLU fused when `relu`: (with batch statistics, with global ones,
    their configuration tensors). Batch: (x, gamma, beta, cfg) -> (y, mean, biased variance, workspace);
    global: (x, gamma, beta, mean, variance, cfg) -> (y, workspace). Both with their backward."""
    so = onednn.library()
    lib = _lib(so)
    eps_bits = int(np.array(eps, np.float64).view(np.int64))

    def workspace(x, gamma, cfg, glob):
        n, _, h, w, _ = x
        # ReLU or not from the configuration's length, not from this closure: PyNative caches an operator's
        # output shapes by its name and input shapes, and both variants share the name.
        got = lib.BnWorkspaceBytes(n, gamma[0], h, w, b, int(cfg[0] == 4), eps_bits, glob)
        if got < 0:
            raise ModelError(f"model.conv: oneDNN has no batch normalization for blocked input {tuple(x)}")
        return [max(got, 1)]

    backward = onednn.custom(
        so, "BnBackward", lambda dy, x, g, m, v, ws, cfg: (x, g, g), lambda dy, x, g, m, v, ws, cfg: (x, g, g)
    )

    def batch_bprop(x, gamma, beta, cfg, out, dout):
        dx, dgamma, dbeta = backward(dout[0], x, gamma, out[1], out[2], out[3], cfg)
        return dx, dgamma, dbeta, ops.zeros_like(cfg)

    def global_bprop(x, gamma, beta, mean, var, cfg, out, dout):
        dx, dgamma, dbeta = backward(dout[0], x, gamma, mean, var, out[1], cfg)
        return dx, dgamma, dbeta, ops.zeros_like(mean), ops.zeros_like(var), ops.zeros_like(cfg)

    batch = onednn.custom(
        so,
        "BnTrainForward",
        lambda x, g, bt, cfg: (x, g, g, workspace(x, g, cfg, 0)),
        lambda x, g, bt, cfg: (x, g, g, mstype.uint8),
        batch_bprop,
        (b, eps_bits),
    )
    glob = onednn.custom(
        so,
        "BnGlobalForward",
        lambda x, g, bt, m, v, cfg: (x, workspace(x, g, cfg, 1)),
        lambda x, g, bt, m, v, cfg: (x, mstype.uint8),
        global_bprop,
        (b, eps_bits),
    )
    # (relu, epsilon's bits, global statistics), and a fourth value (unread) where the ReLU is fused.
    cfg = [Tensor(np.array([int(relu), eps_bits, g] + [1] * relu, np.int64)) for g in (0, 1)]
    return batch, glob, cfg[0], cfg[1]


def add_relu_op():
    """(a, b) -> relu(a + b) on two tensors of one layout, with its backward (the same gradient to both)."""
    so = onednn.library()
    backward = onednn.custom(so, "ReluBackward", lambda dy, y: dy, lambda dy, y: dy)

    def bprop(a, b, out, dout):
        d = backward(dout, out)
        return d, d

    return onednn.custom(so, "AddRelu", lambda a, b: a, lambda a, b: a, bprop)


def max_pool_op(kernel_size: int, stride: int, b: int):
    """Max pool ("same" padding) on a blocked tensor -> (y, workspace), with its backward reading the
    workspace (the stem's pool)."""
    so = onednn.library()
    lib = _lib(so)

    def shapes(x, ks):
        n, cb, h, w, _ = x
        got = lib.BlockedMaxPoolWorkspaceBytes(n, cb * b, h, w, kernel_size, stride, b)
        if got < 0:
            raise ModelError(f"model.conv: oneDNN has no max pooling for blocked input {tuple(x)}")
        return [n, cb, -(-h // stride), -(-w // stride), b], [max(got, 1)]

    return onednn.pool_with_workspace(so, shapes, kernel_size, stride, b)


def bn_blocked(self, x, relu: bool):
    """BatchNorm2d cell `self`'s computation on a blocked x (`attach_bn` gave it the operators): the statistics it
    would use in construct (batch ones while training unless frozen), the running ones updated as
    MindSpore's BatchNorm updates them (momentum, unbiased batch variance)."""
    if relu:
        batch_op, global_op, batch_cfg, global_cfg = self.bk_relu_ops
    else:
        batch_op, global_op, batch_cfg, global_cfg = self.bk_ops
    use_batch = self.training if self.use_batch_statistics is None else self.use_batch_statistics
    if use_batch:
        y, mean, var, _ = batch_op(x, self.gamma, self.beta, batch_cfg)
        mean = ops.stop_gradient(mean)
        count = x.shape[0] * x.shape[2] * x.shape[3]
        var = ops.stop_gradient(var) * (count / max(count - 1, 1))
        m = self.momentum  # MindSpore's: the batch statistics' weight (1 - nn.BatchNorm2d's momentum)
        y = ops.depend(y, ops.assign(self.moving_mean, self.moving_mean * (1.0 - m) + mean * m))
        y = ops.depend(y, ops.assign(self.moving_variance, self.moving_variance * (1.0 - m) + var * m))
        return y
    return global_op(x, self.gamma, self.beta, self.moving_mean, self.moving_variance, global_cfg)[0]


def attach_bn(bn: nn.BatchNorm2d, b: int) -> None:
    """Give a BatchNorm2d cell the operators `bn_blocked` runs (its class, parameters and construct unchanged:
    a subclass would escape amp=o1's rewrite, which matches cell classes exactly)."""
    bn.bk_ops = bn_ops(False, bn.eps, b)
    bn.bk_relu_ops = bn_ops(True, bn.eps, b)


@contextmanager
def plain_bodies(net):
    """Run `net`'s blocked bodies plain NCHW inside the block: for probes that hook cells (FLOP counts, plan,
    amp diagnose), whose hooks must see the cells called with plain tensors."""
    cells = [c for _, c in net.cells_and_names() if getattr(c, "_blocked", False)]
    for c in cells:
        c._blocked = False
    try:
        yield
    finally:
        for c in cells:
            c._blocked = True


def body_layout(net) -> str:
    """The memory format `net`'s body keeps between layers: a blocked one (nChw16c ...) or "nchw"."""
    for _, cell in net.cells_and_names():
        if getattr(cell, "_blocked", False):
            return cell.body_layout
    return "nchw"


def plain_body(net) -> None:
    """Run every blocked body of `net` plain NCHW from now on (AMP above O0 casts inside bodies)."""
    for _, cell in net.cells_and_names():
        if getattr(cell, "_blocked", False):
            cell.plain_body()
