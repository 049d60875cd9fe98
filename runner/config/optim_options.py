"""The `optim` group's optimizers and schedules, each declared once (runner/config/options.py).

An option's settings are the fields of `optim` it reads beyond the ones every optimizer reads (lr, momentum,
weight_decay, ... in schema.py OptimCommon); schema.OptimConfig is OptimCommon plus all of them.
"""

from dataclasses import dataclass, field
from typing import List

from runner.config.options import Option, Options

OPTIMIZERS = Options("optim.name", "runner.optimizers")
SCHEDULES = Options("optim.schedule", "runner.schedules")


@dataclass
class Nesterov:
    nesterov: bool = False  # momentum, sgd


@dataclass
class AdamMoments:
    beta2: float = 0.999  # adam, adamw, lion (optim.momentum is beta1)
    eps: float = 1e-8  # adam, adamw


@dataclass
class LionMoments:
    beta2: float = 0.999


_OPTIM = "runner.training.optim"
for _option in (
    Option("momentum", Nesterov, f"{_OPTIM}:build_momentum", "SGD with momentum (`nn.Momentum`), L2 weight decay"),
    Option("sgd", Nesterov, f"{_OPTIM}:build_sgd", "SGD (`nn.SGD`; `conf/optim/sgd.yaml` sets Nesterov)"),
    Option("adam", AdamMoments, f"{_OPTIM}:build_adam", "Adam (`nn.Adam`), L2 weight decay"),
    Option("adamw", AdamMoments, f"{_OPTIM}:build_adamw", "AdamW (`nn.AdamWeightDecay`), decoupled decay"),
    Option("lion", LionMoments, f"{_OPTIM}:build_lion", "Lion (MindCV's, the `zoo` extra), decoupled decay"),
):
    OPTIMIZERS.register(_option)


@dataclass
class Warmup:
    warmup_epochs: float = 0.0  # linear ramp to lr; the schedule starts when it ends


@dataclass
class Cosine(Warmup):
    min_lr: float = 0.0  # the last step's rate


@dataclass
class Step(Warmup):
    step_epochs: float = 30.0  # multiply by gamma every step_epochs epochs
    gamma: float = 0.1


@dataclass
class MultiStep(Warmup):
    milestones: List[float] = field(default_factory=list)  # epochs (after warmup) at which to decay
    gamma: float = 0.1


@dataclass
class Exponential(Warmup):
    gamma: float = 0.1  # the factor per epoch


@dataclass
class OneCycle:  # its rising phase is the warmup
    min_lr: float = 0.0
    pct_start: float = 0.3  # the share of the steps spent rising
    div_factor: float = 25.0  # the first rate is lr / div_factor


for _option in (
    Option("constant", Warmup, f"{_OPTIM}:schedule_constant", "`lr`"),
    Option("cosine", Cosine, f"{_OPTIM}:schedule_cosine", "cosine from `lr` to `min_lr` over the run"),
    Option("step", Step, f"{_OPTIM}:schedule_step", "x `gamma` every `step_epochs` epochs"),
    Option("multistep", MultiStep, f"{_OPTIM}:schedule_multistep", "x `gamma` at each of `milestones` (epochs)"),
    Option("exponential", Exponential, f"{_OPTIM}:schedule_exponential", "x `gamma` per epoch, smoothly"),
    Option(
        "onecycle",
        OneCycle,
        f"{_OPTIM}:schedule_onecycle",
        "cosine from `lr/div_factor` up to `lr` over `pct_start` of the run, then down to `min_lr`",
    ),
):
    SCHEDULES.register(_option)

OPTIMIZERS.load_installed()
SCHEDULES.load_installed()
