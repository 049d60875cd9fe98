"""The `padding` group: what shapes the network sees under fixed, bucket and none, and what they cost."""

import re

import numpy as np
import pytest
from conftest import batches, build, compose_cfg, metrics, run_cli
from imagegen import digit_folder, solid_folder

from runner.errors import ConfigError

RAW3 = ["data.mean=[0,0,0]", "data.std=[1,1,1]"]


def one_image(root, h, w, value=255, mode="L"):
    solid_folder(root, [(s, "a", "0.png", mode, h, w, value) for s in ("train", "val")])


@pytest.mark.parametrize(
    "method,columns_of_image",
    [("resize", range(16)), ("crop", range(16)), ("resize_pad", range(4, 12)), ("pad", range(3, 13))],
)
def test_fixed_methods(tmp_path, method, columns_of_image):
    # A white 20x10 (h x w) image into 16x16 with fill 60: where the image ends up says what the method did.
    one_image(tmp_path, 20, 10)
    opts = ["data=imagefolder", f"data.root={tmp_path}", "batch_size=1", f"padding.method={method}", *RAW3]
    (x, _), *_ = batches(build(*opts, "padding.fill=60").train)
    assert x.shape == (1, 3, 16, 16)
    px = np.rint(x[0] * 255)
    image = np.zeros(16, bool)
    image[list(columns_of_image)] = True
    assert (px[:, :, image] == 255).all()
    assert (px[:, :, ~image] == 60).all()  # the fill, in every channel


def test_bucket_pads_each_sample_to_the_smallest_bucket_that_holds_it(tmp_path):
    sizes = [(6, 6), (8, 5), (9, 12), (16, 16), (10, 20), (30, 12)]  # 30x12 exceeds the last bucket
    files = [("train", str(c), f"{i}.png", "RGB", h, w, 0) for c in range(2) for i, (h, w) in enumerate(sizes * 2)]
    solid_folder(tmp_path, files + [("val", "0", "0.png", "L", 4, 4, 0)])
    data = build("data=imagefolder", f"data.root={tmp_path}", "padding=bucket", "padding.buckets=[8,16,24]",
                 "padding.fill=255", "batch_size=2", *RAW3)  # fmt: skip
    seen = []
    for x, _ in batches(data.train):
        side = x.shape[2]
        assert x.shape[3] == side and side in (8, 16, 24)
        for img in x:
            dark = img[0] == 0  # the image is black, the padding white, at the top-left
            h, w = dark.sum(axis=0).max(), dark.sum(axis=1).max()
            assert dark[:h, :w].all() and dark.sum() == h * w
            assert max(h, w) <= side and (side == 8 or max(h, w) > [8, 16, 24][[8, 16, 24].index(side) - 1])
            seen.append((int(h), int(w)))
    assert sorted(seen) == sorted([(6, 6), (8, 5), (9, 12), (16, 16), (10, 20), (24, 10)] * 4)
    assert len(seen) // 2 == data.steps_per_epoch == data.train.get_dataset_size()
    rep = data.padding
    assert rep["input_sizes"] == {"8x8": 8, "16x16": 8, "24x24": 8} and rep["shrunk_samples"] == 4
    assert rep["expected_batch_shapes"] == 3 and rep["dropped_samples_per_epoch"] == 0
    assert (data.height, data.width) == (16, 16)  # the median sample's bucket: what build_model sizes the stem by
    assert rep["padded_pixel_fraction"] == pytest.approx(
        1 - 4 * (36 + 40 + 108 + 256 + 200 + 240) / (8 * (64 + 256 + 576)), abs=1e-4
    )


def test_none_batches_only_same_size_samples_and_drops_nothing(tmp_path):
    sizes = [(6, 6), (8, 5), (9, 12)]
    files = [("train", str(c), f"{i}.png", "L", h, w, 9) for c in range(2) for i, (h, w) in enumerate(sizes * 3)]
    solid_folder(tmp_path, files + [("val", "0", "0.png", "L", 4, 4, 9)])
    data = build("data=imagefolder", f"data.root={tmp_path}", "padding=none", "batch_size=4")
    shapes = [x.shape for x, _ in batches(data.train)]
    assert sorted(shapes) == sorted([(4, 3, h, w) for h, w in sizes] + [(2, 3, h, w) for h, w in sizes])
    assert len(shapes) == data.steps_per_epoch == data.train.get_dataset_size()
    assert data.padding["expected_batch_shapes"] == 6 and data.padding["padded_pixel_fraction"] == 0


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["padding=bucket", "padding.height=8"], "padding=bucket does not use padding.height=8"),
        (["padding=none", "padding.fill=3"], "padding=none does not use padding.fill=3"),
        (["padding=fixed", "padding.buckets=[4]"], "does not use padding.buckets"),
        (["padding=bucket", "padding.buckets=[16,8]"], "strictly increasing"),
        (["padding=fixed", "padding.fill=300"], "0..255"),
    ],
)
def test_padding_mistakes_raise_config_error(overrides, message):
    from runner.config.checks import validate  # before MindSpore: dry_run=true catches these too

    with pytest.raises(ConfigError, match=message):
        validate(compose_cfg(*overrides))


def test_bucket_and_none_refuse_data_parallel_shards():
    from runner.datasets import DataConfigError, build_data

    cfg = compose_cfg("padding=bucket")
    with pytest.raises(DataConfigError, match="data parallel"):
        build_data(cfg.data, cfg.padding, cfg.batch_size, cfg.seed, shard=(2, 0))


@pytest.mark.slow
def test_compile_counts_fixed_bucket_none(tmp_path):
    sizes = [(8, 8), (20, 14)]  # buckets 8 and 24 of the default [8, 16, 24, 32]
    digit_folder(tmp_path / "data", sizes, per_class=6, classes=4, val_per_class=1)
    data = ["data=imagefolder", f"data.root={tmp_path / 'data'}", "batch_size=8", "epochs=1", "model.width=4"]
    run_cli(tmp_path / "runs", "padding=fixed,bucket,none", *data, "eval=false", "save_checkpoint=false", multirun=True)
    jobs = {}
    for job in (tmp_path / "runs").iterdir():
        if job.name.isdigit():
            m = metrics(job)
            jobs[m["padding"]["kind"]] = (m, (job / "runner.log").read_text())
    fixed, bucket, none = (jobs[k][0] for k in ("fixed", "bucket", "none"))
    assert fixed["compile_count"] == fixed["distinct_input_shapes"] == 1
    assert bucket["compile_count"] == bucket["distinct_input_shapes"] == 2 <= len(bucket["padding"]["buckets"])
    # 12 samples of each size, batch 8: a full and a partial batch per size.
    assert none["compile_count"] == none["distinct_input_shapes"] == none["padding"]["expected_batch_shapes"] == 4
    assert none["input_shapes"] == {"8x3x8x8": 1, "4x3x8x8": 1, "8x3x20x14": 1, "4x3x20x14": 1}
    assert "compiles again" in jobs["none"][1] and "compiled 4 times" in jobs["none"][1]
    # The warning's expectation is metrics.json's: 4 batch shapes for padding=none, not "plans 1".
    assert "4 batch shapes expected" in jobs["none"][1] and "plans 1" not in jobs["none"][1]
    assert "WARNING" not in jobs["fixed"][1] + jobs["bucket"][1]
    # one per bucket is the plan: said, not warned (a sweep job's records carry its number: "#1 new input shape")
    assert re.search(r"\[INFO\] - (#\d+ )?new input shape", jobs["bucket"][1])
    assert bucket["padding"]["padded_pixel_fraction"] > fixed["padding"]["padded_pixel_fraction"] == 0


@pytest.mark.slow
def test_fixed_keeps_accuracy_on_digits_rendered_at_varied_sizes(tmp_path):
    # ~20 s; measured val accuracy 0.96 (600 train / 150 val images, 8 epochs). Twelve sizes from
    # 8 to 32 px a side, aspect ratios from 1:3 to 3:1, gray/RGB/RGBA files.
    rng = np.random.RandomState(0)
    sizes = [tuple(int(v) for v in rng.randint(8, 33, 2)) for _ in range(12)]
    digit_folder(tmp_path / "data", sizes, per_class=60, val_per_class=15)
    data = ["data=imagefolder", f"data.root={tmp_path / 'data'}", "padding=fixed", "padding.method=resize_pad"]
    run_cli(tmp_path / "run", *data, "epochs=8", "save_checkpoint=false")
    m = metrics(tmp_path / "run")
    assert m["compile_count"] == m["distinct_input_shapes"] == 1
    assert m["val_accuracy"] >= 0.9, m["val_accuracy"]
