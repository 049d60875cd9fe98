"""Consumer of the `amp` group (and `mode` for the train step): mixed precision, loss scale, Model."""

import os

from mindspore import Model, nn
from mindspore.amp import auto_mixed_precision

from runner.train_step import FP32Logits, JitScaledTrainStep, ScaledTrainStep


def resolve_level(level: str, device_target: str) -> str:
    """`auto` means O2 where FP16 is fast (GPU/Ascend) and O0 on CPU, where FP16 convs run slower."""
    if level != "auto":
        return level
    return "O0" if device_target == "CPU" else "O2"


def build_trainer(net, amp_cfg, optimizer, mode: str, device_target: str, run_dir: str):
    """Wrap net for AMP and loss scaling; return (Model, train cell, eval Model, what was used)."""
    level = resolve_level(amp_cfg.level.name, device_target)
    ls = amp_cfg.loss_scale
    scale_type = ls.type.name
    if amp_cfg.level.name == "auto" and level == "O0":
        scale_type = "none"  # FP32 gradients do not underflow; a scale would only cost time
    if level != "O0":
        # Parameters stay FP32 (master weights); casts are inserted around the FP16 compute.
        # O1 rewrites the network's source into ./rewritten_network/: keep that in the run directory.
        cwd = os.getcwd()
        os.chdir(run_dir)
        try:
            net = auto_mixed_precision(net, level)
        finally:
            os.chdir(cwd)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    fp32_net = FP32Logits(net)
    loss_net = nn.WithLossCell(fp32_net, loss_fn)
    native = device_target != "CPU" and mode != "jit"
    if native and scale_type == "dynamic":
        # On GPU/Ascend MindSpore's own overflow check and scale update are the fast path.
        manager = nn.DynamicLossScaleUpdateCell(ls.init, ls.factor, ls.window)
        step = nn.TrainOneStepWithLossScaleCell(loss_net, optimizer, scale_sense=manager)
    else:
        cls = JitScaledTrainStep if mode == "jit" else ScaledTrainStep
        step = cls(loss_net, optimizer, scale_type, ls.init, ls.factor, ls.window, ls.drop_overflow_update)
    model = Model(step)
    evaluator = Model(fp32_net, loss_fn=loss_fn, metrics={"accuracy": nn.Accuracy(), "loss": nn.Loss()})
    used = {
        "amp_level_used": level,
        "loss_scale_type_used": scale_type,
        "native_loss_scale_cell": native and scale_type == "dynamic",
    }
    return model, step, evaluator, used
