"""Fixed-shape MindSpore input pipelines; the public surface is build_data."""

from dataclasses import dataclass

import mindspore.dataset as ds
import mindspore.dataset.vision as V

from datasets.sources import SOURCES, DataError

__all__ = ["build_data", "Data", "DataError"]


@dataclass
class Data:
    train: ds.Dataset
    val: ds.Dataset
    num_classes: int
    channels: int
    height: int
    width: int
    train_size: int
    val_size: int
    steps_per_epoch: int


def _shape_ops(padding):
    """Ops that bring every sample to padding.height x padding.width (read from the `padding` group)."""
    size = (padding.height, padding.width)
    if padding.method.name == "resize":
        return [V.Resize(size)]
    return [V.PadToSize(size, fill_value=padding.fill)]


def _image_ops(cfg, padding, channels_on_disk):
    ops = []
    if cfg.channels == 1 and channels_on_disk == 3:
        ops.append(V.ConvertColor(V.ConvertMode.COLOR_RGB2GRAY))
    elif cfg.channels == 3 and channels_on_disk == 1:
        ops.append(V.ConvertColor(V.ConvertMode.COLOR_GRAY2RGB))
    # ToTensor scales to [0, 1] and makes CHW, also from the 2-D arrays grayscale conversion leaves.
    ops += _shape_ops(padding) + [V.ToTensor(), V.Normalize(list(cfg.mean), list(cfg.std), is_hwc=False)]
    if cfg.input_scale != 1.0:  # data.input_scale: a reproducible FP16 overflow (issue 3), off by default
        ops.append(V.Rescale(cfg.input_scale, 0.0))
    return ops


def build_data(cfg, padding, batch_size: int, seed: int, shard=None) -> Data:
    """Train/val pipelines from the `data` and `padding` groups, shuffled with the run's seed.

    shard=(num_shards, shard_id): this data-parallel rank's share of the training set.
    """
    ds.config.set_seed(seed)
    src = SOURCES[cfg.name.name](cfg, seed)
    if src.train_size < batch_size:
        raise DataError(
            f"The training set has {src.train_size} samples, fewer than one batch of {batch_size}: "
            "lower batch_size or add data."
        )
    if shard is not None:
        src.train.use_sampler(ds.DistributedSampler(shard[0], shard[1], shuffle=False))
    ops = _image_ops(cfg, padding, src.channels_on_disk)
    workers = cfg.num_parallel_workers
    # Shuffle uses the seed set above, so a re-run sees the same batches in the same order.
    train = src.train.shuffle(buffer_size=src.train_size).map(ops, "image", num_parallel_workers=workers)
    # drop_remainder keeps every training batch the same shape: one graph compile, not two.
    train = train.batch(batch_size, drop_remainder=True)
    val = src.val.map(ops, "image", num_parallel_workers=workers).batch(batch_size, drop_remainder=False)
    return Data(
        train,
        val,
        src.num_classes,
        cfg.channels,
        padding.height,
        padding.width,
        src.train_size,
        src.val_size,
        train.get_dataset_size(),
    )
