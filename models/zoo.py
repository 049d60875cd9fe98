"""MindCV's model zoo as a model source (`model=mindcv model.arch=<name>`, the `zoo` extra).

Pretrained weights come only from a local file (`model.checkpoint`): runs have no network.
"""

import difflib
import logging
import os
from typing import Optional

import numpy as np

from runner.models.errors import ModelError

log = logging.getLogger("runner")


def mindcv_model(
    arch: str, num_classes: int, in_channels: int, checkpoint=None, image_size=None, conv="native", stem_pool="same"
):
    """`mindcv.create_model(arch)` for this data's classes and channels, with local weights if given.

    conv="onednn": every NCHW nn.Conv2d of the model (grouped and depthwise ones included) runs oneDNN's
    blocked kernels, as the runner's own ResNets do (models/conv.py use_onednn); parameters and their
    names are unchanged, so checkpoints load under either.

    Refused (ModelError) when the architecture cannot take this data: some MindCV models ignore
    in_channels (mobilevit builds a 3-channel stem whatever it is asked), and some shrink a small
    input to nothing on the way to their classifier (squeezenet1_0 at 16 px): both would only fail
    once training runs, with MindSpore's shape error. image_size: the network's input side (None:
    not checked). stem_pool="torch": the ResNet family's stem max pool padded as PyTorch pads it
    (models/resnet.py stem_max_pool), for weights converted from torchvision or timm.
    """
    try:
        import mindcv
    except ImportError:
        raise ModelError("model=mindcv needs MindCV: pip install -e '.[zoo]'.") from None
    names = mindcv.list_models()
    if arch not in names:
        close = difflib.get_close_matches(str(arch), names, n=5)
        hint = f"closest: {', '.join(close)}" if close else f"e.g. {', '.join(names[:5])}"
        raise ModelError(
            f"model.arch={arch!r} is not a MindCV architecture ({len(names)} of them: "
            f"python -c 'import mindcv; print(mindcv.list_models())'; {hint})."
        )
    # pretrained=False: mindcv would download weights, and runs are offline; model.checkpoint instead.
    net = mindcv.create_model(arch, num_classes=num_classes, in_channels=in_channels, pretrained=False)
    if stem_pool != "same":
        _pad_stem_pool(net, arch, stem_pool)
    _check_channels(net, arch, in_channels)
    if image_size:
        _check_size(net, arch, in_channels, int(image_size))
    if checkpoint:
        load_pretrained(net, checkpoint)
    if conv == "onednn":
        from runner.models.conv import use_onednn

        swapped = use_onednn(net)
        log.info("model.conv=onednn: %d convolutions of %s run oneDNN's kernels", swapped, arch)
    return net


def _pad_stem_pool(net, arch: str, stem_pool: str) -> None:
    """Replace MindCV's ResNet stem pool (`max_pool`, 3x3/2 with pad_mode="same") by PyTorch's padding."""
    from mindspore import nn

    from runner.models.resnet import stem_max_pool

    pool = getattr(net, "max_pool", None)
    if not isinstance(pool, nn.MaxPool2d) or getattr(pool, "pad_mode", None) != "SAME":
        raise ModelError(
            f"model.stem_pool={stem_pool} pads the 3x3/2 stem max pool of the ResNet family (mindcv's resnet*, "
            f"resnext*); MindCV's {arch} has no such pool. Leave model.stem_pool=same."
        )
    net.max_pool = stem_max_pool(stem_pool)


def _check_channels(net, arch: str, in_channels: int) -> None:
    """The first convolution must read the data's channels (its weight is (out, in/groups, kh, kw))."""
    first = next((p for p in net.get_parameters() if len(p.shape) == 4), None)
    if first is not None and first.shape[1] != in_channels:
        raise ModelError(
            f"MindCV's {arch} ignores in_channels={in_channels}: its first convolution ({first.name}, shape "
            f"{tuple(first.shape)}) reads {first.shape[1]} channels. Use data.channels={first.shape[1]} (gray "
            "images are then read as RGB) or another architecture."
        )


def _runs(net, in_channels: int, size: int) -> Optional[str]:
    """None when net takes a (1, in_channels, size, size) input, else MindSpore's reason: its first line, in
    full (the reason is at its end: "..., but got ..."; the C++ call stack follows on the next lines)."""
    import mindspore as ms

    try:
        net(ms.Tensor(np.zeros((1, in_channels, size, size), np.float32)))
        return None
    except (ValueError, RuntimeError, TypeError) as e:
        return " ".join((str(e).strip().splitlines() or [type(e).__name__])[0].split())


def _check_size(net, arch: str, in_channels: int, size: int) -> None:
    """One forward pass at the input size (PyNative: no graph to compile); when it fails, the smallest
    size that works, found by doubling then bisecting, goes into the refusal."""
    import mindspore as ms

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    training = net.training
    net.set_train(False)
    try:
        why = _runs(net, in_channels, size)
        if why is None:
            return
        low, high = size, None
        for candidate in (size * 2**k for k in range(1, 6)):
            if _runs(net, in_channels, candidate) is None:
                high = candidate
                break
            low = candidate
        if high is not None:
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (low, mid) if _runs(net, in_channels, mid) is None else (mid, high)
        smallest = f"the smallest input it takes is {high} px" if high else f"it takes no input up to {low} px"
        raise ModelError(
            f"MindCV's {arch} cannot take a {size} px input ({why}): {smallest}. Raise the input size "
            "(padding.height/width, or data.image_size) or choose another architecture."
        )
    finally:
        net.set_train(training)
        ms.set_context(mode=mode)


def load_pretrained(net, path: str) -> dict:
    """Load matching weights from a MindSpore checkpoint into net; return what was loaded and skipped.

    A classifier for another number of classes is left at its initialisation; a first convolution
    trained on RGB is summed over its input channels for grayscale data (as timm's adapt_input_conv
    does), so ImageNet weights serve 1-channel data.
    """
    import mindspore as ms

    if not os.path.isfile(path):
        raise ModelError(f"model.checkpoint={path}: no such file.")
    try:
        # load_checkpoint refuses a .safetensors file unless told its format (MindSpore 2.10).
        saved = ms.load_checkpoint(path, format="safetensors" if str(path).endswith(".safetensors") else "ckpt")
    except Exception as e:  # MindSpore raises ValueError/RuntimeError for files it cannot parse
        raise ModelError(
            f"model.checkpoint={path} is not a readable MindSpore checkpoint ({str(e).splitlines()[0]})."
        ) from None
    load, skipped = {}, []
    for p in net.get_parameters():
        value = saved.get(p.name)
        if value is None:
            continue
        have, want = tuple(value.shape), tuple(p.shape)
        if have != want and len(have) == 4 and have[0] == want[0] and have[2:] == want[2:] and want[1] == 1:
            value = ms.Parameter(ms.Tensor(value.asnumpy().sum(axis=1, keepdims=True).astype(np.float32)))
        elif have != want:
            skipped.append(f"{p.name} {have}->{want}")
            continue
        load[p.name] = value
    if not load:
        raise ModelError(
            f"model.checkpoint={path} has no parameter of this network (names like "
            f"{', '.join(list(saved)[:3])}; the network's are like "
            f"{', '.join(p.name for p in list(net.get_parameters())[:3])})."
        )
    ms.load_param_into_net(net, load, strict_load=False)
    missing = [p.name for p in net.get_parameters() if p.name not in load]
    log.info(
        "model.checkpoint: loaded %d tensors from %s; kept the initialisation of %d (%s)",
        len(load),
        path,
        len(missing),
        ", ".join(skipped[:4] + missing[:4]) or "none",
    )
    return {"loaded": len(load), "skipped": skipped, "missing": missing}
