"""Mixed precision you can trust: AMP levels and FP32 islands, the loss-scaled train cell, the
loss-scale trace, the NaN guard and its post-mortem diagnosis.

- precision.py: the `amp` group's consumer: AMP level, FP32 islands, the loss network, the Models;
- train_step.py: the loss-scaled train cell that also runs on CPU;
- fp32_islands.py: `amp.keep_fp32`;
- guard.py: trace -> guard -> post-mortem;
- diagnose.py: the `diagnose` group: gradient statistics and the search for FP32 islands.
"""

from runner.amp.precision import AmpUsed, Trainer, build_loss_net, build_trainer, loss_fn, resolve_level, wrap_amp

__all__ = ["AmpUsed", "Trainer", "build_loss_net", "build_trainer", "loss_fn", "resolve_level", "wrap_amp"]
