"""What an evaluation measures: top-1, top-5, per-class accuracy and the confusion matrix, one implementation.

Validation during training, the run's final numbers and `runner.evaluate` all count through `Scores`,
so a number in metrics.json and the same number from evaluate cannot disagree by construction.
"""

from typing import Optional

import numpy as np
from mindspore import nn


class Scores(nn.Metric):
    """Confusion matrix and top-5 hits of logits (N, C) against class indices (N,).

    MindSpore's nn.Accuracy and nn.TopKCategoricalAccuracy report one number each over all samples;
    a class the network gets wrong hides behind the others there, so the counts are kept per class.
    """

    def __init__(self, num_classes: int):
        super().__init__()
        self.num_classes = num_classes
        self.clear()

    def clear(self):
        """Forget the samples seen so far."""
        self.confusion = np.zeros((self.num_classes, self.num_classes), np.int64)
        self.top5_hits = 0

    def update(self, *inputs):
        """inputs: logits (N, C) and class indices (N,)."""
        logits = np.asarray(self._convert_data(inputs[0]))
        labels = np.asarray(self._convert_data(inputs[1])).reshape(-1).astype(np.int64)
        pred = logits.argmax(axis=-1)  # first maximum on ties, as nn.Accuracy
        np.add.at(self.confusion, (labels, pred), 1)
        if self.num_classes > 5:  # with 5 classes or fewer, top-5 is 1.0 by construction
            best5 = np.argsort(-logits, axis=-1, kind="stable")[:, :5]
            self.top5_hits += int((best5 == labels[:, None]).any(axis=1).sum())

    def eval(self) -> dict:
        """top1, top5 (None with 5 classes or fewer), per_class (None for an unseen class), confusion."""
        total = int(self.confusion.sum())
        if not total:
            raise RuntimeError("Scores.eval: no sample was seen")  # as nn.Accuracy: an empty set is a bug
        seen = self.confusion.sum(axis=1)
        return {
            "top1": float(np.trace(self.confusion) / total),
            "top5": float(self.top5_hits / total) if self.num_classes > 5 else None,
            "per_class": [float(self.confusion[c, c] / n) if n else None for c, n in enumerate(seen)],
            # rows: true class, columns: predicted class
            "confusion": self.confusion.tolist(),
        }


def scores(logits: np.ndarray, labels: np.ndarray, names: list) -> dict:
    """Scores of a whole evaluation, with per-class accuracy and the confusion matrix under class names."""
    metric = Scores(logits.shape[1])
    metric.update(logits, labels)
    result = metric.eval()
    samples = np.asarray(result["confusion"]).sum(axis=1)
    return {
        "top1": result["top1"],
        "top5": result["top5"],
        "per_class": {n: {"accuracy": a, "samples": int(s)} for n, a, s in zip(names, result["per_class"], samples)},
        # rows: true class, columns: predicted class, both in `labels` order
        "confusion": {"labels": list(names), "matrix": result["confusion"]},
    }


def evaluation_metrics(num_classes: int) -> dict:
    """The metrics of every evaluation Model (fresh instances: metrics hold state): loss and Scores."""
    return {"loss": nn.Loss(), "scores": Scores(num_classes)}


def flat(results: Optional[dict]) -> dict:
    """Model.eval's {"loss", "scores"} as the run reads them: accuracy, loss, top5_accuracy, per_class_accuracy."""
    if not results:
        return {}
    s = results["scores"]
    return {
        "accuracy": s["top1"],
        "loss": float(results["loss"]),
        "top5_accuracy": s["top5"],
        "per_class_accuracy": s["per_class"],
    }


def as_metrics(val: dict) -> dict:
    """An evaluation's results as metrics.json records them (empty when there was none)."""
    if not val:
        return {"val_top5_accuracy": None, "val_per_class_accuracy": None}
    top5 = val.get("top5_accuracy")
    return {
        "val_top5_accuracy": float(top5) if top5 is not None else None,
        "val_per_class_accuracy": val["per_class_accuracy"],
    }
