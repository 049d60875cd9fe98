"""`python -m runner.evaluate run=<run dir> [ckpt=final|last|best|<path>] [data.<field>=...]`.

Rebuilds the run's network and validation pipeline from its saved config.yaml, loads a checkpoint and
writes top-1, top-5, loss, per-class accuracy and the confusion matrix into
`<run>/evaluate-<time>/metrics.json` (and confusion.png).
"""

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from runner import saved_model
from runner.errors import ConfigError
from runner.report.outputs import versions
from runner.rundir import saved_run
from runner.rundir.atomic import write_json
from runner.rundir.layout import RunDir
from runner.rundir.saved_run import DataOverrides

log = logging.getLogger("runner")
# Lazy imports in evaluate(): runner.amp and runner.report.accuracy load MindSpore, which must wait until
# open_run has set the CPU ISA cap; runner.report.plots loads matplotlib (~0.5 s), only for the plot.


@dataclass
class EvaluateConfig:
    run: str = MISSING  # the training run's directory (holds config.yaml)
    ckpt: str = "final"  # final (model.ckpt) | last | best (checkpoints/latest.json) | a .ckpt path
    batch_size: Optional[int] = None  # None: the run's batch_size
    # true: at the AMP level the run validated with, so top-1 equals its val_accuracy; false: FP32 throughout.
    # Not `amp`: that is the training config group in the same config package, so Hydra would read amp=false
    # as a group choice.
    use_amp: bool = True
    # strict: refuse data whose class names differ from the run's (classes.json); by_name: map the data's
    # labels to the network's outputs by name (the same classes in another order, or a subset of them)
    classes: str = "strict"
    data: DataOverrides = field(default_factory=DataOverrides)  # e.g. data.root=... (None = the run's)


ConfigStore.instance().store(name="evaluate_schema", node=EvaluateConfig)


@dataclass
class EvalMetrics:
    """Every key of evaluate's metrics.json (what runner.evaluate_run returns)."""

    top1: float  # 0..1
    top5: Optional[float]  # 0..1; None with 5 classes or fewer
    per_class: dict  # class name -> {"accuracy": 0..1 or None when unseen, "samples"}
    confusion: dict  # {"labels", "matrix"}: rows the true class, columns the predicted one
    loss: float  # per-sample mean cross-entropy
    loss_batch_mean: float  # mean of batch means, as training's val_loss
    samples: int
    num_classes: int
    checkpoint: str
    run: str
    data: str
    data_overrides: dict
    amp_level_used: str
    device_target: str
    train_val_accuracy: Optional[float]  # the run's own val_accuracy, for comparison
    versions: dict
    plot: Optional[str] = None  # confusion.png
    # Validation samples the model's weights were trained on: {"val_samples", "seen_in_training", "how"}
    # for the run itself (always 0: more is refused) and, under "init_from", for the run it was
    # fine-tuned from; None where the data cannot share samples with what was trained on.
    training_overlap: Optional[dict] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def run_network(net, dataset):
    """Logits, labels, the per-sample mean loss and the mean of batch losses of net (FP32 logits) over
    a batched (image, label) dataset.

    The loss is training's own (runner.amp.loss_fn). Training's val_loss comes from MindSpore's nn.Loss
    metric, which averages batch means: with a partial last batch that is not the per-sample mean, so
    both are returned (the second reproduces val_loss).
    """
    from runner.amp.precision import eval_cell

    cell = eval_cell(net)
    cell.set_train(False)
    logits, labels, losses = [], [], []
    for images, y in dataset.create_tuple_iterator(num_epochs=1):
        loss, out, _ = cell(images, y)
        logits.append(out.asnumpy())
        labels.append(y.asnumpy())
        losses.append(float(loss.asnumpy()))
    if not labels:
        raise ConfigError("The validation set is empty: there is nothing to evaluate.")
    sizes = [len(y) for y in labels]
    logits, labels = np.concatenate(logits), np.concatenate(labels).astype(np.int64)
    return logits, labels, float(np.dot(losses, sizes) / len(labels)), float(np.mean(losses))


def _cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-sample cross-entropy of FP32 logits (label smoothing aside, training's loss)."""
    z = logits - logits.max(axis=1, keepdims=True)
    return np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(labels)), labels]


def evaluation_overlap(run: str, cfg) -> Optional[dict]:
    """Check that the evaluation set holds no sample the run's weights were trained on; the record for
    metrics.json (None when nothing can overlap).

    The run's own training samples: a ConfigError (data.val_fraction above the run's, for digits and
    synthetic whose split is a permutation of the seed, or data.root naming files the run trained on),
    since its score would be inflated by memorised samples and no honest number can come out. The
    samples of the run that init_from fine-tuned it from: a warning and the record, as training gave.
    """
    from runner.datasets.sources import training_overlap
    from runner.rundir import saved_run
    from runner.training import finetune

    trained = saved_run.load_config(run)
    own = training_overlap(trained.data, trained.seed, cfg.data, cfg.seed)
    if own and own["seen_in_training"]:
        raise ConfigError(
            f"This evaluation set would hold {own['seen_in_training']} of the run's own training samples (of "
            f"{own['val_samples']}; {own['how']}), so its score would count memorised samples. Evaluate on the "
            f"run's validation data: for data={trained.data.name} keep data.val_fraction at most the run's "
            f"{trained.data.val_fraction} (a smaller one is a subset of it), or name data the run never trained on."
        )
    record = {**own} if own else {}
    if cfg.init_from:
        try:
            source = finetune.training_overlap(cfg.init_from, cfg.data, cfg.seed)
        except ConfigError:
            source = None  # the source run is gone: nothing to compare with
        if source:
            record["init_from"] = source
            if source["seen_in_training"]:
                log.warning(
                    "%d of the %d evaluated samples are training samples of %s, which this run was fine-tuned "
                    "from (init_from; %s): the score overstates the model.",
                    source["seen_in_training"],
                    source["val_samples"],
                    source["source"],
                    source["how"],
                )
    return record or None


def evaluate(app, out_dir: str) -> EvalMetrics:
    """Evaluate a checkpoint of app.run on its validation data; write the metrics into out_dir and return them."""
    from runner.report.accuracy import scores
    from runner.report.plots import confusion_plot

    _check_settings(app)
    recorded = saved_run.recorded_classes(app.run)
    overlap = evaluation_overlap(app.run, saved_run.load_config(app.run, app.data))
    saved = _open_for_evaluation(app)
    cfg, target, data, ckpt = saved.cfg, saved.target, saved.data, saved.checkpoint
    mapping = _class_mapping(app, recorded, cfg, data)
    net, level = saved_model.inference_net(saved.net, cfg, app.use_amp, target, out_dir)
    logits, labels, loss, batch_mean = _run_on_mapped_labels(net, data.val, mapping)
    saved_model.cache_done("evaluate")
    result = scores(logits, labels, saved_run.class_names(data, logits.shape[1], recorded))
    metrics = EvalMetrics(
        **result,
        loss=loss,
        loss_batch_mean=batch_mean,
        samples=int(len(labels)),
        num_classes=int(logits.shape[1]),
        checkpoint=ckpt["path"],
        run=os.path.abspath(app.run),
        data=str(cfg.data.name),
        data_overrides={k: v for k, v in OmegaConf.to_container(app.data, enum_to_str=True).items() if v is not None},
        amp_level_used=level,
        device_target=target,
        train_val_accuracy=_val_accuracy_in_training(app.run),
        versions=versions(),
        training_overlap=overlap,
    )
    title = f"{cfg.model.name} on {metrics.data} val: top-1 {result['top1']:.4f} ({os.path.basename(ckpt['path'])})"
    metrics.plot = confusion_plot(result["confusion"], os.path.join(out_dir, "confusion.png"), title)
    write_json(RunDir(out_dir).metrics, metrics.to_dict())
    top5 = f" | top5 {result['top5']:.4f}" if result["top5"] is not None else ""
    print(
        # val_loss as training reports it (the mean of batch means), so the two lines compare; per sample beside it.
        f"top1 {result['top1']:.4f}{top5} | val_loss {batch_mean:.4f} ({loss:.4f} per sample) | {len(labels)} "
        f"samples, {logits.shape[1]} classes | "
        f"{os.path.basename(ckpt['path'])} {level} on {target} | outputs: {out_dir}",
        flush=True,
    )
    return metrics


def _check_settings(app) -> None:
    if app.batch_size is not None and app.batch_size < 1:
        raise ConfigError(f"batch_size must be positive, got {app.batch_size}.")
    if str(app.classes) not in ("strict", "by_name"):
        raise ConfigError(f"classes={app.classes}: strict (the default) or by_name.")


def _open_for_evaluation(app):
    settings = OmegaConf.to_container(app, enum_to_str=True)
    settings = {k: settings.get(k) for k in ("batch_size", "use_amp", "data")}  # what reaches the graphs
    return saved_model.open_run(
        app.run, app.ckpt, saved_run.load_config(app.run, app.data), app.batch_size, "evaluate", settings
    )


def _class_mapping(app, recorded, cfg, data):
    """The data's label -> the network's output index (None: the same), or UserError for classes that do not match."""
    return saved_run.match_classes(
        recorded,
        data,
        f"The data evaluate read ({cfg.data.name} at {cfg.data.get('root')})",
        by_name=app.classes == "by_name",
        hint="Evaluate on data of the run's classes (data.root=<folder>); when the data holds the run's classes "
        "(all or some) under the same names, classes=by_name maps its labels to the network's outputs by name.",
    )


def _run_on_mapped_labels(net, dataset, mapping):
    """(logits, labels in the network's indices, loss per sample, mean of batch losses)."""
    logits, labels, loss, batch_mean = run_network(net, dataset)
    if mapping is not None:  # the loss above used the data's own indices: recompute it on the mapped labels
        labels = mapping[labels]
        loss = batch_mean = float(np.mean(_cross_entropy(logits, labels)))
    return logits, labels, loss, batch_mean


def _val_accuracy_in_training(run: str):
    """The run's own final validation accuracy (its metrics.json), to compare with; None when it has none."""
    trained = RunDir(run).metrics
    if not os.path.isfile(trained):
        return None
    with open(trained) as f:
        return json.load(f).get("val_accuracy")


if __name__ == "__main__":  # `python -m runner.evaluate`: the console script's entry point (runner/cli/commands.py)
    from runner.cli.commands import evaluate

    evaluate()
