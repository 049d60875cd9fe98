"""Mixed precision and the train cell: the `amp` group's consumer (and `mode`'s, for the train step)."""

import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from typing import Optional

from mindspore import JitConfig, Model, nn
from mindspore import dtype as mstype
from mindspore.amp import auto_mixed_precision
from mindspore.rewrite.symbol_tree import symbol_tree

from runner.amp.fp32_islands import keep_fp32, match_cells
from runner.amp.train_step import JIT_STEPS, FP32Logits, ScaledTrainStep, drops_overflow
from runner.config.amp_dtype import resolve_dtype
from runner.models import fp16
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
    amp_dtype_used: str = "float32"  # float32 (O0), float16 or bfloat16
    amp_compute: Optional[dict] = None  # what each part computes in (compute_parts)


@dataclass
class Trainer:
    """The train and eval Models around one network, and the train cell they share weights with."""

    model: Model
    step_cell: nn.Cell
    evaluator: Model
    used: AmpUsed


def resolve_level(level: str, device_target: str) -> str:
    """`auto` means O2 where 16-bit compute is fast (GPU/Ascend) and O0 on CPU: no 16-bit type computes faster
    than the runner's FP32 body there (docs/amp.md#on-a-cpu; amp.dtype=float16 at O2 costs about as much as O0)."""
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


def fast_fp16(net, level: str, dtype: str, device_target: str) -> bool:
    """Whether AMP runs as FP16 numerics on the FP32 fast path (models/fp16.py): O2/O3 float16 on a CPU, for
    the networks that round at their edges (the runner's ResNets). O1 and other networks run MindSpore's AMP."""
    return device_target == "CPU" and level in ("O2", "O3") and dtype == "float16" and fp16.supports(net)


def compute_parts(net, level: str, dtype: str, device_target: str) -> dict:
    """What each part of the network computes in, for metrics.json (amp_compute)."""
    if level == "O0":
        return {"body": "float32", "batchnorm": "float32", "head": "float32", "loss": "float32"}
    if fast_fp16(net, level, dtype, device_target):
        rounded = "float32 compute, activations and their gradients rounded to float16 at each operator's edges"
        return {"body": rounded, "batchnorm": rounded, "head": "float32 (input rounded to float16)", "loss": "float32"}
    bn = dtype if level == "O3" else "float32"
    body = dtype if level != "O1" else f"{dtype} (white-listed ops: convolutions, matmuls), float32 elsewhere"
    return {"body": body, "batchnorm": bn, "head": dtype if level != "O1" else body, "loss": "float32"}


def wrap_amp(net, level: str, keep: list, run_dir: str, dtype: str = "float16", device_target: str = "", fused=None):
    """Apply the AMP level to net with the cells named by `keep` (amp.keep_fp32) left FP32.

    dtype: float16 or bfloat16 (resolved amp.dtype). device_target "CPU" with float16 at O2/O3 keeps the
    FP32 fast body and rounds at its edges (`fast_fp16`); empty (tests, the diagnosis probe) or another
    device runs MindSpore's `auto_mixed_precision`. fused=False rounds by Cast pairs where RoundF16 would
    (bench/amp_cpu.py's comparison)."""
    cells = match_cells(net, keep)  # checked at every level, so a typo fails under O0 too
    if level == "O0":
        return net
    if fast_fp16(net, level, dtype, device_target):
        left = fp16.enable(net, [c for _, c in cells], fused)
        if cells:
            log.info("amp.keep_fp32: %s stay FP32 (unrounded) under %s float16", [n for n, _ in cells], level)
        log.debug("amp %s float16 on CPU: FP32 body rounded at its edges; unrounded: %s", level, left)
        return net
    if device_target == "CPU" and dtype == "float16":
        log.warning(
            "amp=%s float16 on CPU for %s runs MindSpore's float16 kernels (FP16 numerics at a fraction of FP32 "
            "speed): only the runner's ResNets round at their edges on the FP32 fast path.",
            level,
            type(net).__name__,
        )
    # A blocked body (models/blocked.py) is float32 and opaque to AMP's casts and rewrite: plain under AMP.
    plain_body(net)
    if level == "O1":
        # O1's rewrite skips cells whose precision is already set: mark them before it runs.
        for _, cell in cells:
            cell.to_float(mstype.float32)
    # Parameters stay FP32 (master weights); casts are inserted around the FP16 compute.
    with _rewrites_into(run_dir):
        amp_net = auto_mixed_precision(net, level, dtype=mstype.bfloat16 if dtype == "bfloat16" else mstype.float16)
    if level in ("O2", "O3") and cells:
        keep_fp32(amp_net, [c for _, c in cells])
    if cells:
        log.info("amp.keep_fp32: %s stay FP32 under %s", [n for n, _ in cells], level)
    return amp_net


def eval_cell(logits) -> nn.Cell:
    """(loss, logits, labels) of an FP32-logits network: every evaluation's cell (training's and runner.evaluate's)."""
    return nn.WithEvalCell(logits, loss_fn())


def build_loss_net(
    net,
    level: str,
    keep: list,
    run_dir: str,
    label_smoothing: float = 0.0,
    dtype: str = "float16",
    device_target="",
    fused=None,
):
    """(FP32-logits network, loss network) as training runs them: the one place both are built (fused: wrap_amp)."""
    logits = FP32Logits(wrap_amp(net, level, keep, run_dir, dtype, device_target, fused))
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
    level, scale_type, dtype = _resolve_precision(amp_cfg, device_target)
    parts = compute_parts(net, level, dtype, device_target)  # before wrapping: O1's rewrite replaces the net
    logits, loss_net = build_loss_net(
        net, level, list(amp_cfg.keep_fp32), run_dir, label_smoothing, dtype, device_target
    )
    native = device_target != "CPU" and mode != "jit" and not grad_stats and not update
    step = _train_step(loss_net, optimizer, amp_cfg.loss_scale, scale_type, native, mode, jit_level, grad_stats, update)
    used = AmpUsed(
        amp_level_used=level,
        loss_scale_type_used=scale_type,
        native_loss_scale_cell=native and scale_type == "dynamic",
        keep_fp32=list(amp_cfg.keep_fp32),
        drops_overflow=drops_overflow(scale_type, amp_cfg.loss_scale.drop_overflow_update),
        amp_dtype_used=dtype,
        amp_compute=parts,
    )
    return _assemble(step, logits, metrics, mode, jit_level, used)


def _resolve_precision(amp_cfg, device_target: str) -> tuple[str, str, str]:
    """(level, loss-scale type, dtype) this backend runs for the amp group."""
    level = resolve_level(amp_cfg.level, device_target)
    scale_type = str(amp_cfg.loss_scale.type)
    if amp_cfg.level == "auto" and level == "O0":
        scale_type = "none"  # FP32 gradients do not underflow; a scale would only cost time
    dtype = resolve_dtype(amp_cfg.dtype, level, device_target)
    if dtype == "bfloat16" and scale_type != "none":
        log.info(
            "amp.dtype=bfloat16: the %s loss scale is kept and traced as configured; bfloat16 has FP32's exponent "
            "range, so amp.loss_scale.type=none would do",
            scale_type,
        )
    return level, scale_type, dtype


def _assemble(step, logits, metrics, mode: str, jit_level, used: AmpUsed) -> Trainer:
    """The train and eval Models around one training step and one eval cell."""
    # One eval cell for both Models: the train Model validates during Model.fit (runner/training/validation.py)
    # and the evaluator after training, and both run the same compiled graph.
    evaluating = eval_cell(logits)
    evaluator = Model(logits, eval_network=evaluating, metrics=metrics(), eval_indexes=[0, 1, 2])
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
