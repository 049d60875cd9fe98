"""Consumer of the `padding` group: the input shapes the network sees, and what they cost.

A static graph compiles once per input shape (docs/mindspore-notes.md#compile-per-shape), so this
module decides how many shapes a run has:
- `fixed`: every sample becomes height x width (one shape, one compile);
- `bucket`: every sample is padded up to the smallest square bucket that holds it and batches are
  formed within a bucket (at most one compile per bucket);
- `none`: shapes pass through and only same-size samples share a batch (one compile per distinct
  batch shape), for comparison.
Every function here works from the samples' stored sizes, so the plan and its padding cost are known
before any image is decoded.
"""

import math
from collections import Counter

import mindspore.dataset.vision as V
import numpy as np


def _fit(h, w, max_h, max_w, upscale=True):
    """Size after a resize that keeps the aspect ratio and fits in max_h x max_w (at least 1 px)."""
    s = min(max_h / h, max_w / w)
    if not upscale:
        s = min(s, 1.0)
    return max(1, min(max_h, round(h * s))), max(1, min(max_w, round(w * s)))


class AspectResize:
    """Resize an HWC image, keeping its aspect ratio, to fit in (height, width).

    A Python callable because the output size depends on each sample's own size, while MindSpore's
    Resize takes one size (or one shorter-side length) for all samples. It runs MindSpore's Resize.
    """

    def __init__(self, height: int, width: int, upscale: bool = True):
        self.height, self.width, self.upscale = height, width, upscale

    def __call__(self, image):
        h, w = image.shape[:2]
        size = _fit(h, w, self.height, self.width, self.upscale)
        return image if size == (h, w) else V.Resize(size)(image)


def sample_ops(padding, sizes: np.ndarray) -> list:
    """Per-sample ops on HWC uint8 images, before ToTensor."""
    kind = padding.name
    if kind == "fixed":
        H, W = padding.height, padding.width
        method = padding.method
        if method == "resize":
            return [V.Resize((H, W))]
        if method == "crop":  # shorter side to max(H, W) covers H x W for any aspect; then the center
            return [V.Resize(max(H, W)), V.CenterCrop((H, W))]
        if method == "pad":  # a border of `fill`, then the center: pads small images, crops large ones
            ph, pw = (H + 1) // 2, (W + 1) // 2
            return [V.Pad((pw, ph, pw, ph), fill_value=padding.fill), V.CenterCrop((H, W))]
        return [AspectResize(H, W), V.PadToSize((H, W), fill_value=padding.fill)]  # resize_pad
    if kind == "bucket" and len(sizes) and sizes.max() > padding.buckets[-1]:
        # bucket_batch_by_length fails on samples beyond the last bucket: shrink only those.
        side = padding.buckets[-1]
        return [AspectResize(side, side, upscale=False)]
    return []


def network_sizes(padding, sizes: np.ndarray):
    """Per sample: the (h, w) the network sees and the (h, w) of real image pixels inside it."""
    kind = padding.name
    n = len(sizes)
    if kind == "none":
        return sizes, sizes
    if kind == "fixed":
        H, W = padding.height, padding.width
        seen = np.tile([[H, W]], (n, 1))
        method = padding.method
        if method == "pad":
            return seen, np.minimum(sizes, [H, W])
        if method == "resize_pad":
            return seen, np.array([_fit(h, w, H, W) for h, w in sizes]).reshape(n, 2)
        return seen, seen
    side = padding.buckets[-1]
    real = np.array([_fit(h, w, side, side, upscale=False) for h, w in sizes]).reshape(n, 2)
    buckets = np.asarray(padding.buckets)
    seen = buckets[np.searchsorted(buckets, real.max(axis=1))]
    return np.stack([seen, seen], axis=1), real


def representative_size(padding, sizes: np.ndarray):
    """(height, width) of the median training sample as the network sees it (models choose their stem by it)."""
    seen, _ = network_sizes(padding, sizes)
    return int(np.median(seen[:, 0])), int(np.median(seen[:, 1]))


def batch(dataset, padding, batch_size: int, channels: int, sizes: np.ndarray, train: bool):
    """Batch CHW float samples ([0, 1], not yet normalized) as the padding option says.

    Training drops incomplete batches under fixed and bucket so no batch brings a new shape; `none`
    keeps them (nothing is dropped or padded there, at the price of one more shape per size).
    """
    kind = padding.name
    if kind == "fixed":
        return dataset.batch(batch_size, drop_remainder=train)
    if kind == "bucket":
        buckets = list(padding.buckets)
        # pad_to_bucket_boundary pads each None dimension to (boundary - 1): the bucket's side.
        return dataset.bucket_batch_by_length(
            ["image"],
            [b + 1 for b in buckets],
            [batch_size] * (len(buckets) + 1),
            element_length_function=_longer_side,
            pad_info={"image": ([channels, None, None], padding.fill / 255.0)},
            pad_to_bucket_boundary=True,
            drop_remainder=train,
        )
    shapes = sorted({(int(h), int(w)) for h, w in sizes})
    if len(shapes) <= 1:
        return dataset.batch(batch_size, drop_remainder=False)
    index = {s: i for i, s in enumerate(shapes)}
    # One bucket per stored size. A size the headers did not predict (a decoder that rotates by
    # EXIF, say) lands in the last bucket and is padded to its batch's largest: one more shape, no crash.
    return dataset.bucket_batch_by_length(
        ["image"],
        list(range(1, len(shapes) + 1)),
        [batch_size] * (len(shapes) + 1),
        element_length_function=_ShapeIndex(index),
        pad_info={"image": ([channels, None, None], 0.0)},
        drop_remainder=False,
    )


def _longer_side(image):
    return max(image.shape[1], image.shape[2])


class _ShapeIndex:
    """Index of a CHW sample's (h, w) among the stored sizes (Python: MindSpore asks a callable for it)."""

    def __init__(self, index):
        self.index = index

    def __call__(self, image):
        return self.index.get((image.shape[1], image.shape[2]), len(self.index))


def report(padding, sizes: np.ndarray, batch_size: int) -> dict:
    """What the option costs on the training set: shapes, padded pixels, samples changed or dropped per epoch."""
    kind = padding.name
    seen, real = network_sizes(padding, sizes)
    counts = Counter((int(h), int(w)) for h, w in seen)
    total = float(np.prod(seen, axis=1).sum())
    padded = 1.0 - float(np.prod(real, axis=1).sum()) / total if total else 0.0
    if kind == "none":
        shapes = sum((n // batch_size > 0) + (n % batch_size > 0) for n in counts.values())
        dropped = 0
    else:
        shapes = sum(n >= batch_size for n in counts.values())
        dropped = sum(n % batch_size for n in counts.values())
    out = {
        "kind": kind,
        "input_sizes": {f"{h}x{w}": n for (h, w), n in sorted(counts.items())},
        "padded_pixel_fraction": round(padded, 4),
        "expected_batch_shapes": int(shapes),
        "dropped_samples_per_epoch": int(dropped),
        # Compiles the option means to cost; more are warned about (none promises one and warns).
        "compile_budget": len(padding.buckets) if kind == "bucket" else 1,
    }
    if kind == "fixed":
        out["method"] = padding.method
    if kind == "bucket":
        out["buckets"] = list(padding.buckets)
        out["shrunk_samples"] = int(np.sum(sizes.max(axis=1) > padding.buckets[-1]))
    return out


def steps_per_epoch(padding, sizes: np.ndarray, batch_size: int) -> int:
    """Training batches per epoch, from the stored sizes (as the batching above forms them)."""
    seen, _ = network_sizes(padding, sizes)
    counts = Counter((int(h), int(w)) for h, w in seen).values()
    if padding.name == "none":
        return sum(math.ceil(n / batch_size) for n in counts)
    return sum(n // batch_size for n in counts) if padding.name == "bucket" else len(sizes) // batch_size
