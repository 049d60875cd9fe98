"""runner-convert: PyTorch ResNet weights (torchvision, timm) as MindSpore checkpoints, checked by logit parity.

The .safetensors tests write a torchvision-named state dict with numpy alone (the safetensors package's
numpy API), so they run without torch. The parity tests build real torchvision and timm ResNets with
random weights (no downloads) and need the `convert` extra; without it they are skipped.
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY, cli_in_process, metrics, run_in_process

from runner.errors import ConfigError

HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "torchvision", "timm"))
needs_torch = pytest.mark.skipif(
    not HAVE_TORCH, reason="needs torch, torchvision and timm: pip install -e '.[convert]'"
)
SIZE = 32  # the parity batch's side: small, and the stem's pool still sees an even input (16 px)


def _bn(sd, name, width, rng):
    sd[f"{name}.weight"] = rng.uniform(0.5, 1.0, width).astype(np.float32)
    sd[f"{name}.bias"] = rng.normal(0, 0.1, width).astype(np.float32)
    sd[f"{name}.running_mean"] = rng.normal(0, 0.1, width).astype(np.float32)
    sd[f"{name}.running_var"] = rng.uniform(1.0, 3.0, width).astype(np.float32)
    sd[f"{name}.num_batches_tracked"] = np.array(7, np.int64)


def _conv(sd, name, cout, cin, k, rng):
    sd[f"{name}.weight"] = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(1.0 / (cin * k * k))).astype(np.float32)


def resnet18_state_dict(classes=10, seed=0) -> dict:
    """torchvision's resnet18 state dict (names, shapes, dtypes) with random values, built with numpy alone."""
    rng = np.random.default_rng(seed)
    sd = {}
    _conv(sd, "conv1", 64, 3, 7, rng)
    _bn(sd, "bn1", 64, rng)
    cin = 64
    for stage, width in enumerate([64, 128, 256, 512], start=1):
        for block in range(2):
            p = f"layer{stage}.{block}"
            _conv(sd, f"{p}.conv1", width, cin, 3, rng)
            _bn(sd, f"{p}.bn1", width, rng)
            _conv(sd, f"{p}.conv2", width, width, 3, rng)
            _bn(sd, f"{p}.bn2", width, rng)
            if cin != width:
                _conv(sd, f"{p}.downsample.0", width, cin, 1, rng)
                _bn(sd, f"{p}.downsample.1", width, rng)
            cin = width
    sd["fc.weight"] = rng.normal(0, 0.05, (classes, 512)).astype(np.float32)
    sd["fc.bias"] = rng.normal(0, 0.05, classes).astype(np.float32)
    return sd


def save_safetensors(sd: dict, path: Path) -> Path:
    from safetensors.numpy import save_file

    save_file(sd, str(path))
    return path


def convert(src, out=None, **kw):
    from runner.convert import convert_torch

    lines = []
    record = convert_torch(str(src), str(out) if out else None, image_size=SIZE, show=lines.append, **kw)
    return record, "\n".join(lines)


def ckpt(path) -> dict:
    import mindspore as ms

    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items()}


def refusal(src, **kw) -> str:
    with pytest.raises(ConfigError) as e:
        convert(src, **kw)
    return str(e.value)


# ---------------------------------------------------------------------------------------- without torch


def test_safetensors_names_and_batchnorm_statistics(tmp_path):
    sd = resnet18_state_dict()
    src = save_safetensors(sd, tmp_path / "r18.safetensors")
    record, shown = convert(src)
    out = ckpt(tmp_path / "r18.ckpt")
    assert len(out) == 102 and not [n for n in out if "num_batches_tracked" in n or "running" in n]
    # BatchNorm's four tensors each land in their own slot: a swap of mean and variance would fail here.
    for torch_leaf, ms_leaf in [("weight", "gamma"), ("bias", "beta"), ("running_mean", "moving_mean"),
                                ("running_var", "moving_variance")]:  # fmt: skip
        assert np.array_equal(out[f"stem.1.{ms_leaf}"], sd[f"bn1.{torch_leaf}"])
        assert np.array_equal(out[f"layer3.0.down.1.{ms_leaf}"], sd[f"layer3.0.downsample.1.{torch_leaf}"])
    assert np.array_equal(out["stem.0.weight"], sd["conv1.weight"])  # (out, in, kh, kw) in both: no transpose
    assert np.array_equal(out["head.weight"], sd["fc.weight"])
    assert "bn1.running_var" in shown and "stem.1.moving_variance" in shown
    assert "layer1.0.bn1.num_batches_tracked" in shown and "BatchNorm step counter" in shown
    assert (
        record.usage() == f"model=resnet18 model.stem=imagenet model.stem_pool=torch init_from={tmp_path / 'r18.ckpt'}"
    )
    if HAVE_TORCH:  # torchvision's resnet18 holding these tensors computes the same logits
        assert record.parity["max_abs_diff"] <= 1e-4
    else:
        assert "parity: not checked" in shown


@pytest.mark.slow  # with torch installed, the parity check's forward passes take it past 5 s
def test_mindcv_names(tmp_path):
    sd = resnet18_state_dict(classes=5)
    src = save_safetensors(sd, tmp_path / "r18.safetensors")
    record, _ = convert(src, tmp_path / "cv.ckpt", model="mindcv:resnet18")
    out = ckpt(tmp_path / "cv.ckpt")
    assert np.array_equal(out["layer2.0.down_sample.1.moving_variance"], sd["layer2.0.downsample.1.running_var"])
    assert np.array_equal(out["classifier.bias"], sd["fc.bias"]) and "conv1.weight" in out
    assert "model=mindcv model.arch=resnet18 model.checkpoint=" in record.usage()


def test_missing_unexpected_and_misshapen_tensors_are_named(tmp_path):
    sd = resnet18_state_dict()
    del sd["layer2.1.conv2.weight"]
    sd["layer5.0.conv1.weight"] = np.zeros((1, 1, 1, 1), np.float32)
    message = refusal(save_safetensors(sd, tmp_path / "odd.safetensors"))
    assert "have no tensor in the source: layer2.1.conv2.weight" in message
    assert "no place in the network: layer5.0.conv1.weight" in message
    assert not (tmp_path / "odd.ckpt").exists()


@pytest.mark.slow
def test_another_head_needs_drop(tmp_path):
    src = save_safetensors(resnet18_state_dict(classes=1000), tmp_path / "imagenet.safetensors")
    message = refusal(src, num_classes=10)
    assert (
        "fc.weight (1000, 512) -> head.weight (10, 512)" in message and "fc.bias (1000,) -> head.bias (10,)" in message
    )
    assert "--drop fc" in message and "no tensor in the source" not in message
    assert not (tmp_path / "imagenet.ckpt").exists()
    record, shown = convert(src, num_classes=10, drop=["fc"])
    out = ckpt(tmp_path / "imagenet.ckpt")
    assert "head.weight" not in out and len(out) == 100 and record.uninitialised == ["head.weight", "head.bias"]
    assert "fc.weight" in shown and "--drop" in shown
    if HAVE_TORCH:  # the head is new: the pooled features before it are compared
        assert record.parity["compared"] == "features" and record.parity["max_abs_diff"] <= 1e-4


@pytest.mark.parametrize("bad", ["nan", "inf", "int"])
def test_nonfinite_and_integer_tensors_are_refused(tmp_path, bad):
    sd = resnet18_state_dict()
    if bad == "int":
        sd["layer1.0.bn1.weight"] = np.ones(64, np.int64)
    else:
        sd["layer1.0.bn1.weight"][3] = np.nan if bad == "nan" else np.inf
    message = refusal(save_safetensors(sd, tmp_path / "bad.safetensors"))
    what = (
        "hold non-float data (layer1.0.bn1.gamma (Int64))"
        if bad == "int"
        else "hold NaN or infinity (layer1.0.bn1.gamma)"
    )
    assert what in message and "gives no meaningful result" in message  # init_from/evaluate's words
    assert not (tmp_path / "bad.ckpt").exists()


def test_corrupt_and_foreign_files_are_refused(tmp_path):
    whole = save_safetensors(resnet18_state_dict(), tmp_path / "whole.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(whole[: len(whole) // 2])
    assert "cannot be read as a safetensors file (" in refusal(tmp_path / "cut.safetensors")
    (tmp_path / "text.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    assert "deserializing header" in refusal(tmp_path / "text.safetensors")
    other = save_safetensors({"encoder.weight": np.zeros((4, 4), np.float32)}, tmp_path / "bert.safetensors")
    assert "not a torchvision or timm ResNet state dict" in refusal(other)
    assert "no such file" in refusal(tmp_path / "absent.safetensors")


def _forged(path, header: dict, data: bytes) -> Path:
    """A .safetensors file with this header, written byte by byte (the library would never write it)."""
    import json
    import struct

    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)
    return path


@pytest.mark.parametrize(
    "header, says",
    [
        ({"fc.weight": {"dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 8]}}, "expected usize"),
        ({"fc.weight": {"dtype": "F32", "shape": [2**62, 4], "data_offsets": [0, 8]}}, "overflow"),
        ({"fc.weight": {"dtype": "F32", "shape": [10.9], "data_offsets": [0, 40]}}, "floating point"),
        (  # fc.bias read from fc.weight's bytes
            {
                "fc.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "fc.bias": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            },
            "invalid offset",
        ),
        ({"fc.weight": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}}, "F33"),
    ],
)
def test_a_forged_safetensors_header_is_refused_as_the_format_defines(tmp_path, header, says):
    message = refusal(_forged(tmp_path / "forged.safetensors", header, bytes(40)))
    assert "cannot be read as a safetensors file" in message and says in message, message
    assert not (tmp_path / "forged.ckpt").exists()


def test_bf16_tensors_are_widened_to_float32(tmp_path):
    from runner.convert import read_safetensors

    values = np.array([1.0, -2.5, 3.0e-3], np.float32)
    raw = (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "BF16", "shape": [3], "data_offsets": [8, 14]},
    }
    got = read_safetensors(str(_forged(tmp_path / "mixed.safetensors", header, np.ones(2, np.float32).tobytes() + raw)))
    assert got["a"].tolist() == [1.0, 1.0] and got["b"].dtype == np.float32
    assert np.allclose(got["b"], values, rtol=2**-7)  # BF16 keeps 8 significant bits


def test_an_unwritable_out_is_refused_before_the_conversion(tmp_path):
    # A source the conversion itself would refuse: the refusal names OUT, so OUT was checked first.
    src = save_safetensors({"encoder.weight": np.zeros((4, 4), np.float32)}, tmp_path / "bert.safetensors")
    (tmp_path / "file").write_text("mine")
    message = refusal(src, out=tmp_path / "file" / "sub" / "r18.ckpt")
    assert f"{tmp_path / 'file'} is a file, not a folder" in message and "ResNet" not in message
    assert (tmp_path / "file").read_text() == "mine"


def test_an_existing_file_is_never_overwritten(tmp_path):
    src = save_safetensors(resnet18_state_dict(), tmp_path / "r18.safetensors")
    (tmp_path / "r18.ckpt").write_text("mine")
    assert "never overwrites" in refusal(src)
    assert (tmp_path / "r18.ckpt").read_text() == "mine"


@pytest.mark.slow
def test_stem_pool_is_refused_where_there_is_no_pool():
    from runner.models import ModelConfig, ModelError, build_model

    small = ModelConfig(name="resnet18", style="imagenet", depth=18, width=8, stem_pool="torch", conv="native")
    with pytest.raises(ModelError, match="model.stem_pool: the stem at 32 px is the CIFAR one"):
        build_model(small, 10, 3, 32)  # stem=auto below 64 px: no max pool to pad
    build_model(ModelConfig(**{**small.__dict__, "stem": "imagenet"}), 10, 3, 32)
    mobile = ModelConfig(name="m", style="mindcv", arch="mobilenet_v3_small_100", stem_pool="torch", conv="native")
    with pytest.raises(ModelError, match="mobilenet_v3_small_100 has no such pool"):
        build_model(mobile, 10, 3, 32)


@pytest.mark.slow
def test_command_line_exit_codes(tmp_path):
    src = save_safetensors(resnet18_state_dict(), tmp_path / "r18.safetensors")
    refused = cli_in_process(
        str(src), "--num-classes", "4", "--image-size", str(SIZE), app="runner.cli.commands:convert"
    )
    assert refused.returncode == 2 and refused.stderr.startswith("Error: "), refused.stderr
    assert "Traceback" not in refused.stderr and "head.weight (4, 512)" in " ".join(refused.stderr.split())
    done = cli_in_process(
        str(src), str(tmp_path / "x.ckpt"), "--num-classes", "4", "--drop", "fc", "--image-size", str(SIZE),
        app="runner.cli.commands:convert",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "layer4.1.bn2.running_var" in done.stdout and "wrote " in done.stdout and (tmp_path / "x.ckpt").exists()


# ---------------------------------------------------------------------------------------- with torch


def _torch_model(source: str, depth: int, classes: int = 10):
    """A real torchvision or timm ResNet with random weights shaped like trained ones: each residual branch's
    last BatchNorm scaled down (as trained ResNets and zero_init_residual have it), BatchNorm statistics
    of its own (a few batches in train mode, cumulative averages) and logits of a few units.

    Without the small last gammas the residual stream of a random ResNet-50 grows block after block, and
    its fp32 logits are 1.4e-4 away from its own float64 ones, in PyTorch as in MindSpore (measured): a
    1e-4 parity check would then measure float32 rounding, not the conversion.
    """
    import timm
    import torch
    import torchvision

    torch.manual_seed(depth + (1000 if source == "timm" else 0))  # not the same weights for both sources
    if source == "timm":
        net = timm.create_model(f"resnet{depth}", pretrained=False, num_classes=classes)
    else:
        net = getattr(torchvision.models, f"resnet{depth}")(weights=None, num_classes=classes)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None
            torch.nn.init.uniform_(m.weight, 0.5, 1.5)
            torch.nn.init.normal_(m.bias, 0.0, 0.1)
    for stage in (net.layer1, net.layer2, net.layer3, net.layer4):
        for block in stage:
            torch.nn.init.uniform_((block.bn3 if depth >= 50 else block.bn2).weight, 0.1, 0.3)
    with torch.no_grad():
        net.fc.weight.mul_(4.0)
    net.train()
    with torch.no_grad():
        for _ in range(2):
            net(torch.randn(8, 3, SIZE, SIZE))
    return net.eval()


def _mindspore_net(model: str, out: Path, classes: int, stem_pool: str = "torch"):
    """The network as a user's run builds it (models.build_model), holding the converted checkpoint: MindCV
    through model.checkpoint, the runner's through init_from's loader."""
    from runner.models import ModelConfig, build_model
    from runner.training.finetune import load_matching

    if model.startswith("mindcv:"):
        arch = model.split(":")[1]
        cfg = ModelConfig(name=arch, style="mindcv", arch=arch, checkpoint=str(out), stem_pool=stem_pool, conv="native")
        return build_model(cfg, classes, 3, SIZE)
    cfg = ModelConfig(name=model, style="imagenet", depth=int(model[6:]), width=64, stem="imagenet",
                      stem_pool=stem_pool, conv="native")  # fmt: skip
    net = build_model(cfg, classes, 3, SIZE)
    assert load_matching(net, str(out))["reinitialised"] == []
    return net


def _logits(net, x) -> np.ndarray:
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net.set_train(False)
    return net(ms.Tensor(x)).asnumpy()


PARITY = [(s, d, t) for s in ("torchvision", "timm") for d in (18, 50) for t in ("runner", "mindcv")]


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("source,depth,target", PARITY, ids=[f"{s}-resnet{d}-{t}" for s, d, t in PARITY])
def test_logit_parity(tmp_path, source, depth, target):
    import torch

    torch_net = _torch_model(source, depth)
    torch.save(torch_net.state_dict(), tmp_path / "w.pth")
    model = f"mindcv:resnet{depth}" if target == "mindcv" else f"resnet{depth}"
    record, shown = convert(tmp_path / "w.pth", tmp_path / "w.ckpt", model=model)
    assert record.parity["max_abs_diff"] <= 1e-4 and "parity: max |difference| of the logits" in shown
    # Independently of the converter's own check: the source network itself (timm's too) against the
    # network a run builds from the written file, on another batch.
    x = np.random.default_rng(1).standard_normal((3, 3, SIZE, SIZE)).astype(np.float32)
    with torch.no_grad():
        want = torch_net(torch.from_numpy(x)).numpy()
    got = _logits(_mindspore_net(model, tmp_path / "w.ckpt", 10), x)
    diff = float(np.abs(got - want).max())
    print(f"{source} resnet{depth} -> {model}: converter {record.parity['max_abs_diff']:.3g}, rebuilt {diff:.3g}, "
          f"largest |logit| {np.abs(want).max():.3g}")  # fmt: skip
    assert diff <= 1e-4, diff
    if source == "torchvision" and depth == 18:
        # MindSpore's pad_mode="same" pool (the default) takes other windows on an even input: why stem_pool exists.
        same = _logits(_mindspore_net(model, tmp_path / "w.ckpt", 10, stem_pool="same"), x)
        assert float(np.abs(same - want).max()) > 1e-3


@needs_torch
@pytest.mark.slow
def test_pth_refusals(tmp_path):
    import torch

    torch.save(_torch_model("torchvision", 18).state_dict(), tmp_path / "w.pth")
    whole = (tmp_path / "w.pth").read_bytes()
    (tmp_path / "cut.pth").write_bytes(whole[: len(whole) // 3])
    assert "cannot be read as a PyTorch checkpoint (" in refusal(tmp_path / "cut.pth")
    torch.save(torch.nn.Linear(2, 2), tmp_path / "pickled.pth")  # a whole module: code, not only tensors
    assert "refuses to run (weights_only=True)" in refusal(tmp_path / "pickled.pth")
    sd = torch.load(tmp_path / "w.pth", weights_only=True)
    sd["layer1.0.conv1.weight"][0, 0, 0, 0] = float("nan")
    torch.save({"state_dict": sd, "epoch": 3}, tmp_path / "nan.pth")  # a training checkpoint: unwrapped
    assert "hold NaN or infinity (layer1.0.conv1.weight)" in refusal(tmp_path / "nan.pth")


@needs_torch
@pytest.mark.slow
def test_a_converted_checkpoint_fine_tunes_through_init_from(tmp_path):
    import torch

    torch.save(_torch_model("timm", 18, classes=1000).state_dict(), tmp_path / "timm18.pth")
    record, _ = convert(tmp_path / "timm18.pth")
    run = tmp_path / "run"
    # digits at 32 px with the ImageNet stem: every converted tensor fits except the 1000-class head.
    tiny = [a for a in TINY if not a.startswith(("model.width", "padding."))]
    run_in_process(run, *tiny, "padding.height=32", "padding.width=32", *record.usage().split())
    ft = metrics(run)["fine_tune"]
    assert ft["reinitialised"] == ["head.weight", "head.bias"]  # 1000 ImageNet classes -> the 10 digits
    assert "layer4.1.bn2.moving_variance" in ft["loaded"] and ft["adapted"] == ["stem.0.weight"]  # RGB -> gray
    assert np.isfinite(metrics(run)["loss_curve"]).all()
