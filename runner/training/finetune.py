"""Consumer of `init_from` and `optim.freeze`: start from another run's weights, keep chosen cells fixed.

Unlike `resume` (the same run, continued: optimizer state, schedule position and data order), init_from
starts a new run whose network takes every parameter of the checkpoint whose name and shape match;
the rest keeps its fresh initialisation (a new head when the number of classes differs).
"""

import logging
import os
from typing import Optional

import mindspore as ms
import numpy as np
from mindspore import nn

from runner.amp.fp32_islands import match_cells
from runner.datasets.errors import error_reason
from runner.errors import ConfigError
from runner.rundir.layout import file_format
from runner.rundir.saved_run import CLASSES, recorded_classes, source_path
from runner.training.checkpoints import usable_weights

log = logging.getLogger("runner")


def _train_state(name: str, names: set) -> bool:
    """Whether a checkpoint entry is training state rather than a network weight: an optimizer slot
    (`moments.<weight>`, `moment1.<weight>`) or a scalar of the train cell (global_step, loss_scale,
    learning_rate), which the runner's networks never name without a dot."""
    head, _, rest = name.partition(".")
    return not rest or rest in names


def _adapt_input_conv(weight, shape):
    """The first convolution of a grayscale (1-channel) checkpoint for RGB input, or the reverse, as timm's
    adapt_input_conv does it: the kernel repeated over 3 channels and divided by 3 (a gray image made RGB
    then gives the same response), or summed over the 3 channels. None for any other mismatch."""
    w = weight.asnumpy()
    if w.ndim != 4 or len(shape) != 4 or w.shape[0] != shape[0] or tuple(w.shape[2:]) != tuple(shape[2:]):
        return None
    if (w.shape[1], shape[1]) == (1, 3):
        return np.repeat(w, 3, axis=1) / 3
    if (w.shape[1], shape[1]) == (3, 1):
        return w.sum(axis=1, keepdims=True)
    return None


def _source_classes(path: str) -> Optional[list]:
    """The class names the run that wrote the checkpoint at path recorded (its classes.json), or None."""
    folder = os.path.dirname(path)
    if os.path.basename(folder) == "checkpoints":
        folder = os.path.dirname(folder)
    return recorded_classes(folder) if os.path.isfile(os.path.join(folder, CLASSES)) else None


def source_run(path: str) -> Optional[str]:
    """The run directory that wrote the checkpoint at path (beside its config.yaml), or None."""
    from runner.rundir.layout import CONFIG

    folder = os.path.dirname(path)
    if os.path.basename(folder) == "checkpoints":
        folder = os.path.dirname(folder)
    return folder if os.path.isfile(os.path.join(folder, CONFIG)) else None


def training_overlap(init_from: str, data, seed: int) -> Optional[dict]:
    """How many validation samples of `data` (split with `seed`) the init_from checkpoint's run trained
    on (runner.datasets.sources.training_overlap), with `source` added; None when that run's config is
    unknown (a bare .ckpt) or the two data cannot share samples."""
    from runner.datasets.sources import training_overlap as overlap
    from runner.rundir.saved_run import load_config

    run = source_run(source_path(init_from))
    if run is None:
        return None
    try:
        trained = load_config(run)
    except ConfigError:
        return None  # a config of another version: nothing to compare with
    found = overlap(trained.data, trained.seed, data, seed)
    return {**found, "source": run} if found else None


def _match_head(mine: dict, values: dict, source: Optional[list], classes: Optional[list]) -> Optional[dict]:
    """Make a loaded classifier head mean this data's classes: rows reordered by name when the data has the
    source run's classes in another order, the head left freshly initialised when its classes are others.
    values is changed in place; returns the record (None when there is nothing to compare).

    The head is the network's trailing parameters whose first dimension is the number of classes (the
    final Dense layer's weight and bias), loaded only when the counts agree.
    """
    if not source or not classes or list(source) == list(classes) or len(source) != len(classes):
        return None
    head = []
    for n, p in reversed(list(mine.items())):
        if not p.shape or p.shape[0] != len(classes):
            break
        head.append(n)
    head = [n for n in reversed(head) if n in values]
    if not head:
        return None
    if set(source) == set(classes):
        order = [list(source).index(c) for c in classes]
        for n in head:
            values[n] = ms.Tensor(values[n].asnumpy()[order], values[n].dtype)
        log.info("init_from: the head's rows follow this data's class order, matched by name: %s", head)
        return {"source": list(source), "head": head, "mapped_by_name": True}
    for n in head:
        del values[n]
    log.warning(
        "init_from: the checkpoint's head was trained on other classes (%s) than this data's (%s); it is freshly "
        "initialised instead of loaded: %s",
        ", ".join(source[:6]),
        ", ".join(classes[:6]),
        head,
    )
    return {"source": list(source), "head": head, "mapped_by_name": False}


def load_matching(net, init_from: str, classes: Optional[list] = None) -> dict:
    """Load every checkpoint parameter whose name and shape match net's; return what was loaded and not.

    The input convolution is adapted between 1 and 3 channels (data.channels differs). classes: this
    data's class names; the classifier head follows them by name when the source run recorded its own
    (classes.json). Refuses a checkpoint that shares no parameter with net (another architecture, a wrong file).
    """
    path = source_path(init_from)
    try:
        params = ms.load_checkpoint(path, format=file_format(path))
    except (ValueError, RuntimeError, OSError) as e:
        raise ConfigError(
            f"init_from={init_from}: {path} cannot be read as a MindSpore checkpoint ({error_reason(e)})."
        ) from None
    mine = net.parameters_dict()
    values, adapted = {}, []
    for i, (n, p) in enumerate(mine.items()):
        if n not in params:
            continue
        if tuple(params[n].shape) == tuple(p.shape):
            values[n] = params[n]
        elif i == 0 and (w := _adapt_input_conv(params[n], p.shape)) is not None:
            values[n] = ms.Tensor(w, p.dtype)
            adapted.append(n)
    head = _match_head(mine, values, _source_classes(path), classes)
    reinit = [n for n in mine if n not in values]
    unused = [n for n in params if n not in mine and not _train_state(n, set(params))]
    if not values:
        sample = [n for n in params if not _train_state(n, set(params))][:4]
        raise ConfigError(
            f"init_from={init_from}: {path} shares no parameter (name and shape) with this "
            f"{type(net).__name__} (it holds e.g. {sample}; this network has e.g. {list(mine)[:4]}). It is a "
            "checkpoint of another architecture: fine-tune with the model.* settings it was trained with."
        )
    values = usable_weights(values, mine, path, hint="Fine-tune from another checkpoint (init_from=<file or run>).")
    # set_data rather than load_param_into_net, which warns about every parameter it was not given:
    # here those are expected (the new head) and listed below.
    for n, v in values.items():
        mine[n].set_data(v.astype(mine[n].dtype))
    log.info("init_from %s: loaded %d of %d parameters", path, len(values), len(mine))
    if adapted:
        log.info("init_from: input convolution adapted to data.channels=%d: %s", mine[adapted[0]].shape[1], adapted)
    if reinit:
        log.info("init_from: freshly initialised (absent or of another shape): %s", ", ".join(reinit))
    if unused:
        log.info("init_from: checkpoint parameters this network lacks: %s", ", ".join(unused))
    record = {"init_from": path, "loaded": list(values), "adapted": adapted, "reinitialised": reinit, "unused": unused}
    return {**record, "classes": head} if head else record


def freeze(net, patterns) -> dict:
    """Keep the cells the patterns select fixed: their parameters leave the optimizer (requires_grad
    False, so net.trainable_params() omits them) and their BatchNorm layers normalise with, and no
    longer update, their running statistics.

    Patterns match as amp.keep_fp32's do (runner/amp/fp32_islands.py). Model.train sets the whole
    network to training mode, so a frozen BatchNorm is pinned by use_batch_statistics=False rather
    than by set_train(False) (docs/mindspore-notes.md#frozen-bn).
    """
    cells = match_cells(net, list(patterns), option="optim.freeze")
    # A pattern whose cells hold no parameter (activations, pooling: `*relu`) would freeze nothing, silently.
    empty = [
        p
        for p in patterns
        if not any(True for _, c in match_cells(net, [p], "optim.freeze") for _ in c.get_parameters())
    ]
    if empty:
        raise ConfigError(
            f"optim.freeze={list(patterns)}: {empty} select(s) only cells without parameters (activations, pooling), "
            "so it would freeze nothing. Name the cells that hold weights, e.g. stem, layer1 or layer1.0.conv1."
        )
    count = 0
    for _, cell in cells:
        for p in cell.get_parameters():
            if p.requires_grad:
                count += 1
            p.requires_grad = False
        for _, sub in cell.cells_and_names():
            if isinstance(sub, nn.BatchNorm2d):
                sub.use_batch_statistics = False
    if not net.trainable_params():
        raise ConfigError(
            f"optim.freeze={list(patterns)} freezes every parameter of the network: nothing would train. "
            "Leave at least the head out of it."
        )
    names = [n for n, _ in cells]
    log.info("optim.freeze: %s frozen (%d parameters)", names, count)
    return {"frozen": names, "frozen_parameters": count}


def prepare(
    net, init_from: Optional[str], freeze_patterns, classes: Optional[list] = None, data=None, seed: int = 0
) -> Optional[dict]:
    """init_from then optim.freeze on a freshly built network; metrics.json's `fine_tune` record (or None).

    classes: the training data's class names (None where it names none). data, seed: this run's data
    settings and seed; when the init_from run trained on samples this run validates on (another seed or
    split of the same data, or the same files), its validation scores are inflated by what the weights
    memorised: a warning says so, and the record's `validation_overlap` counts them.
    """
    if not init_from and not freeze_patterns:
        return None
    record = {"init_from": None, "loaded": [], "adapted": [], "reinitialised": [], "unused": []}
    if init_from:
        record.update(load_matching(net, init_from, classes))
        overlap = training_overlap(init_from, data, seed) if data is not None else None
        if overlap is not None:
            record["validation_overlap"] = overlap
        if overlap and overlap["seen_in_training"]:
            log.warning(
                "init_from: %d of this run's %d validation samples are training samples of %s (%s): its "
                "val_accuracy and val_loss measure memorised samples too and overstate the model. Validate on "
                "data the source never trained on (the same seed and data.val_fraction for digits/synthetic).",
                overlap["seen_in_training"],
                overlap["val_samples"],
                overlap["source"],
                overlap["how"],
            )
    record.update(freeze(net, freeze_patterns) if freeze_patterns else {"frozen": [], "frozen_parameters": 0})
    fixed_random = [
        p.name
        for p in net.get_parameters()
        if not p.requires_grad and (not init_from or p.name in record["reinitialised"])
    ]
    fixed_random = [n for n in fixed_random if "moving_" not in n]  # running statistics never train
    if freeze_patterns and fixed_random:
        log.warning("optim.freeze keeps freshly initialised parameters fixed (not from init_from): %s", fixed_random)
    return record
