"""Train-step cells: loss scaling with overflow skip that also runs on CPU, and a jit-compiled variant."""

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
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

    clip_norm > 0 clips the unscaled gradients to that global norm, accumulate > 1 updates once per
    that many calls with the mean of their gradients, ema_decay > 0 keeps an average of the weights
    (`use_ema()` puts it into the network); see _init_update.
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
        clip_norm: float = 0.0,
        accumulate: int = 1,
        ema_decay: float = 0.0,
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
        self._init_update(clip_norm, accumulate, ema_decay)

    def construct(self, *inputs):
        return self.step(*inputs)

    def step(self, *inputs):
        loss = self.loss_net(*inputs)
        # The scale this step uses, read before _update_scale assigns the next one (the trace's column).
        used = self.scale + 0.0
        sens = ops.fill(loss.dtype, loss.shape, 1.0) * ops.cast(used, loss.dtype)
        grads = self.grad(self.loss_net, self.weights)(*inputs, sens)
        grads = self.grad_reducer(grads)
        if self.accumulate > 1:
            return self._accumulate(loss, used, grads)
        if not self.scaled and not self.grad_stats:
            # No loss scale: nothing to unscale and no update to skip, so no per-gradient check either
            # (one small kernel per parameter, ~8% of a small network's CPU step); the NaN guard
            # still sees a non-finite loss through the overflow flag.
            loss = ops.depend(loss, self._update(grads))
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
                loss = ops.depend(loss, self._update(grads))
        else:
            loss = ops.depend(loss, self._update(grads))
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

    # Clipping, gradient accumulation and the weights' EMA (optim.clip_grad_norm, optim.accumulate_steps,
    # ema.decay): in this cell rather than MindSpore's wrappers, so they compose with every loss scale
    # and run on CPU.
    def _init_update(self, clip_norm, accumulate, ema_decay):
        self.clip_norm = float(clip_norm)
        self.accumulate = int(accumulate)
        if self.accumulate > 1:
            # The running sum of the scaled gradients and the micro-batch count, both part of the
            # checkpointed state so a resume mid-window continues the same sum.
            self.accum = self.weights.clone(prefix="accum", init="zeros")
            self.micro = Parameter(Tensor(0, mstype.int32), name="accumulate_micro_step", requires_grad=False)
        self.ema_decay = float(ema_decay)
        if self.ema_decay > 0:
            # Every parameter of the network (BatchNorm statistics too), so the averaged model evaluates
            # with statistics that match its weights.
            self.ema_source = ParameterTuple(self.loss_net.get_parameters())
            self.ema = self.ema_source.clone(prefix="ema", init="same")

    def _update(self, grads):
        """Clip (global norm of the unscaled gradients), step the optimizer, then move the EMA."""
        if self.clip_norm > 0:
            grads = ops.clip_by_global_norm(grads, self.clip_norm)
        done = self.optimizer(grads)
        if self.ema_decay > 0:
            # The decay ramps up as TensorFlow's ExponentialMovingAverage(num_updates=...) and MindCV's
            # and timm's EMA warm-ups do: min(decay, (1 + n) / (10 + n)) at the n-th update (from 0), so
            # the initial weights fade within the first updates and a decay too high for a short run
            # still averages trained weights. n is the optimizer's own update count (read after its
            # update, so skipped updates are not counted; a resume continues it).
            n = ops.cast(ops.depend(self.optimizer.global_step, done), mstype.float32).reshape(()) - 1.0
            decay = ops.minimum(ops.scalar_to_tensor(self.ema_decay, mstype.float32), (1.0 + n) / (10.0 + n))
            done = ops.depend(self.hyper_map(ops.partial(_ema, decay), self.ema, self.ema_source), done)
        return done

    def _accumulate(self, loss, used, grads):
        """Add this micro-batch's gradients; every `accumulate`-th call, update with their mean.

        The overflow flag reports whether the sum so far is non-finite (the NaN guard counts
        micro-batches); the skip counter, the loss scale and the update act once per window.
        """
        summed = self.hyper_map(ops.add, self.accum, grads)
        micro = self.micro + 1
        boundary = micro >= self.accumulate
        mean = self.hyper_map(ops.partial(_unscale, 1.0 / (used * self.accumulate)), summed)
        finite = all_finite(mean)
        overflow = ops.logical_not(finite)
        one = ops.ones_like(self.skipped)
        skip = ops.logical_and(boundary, overflow)
        loss = ops.depend(loss, ops.assign_add(self.skipped, ops.select(skip, one, one - one)))
        loss = ops.depend(loss, ops.assign(self.micro, ops.select(boundary, ops.zeros_like(micro), micro)))
        loss = ops.depend(loss, self.hyper_map(ops.partial(_reset_if, boundary), self.accum, summed))
        if boundary:
            if self.dynamic:
                loss = ops.depend(loss, self._update_scale(finite))
            if self.drop:
                if finite:
                    loss = ops.depend(loss, self._update(mean))
            else:
                loss = ops.depend(loss, self._update(mean))
        if self.grad_stats:
            return loss, overflow, used, ops.stack(self.hyper_map(_grad_stat, mean))
        return loss, overflow, used

    def use_ema(self):
        """Copy the EMA into the network's parameters (after training: what is evaluated and saved)."""
        for p, e in zip(self.ema_source, self.ema):
            p.set_data(e.data.copy())


def ema_decay_at(decay: float, n: int) -> float:
    """The decay of the n-th EMA update (from 0): the ramp ScaledTrainStep applies, for tests and docs."""
    return min(float(decay), (1.0 + n) / (10.0 + n))


def _ema(decay, avg, value):
    d = ops.cast(decay, avg.dtype)
    return ops.assign(avg, avg * d + ops.cast(value, avg.dtype) * (1.0 - d))


def _reset_if(boundary, acc, summed):
    return ops.assign(acc, ops.select(boundary, ops.zeros_like(summed), summed))


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


class JitO1ScaledTrainStep(ScaledTrainStep):
    """JitScaledTrainStep compiled at jit_level O1 (operator fusion); mindspore.jit's default is O0."""

    @ms.jit(jit_level="O1")
    def construct(self, *inputs):
        return self.step(*inputs)


# mode=jit's train step per mode.jit_level: the level is an argument of the decorator, fixed per class.
# mindspore.jit takes O0 or O1 only (2.7 to 2.10); runner/config/checks.py refuses mode=jit with O2.
JIT_STEPS = {"auto": JitScaledTrainStep, "O0": JitScaledTrainStep, "O1": JitO1ScaledTrainStep}
