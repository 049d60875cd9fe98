"""Every numeric setting is range-checked before MindSpore sees it: one sentence naming the setting."""

import pytest
from conftest import TINY, compose_cfg, dry_run

from runner.config.checks import validate
from runner.errors import ConfigError

IMAGENET = ["augment=imagenet", "data.channels=3", "data.mean=[0.5,0.5,0.5]", "data.std=[0.5,0.5,0.5]"]


@pytest.mark.parametrize(
    "overrides,message",
    [
        ([*IMAGENET, "augment.crop_ratio=[1e9,1e9]"], "augment.crop_ratio[1] must be in [0, 16777216]"),
        (["data=synthetic", "data.num_classes=0"], "data.num_classes must be in [2, 100000]"),
        (["data=synthetic", "data.num_samples=1"], "data.num_samples must be in"),
        (["data=synthetic", "data.image_size=4096", "data.num_samples=100000"], "beyond the 134217728"),
        (["data.mean=[300]"], "data.mean[0] must be in [0, 255]"),
        (["data.input_scale=0"], "data.input_scale must be in (0, 16777216]"),
        (["data.input_scale=1e8"], "data.input_scale must be in (0, 16777216]"),
        (["padding.height=100000000"], "padding.height must be in [1, 16777216]"),
        (["padding=bucket", "padding.buckets=[8,100000000]"], "padding.buckets[-1] must be in"),
        (["augment=basic", "augment.crop_padding=1000", "padding.height=8", "padding.width=8"], "pads more than"),
        (["device.id=-1"], "device.id must be in [0, 4095]"),
        (["distributed.timeout_s=0"], "distributed.timeout_s must be in [1, 86400]"),
        (["distributed.workers=4", "distributed.local_workers=8"], "distributed.local_workers must be in [1, 4]"),
        (["checkpoint.every_epochs=-1"], "checkpoint.every_epochs must be in"),
        (["diagnose.every=0"], "diagnose.every must be in"),
        (["diagnose.patience=0"], "diagnose.patience must be in"),
        (["diagnose.max_islands=-1"], "diagnose.max_islands must be in"),
    ],
)
def test_out_of_range_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(*overrides))
    assert message in str(err.value)


def test_the_defaults_and_every_shipped_augmentation_pass():
    for overrides in ([], IMAGENET, ["augment=basic", "augment.crop_padding=4"], ["data=synthetic"]):
        validate(compose_cfg(*overrides))


def test_a_huge_crop_ratio_is_one_paragraph_on_the_cli(tmp_path):
    proc = dry_run(tmp_path, *TINY, *IMAGENET, "augment.crop_ratio=[1e9,1e9]")
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "augment.crop_ratio[1] must be in" in text and "Traceback" not in text


def test_the_bounds_are_mindspores_own():
    """Each bound above is the one MindSpore's dataset validators enforce: the largest accepted value builds
    the op, the next one is refused by MindSpore too (data.input_scale: Rescale; sizes: Resize)."""
    import mindspore.dataset.vision as V
    from mindspore.dataset.core.validator_helpers import FLOAT_MAX_INTEGER

    from runner.config import checks

    assert checks.FLOAT_MAX_INTEGER == FLOAT_MAX_INTEGER
    validate(compose_cfg(f"data.input_scale={FLOAT_MAX_INTEGER}"))
    V.Rescale(float(FLOAT_MAX_INTEGER), 0.0)
    with pytest.raises(ValueError):
        V.Rescale(float(FLOAT_MAX_INTEGER + 1), 0.0)
