"""MindSpore input pipelines built from the data and padding settings (datasets/settings.py)."""

import logging
from dataclasses import dataclass
from typing import Optional

import mindspore.dataset as ds
import mindspore.dataset.vision as V
import numpy as np

from runner.datasets import augment as A
from runner.datasets import padding as P
from runner.datasets.errors import DataConfigError, DataError
from runner.datasets.settings import check_padding
from runner.datasets.sources import SOURCES

log = logging.getLogger(__name__)


@dataclass
class Data:
    train: ds.Dataset
    val: ds.Dataset
    num_classes: int
    channels: int
    height: int  # a representative input size (the median training sample's, as the network sees it)
    width: int
    train_size: int
    val_size: int
    steps_per_epoch: int
    padding: dict  # datasets.padding.report: shapes, padded pixels, dropped samples
    skipped_samples: list  # files that could not be decoded, left out under data.on_bad_sample=skip
    class_names: Optional[list] = None  # per label: an image folder's class folders, CIFAR-10's names
    augment: Optional[dict] = None  # datasets.augment.describe: what training applies


def _sample_ops(cfg, padding, channels_on_disk, sizes, augment_ops=(), resize=True):
    """HWC uint8 -> CHW float in [0, 1], shaped per sample as the padding option says, then augmented.

    resize=False: the augmentation's random-resized crop shapes the samples instead.
    """
    ops = []
    if cfg.channels == 1 and channels_on_disk == 3:
        ops.append(V.ConvertColor(V.ConvertMode.COLOR_RGB2GRAY))
    elif cfg.channels == 3 and channels_on_disk == 1:
        ops.append(V.ConvertColor(V.ConvertMode.COLOR_GRAY2RGB))
    # ToTensor makes CHW, also from the 2-D arrays grayscale conversion leaves.
    # Augmentation after the resize: crops and affines work at the size the network sees.
    return ops + (P.sample_ops(padding, sizes) if resize else []) + list(augment_ops) + [V.ToTensor()]


def _batch_ops(cfg):
    """Ops on whole batches, after any padding, so padded pixels hold `fill` in every channel."""
    ops = [V.Normalize(list(cfg.mean), list(cfg.std), is_hwc=False)]
    if cfg.input_scale != 1.0:  # data.input_scale: a reproducible FP16 overflow for AMP tests, off by default
        ops.append(V.Rescale(cfg.input_scale, 0.0))
    return ops


def _pipeline(d, cfg, padding, channels_on_disk: int, sizes, batch_size: int, train: bool, augment=None):
    """Samples of (HWC uint8 image, label) -> normalized CHW float batches, shaped as `padding` says.

    augment: (per-image ops, per-tensor ops, label ops, batch ops, replaces the resize) of
    datasets/augment.py, or None.
    """
    workers = cfg.num_parallel_workers
    image_ops, tensor_ops, label_ops, mix_ops, own_resize = augment or ([], [], [], [], False)
    sample = _sample_ops(cfg, padding, channels_on_disk, sizes, image_ops, resize=not own_resize)
    d = d.map(sample, "image", num_parallel_workers=workers)
    if tensor_ops:  # one worker: their own generator must see the images in pipeline order
        d = d.map(tensor_ops, "image", num_parallel_workers=1)
    if mix_ops:
        # One-hot per sample, before batching: MindSpore's OneHot turns a batch of one label, shape (1,),
        # into shape (depth,), which MixUpBatch/CutMixBatch then refuse (a lone image of its size under
        # padding=none); per sample, batching stacks rows into (batch, depth) for every batch size.
        d = d.map(label_ops, "label")
    d = P.batch(d, padding, batch_size, cfg.channels, sizes, train)
    d = d.map(_batch_ops(cfg), "image", num_parallel_workers=workers)
    if mix_ops:
        d = d.map(mix_ops, ["image", "label"])
    return d


def _check_padding_for(padding, shard) -> None:
    check_padding(padding)
    if shard is not None and padding.name != "fixed":
        # Each rank would form its own buckets from its own samples, so ranks could run different
        # numbers of steps and wait for each other forever at the gradient all-reduce.
        raise DataConfigError(
            f"padding={padding.name} cannot be used with data parallel training: ranks would run "
            "different numbers of steps. Use padding=fixed."
        )


def _train_augment(augment, aug_args, depth: int, classes: int, seed: int):
    """The training pipeline's augmentation stages (None without `augment`): per sample, per tensor, the
    one-hot labels and the batch mixing, and whether they replace the resize."""
    if augment is None:
        return None
    if A.soft_labels(augment) and depth < classes:
        raise DataConfigError(
            f"The data has {classes} classes but the network {depth} outputs: one-hot labels for "
            "mixup/cutmix cannot hold them. Raise model.num_classes or leave it null."
        )
    mix = A.batch_ops(augment)
    return (
        A.sample_ops(augment, *aug_args),
        A.tensor_ops(augment, seed),
        A.one_hot(depth) if mix else [],
        mix,
        A.replaces_resize(augment),
    )


def build_data(cfg, padding, batch_size: int, seed: int, shard=None, augment=None, label_depth=None) -> Data:
    """Train/val pipelines from the `data` and `padding` groups, shuffled with the run's seed.

    shard=(num_shards, shard_id): this data-parallel rank's share of the training set.
    augment: the `augment` settings (datasets.settings.AugmentConfig), applied to training only.
    label_depth: the width of one-hot labels when batches are mixed (the network's outputs);
    None: the data's class count.
    """
    _check_padding_for(padding, shard)
    ds.config.set_seed(seed)
    src = SOURCES[cfg.name](cfg, seed)
    if shard is not None:
        src.train.use_sampler(ds.DistributedSampler(shard[0], shard[1], shuffle=False))
    if src.skipped:
        log.warning(
            "data.on_bad_sample=skip: %d unreadable image(s) left out, e.g. %s", len(src.skipped), src.skipped[0]
        )
    fixed_size = (padding.height, padding.width) if padding.name == "fixed" else (None, None)
    aug_args = (cfg.channels, *fixed_size, cfg.mirrorable)
    train_aug = _train_augment(augment, aug_args, label_depth or src.num_classes, src.num_classes, seed)

    def pipeline(d, sizes, train):
        aug = train_aug if train else None
        return _pipeline(d, cfg, padding, src.channels_on_disk, sizes, batch_size, train, aug)

    # Shuffle uses the seed set above, so a re-run sees the same batches in the same order.
    train = pipeline(src.train.shuffle(buffer_size=max(2, src.train_size)), src.train_sizes, True)
    val = pipeline(src.val, src.val_sizes, False)
    # fixed: MindSpore counts its batches cheaply (and knows the shard); bucket, none: counted from
    # the stored sizes, which saves a pass that decodes every image.
    fixed = padding.name == "fixed"
    steps = train.get_dataset_size() if fixed else P.steps_per_epoch(padding, src.train_sizes, batch_size)
    if steps < 1:
        sizes = P.report(padding, src.train_sizes, batch_size)["input_sizes"]
        raise DataError(
            f"The training set ({src.train_size} samples, {sizes} as padding={padding.name} shapes them) "
            f"does not fill one batch of {batch_size}: lower batch_size, add data, or use fewer/larger buckets."
        )
    height, width = P.representative_size(padding, src.train_sizes)
    return Data(
        train,
        val,
        src.num_classes,
        cfg.channels,
        height,
        width,
        src.train_size,
        src.val_size,
        steps,
        P.report(padding, src.train_sizes, batch_size),
        src.skipped,
        src.class_names,
        A.describe(augment, *aug_args) if augment is not None else None,
    )


class _Files:
    """Random-access source of (encoded file bytes, index) for GeneratorDataset."""

    def __init__(self, paths):
        self.paths = list(paths)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return np.fromfile(self.paths[i], dtype=np.uint8), np.int32(i)


def build_inputs(cfg, padding, paths, sizes, batch_size: int) -> ds.Dataset:
    """Batches of (image, index into paths) from image files, preprocessed as build_data's validation set.

    The files are decoded by MindSpore's Decode (as data=imagefolder decodes them: always 3 channels,
    converted to data.channels) and go through the same per-sample, padding and normalization ops.
    sizes: each file's (height, width), which bucket and none padding group by.
    """
    d = ds.GeneratorDataset(_Files(paths), ["image", "label"], shuffle=False, python_multiprocessing=False)
    d = d.map(V.Decode(), "image")
    return _pipeline(d, cfg, padding, 3, np.asarray(sizes, dtype=np.int64).reshape(-1, 2), batch_size, False)
