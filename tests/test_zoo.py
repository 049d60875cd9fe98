"""Models from MindCV's zoo (`model=mindcv`) and the built-in ResNets' explicit stem choice."""

import json

import numpy as np
import pytest
from conftest import TINY, compose_cfg, metrics, run_cli, run_in_process

pytest.importorskip("mindcv")  # the `zoo` extra
NO_WIDTH = [o for o in TINY if not o.startswith("model.width")]  # width is a built-in ResNet's setting
ZOO = ["model=mindcv", "model.arch=mobilenet_v3_small_075", *NO_WIDTH]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model=mindcv", "model.arch=mobilenet_v3_smal_075"], "closest: mobilenet_v3_small_075"),
        (["model=mindcv", "model.width=8"], "model.style=mindcv does not use model.width=8"),
        (["model=mindcv", "model.checkpoint=/nonexistent.ckpt"], "/nonexistent.ckpt: no such file"),
        (["model=resnet8", "model.stem=cifar"], "model.style=cifar does not use model.stem=cifar"),
        (["model=resnet8", "model.stem_pool=torch"], "model.style=cifar does not use model.stem_pool=torch"),
        (["model=resnet18", "model.arch=resnet18"], "does not use model.arch=resnet18"),
    ],
)
def test_bad_model_settings_are_refused(tmp_path, overrides, message):
    proc = run_in_process(tmp_path, *overrides, "epochs=1", check=False)
    assert proc.returncode == 2 and message in " ".join(proc.stderr.split()) and "Traceback" not in proc.stderr


def test_an_architecture_that_ignores_in_channels_is_refused_at_build():
    from runner.models import build_model
    from runner.models.errors import ModelError

    cfg = compose_cfg("model=mindcv", "model.arch=mobilevit_xx_small")
    with pytest.raises(
        ModelError, match=r"mobilevit_xx_small ignores in_channels=1: .* reads 3 channels.*data.channels=3"
    ):
        build_model(cfg.model, 10, 1, 32)


@pytest.mark.slow  # ~20 s: the search for the smallest size runs several forward passes
def test_an_architecture_that_shrinks_a_small_input_to_nothing_is_refused_with_the_size_that_works():
    from runner.models import build_model
    from runner.models.errors import ModelError

    cfg = compose_cfg("model=mindcv", "model.arch=squeezenet1_0")
    with pytest.raises(
        ModelError, match=r"cannot take a 16 px input \(For 'MaxPool'.*smallest input it takes is 35 px"
    ):
        build_model(cfg.model, 10, 1, 16)
    build_model(cfg.model, 10, 1, 35)  # and that size builds


@pytest.mark.slow
def test_pretrained_checkpoint_adapts_head_and_input_channels(tmp_path):
    import mindcv
    import mindspore as ms

    from runner.models import ModelError, build_model

    rgb = mindcv.create_model("shufflenet_v2_x0_5", num_classes=5, in_channels=3)
    ms.save_checkpoint(rgb, str(tmp_path / "rgb.ckpt"))
    saved = {p.name: p.asnumpy() for p in rgb.get_parameters()}

    def model_cfg(ckpt):
        return compose_cfg("model=mindcv", "model.arch=shufflenet_v2_x0_5", f"model.checkpoint={ckpt}").model

    cfg = model_cfg(tmp_path / "rgb.ckpt")
    gray = build_model(cfg, num_classes=10, in_channels=1, image_size=8)
    got = {p.name: p.asnumpy() for p in gray.get_parameters()}
    first = next(n for n in got if got[n].ndim == 4)
    np.testing.assert_allclose(got[first], saved[first].sum(axis=1, keepdims=True), rtol=1e-6)  # RGB -> gray
    head = [n for n in got if got[n].shape != saved[n].shape and got[n].shape[0] == 10]
    assert head  # the 10-class head could not come from a 5-class checkpoint: it keeps its initialisation
    same = [n for n in got if n != first and n not in head]
    assert len(same) > 50 and all(np.array_equal(got[n], saved[n]) for n in same)
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelError, match="not a readable MindSpore checkpoint"):
        build_model(model_cfg(tmp_path / "junk.ckpt"), 10, 1, 8)


def test_resnet_stem_is_explicit():
    from mindspore import nn

    from runner.models.resnet import resnet

    def pools(**kw):
        return sum(isinstance(c, nn.MaxPool2d) for _, c in resnet("imagenet", 18, 4, 10, 1, **kw).cells_and_names())

    assert pools(image_size=8) == 0 and pools(image_size=64) == 1  # auto: by input size
    assert pools(image_size=8, stem="imagenet") == 1 and pools(image_size=224, stem="cifar") == 0


@pytest.mark.slow
def test_zoo_model_with_amp_islands_diagnosis_and_flops(tmp_path):
    # PyNative, so no compile, but ~1.4 s a step here (float16 kernels): half the digits held out (28 steps, not
    # 44); the guard trips at step 13, when the dynamic loss scale has fallen to 1.
    fault = tmp_path / "fault"
    args = [*ZOO, "data.val_fraction=0.5", "mode=pynative", "amp=o2", "data.input_scale=1e5", "diagnose.patience=3"]
    args.append("eval=false")
    proc = run_cli(fault, *args, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    diag = json.loads((fault / "diagnosis.json").read_text())
    assert diag["first"]["cell"] == "features.0" and diag["fixed"] and diag["keep_fp32"] == ["features.0"]
    assert "amp.keep_fp32=[features.0]" in " ".join(proc.stderr.split())

    fixed = tmp_path / "fixed"
    run_cli(fixed, *args, "amp.keep_fp32=[features.0]")
    m = metrics(fixed)
    assert m["amp_level_used"] == "O2" and m["keep_fp32"] == ["features.0"] and not m["nan_guard"]["tripped"]
    assert np.isfinite(m["loss_curve"]).all() and m["loss_scale"]["skipped_steps"] == 0
    assert m["flops"]["forward_conv_per_sample"] > 0 and m["flops"]["forward_dense_per_sample"] > 0


@pytest.mark.slow
def test_zoo_model_trains_in_graph_mode(tmp_path):
    run_cli(tmp_path, *ZOO, "optim=adamw", "epochs=2")
    m = metrics(tmp_path)
    curve = np.array(m["loss_curve"])
    assert m["compile_count"] == 1 and curve[-10:].mean() < curve[:10].mean() - 0.3


@pytest.mark.slow
def test_resnet_stem_through_the_cli(tmp_path):
    # At 8x8, auto keeps the CIFAR stem; model.stem=imagenet forces the 7x7/2 + pool stem, which
    # leaves a quarter of the side for the stages: fewer FLOPs per sample (measured 97.5k vs 275.6k;
    # the 7x7 convolution itself and the 1x1 deep stages that both share keep it from 16x).
    small = ["model=resnet18", "model.width=4", *[o for o in TINY if not o.startswith("model.width")]]
    run_cli(tmp_path / "auto", *small)
    run_cli(tmp_path / "imagenet", *small, "model.stem=imagenet")
    auto, imagenet = metrics(tmp_path / "auto"), metrics(tmp_path / "imagenet")
    assert imagenet["flops"]["forward_per_sample"] < auto["flops"]["forward_per_sample"] / 2
    assert np.isfinite(imagenet["final_loss"]) and np.isfinite(auto["final_loss"])


@pytest.mark.slow  # 23 s here: mobilenet_v2 probed in PyNative, two rounds
def test_the_nan_diagnosis_of_a_mindcv_network_names_its_layers():
    """The probe runs the batch in PyNative with hooks and FP32 islands; on mobilenet_v2 at 32 px the runner's
    oneDNN kernels' backward failed there (ReLU6Grad: "The 2th dim of x(1) and dout(2) not equal"), so the
    diagnosis ended in a traceback. It probes with MindSpore's convolutions (diagnose.with_reference_convolutions),
    on the weights trained with the runner's."""
    from functools import partial

    from runner.amp.diagnose import find_islands
    from runner.models import build_model

    make = partial(
        build_model, compose_cfg("model=mindcv", "model.arch=mobilenet_v2_100").model, 10, 1, 32, conv="best"
    )
    weights = {n: p.asnumpy() for n, p in make().parameters_dict().items()}
    rng = np.random.default_rng(0)
    x, y = rng.random((4, 1, 32, 32), dtype=np.float32) * 1e5, np.arange(4, dtype=np.int32)  # data.input_scale=1e5
    found = find_islands(make, weights, "O3", [], (x, y), 1.0, 4)
    assert found["cause"] == "amp" and found["first"]["cell"] == "features.0" and found["fixed"], found
    assert found["keep_fp32"][0] == "features.0" and len(found["rounds"]) == len(found["keep_fp32"]) + 1
