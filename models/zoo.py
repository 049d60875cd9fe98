"""MindCV's model zoo as a model source (`model=mindcv model.arch=<name>`, the `zoo` extra).

Pretrained weights come only from a local file (`model.checkpoint`): runs have no network.
"""

import difflib
import logging
import os

import numpy as np

from runner.models.errors import ModelError

log = logging.getLogger("runner")


def mindcv_model(arch: str, num_classes: int, in_channels: int, checkpoint=None):
    """`mindcv.create_model(arch)` for this data's classes and channels, with local weights if given."""
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
    if checkpoint:
        load_pretrained(net, checkpoint)
    return net


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
        saved = ms.load_checkpoint(path)
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
