"""What an evaluation measures besides accuracy and loss: top-5 and per-class accuracy, on hard labels."""

import numpy as np
from mindspore import nn


class PerClassAccuracy(nn.Metric):
    """Accuracy within each true class (None for a class the evaluation set lacks).

    MindSpore's metrics report one number over all samples; a class the network gets wrong can
    hide behind the others there.
    """

    def __init__(self, num_classes: int):
        super().__init__()
        self.num_classes = num_classes
        self.clear()

    def clear(self):
        """Forget the samples seen so far."""
        self.correct = np.zeros(self.num_classes, np.int64)
        self.total = np.zeros(self.num_classes, np.int64)

    def update(self, *inputs):
        """inputs: logits (N, C) and class indices (N,)."""
        logits, labels = self._convert_data(inputs[0]), self._convert_data(inputs[1]).reshape(-1).astype(np.int64)
        hit = logits.argmax(axis=-1) == labels
        np.add.at(self.total, labels, 1)
        np.add.at(self.correct, labels[hit], 1)

    def eval(self):
        """Per class, correct / seen."""
        return [float(c / t) if t else None for c, t in zip(self.correct, self.total)]


def evaluation_metrics(num_classes: int) -> dict:
    """The metrics of every evaluation: accuracy, loss, per-class accuracy and, above 5 classes, top-5."""
    metrics = {"accuracy": nn.Accuracy(), "loss": nn.Loss(), "per_class_accuracy": PerClassAccuracy(num_classes)}
    if num_classes > 5:  # with 5 classes or fewer, top-5 is 1.0 by construction
        metrics["top5_accuracy"] = nn.TopKCategoricalAccuracy(5)
    return metrics


def as_metrics(val: dict) -> dict:
    """An evaluation's results as metrics.json records them (empty when there was none)."""
    if not val:
        return {"val_top5_accuracy": None, "val_per_class_accuracy": None}
    top5 = val.get("top5_accuracy")
    return {
        "val_top5_accuracy": float(top5) if top5 is not None else None,
        "val_per_class_accuracy": val["per_class_accuracy"],
    }
