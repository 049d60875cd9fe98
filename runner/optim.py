"""Consumer of the `optim` group: optimizer and per-step learning-rate schedule."""

import math

from mindspore import nn


def lr_schedule(cfg, steps_per_epoch: int, total: int) -> list:
    """Per-step learning rates: linear warmup over warmup_epochs, then constant or cosine to min_lr."""
    warmup = int(round(cfg.warmup_epochs * steps_per_epoch))
    lrs = []
    for step in range(total):
        if step < warmup:
            lrs.append(cfg.lr * (step + 1) / warmup)
        elif cfg.schedule == "cosine":
            progress = (step - warmup) / max(1, total - warmup)
            lrs.append(cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress)))
        else:
            lrs.append(cfg.lr)
    return lrs


def build_optimizer(cfg, params, steps_per_epoch: int, total_steps: int):
    """Momentum SGD or Adam (optim.momentum is Adam's beta1) with the schedule above and weight decay."""
    lr = lr_schedule(cfg, steps_per_epoch, total_steps)
    name = cfg.name
    if name == "momentum":
        return nn.Momentum(params, lr, cfg.momentum, weight_decay=cfg.weight_decay)
    return nn.Adam(params, lr, beta1=cfg.momentum, weight_decay=cfg.weight_decay)
