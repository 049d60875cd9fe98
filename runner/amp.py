"""Consumer of the `amp` group (and `mode` for the train step): mixed precision, loss scale, Model."""

import logging
import os

from mindspore import Model, nn
from mindspore import dtype as mstype
from mindspore.amp import auto_mixed_precision

from runner.fp32_islands import keep_fp32, match_cells
from runner.train_step import FP32Logits, JitScaledTrainStep, ScaledTrainStep

log = logging.getLogger("runner")


def resolve_level(level: str, device_target: str) -> str:
    """`auto` means O2 where FP16 is fast (GPU/Ascend) and O0 on CPU, where FP16 convs run slower."""
    if level != "auto":
        return level
    return "O0" if device_target == "CPU" else "O2"


def loss_fn(label_smoothing: float = 0.0):
    """Cross entropy on FP32 logits (FP32Logits casts them), for class indices or class probabilities.

    nn.CrossEntropyLoss works through log_softmax: logits [1e3, 0, -1e3] with label 1 give 1000.0,
    where MindSpore 2.10's SoftmaxCrossEntropyWithLogits(sparse=True) returns inf on CPU. It also
    takes the (N, classes) probabilities of mixup/cutmix batches and label smoothing (measured
    against a NumPy log-softmax reference, for hard and soft labels, in graph mode).
    """
    return nn.CrossEntropyLoss(reduction="mean", label_smoothing=label_smoothing)


def wrap_amp(net, level: str, keep: list, run_dir: str):
    """Apply the AMP level to net with the cells named by `keep` (amp.keep_fp32) left FP32."""
    cells = match_cells(net, keep)  # checked at every level, so a typo fails under O0 too
    if level == "O0":
        return net
    if level == "O1":
        # O1's rewrite skips cells whose precision is already set: mark them before it runs.
        for _, cell in cells:
            cell.to_float(mstype.float32)
    # Parameters stay FP32 (master weights); casts are inserted around the FP16 compute.
    # O1 rewrites the network's source into ./rewritten_network/: keep that in the run directory.
    cwd = os.getcwd()
    os.chdir(run_dir)
    try:
        amp_net = auto_mixed_precision(net, level)
    finally:
        os.chdir(cwd)
    if level in ("O2", "O3") and cells:
        keep_fp32(amp_net, [c for _, c in cells])
    if cells:
        log.info("amp.keep_fp32: %s stay FP32 under %s", [n for n, _ in cells], level)
    return amp_net


def build_trainer(
    net,
    amp_cfg,
    optimizer,
    mode: str,
    device_target: str,
    run_dir: str,
    grad_stats=False,
    label_smoothing=0.0,
    metrics=None,
):
    """Wrap net for AMP and loss scaling; return (Model, train cell, eval Model, what was used).

    label_smoothing applies to the training loss only. metrics: the eval Model's metrics (default:
    accuracy and loss); evaluation always sees hard labels.

    grad_stats (diagnose=on) makes the train step also return per-parameter gradient statistics;
    it uses the portable ScaledTrainStep on every backend, since MindSpore's native loss-scale cell
    returns only (loss, overflow, scale).
    """
    level = resolve_level(amp_cfg.level.name, device_target)
    ls = amp_cfg.loss_scale
    scale_type = ls.type.name
    if amp_cfg.level.name == "auto" and level == "O0":
        scale_type = "none"  # FP32 gradients do not underflow; a scale would only cost time
    net = wrap_amp(net, level, list(amp_cfg.keep_fp32), run_dir)
    fp32_net = FP32Logits(net)
    loss_net = nn.WithLossCell(fp32_net, loss_fn(label_smoothing))
    native = device_target != "CPU" and mode != "jit" and not grad_stats
    if native and scale_type == "dynamic":
        # On GPU/Ascend MindSpore's own overflow check and scale update are the fast path.
        manager = nn.DynamicLossScaleUpdateCell(ls.init, ls.factor, ls.window)
        step = nn.TrainOneStepWithLossScaleCell(loss_net, optimizer, scale_sense=manager)
    else:
        cls = JitScaledTrainStep if mode == "jit" else ScaledTrainStep
        step = cls(loss_net, optimizer, scale_type, ls.init, ls.factor, ls.window, ls.drop_overflow_update, grad_stats)
    model = Model(step)
    metrics = metrics or {"accuracy": nn.Accuracy(), "loss": nn.Loss()}
    evaluator = Model(fp32_net, loss_fn=loss_fn(), metrics=metrics)
    used = {
        "amp_level_used": level,
        "loss_scale_type_used": scale_type,
        "native_loss_scale_cell": native and scale_type == "dynamic",
        "keep_fp32": list(amp_cfg.keep_fp32),
    }
    return model, step, evaluator, used
