"""Consumer of the `diagnose` group: gradient statistics while training, and the NaN diagnosis after.

- GradStats (diagnose=on): per-cell gradient norm and non-finite count every `every` steps (and on
  every overflowing step) into grad_stats.jsonl, plus a non-finite check of every input batch
  (written into the run state, RunState.bad_input, where the NaN guard reads it at the step's end).
- find_islands (always, when the NaN guard fires): rebuilds the network from the last good weights,
  runs the failing batch in PyNative with forward hooks on every leaf cell, and names the first cell
  whose output went non-finite (or, if the forward pass stays finite, the cell where non-finite
  gradients start in backward order). It then keeps that cell FP32, exactly as
  `amp.keep_fp32` would, and tries again, so the fix it suggests has been checked on that batch.
"""

import functools
import json
import logging
import math
import os
import tempfile
from collections import OrderedDict

import mindspore as ms
import numpy as np
from mindspore import ops
from mindspore.train import Callback

from runner.amp.precision import build_loss_net
from runner.models.blocked import plain_body
from runner.rundir.atomic import finite_or_str
from runner.rundir.run_state import RunState

log = logging.getLogger("runner")


class GradStats(Callback):
    """Reads the (parameters x 2) statistics ScaledTrainStep returns when grad_stats is on."""

    def __init__(self, run_dir: str, param_names, every: int, state: RunState):
        super().__init__()
        self.path = os.path.join(run_dir, "grad_stats.jsonl")
        self.owners = [n.rsplit(".", 1)[0] for n in param_names]  # layer1.0.conv1.weight -> layer1.0.conv1
        self.every = max(1, every)
        self.state = state
        self.rows = 0
        self.bad_inputs = 0
        self._file = None

    def on_train_begin(self, run_context):
        self._file = open(self.path, "w")

    def on_train_step_begin(self, run_context):
        batch = run_context.original_args().get("train_dataset_element")
        if batch is None:  # data sink: the batch never reaches the host
            return
        for t in batch:
            a = t.asnumpy()
            if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
                self.bad_inputs += 1
                self.state.bad_input = f"non-finite input ({int((~np.isfinite(a)).sum())} values)"
                return

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        out = cb.net_outputs
        overflow = bool(out[1].asnumpy())
        if cb.cur_step_num % self.every and not overflow:
            return
        stats = out[3].asnumpy().astype(np.float64)
        cells = OrderedDict()
        for owner, (sumsq, bad) in zip(self.owners, stats):
            c = cells.setdefault(owner, [0.0, 0])
            c[0] += sumsq
            c[1] += int(bad)
        row = {
            "step": cb.cur_step_num,
            "scale": float(out[2].asnumpy()),
            "overflow": overflow,
            "global_norm": math.sqrt(stats[:, 0].sum()),
            "nonfinite": int(stats[:, 1].sum()),
            "cells": {k: {"norm": math.sqrt(s), "nonfinite": b} for k, (s, b) in cells.items()},
        }
        self._file.write(json.dumps(finite_or_str(row)) + "\n")
        self._file.flush()
        self.rows += 1

    def on_train_end(self, run_context):
        if self._file:
            self._file.close()

    def summary(self) -> dict:
        return {
            "grad_stats": os.path.basename(self.path),
            "rows": self.rows,
            "nonfinite_input_batches": self.bad_inputs,
        }


def find_islands(make_net, weights: dict, level: str, keep: list, batch, scale: float, max_islands: int) -> dict:
    """Which cells must stay FP32 for this batch to train finitely; each round is one probe."""
    if batch is None:
        return {"cause": "unknown", "first": None, "keep_fp32": list(keep), "fixed": False, "rounds": []}
    x, y = batch[0], batch[1]
    bad_in = int((~np.isfinite(x)).sum()) if np.issubdtype(x.dtype, np.floating) else 0
    if bad_in:
        return {"cause": "input", "input_nonfinite": bad_in, "first": None, "keep_fp32": list(keep), "fixed": False}
    ms.set_context(mode=ms.PYNATIVE_MODE)  # forward hooks run in PyNative only; the run is over anyway
    keep, rounds, added = list(keep), [], 0
    while True:
        culprit = _probe(make_net, weights, level, keep, x, y, scale)
        rounds.append({"keep_fp32": list(keep), "culprit": culprit})
        if culprit is None or level == "O0" or culprit["cell"] in keep or added >= max_islands:
            break
        keep.append(culprit["cell"])
        added += 1
        log.info("diagnosis: %s went non-finite first; trying again with it in FP32", culprit["cell"])
    first = rounds[0]["culprit"]
    return {
        "cause": "amp" if first and level != "O0" else ("none" if first is None else "fp32"),
        "first": first,
        "keep_fp32": keep,
        "fixed": first is not None and rounds[-1]["culprit"] is None,
        "rounds": rounds,
    }


def _probe(make_net, weights, level, keep, x, y, scale):
    """Forward (hooks on every leaf cell) and backward of one batch; the first culprit or None."""
    net = with_reference_convolutions(make_net)()
    plain_body(net)  # the hooks must see each cell called, with plain tensors (models/blocked.py)
    not_loaded, _ = ms.load_param_into_net(net, {n: ms.Parameter(ms.Tensor(w), name=n) for n, w in weights.items()})
    if not_loaded:
        raise ValueError(f"the probe's network lacks the trained weights' places: {not_loaded[:4]}")
    names = {id(c): n for n, c in net.cells_and_names() if n}
    seen = []

    def hook(cell, inputs, output):
        seen.append((names[id(cell)], type(cell).__name__, _max_abs(inputs), _max_abs(output)))

    handles = [c.register_forward_hook(hook) for n, c in net.cells_and_names() if n and not c.name_cells()]
    with tempfile.TemporaryDirectory() as tmp:  # O1 writes its rewritten source to the cwd
        _, loss_net = build_loss_net(net, level, keep, tmp)
    loss_net.set_train(True)
    xt, yt = ms.Tensor(x), ms.Tensor(y)
    loss_net(xt, yt)
    for h in handles:
        h.remove()
    for name, kind, in_max, out_max in seen:
        if not math.isfinite(out_max):
            return {"cell": name, "type": kind, "where": "output", "input_max_abs": in_max}
    params = loss_net.trainable_params()
    sens = ms.Tensor(np.float32(scale))
    grads = ops.GradOperation(get_by_list=True, sens_param=True)(loss_net, ms.ParameterTuple(params))(xt, yt, sens)
    bad = {p.name.rsplit(".", 1)[0] for p, g in zip(params, grads) if not np.isfinite(g.asnumpy()).all()}
    if not bad:
        return None
    # Non-finite gradients flow backwards: they start at the bad cell that ran last in the forward pass.
    order = {n: i for i, (n, *_) in enumerate(seen)}
    cell = max(bad, key=lambda n: order.get(n, -1))
    kind = next((k for n, k, *_ in seen if n == cell), "")
    return {"cell": cell, "type": kind, "where": "gradients", "input_max_abs": None}


def with_reference_convolutions(make_net):
    """make_net building the same network (the same parameter names and values) with MindSpore's own
    convolutions (model.conv=native). The probe asks where FP16 overflows, a question of precision, and asks it
    in PyNative with forward hooks, where MindSpore's kernels are the reference the runner's are held to
    (tests/test_conv.py). The runner's oneDNN kernels' PyNative backward breaks on a MindCV network once FP32
    islands are added (mobilenet_v2 at 32 px: "The 2th dim of x(1) and dout(2) not equal, primitive name:
    ReLU6Grad"), which ended the diagnosis in a traceback instead of naming the layers."""
    if isinstance(make_net, functools.partial) and "conv" in make_net.keywords:
        return functools.partial(make_net, conv="native")
    return make_net


def _max_abs(value) -> float:
    """Largest |x| over the float tensors in value (nan if any is NaN, inf if any is inf)."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    peak = 0.0
    for t in items:
        if hasattr(t, "asnumpy"):
            a = t.asnumpy()
            if np.issubdtype(a.dtype, np.floating) and a.size:
                a = np.abs(a.astype(np.float32))
                peak = max(peak, float(np.nan if np.isnan(a).any() else a.max()), key=_nan_first)
    return peak


def _nan_first(v: float) -> float:
    return math.inf if math.isnan(v) else v
