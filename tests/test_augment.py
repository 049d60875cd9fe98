"""The `augment` group, label smoothing and soft labels, and the top-5/per-class evaluation metrics."""

import json
import math

import numpy as np
import pytest
from conftest import TINY, compose_cfg, metrics, run_cli, run_in_process
from omegaconf import OmegaConf

from runner.config.checks import validate
from runner.errors import ConfigError

POLICIES = ["none", "basic", "imagenet", "randaugment", "autoaugment", "trivialaugment"]
# Every random draw of the pipeline at once: image policy, crop, erasing, and batch mixing.
ALL_RANDOM = [
    "augment=randaugment",
    "augment.erasing_prob=0.5",
    "augment.mixup.alpha=0.4",
    "augment.cutmix.alpha=1.0",
    "augment.cutmix.prob=0.5",
    "loss.label_smoothing=0.1",
]


def _settings(**changes):
    """The `augment` node of a composed config, with changes (as the runner hands it to datasets/)."""
    cfg = compose_cfg(f"augment={changes.pop('name', 'none')}")
    for key, value in changes.items():
        OmegaConf.update(cfg, f"augment.{key}", value)
    return cfg.augment


@pytest.mark.slow
def test_every_option_trains_with_one_compile(tmp_path):
    # One process for the five jobs (basic launcher): this checks shapes and numbers, not timings.
    run_cli(tmp_path, f"augment={','.join(POLICIES)}", "hydra/launcher=basic", *TINY, multirun=True)
    seen = {}
    for job in sorted(p for p in tmp_path.iterdir() if p.is_dir() and p.name.isdigit()):
        m = metrics(job)
        seen[m["augment"]["name"]] = m["augment"]["image_ops"]
        assert m["compile_count"] == 1 and m["distinct_input_shapes"] == 1
        # One process for all jobs: the compile cache is off for each (a job after one that loaded cached graphs
        # compiled its train step twice: runner/training/compile_cache.py _jobs_share_this_process).
        assert m["compile_cache"]["state"] == "off" and "hydra/launcher=basic" in m["compile_cache"]["reason"]
        assert math.isfinite(m["final_loss"]) and m["final_loss"] < m["loss_curve"][0]
        assert m["augment"]["hflip"] is False  # digits are declared not mirrorable
        # Evaluation reads hard labels: top-5 (10 classes) and per-class accuracy agree with accuracy.
        per_class = m["val_per_class_accuracy"]
        assert len(per_class) == 10 and m["val_accuracy"] <= m["val_top5_accuracy"] <= 1
        assert min(per_class) <= m["val_accuracy"] <= max(per_class)
    assert seen == {
        "none": [],
        "basic": ["RandomCrop", "RandomAffine"],
        "imagenet": ["RandomResizedCrop", "RandomColorAdjust"],
        "randaugment": ["RandomCrop", "RandAugment"],
        "autoaugment": ["RandomCrop", "AutoAugment"],
        "trivialaugment": ["RandomCrop", "TrivialAugmentWide"],
    }


@pytest.mark.slow
def test_mixup_cutmix_erasing_and_label_smoothing_train(tmp_path):
    run_in_process(tmp_path, *TINY, *ALL_RANDOM)
    m = metrics(tmp_path)
    assert m["compile_count"] == 1 and m["augment"]["soft_labels"] is True
    assert [b["op"] for b in m["augment"]["batch_ops"]] == ["MixUpBatch", "CutMixBatch"]
    assert m["augment"]["image_ops"] == ["RandomCrop", "RandAugment", "RandomErasing"]
    assert m["label_smoothing"] == 0.1 and math.isfinite(m["final_loss"])
    assert m["val_accuracy"] > 0.2  # evaluated on hard labels: chance is 0.1
    # The per-class accuracies, weighted by the validation set's class counts, give the accuracy.
    from sklearn.datasets import load_digits

    labels = load_digits().target
    order = np.random.RandomState(0).permutation(len(labels))  # the runner's split with seed 0
    counts = np.bincount(labels[order[: m["val_samples"]]], minlength=10)
    assert np.dot(counts, m["val_per_class_accuracy"]) / counts.sum() == pytest.approx(m["val_accuracy"])


@pytest.mark.slow
def test_mirrorable_rgb_folder_flips_and_has_no_top5(tmp_path):
    from imagegen import digit_folder

    digit_folder(tmp_path / "data", [(12, 12)], per_class=8, classes=4, val_per_class=3)
    run_in_process(
        tmp_path / "run",
        *TINY,
        "data=imagefolder",
        f"data.root={tmp_path / 'data'}",
        "batch_size=8",
        "augment=trivialaugment",
    )
    m = metrics(tmp_path / "run")
    assert m["augment"]["hflip"] is True  # imagefolder data is mirrorable unless declared otherwise
    assert m["augment"]["image_ops"] == ["RandomCrop", "RandomHorizontalFlip", "TrivialAugmentWide"]
    assert m["compile_count"] == 1
    assert m["val_top5_accuracy"] is None and len(m["val_per_class_accuracy"]) == 4  # 4 classes: no top-5


@pytest.mark.slow
def test_label_smoothing_changes_the_training_loss_only(tmp_path):
    run_cli(tmp_path, "loss.label_smoothing=0,0.3", "hydra/launcher=basic", *TINY, multirun=True)
    plain, smooth = metrics(tmp_path / "0"), metrics(tmp_path / "1")
    assert (plain["label_smoothing"], smooth["label_smoothing"]) == (0.0, 0.3)
    # Same seed, weights and first batch: only the targets differ. A smoothed target keeps the loss
    # away from 0 (its floor is the targets' entropy, 1.18 nats for 0.3 over 10 classes).
    assert smooth["loss_curve"][0] != plain["loss_curve"][0]
    assert smooth["final_loss"] > 1.17 > plain["final_loss"]
    # Evaluation reads plain cross entropy on hard labels either way.
    assert smooth["val_accuracy"] > 0.5 and plain["val_accuracy"] > 0.5


@pytest.mark.slow
def test_augmented_runs_repeat_from_the_seed_and_resume_exactly(tmp_path):
    args = ["epochs=2", *[o for o in TINY if not o.startswith("epochs=")], *ALL_RANDOM]
    a, b, other, resumed = (tmp_path / n for n in ("a", "b", "other", "resumed"))
    run_cli(a, *args)
    run_cli(b, *args)
    run_cli(other, *args, "seed=1")
    assert metrics(a)["loss_curve"] == metrics(b)["loss_curve"]
    assert metrics(a)["loss_curve"] != metrics(other)["loss_curve"]
    # Epoch 1's checkpoint, resumed to 2 epochs in a new process: the pipeline is replayed from the
    # start, so epoch 2 gets the same crops, policies, erasures and mixes as the uninterrupted run.
    state = json.loads((a / "checkpoints" / "latest.json").read_text())
    first = state["kept"][0]
    run_cli(resumed, *args, f"resume={a}/checkpoints/{first}")
    steps = int(first.split("_")[1].split(".")[0])
    # The resumed run's curve starts with the checkpoint's record of the first epoch; the steps it ran
    # itself must be the uninterrupted run's, to the bit.
    assert metrics(resumed)["loss_curve"][steps:] == metrics(a)["loss_curve"][steps:]
    assert metrics(resumed)["final_loss"] == metrics(a)["final_loss"]
    assert metrics(resumed)["val_accuracy"] == metrics(a)["val_accuracy"]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["augment.hflip=true"], "data=digits is declared not mirrorable"),
        (["data=synthetic", "augment=basic", "augment.hflip=true"], "data=synthetic is declared not mirrorable"),
        (["augment=basic", "padding=bucket"], "needs padding=fixed"),
        (["augment.mixup.prob=0.5"], "augment.mixup.prob=0.5 does nothing"),
        (["augment.cutmix.alpha=-1"], "augment.cutmix.alpha must be in"),
        (["augment.mixup.alpha=1", "augment.mixup.prob=1.5"], "augment.mixup.prob must be in"),
        (["loss.label_smoothing=1.0"], "loss.label_smoothing must be in [0, 1)"),
        (["augment.erasing_prob=2"], "augment.erasing_prob must be in"),
        (["augment=randaugment", "augment.randaugment_magnitude=31"], "augment.randaugment_magnitude"),
        (["augment=basic", "augment.randaugment_num_ops=3"], "augment=basic does not use augment.randaugment_num_ops"),
        (["augment=randaugment", "augment.autoaugment_policy=svhn"], "does not use augment.autoaugment_policy"),
        (["augment=imagenet", "augment.crop_padding=2"], "are two random crops of one image"),
        (["augment=basic", "augment.crop_scale=[0.5,1]"], "does nothing without augment.resized_crop=true"),
        (["augment=imagenet", "augment.crop_scale=[0.5,1.5]"], "augment.crop_scale is [min, max] area shares"),
        (["augment=imagenet", "augment.crop_ratio=[2,1]"], "augment.crop_ratio is [min, max] aspect ratios"),
        (["augment=imagenet", "padding=bucket"], "augment.resized_crop=true resizes every crop to one input size"),
        (["augment.color_jitter=1.5"], "augment.color_jitter must be in [0, 1]"),
        (["augment.color_jitter_hue=0.1"], "does nothing to gray images (data.channels=1)"),
    ],
)
@pytest.mark.slow
def test_conflicts_and_bad_values_are_refused(overrides, message):
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(*overrides))
    assert message in str(err.value)


def test_refusal_is_one_paragraph_on_the_cli(tmp_path):
    proc = run_in_process(tmp_path, *TINY, "augment=basic", "augment.hflip=true", check=False)
    text = " ".join(proc.stderr.split())  # the CLI wraps its paragraph
    assert proc.returncode == 2 and "data=digits is declared not mirrorable" in text and "Traceback" not in text


def test_mixed_labels_need_room_for_every_class():
    from runner.datasets import DataError, build_data

    cfg = compose_cfg("augment.mixup.alpha=1.0", "padding.height=8", "padding.width=8")
    with pytest.raises(DataError, match="10 classes but the network 8 outputs"):
        build_data(cfg.data, cfg.padding, 32, 0, augment=cfg.augment, label_depth=8)


@pytest.mark.parametrize("mix", ["augment.mixup.alpha=0.2", "augment.cutmix.alpha=1.0"])
def test_a_batch_of_one_image_is_mixed_too(tmp_path, mix):
    """padding=none batches images by size: a size held by one image makes a batch of one, whose one-hot
    label MindSpore's OneHot used to flatten to (depth,), which MixUpBatch refused mid-training."""
    from PIL import Image

    from runner.datasets import build_data

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in ("a", "b"):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(4):
                Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(tmp_path / split / c / f"{i}.png")
    Image.fromarray(rng.integers(0, 255, (12, 12), dtype=np.uint8)).save(tmp_path / "train" / "a" / "alone.png")
    cfg = compose_cfg(*TINY, "data=imagefolder", f"data.root={tmp_path}", "data.channels=1", "data.mean=[0.5]",
                      "data.std=[0.5]", "padding=none", mix)  # fmt: skip
    data = build_data(cfg.data, cfg.padding, 4, 0, augment=cfg.augment)
    shapes = sorted((x.shape, y.shape) for x, y in data.train.create_tuple_iterator(output_numpy=True))
    assert shapes == [((1, 1, 12, 12), (1, 2)), ((4, 1, 8, 8), (4, 2)), ((4, 1, 8, 8), (4, 2))]


def test_training_batches_carry_mixed_labels_and_validation_hard_ones():
    from runner.datasets import build_data

    cfg = compose_cfg("augment.mixup.alpha=1.0", "padding.height=8", "padding.width=8")
    data = build_data(cfg.data, cfg.padding, 32, 0, augment=cfg.augment)
    x, y = next(data.train.create_tuple_iterator(num_epochs=1, output_numpy=True))
    assert x.shape == (32, 1, 8, 8) and y.shape == (32, 10) and y.dtype == np.float32
    assert np.allclose(y.sum(axis=1), 1) and ((y > 0) & (y < 1)).any()  # mixed: no longer one-hot
    _, yv = next(data.val.create_tuple_iterator(num_epochs=1, output_numpy=True))
    assert yv.shape == (32,) and yv.dtype == np.int32


def _through_pipeline(image, ops, n):
    """n copies of image through a seeded MindSpore map (eager calls with a seed set repeat one draw)."""
    import mindspore.dataset as ds

    ds.config.set_seed(0)
    d = ds.NumpySlicesDataset({"image": np.stack([image] * n)}, shuffle=False).map(ops, "image")
    return [row[0] for row in d.create_tuple_iterator(num_epochs=1, output_numpy=True)]


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize(
    "changes",
    [
        {"crop_padding": 2},
        {"hflip": True},
        {"affine_degrees": 20},
        {"affine_translate": 0.2},
        {"affine_scale": 0.3},
        {"name": "randaugment"},
        {"name": "autoaugment", "autoaugment_policy": "svhn"},
        {"name": "trivialaugment"},
        {"resized_crop": True},
        {"color_jitter": 0.4},
    ],
)
@pytest.mark.slow
def test_each_image_op_changes_images_and_keeps_their_shape(channels, changes):
    from runner.datasets.augment import sample_ops

    ops = sample_ops(_settings(**changes), channels, 16, 16, mirrorable=True)
    image = np.random.RandomState(0).randint(0, 256, (16, 16, channels)).astype(np.uint8)
    outputs = _through_pipeline(image, ops, 8)
    # A gray image leaves the RGB-only policies as (H, W), which ToTensor reads as one channel.
    assert all(o.shape[:2] == (16, 16) and o.size == image.size and o.dtype == np.uint8 for o in outputs)
    changed = [not np.array_equal(o.reshape(image.shape), image) for o in outputs]
    assert any(changed) and len({o.tobytes() for o in outputs}) > 1  # random: not one fixed transform


def test_hue_jitter_changes_colour_images():
    from runner.datasets.augment import sample_ops

    ops = sample_ops(_settings(color_jitter_hue=0.3), 3, 16, 16, mirrorable=False)
    assert [type(op).__name__ for op in ops] == ["RandomColorAdjust"]
    image = np.random.RandomState(0).randint(0, 256, (16, 16, 3)).astype(np.uint8)
    outputs = _through_pipeline(image, ops, 8)
    assert len({o.tobytes() for o in outputs}) > 1 and not all(np.array_equal(o, image) for o in outputs)


def _first_batches(seed, *overrides):
    from runner.datasets import build_data

    cfg = compose_cfg("data=synthetic", "data.num_samples=64", "data.image_size=16", *overrides)
    validate(cfg)
    data = build_data(cfg.data, cfg.padding, 16, seed, augment=cfg.augment)
    first = lambda d: next(d.create_tuple_iterator(num_epochs=1, output_numpy=True))[0]  # noqa: E731
    return first(data.train), first(data.val), data


def test_resized_crop_takes_the_decoded_image_and_follows_the_seed():
    # padding.method=pad puts a border of fill (-1 once normalised) around each 16 px image in 24 px.
    # The random-resized crop replaces that in training: a crop of the whole image (scale 1, ratio 1)
    # fills the 24 px with image pixels, while validation keeps the padded border.
    whole = ["augment=imagenet", "augment.crop_scale=[1,1]", "augment.crop_ratio=[1,1]", "augment.color_jitter=0"]
    pad = ["padding.height=24", "padding.width=24", "padding.method=pad"]
    train, val, data = _first_batches(0, *whole, *pad)
    assert train.shape == (16, 3, 24, 24) and val.shape[1:] == (3, 24, 24)
    assert np.all(val[:, :, :4, :] == -1) and not np.any(np.all(train[:, :, :4, :] == -1, axis=(1, 2, 3)))
    assert data.augment["image_ops"] == ["RandomResizedCrop"]
    # The default crop (8%..100% of the area) and the jitter draw from the run's seed: the same seed
    # gives the same batch, another seed another.
    a, _, _ = _first_batches(0, "augment=imagenet", "augment.color_jitter_hue=0.1")
    b, _, _ = _first_batches(0, "augment=imagenet", "augment.color_jitter_hue=0.1")
    c, _, _ = _first_batches(1, "augment=imagenet", "augment.color_jitter_hue=0.1")
    plain, _, _ = _first_batches(0)
    assert np.array_equal(a, b) and a.shape == c.shape == plain.shape == (16, 3, 16, 16)
    assert not np.array_equal(a, c) and not np.array_equal(a, plain)


@pytest.mark.parametrize("name", ["randaugment", "autoaugment", "trivialaugment"])
def test_gray_images_round_trip_through_the_rgb_only_policies(name):
    import mindspore.dataset.vision as V

    from runner.datasets.augment import _policy_op

    policy = _policy_op(_settings(name=name))
    image = np.random.RandomState(1).randint(0, 256, (16, 16, 1)).astype(np.uint8)
    with pytest.raises(RuntimeError):
        policy(image)  # why the gray -> RGB -> gray detour exists
    to_rgb, to_gray = V.ConvertColor(V.ConvertMode.COLOR_GRAY2RGB), V.ConvertColor(V.ConvertMode.COLOR_RGB2GRAY)
    outputs = _through_pipeline(image, [to_rgb, policy], 100)
    assert len({o.tobytes() for o in outputs}) > 10
    for rgb in outputs:
        assert np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 1], rgb[..., 2])
        assert np.array_equal(to_gray(rgb), rgb[..., 0])  # the round trip loses nothing


def test_random_erasing_follows_its_seed():
    from runner.datasets.augment import RandomErasing

    image = np.ones((1, 16, 16), np.float32)
    first, second = RandomErasing(0.5, seed=3), RandomErasing(0.5, seed=3)
    a = [first(image) for _ in range(20)]
    b = [second(image) for _ in range(20)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    erased = [x for x in a if not np.array_equal(x, image)]
    assert 0 < len(erased) < 20  # prob 0.5
    for x in erased:  # one rectangle of zeros, between 2% and 33% of the image
        rows, cols = np.nonzero(x[0] == 0)
        box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
        assert box == len(rows) and 0.02 * 256 * 0.5 <= len(rows) <= 256 / 3 * 1.5
    assert np.array_equal(RandomErasing(0.0, seed=3)(image), image)


@pytest.mark.slow
def test_label_smoothing_and_soft_labels_keep_the_loss_finite_and_exact():
    import mindspore as ms

    from runner.amp import loss_fn

    logits = np.array([[1e3, 0.0, -1e3], [0.0, 1.0, 2.0]], np.float32)
    soft = np.array([[0.0, 0.7, 0.3], [0.0, 0.0, 1.0]], np.float32)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    for eps in (0.0, 0.1):
        for target in (np.eye(3, dtype=np.float32)[[1, 2]], soft):
            smoothed = target * (1 - eps) + eps / 3
            expected = float(-(smoothed * log_p).sum(axis=1).mean())
            got = float(loss_fn(eps)(ms.Tensor(logits), ms.Tensor(target)).asnumpy())
            assert math.isfinite(got) and got == pytest.approx(expected, rel=1e-5)
        hard = float(loss_fn(eps)(ms.Tensor(logits), ms.Tensor(np.array([1, 2], np.int32))).asnumpy())
        assert hard == pytest.approx(float(-(((np.eye(3)[[1, 2]]) * (1 - eps) + eps / 3) * log_p).sum(1).mean()))


def test_scores_count_each_class():
    from runner.report.accuracy import Scores

    metric = Scores(4)
    logits = np.eye(4, dtype=np.float32)[[0, 1, 1, 3, 0]]
    metric.update(logits, np.array([0, 1, 2, 3, 3]))
    result = metric.eval()
    assert result["per_class"] == [1.0, 1.0, 0.0, 0.5] and result["top1"] == 0.6 and result["top5"] is None
    assert result["confusion"][2] == [0, 1, 0, 0]  # the class-2 sample was called class 1
    metric.clear()
    metric.update(logits[:1], np.array([0]))
    assert metric.eval()["per_class"] == [1.0, None, None, None]


def test_scores_agree_with_mindspores_accuracy_and_top5_over_several_batches():
    from mindspore import nn

    from runner.report.accuracy import Scores

    rng = np.random.RandomState(0)
    ours, top1, top5 = Scores(10), nn.Accuracy(), nn.TopKCategoricalAccuracy(5)
    for n in (32, 32, 7):  # a partial last batch, as a validation set has
        logits, labels = rng.randn(n, 10).astype(np.float32), rng.randint(0, 10, n)
        for m in (ours, top1, top5):
            m.update(logits, labels)
    result = ours.eval()
    assert result["top1"] == pytest.approx(top1.eval()) and result["top5"] == pytest.approx(top5.eval())
    assert sum(map(sum, result["confusion"])) == 71
