"""Where samples come from: each source returns unbatched train/val datasets of (image HWC uint8, label)."""

import os
from dataclasses import dataclass

import mindspore.dataset as ds
import mindspore.dataset.transforms as T
import numpy as np
from mindspore import dtype as mstype

from runner.errors import DataError


@dataclass
class Source:
    train: ds.Dataset
    val: ds.Dataset
    num_classes: int
    train_size: int
    val_size: int
    channels_on_disk: int  # 1 or 3, before conversion to data.channels


def _split(n: int, val_fraction: float, seed: int):
    order = np.random.RandomState(seed).permutation(n)
    n_val = int(round(n * val_fraction))
    return order[n_val:], order[:n_val]


def _from_arrays(images, labels, cfg, seed, num_classes):
    tr, va = _split(len(images), cfg.val_fraction, seed)
    labels = labels.astype(np.int32)

    def make(idx):
        return ds.NumpySlicesDataset({"image": images[idx], "label": labels[idx]}, shuffle=False)

    return Source(make(tr), make(va), num_classes, len(tr), len(va), images.shape[-1])


def digits(cfg, seed):
    """scikit-learn's bundled 8x8 digits, pixel values 0..16 scaled to 0..255."""
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.clip(d.images * 16, 0, 255).astype(np.uint8)[..., None]
    return _from_arrays(images, d.target, cfg, seed, 10)


def synthetic(cfg, seed):
    """Learnable random images: a fixed random pattern per class plus noise."""
    rng = np.random.RandomState(seed)
    size, c = cfg.image_size, cfg.channels
    patterns = rng.randint(0, 256, (cfg.num_classes, size, size, c))
    labels = rng.randint(0, cfg.num_classes, cfg.num_samples)
    noise = rng.randint(-64, 64, (cfg.num_samples, size, size, c))
    images = np.clip(patterns[labels] // 2 + 64 + noise, 0, 255).astype(np.uint8)
    return _from_arrays(images, labels, cfg, seed, cfg.num_classes)


def _need_dir(path, what):
    if not os.path.isdir(path):
        raise DataError(f"{what} {path!r} does not exist or is not a directory.")


def imagefolder(cfg, seed):
    """root/train/<class>/* and root/val/<class>/*, decoded by MindSpore; classes from train."""
    root = os.path.expanduser(cfg.root)
    _need_dir(root, "data.root")
    splits = {}
    for split in ("train", "val"):
        _need_dir(os.path.join(root, split), f"data.root must contain {split}/; missing:")
    classes = sorted(e.name for e in os.scandir(os.path.join(root, "train")) if e.is_dir())
    if not classes:
        raise DataError(f"{os.path.join(root, 'train')!r} has no class folders (expected train/<class>/*.png|jpg).")
    index = {c: i for i, c in enumerate(classes)}
    for split in ("train", "val"):
        d = ds.ImageFolderDataset(os.path.join(root, split), shuffle=False, decode=True, class_indexing=index)
        splits[split] = d.map(T.TypeCast(mstype.int32), "label")
    # Decode always yields RGB, grayscale files included.
    return Source(
        splits["train"],
        splits["val"],
        len(classes),
        splits["train"].get_dataset_size(),
        splits["val"].get_dataset_size(),
        3,
    )


def cifar10(cfg, seed):
    """CIFAR-10 binary files in data.root, read by MindSpore's Cifar10Dataset."""
    root = os.path.expanduser(cfg.root)
    _need_dir(root, "data.root")
    splits = {}
    for usage in ("train", "test"):
        d = ds.Cifar10Dataset(root, usage=usage, shuffle=False)
        splits[usage] = d.map(T.TypeCast(mstype.int32), "label")
    return Source(
        splits["train"],
        splits["test"],
        10,
        splits["train"].get_dataset_size(),
        splits["test"].get_dataset_size(),
        3,
    )


SOURCES = {"digits": digits, "synthetic": synthetic, "imagefolder": imagefolder, "cifar10": cifar10}
