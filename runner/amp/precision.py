"""Mixed precision and the train cell: the `amp` group's consumer (and `mode`'s, for the train step)."""

import contextlib
import logging
import os
import sys
from dataclasses import dataclass

from mindspore import JitConfig, Model, nn
from mindspore import dtype as mstype
from mindspore.amp import auto_mixed_precision
from mindspore.rewrite.symbol_tree import symbol_tree

from runner.amp.fp32_islands import keep_fp32, match_cells
from runner.amp.train_step import JIT_STEPS, FP32Logits, ScaledTrainStep, drops_overflow
from runner.models.blocked import plain_body

log = logging.getLogger("runner")


@dataclass
class AmpUsed:
    """What the `amp` group resolved to on this device (metrics.json records each field)."""

    amp_level_used: str
    loss_scale_type_used: str
    native_loss_scale_cell: bool
    keep_fp32: list
    drops_overflow: bool  # whether a step whose gradients overflow skips its update


@dataclass
class Trainer:
    """The train and eval Models around one network, and the train cell they share weights with."""

    model: Model
    step_cell: nn.Cell
    evaluator: Model
    used: AmpUsed


def resolve_level(level: str, device_target: str) -> str:
    """`auto` means O2 where FP16 is fast (GPU/Ascend) and O0 on CPU, where FP16 convs run slower."""
    if level != "auto":
        return str(level)
    return "O0" if device_target == "CPU" else "O2"


def loss_fn(label_smoothing: float = 0.0):
    """The training and evaluation loss on FP32 logits, for class indices or class probabilities.

    nn.CrossEntropyLoss, not SoftmaxCrossEntropyWithLogits(sparse=True): the latter returns inf on CPU
    once a logit gap reaches ~90 (docs/mindspore-notes.md#sparse-softmax-ce). It also reads the
    (N, classes) probabilities of mixup/cutmix batches and applies label smoothing to either kind
    of label (checked against a NumPy log-softmax reference in tests/test_augment.py).
    """
    return nn.CrossEntropyLoss(reduction="mean", label_smoothing=label_smoothing)


class _CwdIs:
    """`os` as MindSpore's rewrite module sees it, with getcwd() answering `path`."""

    def __init__(self, path: str):
        self._path = path

    def getcwd(self) -> str:
        return self._path

    def __getattr__(self, name):
        return getattr(os, name)


@contextlib.contextmanager
def _rewrites_into(run_dir: str):
    """Where O1's rewrite writes the network's generated source: the run directory, not the cwd.

    MindSpore's rewrite (O1, pinned 2.10) writes `<os.getcwd()>/rewritten_network/<cls>.py`, imports it
    and appends that folder to sys.path, with no parameter for the place (docs/mindspore-notes.md#o1-rewrite).
    Changing the process's working directory would move every relative path of every thread (the data
    pipeline's included) for the duration; instead only that module's view of `os.getcwd` is redirected,
    and sys.path is restored afterwards.
    """
    path = list(sys.path)
    symbol_tree.os = _CwdIs(os.path.abspath(run_dir))
    try:
        yield
    finally:
        symbol_tree.os = os
        sys.path[:] = path


def wrap_amp(net, level: str, keep: list, run_dir: str):
    """Apply the AMP level to net with the cells named by `keep` (amp.keep_fp32) left FP32."""
    cells = match_cells(net, keep)  # checked at every level, so a typo fails under O0 too
    if level == "O0":
        return net
    # A blocked body (models/blocked.py) is float32 and opaque to AMP's casts and rewrite: plain under AMP.
    plain_body(net)
    if level == "O1":
        # O1's rewrite skips cells whose precision is already set: mark them before it runs.
        for _, cell in cells:
            cell.to_float(mstype.float32)
    # Parameters stay FP32 (master weights); casts are inserted around the FP16 compute.
    with _rewrites_into(run_dir):
        amp_net = auto_mixed_precision(net, level)
    if level in ("O2", "O3") and cells:
        keep_fp32(amp_net, [c for _, c in cells])
    if cells:
        log.info("amp.keep_fp32: %s stay FP32 under %s", [n for n, _ in cells], level)
    return amp_net


def eval_cell(logits) -> nn.Cell:
    """(loss, logits, labels) of an FP32-logits network: every evaluation's cell (training's and runner.evaluate's)."""
    return nn.WithEvalCell(logits, loss_fn())


def build_loss_net(net, level: str, keep: list, run_dir: str, label_smoothing: float = 0.0):
    """(FP32-logits network, loss network) as training runs them: the one place both are built."""
    logits = FP32Logits(wrap_amp(net, level, keep, run_dir))
    return logits, nn.WithLossCell(logits, loss_fn(label_smoothing))


def build_trainer(
    net,
    amp_cfg,
    optimizer,
    mode: str,
    device_target: str,
    run_dir: str,
    grad_stats=False,
    *,
    metrics,
    update=None,
    label_smoothing=0.0,
    jit_level="auto",
) -> Trainer:
    """Wrap net for AMP and loss scaling into train and eval Models.

    label_smoothing applies to the training loss only. metrics() makes the evaluation metrics (fresh
    instances for each Model: metrics hold state; runner.report.accuracy.evaluation_metrics); evaluation always reads
    hard labels and reports plain cross entropy.

    grad_stats (diagnose=on) makes the train step also return per-parameter gradient statistics;
    it uses the portable ScaledTrainStep on every backend, since MindSpore's native loss-scale cell
    returns only (loss, overflow, scale). `update` (clip_norm, accumulate, ema_decay) adds clipping,
    gradient accumulation and the weights' EMA to that step; any of them also selects it.
    jit_level: mode.jit_level ("auto": MindSpore's default), for the graph and jit modes' compiled cells.
    """
    update = {k: v for k, v in (update or {}).items() if v and not (k == "accumulate" and v == 1)}
    level = resolve_level(amp_cfg.level, device_target)
    scale_type = str(amp_cfg.loss_scale.type)
    if amp_cfg.level == "auto" and level == "O0":
        scale_type = "none"  # FP32 gradients do not underflow; a scale would only cost time
    logits, loss_net = build_loss_net(net, level, list(amp_cfg.keep_fp32), run_dir, label_smoothing)
    native = device_target != "CPU" and mode != "jit" and not grad_stats and not update
    step = _train_step(loss_net, optimizer, amp_cfg.loss_scale, scale_type, native, mode, jit_level, grad_stats, update)
    # One eval cell for both Models: the train Model validates during Model.fit (runner/training/validation.py)
    # and the evaluator after training, and both run the same compiled graph.
    evaluating = eval_cell(logits)
    evaluator = Model(logits, eval_network=evaluating, metrics=metrics(), eval_indexes=[0, 1, 2])
    used = AmpUsed(
        amp_level_used=level,
        loss_scale_type_used=scale_type,
        native_loss_scale_cell=native and scale_type == "dynamic",
        keep_fp32=list(amp_cfg.keep_fp32),
        drops_overflow=drops_overflow(scale_type, amp_cfg.loss_scale.drop_overflow_update),
    )
    if mode == "graph" and jit_level != "auto":
        # Per cell rather than set_context(jit_config=...): the Python API may run several runs in one process.
        for cell in (step, evaluating):
            cell.set_jit_config(JitConfig(jit_level=jit_level))
    model = Model(step, eval_network=evaluating, metrics=metrics(), eval_indexes=[0, 1, 2])
    return Trainer(model, step, evaluator, used)


def _train_step(loss_net, optimizer, ls, scale_type: str, native: bool, mode: str, jit_level, grad_stats, update):
    """The cell one training step runs: MindSpore's loss-scale cell where it is native and enough, else ours."""
    if native and scale_type == "dynamic":
        # On GPU/Ascend MindSpore's own overflow check and scale update are the fast path
        # (on CPU they do not run: docs/mindspore-notes.md#cpu-loss-scale).
        manager = nn.DynamicLossScaleUpdateCell(ls.init, ls.factor, ls.window)
        return nn.TrainOneStepWithLossScaleCell(loss_net, optimizer, scale_sense=manager)
    cls = JIT_STEPS[jit_level] if mode == "jit" else ScaledTrainStep
    return cls(
        loss_net,
        optimizer,
        scale_type,
        ls.init,
        ls.factor,
        ls.window,
        ls.drop_overflow_update,
        grad_stats,
        **update,
    )
