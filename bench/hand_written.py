"""The same training as the runner, written by hand with MindSpore only: the overhead benchmark's reference.

Same model (models/resnet.py), same-shaped synthetic data through the same pipeline ops, batch, graph mode, FP32 (O0),
no sink, SGD momentum; step time measured as the runner measures it (step end to step end).
Prints one JSON line. Used by bench/overhead.py; not part of the runner.
"""

import argparse
import json
import os
import time

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")  # what the runner does on CPU (docs/mindspore-notes.md#cpu-isa)

import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
import mindspore.dataset.vision as V  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import Model, nn  # noqa: E402
from mindspore.train import Callback  # noqa: E402

from runner.models.resnet import resnet  # noqa: E402


class StepTimes(Callback):
    def on_train_begin(self, run_context):
        self.last, self.times = time.perf_counter(), []

    def on_train_step_end(self, run_context):
        now = time.perf_counter()
        self.times.append(now - self.last)
        self.last = now


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=1280)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--width", type=int, default=16)
    a = p.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    rng = np.random.RandomState(0)
    images = rng.randint(0, 256, (a.samples, a.size, a.size, 3)).astype(np.uint8)
    labels = rng.randint(0, 10, a.samples).astype(np.int32)
    ops = [V.Resize((a.size, a.size)), V.ToTensor(), V.Normalize([0.5] * 3, [0.5] * 3, is_hwc=False)]
    data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=True)
    data = data.map(ops, "image", num_parallel_workers=2).batch(a.batch, drop_remainder=True)
    net = resnet(style="cifar", depth=a.depth, width=a.width, num_classes=10, in_channels=3, image_size=a.size)
    loss = nn.CrossEntropyLoss(reduction="mean")  # the loss the runner trains with
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9, weight_decay=1e-4)
    cb = StepTimes()
    Model(nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)).train(1, data, callbacks=[cb], dataset_sink_mode=False)
    steady = np.array(cb.times[1:])
    print(json.dumps({"step_time_median_ms": float(np.median(steady)) * 1000, "steps": len(cb.times)}))


if __name__ == "__main__":
    main()
