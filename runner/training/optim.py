"""Consumer of the `optim` group: the optimizer and its learning-rate schedule.

The schedule is a `LearningRateSchedule` cell that computes each step's rate from the optimizer's
`global_step`, so a checkpoint stores the schedule's parameters (the peak rate as the Parameter
`learning_rate`), not one rate per step: a per-step list made an epochs=100000 run's every
checkpoint 18 MB (docs/mindspore-notes.md#lr-schedule-cell).
"""

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype
from mindspore.nn.learning_rate_schedule import LearningRateSchedule

from runner.config.optim_options import OPTIMIZERS, SCHEDULES
from runner.errors import UserError

# mindcv (optim=lion) is the optional `zoo` extra: imported by the optimizer that needs it.


class Constant(LearningRateSchedule):
    """Factor 1 at every step (the rate is the peak rate)."""

    def construct(self, global_step):
        return ops.ones_like(ops.cast(global_step, mstype.float32))


class MultiStep(LearningRateSchedule):
    """gamma ** (number of milestones reached).

    MindSpore's nn has no milestone schedule (and mindcv.scheduler's multi_step_lr returns a per-step
    list, which is what this module avoids), so this is the one line of it.
    """

    def __init__(self, milestones: list, gamma: float):
        super().__init__()
        self.milestones = Tensor(milestones, mstype.float32)
        self.gamma = float(gamma)

    def construct(self, global_step):
        step = ops.cast(global_step, mstype.float32).reshape(-1)[:1]
        reached = ops.reduce_sum(ops.cast(self.milestones <= step, mstype.float32))
        return ops.pow(Tensor(self.gamma, mstype.float32), reached).reshape(1)


class OneCycle(LearningRateSchedule):
    """Smith's one-cycle policy, cosine-annealed as in torch's OneCycleLR: from 1/div_factor up to 1
    over the first pct_start of the steps, then down to min_factor.

    Neither MindSpore's nn nor mindcv.scheduler has it as a step-computed schedule.
    """

    def __init__(self, total: int, pct_start: float, div_factor: float, min_factor: float):
        super().__init__()
        self.up = max(1.0, float(round(total * pct_start)))
        self.down = max(1.0, float(total) - self.up)
        self.start = 1.0 / float(div_factor)
        self.end = float(min_factor)
        self.pi = 3.141592653589793

    def construct(self, global_step):
        step = ops.cast(global_step, mstype.float32)
        rise = ops.minimum(step / self.up, 1.0)
        fall = ops.clip_by_value((step - self.up) / self.down, Tensor(0.0, mstype.float32), Tensor(1.0, mstype.float32))
        up = self.start + (1.0 - self.start) * 0.5 * (1.0 - ops.cos(self.pi * rise))
        down = self.end + (1.0 - self.end) * 0.5 * (1.0 + ops.cos(self.pi * fall))
        return ops.select(step < self.up, up, down)


class WarmupSchedule(LearningRateSchedule):
    """peak rate x the schedule's factor, after `warmup` steps of a linear ramp to the peak.

    The schedule runs over the steps after warmup (its step 0 is the first step after the ramp).
    """

    def __init__(self, lr: float, factor: LearningRateSchedule, warmup: int):
        super().__init__()
        self.learning_rate = Parameter(Tensor(lr, mstype.float32), name="learning_rate", requires_grad=False)
        self.factor = factor
        self.warmup = int(warmup)

    def construct(self, global_step):
        step = ops.cast(global_step, mstype.float32)
        if self.warmup > 0:
            after = ops.cast(ops.maximum(global_step - self.warmup, 0), global_step.dtype)
            ramp = (step + 1.0) / self.warmup
            return self.learning_rate * ops.select(step < self.warmup, ramp, self.factor(after))
        return self.learning_rate * self.factor(global_step)


# The schedules' builders (runner/config/optim_options.py names them): each returns the schedule as a factor
# of the peak rate over `steps` optimizer updates after warmup.


def schedule_constant(cfg, updates_per_epoch: float, steps: int) -> LearningRateSchedule:
    return Constant()


def schedule_cosine(cfg, updates_per_epoch: float, steps: int) -> LearningRateSchedule:
    return nn.CosineDecayLR(cfg.min_lr / cfg.lr, 1.0, max(1, steps))


def schedule_step(cfg, updates_per_epoch: float, steps: int) -> LearningRateSchedule:
    # ExponentialDecayLR with is_stair is exactly step decay: gamma every decay_steps.
    return nn.ExponentialDecayLR(1.0, cfg.gamma, max(1, int(round(cfg.step_epochs * updates_per_epoch))), True)


def schedule_exponential(cfg, updates_per_epoch: float, steps: int) -> LearningRateSchedule:
    return nn.ExponentialDecayLR(1.0, cfg.gamma, max(1, int(round(updates_per_epoch))))  # gamma per epoch, smooth


def schedule_multistep(cfg, updates_per_epoch: float, steps: int) -> LearningRateSchedule:
    return MultiStep([round(m * updates_per_epoch) for m in cfg.milestones], cfg.gamma)


def schedule_onecycle(cfg, updates_per_epoch: float, steps: int) -> LearningRateSchedule:
    return OneCycle(steps, cfg.pct_start, cfg.div_factor, cfg.min_lr / cfg.lr)


def schedule_factor(cfg, updates_per_epoch: float, steps: int) -> LearningRateSchedule:
    """The schedule as a factor of the peak rate over `steps` optimizer updates (after warmup)."""
    return SCHEDULES.builder(cfg.schedule)(cfg, updates_per_epoch, steps)


def build_schedule(cfg, updates_per_epoch: float, total_updates: int) -> WarmupSchedule:
    """The run's learning-rate schedule over `total_updates` optimizer updates."""
    warmup = int(round(cfg.warmup_epochs * updates_per_epoch))
    schedule = WarmupSchedule(cfg.lr, schedule_factor(cfg, updates_per_epoch, total_updates - warmup), warmup)
    host_rates(schedule, [0])  # one the lr record cannot follow is refused here, before anything trains
    return schedule


def host_rates(schedule: LearningRateSchedule, updates) -> np.ndarray:
    """The rate `schedule` gives after each number of optimizer updates in `updates`, computed with numpy:
    the run's record of its learning rate (metrics.csv, metrics.json, curves.png) compiles no graph for it.
    Each branch is its cell's construct() above (or MindSpore's, for CosineDecayLR and ExponentialDecayLR);
    tests/test_optim.py checks them against the cells for every schedule."""
    u = np.asarray(updates, np.float64)
    if isinstance(schedule, WarmupSchedule):
        peak = float(schedule.learning_rate.asnumpy().reshape(-1)[0])
        if schedule.warmup <= 0:
            return peak * host_rates(schedule.factor, u)
        after = host_rates(schedule.factor, np.maximum(u - schedule.warmup, 0))
        return peak * np.where(u < schedule.warmup, (u + 1.0) / schedule.warmup, after)
    if isinstance(schedule, Constant):
        return np.ones_like(u)
    if isinstance(schedule, nn.CosineDecayLR):
        p = np.minimum(u, schedule.decay_steps) / schedule.decay_steps
        return schedule.min_lr + schedule.delta * (1.0 + np.cos(np.pi * p))
    if isinstance(schedule, nn.ExponentialDecayLR):
        p = u / schedule.decay_steps
        return schedule.learning_rate * schedule.decay_rate ** (np.floor(p) if schedule.is_stair else p)
    if isinstance(schedule, MultiStep):
        milestones = schedule.milestones.asnumpy().reshape(1, -1)
        return schedule.gamma ** np.sum(milestones <= u.reshape(-1, 1), axis=1).reshape(u.shape)
    if isinstance(schedule, OneCycle):
        rise = np.minimum(u / schedule.up, 1.0)
        fall = np.clip((u - schedule.up) / schedule.down, 0.0, 1.0)
        up = schedule.start + (1.0 - schedule.start) * 0.5 * (1.0 - np.cos(np.pi * rise))
        down = schedule.end + (1.0 - schedule.end) * 0.5 * (1.0 + np.cos(np.pi * fall))
        return np.where(u < schedule.up, up, down)
    if hasattr(schedule, "host_rates"):  # an installed package's schedule brings its own formula
        return np.asarray(schedule.host_rates(u), np.float64).reshape(u.shape)
    # Not the cell itself: called in graph mode it would compile a graph of its own inside the run's sequence
    # of compiles (the compile count, and the order the compile cache hands graphs out in).
    raise UserError(
        f"The learning-rate schedule {type(schedule).__name__} has no host_rates(updates) method: the runner "
        "records each step's rate with it, without running a graph (CONTRIBUTING.md, adding a schedule)."
    )


class StepRates:
    """The learning rate of each training step, read on the host without a device sync: the rate of the
    optimizer update the step makes (or, inside an optim.accumulate_steps window, the one it contributes to).

    The optimizer counts its updates in global_step, and the schedule is a function of that count: one per
    step, one per accumulation window, none for a step whose update a loss-scale overflow skipped. `at` is
    asked for every step in order; it learns whether the step before updated from the run state's step
    outputs, which the loss-scale trace writes after the step (runner/training/callbacks.py ORDER)."""

    def __init__(self, optimizer, total_steps: int, accumulate: int, skips_overflow: bool):
        self.schedule = optimizer.learning_rate
        self.accumulate = max(1, int(accumulate))
        self.updates = int(optimizer.global_step.asnumpy().reshape(-1)[0])  # after a resume's restore
        self.rates = host_rates(self.schedule, np.arange(self.updates + total_steps // self.accumulate + 2))
        self.skips_overflow = skips_overflow
        self._last: int | None = None  # the step asked for before

    def at(self, step: int, overflowed_before: bool = False) -> float:
        """The rate of global step `step` (1-based); overflowed_before: the step asked for before overflowed."""
        last, n = self._last, self.accumulate
        if last is not None:
            # The step asked for before updated unless its update was skipped; windows that ended between it
            # and this step (a data-sink call runs several steps) updated too.
            updated_last = last % n == 0 and not (overflowed_before and self.skips_overflow)
            self.updates += int(updated_last) + (step - 1) // n - last // n
        self._last = step
        return float(self.rates[min(self.updates, len(self.rates) - 1)])


def schedule_rates(schedule: LearningRateSchedule, steps: int) -> list:
    """The rate at steps 0..steps-1, for tests and plots (evaluated by the cell itself)."""
    return [float(schedule(Tensor([s], mstype.int32)).asnumpy().reshape(-1)[0]) for s in range(steps)]


def exempt_from_decay(param) -> bool:
    """Biases and normalisation scales/shifts (BatchNorm/LayerNorm gamma and beta): timm's rule,
    every parameter of at most one dimension or named *.bias."""
    return len(param.shape) <= 1 or param.name.endswith(".bias")


def decay_groups(params, weight_decay: float, filter_bias_and_bn: bool) -> list:
    """MindSpore parameter groups giving each parameter its weight decay.

    Always grouped, also when nothing is filtered: without groups MindSpore's Optimizer silently
    exempts every parameter whose name contains "beta" or "gamma" (its own decay_filter), so
    filter_bias_and_bn=false would not decay BatchNorm after all.
    """
    params = list(params)
    if not filter_bias_and_bn:
        return [{"params": params, "weight_decay": weight_decay}, {"order_params": params}]
    decay = [p for p in params if not exempt_from_decay(p)]
    exempt = [p for p in params if exempt_from_decay(p)]
    groups = [{"params": g, "weight_decay": w} for g, w in ((decay, weight_decay), (exempt, 0.0)) if g]
    return [*groups, {"order_params": params}]


def decay_record(optimizer, cfg) -> dict:
    """What the optimizer decays (metrics.json's weight_decay), read from its own per-parameter flags."""
    flags = [bool(f) for f in optimizer.decay_flags] if optimizer.exec_weight_decay else []
    params = list(optimizer.parameters)
    decayed = [p for p, f in zip(params, flags) if f]
    return {
        "value": float(cfg.weight_decay),
        "filter_bias_and_bn": bool(cfg.filter_bias_and_bn),
        "decayed_tensors": len(decayed),
        "exempt_tensors": len(params) - len(decayed),
        "decayed_values": int(sum(int(np.prod(p.shape)) for p in decayed)),
    }


def build_optimizer(cfg, params, steps_per_epoch: int, total_steps: int):
    """The configured optimizer with its schedule; schedules count optimizer updates, so with
    optim.accumulate_steps=N an epoch is steps_per_epoch / N updates. optim.filter_bias_and_bn
    exempts biases and normalisation parameters from weight decay (MindCV's and timm's default)."""
    n = max(1, int(cfg.accumulate_steps))
    lr = build_schedule(cfg, steps_per_epoch / n, max(1, total_steps // n))
    wd = float(cfg.weight_decay)
    return OPTIMIZERS.builder(cfg.name)(cfg, decay_groups(params, wd, bool(cfg.filter_bias_and_bn)), lr, wd)


# The optimizers' builders (runner/config/optim_options.py names them): (optim, parameter groups, schedule,
# weight decay) -> a MindSpore optimizer.


def build_momentum(cfg, params, lr, wd):
    return nn.Momentum(params, lr, cfg.momentum, weight_decay=wd, use_nesterov=cfg.nesterov)


def build_sgd(cfg, params, lr, wd):
    return nn.SGD(params, lr, momentum=cfg.momentum, weight_decay=wd, nesterov=cfg.nesterov)


def build_adam(cfg, params, lr, wd):  # L2 weight decay, added to the gradient
    return nn.Adam(params, lr, beta1=cfg.momentum, beta2=cfg.beta2, eps=cfg.eps, weight_decay=wd)


def build_adamw(cfg, params, lr, wd):  # decoupled weight decay (Loshchilov & Hutter)
    return nn.AdamWeightDecay(params, lr, beta1=cfg.momentum, beta2=cfg.beta2, eps=cfg.eps, weight_decay=wd)


def build_lion(cfg, params, lr, wd):
    # MindSpore's nn has no Lion; its nn.Lamb would be the other large-batch choice, but it does
    # not run on CPU (docs/mindspore-notes.md#cpu-lamb).
    try:
        from mindcv.optim.lion import Lion
    except ImportError:
        raise UserError("optim=lion comes from MindCV: pip install -e '.[zoo]'.") from None
    return Lion(params, lr, beta1=float(cfg.momentum), beta2=float(cfg.beta2), weight_decay=wd)
