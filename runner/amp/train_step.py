"""Train-step cells: loss scaling with overflow skip that also runs on CPU, and a jit-compiled variant."""

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype
from mindspore.amp import all_finite
from mindspore.context import ParallelMode
from mindspore.parallel._utils import _get_device_num, _get_gradients_mean, _get_parallel_mode


def drops_overflow(scale_type: str, drop_overflow_update: bool) -> bool:
    """Whether an overflowing step skips its update: always under a dynamic scale, by choice under a fixed one."""
    return scale_type == "dynamic" or (scale_type == "fixed" and bool(drop_overflow_update))


class FP32Logits(nn.Cell):
    """Casts the network's output to FP32 so losses and metrics never run in FP16."""

    def __init__(self, net):
        super().__init__(auto_prefix=False)
        self.net = net

    def construct(self, x):
        return ops.cast(self.net(x), mstype.float32)


class ScaledTrainStep(nn.Cell):
    """One optimizer step with a fixed or dynamic loss scale; returns (loss, overflow, scale used).

    With grad_stats=True it also returns a (parameters x 2) tensor: each unscaled gradient's sum of
    squares and its count of non-finite values, computed in the step so that `diagnose=on` sees
    the very gradients the optimizer got, without a second backward pass.

    MindSpore's Model refuses DynamicLossScaleManager on CPU and TrainOneStepWithLossScaleCell
    needs NPUGetFloatStatusV2, which the CPU lacks (docs/mindspore-notes.md#cpu-loss-scale). This cell checks the
    unscaled gradients with all_finite instead, which every backend has.
    """

    def __init__(
        self,
        loss_net,
        optimizer,
        scale_type: str,
        init: float,
        factor: float,
        window: int,
        drop: bool,
        grad_stats=False,
    ):
        super().__init__(auto_prefix=False)
        self.loss_net = loss_net
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.scaled = scale_type != "none"
        self.dynamic = scale_type == "dynamic"
        self.drop = drops_overflow(scale_type, drop)
        self.factor = float(factor)
        self.window = int(window)
        scale = float(init) if scale_type != "none" else 1.0
        self.scale = Parameter(Tensor(scale, mstype.float32), name="loss_scale", requires_grad=False)
        self.good_steps = Parameter(Tensor(0, mstype.int32), name="loss_scale_good_steps", requires_grad=False)
        self.skipped = Parameter(Tensor(0, mstype.int32), name="loss_scale_skipped_steps", requires_grad=False)
        self.hyper_map = ops.HyperMap()
        # Under data parallel (msrun) a custom train cell must average gradients itself, as
        # nn.TrainOneStepCell does; before the finiteness check, so every rank skips the same steps.
        self.grad_reducer = nn.Identity()
        if _get_parallel_mode() in (ParallelMode.DATA_PARALLEL, ParallelMode.HYBRID_PARALLEL):
            self.grad_reducer = nn.DistributedGradReducer(self.weights, _get_gradients_mean(), _get_device_num())
        self.grad_stats = grad_stats

    def construct(self, *inputs):
        return self.step(*inputs)

    def step(self, *inputs):
        loss = self.loss_net(*inputs)
        # The scale this step uses, read before _update_scale assigns the next one (the trace's column).
        used = self.scale + 0.0
        sens = ops.fill(loss.dtype, loss.shape, 1.0) * ops.cast(used, loss.dtype)
        grads = self.grad(self.loss_net, self.weights)(*inputs, sens)
        grads = self.grad_reducer(grads)
        if not self.scaled and not self.grad_stats:
            # No loss scale: nothing to unscale and no update to skip, so no per-gradient check either
            # (one small kernel per parameter, ~8% of a small network's CPU step); the NaN guard
            # still sees a non-finite loss through the overflow flag.
            loss = ops.depend(loss, self.optimizer(grads))
            return loss, ops.logical_not(ops.isfinite(loss)), used
        if self.scaled:
            grads = self.hyper_map(ops.partial(_unscale, 1.0 / used), grads)
        finite = all_finite(grads)
        overflow = ops.logical_not(finite)
        one = ops.ones_like(self.skipped)
        loss = ops.depend(loss, ops.assign_add(self.skipped, ops.select(overflow, one, one - one)))
        if self.dynamic:
            loss = ops.depend(loss, self._update_scale(finite))
        if self.drop:
            if finite:
                loss = ops.depend(loss, self.optimizer(grads))
        else:
            loss = ops.depend(loss, self.optimizer(grads))
        if self.grad_stats:
            return loss, overflow, used, ops.stack(self.hyper_map(_grad_stat, grads))
        return loss, overflow, used

    def _update_scale(self, finite):
        zero = ops.zeros_like(self.good_steps)
        good = ops.select(finite, self.good_steps + 1, zero)
        grow = good >= self.window
        grown = ops.select(grow, self.scale * self.factor, self.scale)
        # Never below 1: a scale under 1 would shrink gradients that already underflow.
        shrunk = ops.maximum(self.scale / self.factor, ops.ones_like(self.scale))
        new_scale = ops.select(finite, grown, shrunk)
        ops.assign(self.good_steps, ops.select(grow, zero, good))
        return ops.assign(self.scale, new_scale)


def _unscale(inv, grad):
    return grad * ops.cast(inv, grad.dtype)


def _grad_stat(grad):
    g = ops.cast(grad, mstype.float32)
    bad = ops.cast(ops.logical_not(ops.isfinite(g)), mstype.float32)
    return ops.stack([ops.reduce_sum(g * g), ops.reduce_sum(bad)])


class JitScaledTrainStep(ScaledTrainStep):
    """The same step with its construct compiled by mindspore.jit while the process runs in PyNative."""

    @ms.jit
    def construct(self, *inputs):
        return self.step(*inputs)
