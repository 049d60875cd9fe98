"""Training-only augmentation from MindSpore's own `dataset.vision` ops: per image and per batch.

Everything here keeps shapes: per-image ops return the size they were given and batch mixing keeps
the batch, so a static graph still compiles once. Every random op draws from MindSpore's seeded
generators (`ds.config.set_seed`, set by `build_data`) or from a generator seeded here, so the
augmentation stream is a function of the seed and replays identically when a resumed run replays
its pipeline. The settings are read by attribute (the runner's `augment` node, or any object with
the same fields; datasets/settings.py types it), so this module does not depend on the runner.
"""

import math

import mindspore.dataset.transforms as T
import mindspore.dataset.vision as V
import numpy as np

POLICIES = ("randaugment", "autoaugment", "trivialaugment")


def flip_enabled(settings, mirrorable: bool) -> bool:
    """Whether training images are mirrored: `hflip` as set, or, when null, on for data that may be mirrored."""
    if settings.hflip is not None:
        return bool(settings.hflip)
    return mirrorable and str(settings.name) != "none"


def _policy_op(settings):
    name = str(settings.name)
    if name == "randaugment":
        return V.RandAugment(
            num_ops=settings.randaugment_num_ops,
            magnitude=settings.randaugment_magnitude,
            num_magnitude_bins=settings.num_magnitude_bins,
        )
    if name == "autoaugment":
        return V.AutoAugment(policy=getattr(V.AutoAugmentPolicy, str(settings.autoaugment_policy).upper()))
    if name == "trivialaugment":
        return V.TrivialAugmentWide(num_magnitude_bins=settings.num_magnitude_bins)
    return None


def replaces_resize(settings) -> bool:
    """Whether training's first op is a random-resized crop, which takes the decoded image of any
    size itself, so the padding's resize must not run before it."""
    return bool(settings.resized_crop)


def _gray_safe(op, channels: int) -> list:
    """op, run through RGB for gray images: MindSpore's policies and colour adjustment accept only
    3-channel HWC uint8 images (docs/mindspore-notes.md#policy-rgb-only). Gray -> RGB copies the value
    into three equal channels, every such op keeps them equal (there is no hue or saturation to
    change), and RGB -> gray returns that value: the gray image the op would have produced."""
    if channels != 1:
        return [op]
    return [V.ConvertColor(V.ConvertMode.COLOR_GRAY2RGB), op, V.ConvertColor(V.ConvertMode.COLOR_RGB2GRAY)]


def sample_ops(settings, channels: int, height: int, width: int, mirrorable: bool) -> list:
    """Per-image ops on HWC uint8 images, to run before ToTensor: after the padding's resize to
    height x width, or, with resized_crop (replaces_resize), on the decoded image itself.

    height/width: the size every image has at the end (random crops return to it); None when
    sizes vary, which only the size-keeping ops allow.
    """
    ops = []
    if settings.resized_crop:
        if height is None:
            raise ValueError("a random-resized crop needs one input size for every image (padding=fixed)")
        scale, ratio = tuple(settings.crop_scale), tuple(settings.crop_ratio)
        ops.append(V.RandomResizedCrop((height, width), scale=scale, ratio=ratio))
    if settings.crop_padding > 0:
        if height is None:
            raise ValueError("a random crop needs one input size for every image (padding=fixed)")
        ops.append(V.RandomCrop((height, width), padding=settings.crop_padding))
    if flip_enabled(settings, mirrorable):
        ops.append(V.RandomHorizontalFlip())
    if settings.affine_degrees or settings.affine_translate or settings.affine_scale:
        t, s = settings.affine_translate, settings.affine_scale
        ops.append(
            V.RandomAffine(
                degrees=settings.affine_degrees,
                translate=(-t, t, -t, t) if t else None,
                scale=(1 - s, 1 + s) if s else None,
            )
        )
    if settings.color_jitter or settings.color_jitter_hue:
        j = float(settings.color_jitter)
        ops += _gray_safe(V.RandomColorAdjust(j, j, j, float(settings.color_jitter_hue)), channels)
    policy = _policy_op(settings)
    if policy is not None:
        ops += _gray_safe(policy, channels)
    return ops


class RandomErasing:
    """Set a random rectangle of a CHW float image to 0 with probability `prob` (Zhong et al. 2020).

    MindSpore's vision.RandomErasing draws from Python's process-wide `random` module, which the
    pipeline's worker threads share in no fixed order, so its rectangles would not follow from the
    run's seed (docs/mindspore-notes.md#seeded-random-ops). This one owns a generator seeded from
    the run's seed and runs in a single-worker map, so the n-th image always gets the n-th draw (and
    a resumed run, replaying its pipeline, the same).
    The rectangle is drawn as MindSpore's does: area 2%..33% of the image, aspect 0.3..3.3.
    """

    def __init__(self, prob: float, seed: int, scale=(0.02, 1 / 3), ratio=(0.3, 3.3), attempts: int = 10):
        self.prob, self.scale, self.attempts = prob, scale, attempts
        self.log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
        self.rng = np.random.default_rng(seed)

    def __call__(self, image):
        if self.rng.random() >= self.prob:
            return image
        _, h, w = image.shape
        for _ in range(self.attempts):
            area = self.rng.uniform(*self.scale) * h * w
            aspect = math.exp(self.rng.uniform(*self.log_ratio))
            eh, ew = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
            if 0 < eh < h and 0 < ew < w:
                top, left = int(self.rng.integers(0, h - eh + 1)), int(self.rng.integers(0, w - ew + 1))
                out = image.copy()
                out[:, top : top + eh, left : left + ew] = 0
                return out
        return image


def tensor_ops(settings, seed: int) -> list:
    """Per-image ops on CHW float images in [0, 1], after ToTensor; run them with one worker (see RandomErasing)."""
    return [RandomErasing(settings.erasing_prob, seed)] if settings.erasing_prob > 0 else []


def soft_labels(settings) -> bool:
    """True when batches are mixed, so that labels become class probabilities."""
    return settings.mixup.alpha > 0 or settings.cutmix.alpha > 0


def batch_ops(settings) -> list:
    """Ops on whole NCHW batches and their labels: one-hot labels, then MixUp and/or CutMix.

    MindSpore's MixUpBatch and CutMixBatch need one-hot labels, so labels leave as float32 class
    probabilities (a soft-label loss reads them; docs/mindspore-notes.md#mix-batch-one-hot). With
    both on, each batch gets one of the two.
    """
    mixers = []
    if settings.mixup.alpha > 0:
        mixers.append(T.RandomApply([V.MixUpBatch(settings.mixup.alpha)], settings.mixup.prob))
    if settings.cutmix.alpha > 0:
        cut = V.CutMixBatch(V.ImageBatchFormat.NCHW, settings.cutmix.alpha, 1.0)  # every image of a chosen batch
        mixers.append(T.RandomApply([cut], settings.cutmix.prob))
    if not mixers:
        return []
    return [T.RandomChoice(mixers) if len(mixers) > 1 else mixers[0]]


def one_hot(num_classes: int) -> list:
    """Label ops turning class indices into float32 one-hot rows (what the batch mixers need)."""
    return [T.OneHot(num_classes), T.TypeCast(np.float32)]


def describe(settings, channels: int, height: int, width: int, mirrorable: bool) -> dict:
    """What training applies, by MindSpore op name, for metrics.json."""
    names = [type(op).__name__ for op in sample_ops(settings, channels, height, width, mirrorable)]
    names += [type(op).__name__ for op in tensor_ops(settings, 0)]
    mix = []
    if settings.mixup.alpha > 0:
        mix.append({"op": "MixUpBatch", "alpha": settings.mixup.alpha, "prob": settings.mixup.prob})
    if settings.cutmix.alpha > 0:
        mix.append({"op": "CutMixBatch", "alpha": settings.cutmix.alpha, "prob": settings.cutmix.prob})
    return {
        "name": str(settings.name),
        "image_ops": [n for n in names if n != "ConvertColor"],
        "hflip": flip_enabled(settings, mirrorable),
        "batch_ops": mix,
        "soft_labels": soft_labels(settings),
    }
