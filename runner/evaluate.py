"""`python -m runner.evaluate run=<run dir> [ckpt=final|last|best|<path>] [data.<field>=...]`.

Rebuilds the run's network and validation pipeline from its saved config.yaml, loads a checkpoint and
writes top-1, top-5, loss, per-class accuracy and the confusion matrix into
`<run>/evaluate-<time>/metrics.json` (and confusion.png).
"""

import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import hydra
import numpy as np
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import MISSING, OmegaConf

from runner.cli.app import entry_point
from runner.errors import ConfigError
from runner.rundir.saved_run import DataOverrides, check_run_argument, own_new_dir, reported_errors

log = logging.getLogger("runner")


@dataclass
class EvaluateConfig:
    run: str = MISSING  # the training run's directory (holds config.yaml)
    ckpt: str = "final"  # final (model.ckpt) | last | best (checkpoints/latest.json) | a .ckpt path
    batch_size: Optional[int] = None  # None: the run's batch_size
    # true: at the AMP level the run validated with, so top-1 equals its val_accuracy; false: FP32 throughout
    amp: bool = True
    data: DataOverrides = field(default_factory=DataOverrides)  # e.g. data.root=... (None = the run's)


ConfigStore.instance().store(name="evaluate_schema", node=EvaluateConfig)


def run_network(net, dataset):
    """Logits, labels, the per-sample mean loss and the mean of batch losses of net (FP32 logits) over
    a batched (image, label) dataset.

    The loss is training's own (runner.amp.loss_fn). Training's val_loss comes from MindSpore's nn.Loss
    metric, which averages batch means: with a partial last batch that is not the per-sample mean, so
    both are returned (the second reproduces val_loss).
    """
    from mindspore import nn

    from runner.amp import loss_fn

    cell = nn.WithEvalCell(net, loss_fn())
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


def scores(logits: np.ndarray, labels: np.ndarray, names: list) -> dict:
    """Top-1, top-5 (more than 5 classes only), per-class accuracy and the confusion matrix."""
    k = logits.shape[1]
    pred = logits.argmax(axis=1)  # first maximum on ties, as nn.Accuracy
    confusion = np.zeros((k, k), dtype=np.int64)
    np.add.at(confusion, (labels, pred), 1)
    top5 = None
    if k > 5:
        best5 = np.argsort(-logits, axis=1, kind="stable")[:, :5]
        top5 = float(np.mean((best5 == labels[:, None]).any(axis=1)))
    per_class = {}
    for c, name in enumerate(names):
        n = int(confusion[c].sum())
        per_class[name] = {"accuracy": float(confusion[c, c] / n) if n else None, "samples": n}
    return {
        "top1": float(np.mean(pred == labels)),
        "top5": top5,
        "per_class": per_class,
        # rows: true class, columns: predicted class, both in `labels` order
        "confusion": {"labels": list(names), "matrix": confusion.tolist()},
    }


def confusion_plot(confusion: dict, path: str, title: str) -> str:
    """The confusion matrix as a heat map, counts written in the cells while they stay legible."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = np.asarray(confusion["matrix"])
    names = confusion["labels"]
    k = len(names)
    size = min(12, 2.5 + 0.45 * k)
    fig, ax = plt.subplots(figsize=(size, size))
    share = m / np.maximum(m.sum(axis=1, keepdims=True), 1)
    ax.imshow(share, cmap="Blues", vmin=0, vmax=1)  # colour: share of the true class
    if k <= 25:
        for i in range(k):
            for j in range(k):
                if m[i, j]:
                    colour = "white" if share[i, j] > 0.5 else "black"
                    ax.text(j, i, str(m[i, j]), ha="center", va="center", fontsize=8, color=colour)
        ax.set_xticks(range(k), names, rotation=90 if max(map(len, names)) > 3 else 0, fontsize=8)
        ax.set_yticks(range(k), names, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def evaluate(app) -> dict:
    """Evaluate a checkpoint of app.run on its validation data; write and return the metrics."""
    from runner.report.outputs import versions
    from runner.rundir import saved_run as lifecycle
    from runner.rundir.atomic import write_json

    out_dir = HydraConfig.get().runtime.output_dir
    if app.batch_size is not None and app.batch_size < 1:
        raise ConfigError(f"batch_size must be positive, got {app.batch_size}.")
    saved = lifecycle.open_run(app.run, app.ckpt, lifecycle.load_config(app.run, app.data), app.batch_size)
    cfg, target, data, ckpt = saved.cfg, saved.target, saved.data, saved.checkpoint
    net, level = lifecycle.inference_net(saved.net, cfg, app.amp, target, out_dir)
    logits, labels, loss, batch_mean = run_network(net, data.val)
    names = lifecycle.class_names(data, logits.shape[1])
    result = scores(logits, labels, names)
    trained = os.path.join(app.run, "metrics.json")
    train_acc = None
    if os.path.isfile(trained):
        import json

        with open(trained) as f:
            train_acc = json.load(f).get("val_accuracy")
    overrides = {k: v for k, v in OmegaConf.to_container(app.data, enum_to_str=True).items() if v is not None}
    metrics = {
        **result,
        "loss": loss,  # per-sample mean
        "loss_batch_mean": batch_mean,  # mean of batch means, as training's val_loss
        "samples": int(len(labels)),
        "num_classes": int(logits.shape[1]),
        "checkpoint": ckpt["path"],
        "run": os.path.abspath(app.run),
        "data": str(cfg.data.name),
        "data_overrides": overrides,
        "amp_level_used": level,
        "device_target": target,
        "train_val_accuracy": train_acc,  # the run's own val_accuracy, for comparison
        "versions": versions(),
    }
    title = f"{cfg.model.name} on {metrics['data']} val: top-1 {result['top1']:.4f} ({os.path.basename(ckpt['path'])})"
    metrics["plot"] = confusion_plot(result["confusion"], os.path.join(out_dir, "confusion.png"), title)
    write_json(os.path.join(out_dir, "metrics.json"), metrics)
    top5 = f" | top5 {result['top5']:.4f}" if result["top5"] is not None else ""
    print(
        f"top1 {result['top1']:.4f}{top5} | loss {loss:.4f} | {len(labels)} samples, {logits.shape[1]} classes | "
        f"{os.path.basename(ckpt['path'])} {level} on {target} | outputs: {out_dir}",
        flush=True,
    )
    return metrics


@hydra.main(version_base="1.3", config_path="pkg://runner.conf", config_name="evaluate")
def main(app) -> float:
    with reported_errors():
        return evaluate(app)["top1"]


cli = entry_point(main, lambda argv: check_run_argument(argv, "evaluate"), before_run=own_new_dir("evaluate"))

if __name__ == "__main__":
    cli()
