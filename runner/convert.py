"""`runner-convert SRC [OUT]`: a torchvision or timm ResNet state dict as a MindSpore checkpoint.

The checkpoint fits the runner's resnet18/34/50 (`init_from=OUT`) or MindCV's resnet family
(`model=mindcv model.checkpoint=OUT`). Every tensor is placed by name (the name map is printed), every
one that does not fit is named, and nothing is written unless the converted network computes PyTorch's
logits on the same batch (when torch is importable). `.pth`/`.pt` files are read by torch's safe loader
(weights_only=True, never arbitrary pickle); `.safetensors` files by the small reader below, without torch.
"""

import fnmatch
import json
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from runner.errors import ConfigError

# The source's BatchNorm parameter -> MindSpore's BatchNorm2d parameter.
BN_NAMES = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}
# (blocks per stage, bottleneck?) -> depth, for torchvision's and timm's plain ResNets.
DEPTHS: Dict[Tuple[Tuple[int, ...], bool], int] = {
    ((2, 2, 2, 2), False): 18,
    ((3, 4, 6, 3), False): 34,
    ((3, 4, 6, 3), True): 50,
    ((3, 4, 23, 3), True): 101,
    ((3, 8, 36, 3), True): 152,
}
RUNNER_MODELS = ("resnet18", "resnet34", "resnet50")
# Where each target names what torchvision calls conv1/bn1, downsample and fc.
TARGETS = {
    "runner": {"conv1": "stem.0", "bn1": "stem.1", "downsample": "down", "fc": "head"},
    "mindcv": {"conv1": "conv1", "bn1": "bn1", "downsample": "down_sample", "fc": "classifier"},
}
COUNTER = "num_batches_tracked"  # BatchNorm's step counter: MindSpore's BatchNorm has none
DEFAULT_TOLERANCE = 1e-4  # largest |logit difference| between PyTorch and the converted network (fp32)
HINT = "Convert a checkpoint of the model that holds finite float weights (one saved before training diverged)."


@dataclass
class Conversion:
    """What runner-convert did: the name map, what it left out, and the parity it measured."""

    source: str
    out: Optional[str]  # None until written (a refusal writes nothing)
    model: str  # resnet18|resnet34|resnet50|mindcv:<arch>
    source_depth: Optional[int]
    num_classes: int
    in_channels: int
    name_map: List[Tuple[str, str, Tuple[int, ...]]] = field(default_factory=list)  # (source, target, shape)
    dropped: List[str] = field(default_factory=list)  # source tensors left out: --drop and BatchNorm counters
    uninitialised: List[str] = field(default_factory=list)  # the network's parameters the file does not hold
    parity: Optional[Dict[str, Any]] = None  # {"max_abs_diff", "tolerance", "compared", "batch"}
    parity_skipped: Optional[str] = None  # why parity was not measured

    def usage(self) -> str:
        """The settings that train from the converted file."""
        pool = "model.stem_pool=torch"
        if self.model.startswith("mindcv:"):
            return f"model=mindcv model.arch={self.model.split(':', 1)[1]} model.checkpoint={self.out} {pool}"
        return f"model={self.model} model.stem=imagenet {pool} init_from={self.out}"


# ---------------------------------------------------------------------------------------------- reading


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    """A .safetensors file's tensors as numpy arrays, without torch, read by the safetensors library, whose
    header checks (dtypes, integer shapes whose size fits, byte ranges that tile the data without overlap)
    are the format's definition. BF16, which numpy has no type for, is widened to float32 from the bytes of
    the range the library checked. A ConfigError for anything it refuses."""
    from safetensors import SafetensorError, safe_open

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"{path} cannot be read as a safetensors file ({why}).")

    tensors: Dict[str, np.ndarray] = {}
    bf16 = []
    try:
        with safe_open(path, framework="numpy") as f:
            for name in f.keys():
                if f.get_slice(name).get_dtype() == "BF16":
                    bf16.append(name)
                else:
                    tensors[name] = np.array(f.get_tensor(name))
    except (SafetensorError, OSError, ValueError, TypeError) as e:
        raise refuse(" ".join(str(e).split()) or type(e).__name__) from None
    if bf16:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
            for name in bf16:
                start, end = header[name]["data_offsets"]
                f.seek(8 + size + start)
                raw = np.frombuffer(f.read(end - start), dtype=np.uint16).reshape(header[name]["shape"])
                tensors[name] = (raw.astype(np.uint32) << 16).view(np.float32)
    return tensors


def read_torch(path: str) -> Dict[str, np.ndarray]:
    """A .pth/.pt state dict through torch's safe loader (weights_only=True: tensors and plain containers
    only, no code run); a training checkpoint's {"state_dict": ...} or {"model": ...} is unwrapped, and
    DataParallel's `module.` prefix removed."""
    try:
        import torch
    except ImportError:
        raise ConfigError(
            f"{path} is a PyTorch file, which only PyTorch reads: install it (pip install -e '.[convert]') or "
            "save the weights as .safetensors (safetensors.torch.save_file(model.state_dict(), 'w.safetensors')), "
            "which runner-convert reads without torch."
        ) from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises RuntimeError, UnpicklingError, EOFError, ... for a bad file
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if "Weights only load failed" in str(e):
            raise ConfigError(
                f"{path} holds Python objects besides tensors (a pickled model?), which torch's safe loader "
                "refuses to run (weights_only=True). Save the weights alone: "
                "torch.save(model.state_dict(), 'weights.pth')."
            ) from None
        raise ConfigError(f"{path} cannot be read as a PyTorch checkpoint ({first}).") from None
    if isinstance(obj, dict):
        for key in ("state_dict", "model", "model_state_dict"):
            if key in obj and isinstance(obj[key], dict) and not torch.is_tensor(obj.get(key)):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj:
        raise ConfigError(f"{path} holds a {type(obj).__name__}, not a state dict (tensor names to tensors).")
    others = [f"{k} ({type(v).__name__})" for k, v in obj.items() if not torch.is_tensor(v)]
    if others:
        raise ConfigError(
            f"{path} is not a state dict of tensors: {len(others)} entries are something else "
            f"({', '.join(others[:4])})."
        )
    if all(k.startswith("module.") for k in obj):
        obj = {k[len("module.") :]: v for k, v in obj.items()}
    tensors = {}
    for name, t in obj.items():
        t = t.detach().cpu()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds every bfloat16 exactly
            t = t.float()
        tensors[name] = t.numpy().copy()
    return tensors


def read_source(path: str) -> Dict[str, np.ndarray]:
    """The source file's tensors by name: .safetensors without torch, anything else through torch."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such file. Name a .pth, .pt or .safetensors state dict.")
    if path.endswith(".safetensors"):
        return read_safetensors(path)
    return read_torch(path)


# ---------------------------------------------------------------------------------------------- mapping


def source_shape(tensors: Dict[str, np.ndarray]) -> Tuple[Optional[int], int, Optional[int]]:
    """(depth or None, input channels, classes or None) of a torchvision/timm ResNet state dict.

    Refused (ConfigError) when it is no ResNet at all: its first convolution `conv1.weight` is missing."""
    first = tensors.get("conv1.weight")
    if first is None or first.ndim != 4:
        raise ConfigError(
            f"This is not a torchvision or timm ResNet state dict: it has no 4-dimensional conv1.weight "
            f"(it holds e.g. {', '.join(list(tensors)[:4])}). runner-convert converts the ResNet family."
        )
    blocks = []
    for stage in range(1, 5):
        found = {int(m.group(1)) for n in tensors if (m := re.match(rf"layer{stage}\.(\d+)\.", n))}
        blocks.append(max(found) + 1 if found else 0)
    depth = DEPTHS.get((tuple(blocks), "layer1.0.conv3.weight" in tensors))
    head = tensors.get("fc.weight")
    classes = int(head.shape[0]) if head is not None and head.ndim == 2 else None
    return depth, int(first.shape[1]), classes


def target_name(name: str, target: str, bn_modules: set) -> Optional[str]:
    """The target network's name for a source tensor; None for BatchNorm's step counter.

    bn_modules: the source's BatchNorm modules (those with a running_var), whose weight/bias/running_*
    become gamma/beta/moving_*."""
    module, _, leaf = name.rpartition(".")
    if leaf == COUNTER:
        return None
    names = TARGETS[target]
    parts = module.split(".")
    if len(parts) == 1 and parts[0] in names:  # conv1, bn1, fc at the top
        parts = names[parts[0]].split(".")
    else:
        parts = [names["downsample"] if p == "downsample" else p for p in parts]
    if module in bn_modules:
        leaf = BN_NAMES.get(leaf, leaf)
    return ".".join(parts + [leaf])


def _matches(name: str, patterns: Sequence[str]) -> bool:
    """A --drop pattern matches a tensor name, the module above it (`fc` drops fc.weight and fc.bias), or
    as a glob (`layer4.*`)."""
    return any(name == p or name.startswith(p + ".") or fnmatch.fnmatchcase(name, p) for p in patterns)


@dataclass
class Plan:
    """Which source tensor goes where, and what does not fit."""

    pairs: List[Tuple[str, str]]  # (source, target) converted
    dropped: List[str]  # source tensors left out on purpose
    missing: List[str]  # target parameters with no source tensor
    unexpected: List[str]  # source tensors with no target parameter
    misshapen: List[str]  # "source (shape) -> target (shape)"
    uninitialised: List[str]  # target parameters the file will not hold (dropped, or missing and dropped)


def plan(tensors: Dict[str, np.ndarray], own: Dict[str, Any], target: str, drop: Sequence[str]) -> Plan:
    """Match the source's tensors to the network's parameters (own: name -> Parameter) by name and shape."""
    bn_modules = {n[: -len(".running_var")] for n in tensors if n.endswith(".running_var")}
    pairs, dropped, unexpected, misshapen = [], [], [], []
    placed = {}
    for s, value in tensors.items():
        t = target_name(s, target, bn_modules)
        if t is None:
            dropped.append(s)
            continue
        if _matches(s, drop) or _matches(t, drop):
            dropped.append(s)
            placed[t] = s
            continue
        if t not in own:
            unexpected.append(s)
        elif tuple(value.shape) != tuple(own[t].shape):
            misshapen.append(f"{s} {tuple(value.shape)} -> {t} {tuple(own[t].shape)}")
            placed[t] = s  # named once, as of another shape, not also as missing
        else:
            pairs.append((s, t))
            placed[t] = s
    converted = {t for _, t in pairs}
    absent = [t for t in own if t not in placed]
    missing = [t for t in absent if not _matches(t, drop)]
    uninitialised = [t for t in own if t not in converted]
    return Plan(pairs, dropped, missing, unexpected, misshapen, uninitialised)


def _misfit(src: str, model: str, depth: Optional[int], p: Plan) -> ConfigError:
    """One paragraph naming every tensor that does not fit."""
    what = []
    if p.missing:
        what.append(
            f"{len(p.missing)} of the network's parameters have no tensor in the source: {', '.join(p.missing)}"
        )
    if p.unexpected:
        what.append(f"{len(p.unexpected)} source tensors have no place in the network: {', '.join(p.unexpected)}")
    if p.misshapen:
        what.append(f"{len(p.misshapen)} are of another shape: {'; '.join(p.misshapen)}")
    looks = f"ResNet-{depth}" if depth else "a ResNet of no standard depth"
    return ConfigError(
        f"{src} (which looks like {looks}) does not fit {model}: {'. '.join(what)}. Nothing was written. Convert into "
        "the architecture the weights are for (--model), or leave tensors out with --drop PATTERN (e.g. --drop fc "
        "for a head of another number of classes: the network then initialises them afresh)."
    )


# ---------------------------------------------------------------------------------------------- networks


def _build_target(model: str, depth: Optional[int], num_classes: int, in_channels: int, image_size: int):
    """(the MindSpore network the checkpoint is for, its target kind, the name of its head attribute)."""
    from runner.models.errors import ModelError

    try:
        if model.startswith("mindcv:"):
            from runner.models.zoo import mindcv_model

            net = mindcv_model(model.split(":", 1)[1], num_classes, in_channels, stem_pool="torch")
            return net, "mindcv", "classifier"
        from runner.models.resnet import resnet

        # width 64 and the ImageNet stem: the torchvision layout conf/model/resnet*.yaml trains.
        net = resnet("imagenet", int(model[len("resnet") :]), 64, num_classes, in_channels, image_size, "native",
                     stem="imagenet", stem_pool="torch")  # fmt: skip
        return net, "runner", "head"
    except ModelError as e:
        raise ConfigError(f"--model {model}: {e}") from None


def _torch_reference(tensors: Dict[str, np.ndarray], depth: Optional[int], in_channels: int, classes: int):
    """torchvision's ResNet of the source's depth holding the source's tensors, or (None, why not)."""
    try:
        import torch
        import torchvision
    except ImportError as e:
        return None, f"PyTorch and torchvision are needed for the parity check ({e}; pip install -e '.[convert]')"
    if depth is None:
        return None, "the source is a ResNet of no standard depth, which torchvision does not build"
    net = getattr(torchvision.models, f"resnet{depth}")(weights=None, num_classes=classes)
    if in_channels != 3:
        net.conv1 = torch.nn.Conv2d(in_channels, net.conv1.out_channels, 7, 2, 3, bias=False)
    try:
        net.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=True)
    except RuntimeError as e:
        return None, f"the source does not load into torchvision's resnet{depth} ({str(e).splitlines()[0]})"
    return net.eval(), None


def measure_parity(
    tensors: Dict[str, np.ndarray],
    net: Any,
    head: str,
    depth: Optional[int],
    in_channels: int,
    classes: Optional[int],
    image_size: int,
    features_only: bool,
    batch: int = 4,
) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """The largest |difference| between PyTorch's and the converted network's outputs on one random batch,
    both in eval mode (BatchNorm on its running statistics); (None, why) when it cannot be measured.

    features_only: the head was left out, so the pooled features before it are compared instead."""
    import mindspore as ms
    from mindspore import nn

    reference, why = _torch_reference(tensors, depth, in_channels, classes or 1000)
    if reference is None:
        return None, why
    import torch

    x = np.random.RandomState(0).standard_normal((batch, in_channels, image_size, image_size)).astype(np.float32)
    if features_only:
        reference.fc = torch.nn.Identity()
        setattr(net, head, nn.Identity())
    with torch.no_grad():
        want = reference(torch.from_numpy(x)).numpy()
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)  # one forward pass: no graph to compile
    try:
        net.set_train(False)
        got = net(ms.Tensor(x)).asnumpy()
    finally:
        ms.set_context(mode=mode)
    diff = float(np.abs(got - want).max())
    return {
        "max_abs_diff": diff,
        "max_abs_output": float(np.abs(want).max()),
        "compared": "features" if features_only else "logits",
        "batch": list(x.shape),
    }, None


# ---------------------------------------------------------------------------------------------- converting


def default_out(src: str) -> str:
    """SRC beside itself with the .ckpt suffix: weights.pth -> weights.ckpt."""
    root, _ = os.path.splitext(src)
    return root + ".ckpt"


def convert_torch(
    src: str,
    out: Optional[str] = None,
    model: Optional[str] = None,
    drop: Sequence[str] = (),
    num_classes: Optional[int] = None,
    image_size: int = 224,
    tolerance: float = DEFAULT_TOLERANCE,
    show: Optional[Callable[[str], None]] = print,
) -> Conversion:
    """Convert a torchvision/timm ResNet state dict (src: .pth, .pt or .safetensors) into a MindSpore
    checkpoint at out (default: src with .ckpt), as `runner-convert` does; return what was done.

    model: resnet18|resnet34|resnet50 (the runner's, for init_from) or mindcv:<arch> (model.checkpoint);
    default: the runner's ResNet of the source's depth. drop: name patterns (source or target names) left
    out, e.g. ["fc"] with num_classes for a new head. num_classes: the network's classes (default: the
    source head's). The parity check runs one batch of image_size px through both networks when torch
    and torchvision are importable; a difference above tolerance refuses. show: where the name map and
    the parity line go (None: nowhere). Every refusal is a runner.errors.ConfigError and writes nothing.
    """
    say = show or (lambda _line: None)
    out = out or default_out(src)
    _check_request(out, tolerance)
    tensors = read_source(src)
    depth, in_channels, classes = source_shape(tensors)
    model = _target_model(src, model, depth)
    classes_out = num_classes or classes or 1000
    net, target, head = _build_target(model, depth, classes_out, in_channels, image_size)
    own = net.parameters_dict()
    p = plan(tensors, own, target, drop)
    record = Conversion(src, None, model, depth, classes_out, in_channels)
    _say_name_map(record, tensors, p, say)
    if p.missing or p.unexpected or p.misshapen:
        raise _misfit(src, model, depth, p)
    values = _load_into(own, tensors, p, src)
    head_params = {n for n in own if n.startswith(head + ".")}
    if p.uninitialised and not set(p.uninitialised) <= head_params:
        kept_source = [s for s in p.dropped if not s.endswith(COUNTER)]
        record.parity_skipped = f"tensors outside the head were dropped ({', '.join(kept_source[:4])})"
    else:
        features_only = bool(p.uninitialised)
        record.parity, record.parity_skipped = measure_parity(
            tensors, net, head, depth, in_channels, classes, image_size, features_only
        )
    _refuse_outside_tolerance(record, tolerance, say)
    from runner.rundir.atomic import save_checkpoint

    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    save_checkpoint([{"name": t, "data": values[t]} for _, t in p.pairs], out)
    record.out = out
    say(f"wrote {out} ({len(p.pairs)} tensors); train from it with: {record.usage()}")
    if p.uninitialised:
        say(f"initialised afresh by the network: {', '.join(p.uninitialised)}")
    return record


def _check_request(out: str, tolerance: float) -> None:
    """Refuse, before anything is read or converted, an OUT that exists or cannot be written."""
    if os.path.lexists(out):
        raise ConfigError(f"{out} exists; runner-convert never overwrites a file. Remove it or name another OUT.")
    existing = os.path.dirname(os.path.abspath(out))
    while not os.path.lexists(existing):  # the folders runner-convert would create
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError(
            f"{out} cannot be written: {existing} is a file, not a folder, so nothing can be created under it. "
            "Name an OUT in a folder."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{out} cannot be written: {existing} is not writable by this user. Name another OUT.")
    if not 0 < tolerance:
        raise ConfigError(
            f"--tolerance {tolerance}: a positive number expected (the default is {DEFAULT_TOLERANCE:g})."
        )


def _target_model(src: str, model: Optional[str], depth: Optional[int]) -> str:
    """--model as given, or the runner's ResNet of the source's depth; ConfigError for one that is neither."""
    if model is None:
        if depth not in (18, 34, 50):
            raise ConfigError(
                f"{src} looks like {f'ResNet-{depth}' if depth else 'a ResNet of no standard depth'}, and the runner "
                f"builds {', '.join(RUNNER_MODELS)}: name the target with --model "
                f"(e.g. --model mindcv:resnet{depth or 101})."
            )
        model = f"resnet{depth}"
    if model not in RUNNER_MODELS and not model.startswith("mindcv:"):
        raise ConfigError(f"--model {model}: one of {', '.join(RUNNER_MODELS)} or mindcv:<arch> expected.")
    return model


def _say_name_map(record: Conversion, tensors: Dict[str, np.ndarray], p: Plan, say: Callable[[str], None]) -> None:
    """Record and show which source tensor becomes which parameter, and which were dropped."""
    record.name_map = [(s, t, tuple(tensors[s].shape)) for s, t in p.pairs]
    record.dropped, record.uninitialised = p.dropped, p.uninitialised
    say(f"{record.source} -> {record.model} ({len(p.pairs)} tensors):")
    for s, t, shape in record.name_map:
        say(f"  {s:<40} -> {t:<40} {shape}")
    for s in p.dropped:
        say(f"  {s:<40} -- dropped ({'BatchNorm step counter' if s.endswith(COUNTER) else '--drop'})")


def _load_into(own: Dict[str, Any], tensors: Dict[str, np.ndarray], p: Plan, src: str) -> Dict[str, Any]:
    """Set the network's parameters from the mapped tensors (refused when one is not finite); return them."""
    import mindspore as ms

    from runner.training.checkpoints import usable_weights

    values = usable_weights({t: ms.Tensor(tensors[s]) for s, t in p.pairs}, own, src, hint=HINT)
    for t, v in values.items():
        own[t].set_data(v)
    return values


def _refuse_outside_tolerance(record: Conversion, tolerance: float, say: Callable[[str], None]) -> None:
    if record.parity is None:
        say(f"parity: not checked: {record.parity_skipped}")
        return
    record.parity["tolerance"] = tolerance
    d = record.parity
    say(
        f"parity: max |difference| of the {d['compared']} {d['max_abs_diff']:.3g} (largest |value| "
        f"{d['max_abs_output']:.3g}) on a batch of {d['batch']} in eval mode; tolerance {tolerance:g}"
    )
    if not d["max_abs_diff"] <= tolerance:
        raise ConfigError(
            f"The converted network's {d['compared']} differ from PyTorch's by up to {d['max_abs_diff']:.3g} on "
            f"the same batch (tolerance {tolerance:g}): {record.source} converted into {record.model} does not compute "
            "what it computed in PyTorch, so nothing was written. Check that --model names the architecture the "
            "weights were trained as."
        )


if __name__ == "__main__":  # `python -m runner.convert`: the console script's function (runner/cli/commands.py)
    from runner.cli.commands import convert

    convert()
