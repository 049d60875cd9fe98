"""A finished run's network rebuilt for use: device set-up, network building, weight loading, the network
evaluate, predict and export run. Shared by `runner.evaluate`, `runner.predict` and `runner.export`.

Everything is rebuilt from the run's `config.yaml` (runner/rundir/saved_run.py reads it and names its
files) through the builders training uses (datasets.build_data, models.build_model), so the network and
the preprocessing are those of the run. Lazy imports here are the point: MindSpore (and runner.datasets,
runner.models, runner.amp and runner.training.checkpoints, which import it) loads only after the CPU ISA
cap is set (before_mindspore; runner/training/environment.py).
"""

import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from runner.config.checks import check_tools
from runner.errors import ConfigError
from runner.models.errors import ModelError
from runner.rundir.layout import read_checkpoint
from runner.rundir.saved_run import checkpoint_path, read_classes
from runner.training.environment import cap_cpu_isa, choose_conv, setup

log = logging.getLogger("runner")


def set_up_device(cfg: Any) -> str:
    """Environment and MindSpore context as the run had them (CPU ISA cap, mode, device, seed); the target."""
    before_mindspore(cfg)
    return setup(cfg.device, cfg.mode, cfg.seed, training=False)


def prepare_cache(
    cfg: Any, target: str, purpose: str, extra: Optional[Dict[str, Any]], data: Any, classes: int, net: Any
) -> None:
    """The compile cache for a command's graphs (evaluate, export), before the first compiles: keyed on the run's
    config, the command's settings in `extra` and what the data decides about the graphs
    (runner/training/compile_cache.py)."""
    from runner.training import compile_cache

    graphs = [
        {
            "graph": purpose,
            "input": [data.channels, data.height, data.width],
            "classes": classes,
            "samples": data.val_size,  # the batch shapes evaluate (and export's parity check) run
        }
    ]
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA")
    _cache[purpose] = compile_cache.prepare(
        cfg,
        purpose=purpose,
        graphs=graphs,
        target=target,
        conv=str(cfg.model.conv),
        isa=str(isa),
        extra=extra,
        cells=(net,),
    )


_cache: Dict[str, Any] = {}  # purpose -> compile_cache.prepare's record, for cache_done


def cache_done(purpose: str) -> Dict[str, Any]:
    """What the compile cache did for this command's graphs (said in one line); {} when it was not set up."""
    from runner.training import compile_cache

    record = _cache.pop(purpose, None)
    if record is None:
        return {}
    state = compile_cache.finish(record, None, "")
    said = compile_cache.line(state)
    if said:
        log.info(said)
    return dict(state)


def before_mindspore(cfg: Any) -> None:
    """What must happen before MindSpore loads: oneDNN reads its ISA cap once (runner/training/environment.py)."""
    cfg.model.conv = choose_conv(cfg)["path"]  # best: decided on this machine, as training decides it
    try:
        check_tools(cfg)
    except ModelError as e:
        # A run trained with model.conv=onednn, used on a machine without a compiler: MindSpore's own
        # Conv2D computes the same numbers (to 1e-5) from the same parameters.
        log.warning("The run trained with model.conv=onednn, which runs native convolutions here: %s", e)
        cfg.model.conv = "native"
    cap_cpu_isa(cfg.device, cfg.model.conv)
    from runner.training import compile_cache

    compile_cache.quiet_messages(cfg)


def build(cfg: Any, batch_size: Optional[int] = None, num_classes: Optional[int] = None) -> Tuple[Any, Any]:
    """(Data, network) through the training builders; batch_size None = the run's (its global batch);
    num_classes: the classes the run trained on (classes.json), None = the data's count."""
    from runner.datasets import build_data  # loads MindSpore
    from runner.models import build_model

    data = build_data(cfg.data, cfg.padding, batch_size or cfg.batch_size, cfg.seed)
    net = build_model(cfg.model, num_classes or data.num_classes, data.channels, min(data.height, data.width))
    return data, net


def load_weights(net: Any, params: Dict[str, Any], path: str, cfg: Any) -> Dict[str, Any]:
    """Load a checkpoint's parameters into net; a ConfigError naming what does not fit. Returns a record.

    Resumable checkpoints hold the whole train cell (optimizer moments, loss scale, step); only the
    network's own parameters are taken from them. Shapes are compared here first: MindSpore's
    load_param_into_net stops at the first mismatch with a RuntimeError and a CRITICAL log line
    (docs/mindspore-notes.md#load-param-shape), while the user needs every misfit named.
    """
    import mindspore as ms

    from runner.training.checkpoints import usable_weights

    own = {p.name: p for p in net.get_parameters()}
    averaged = cfg.ema.decay > 0 and all(f"ema.{n}" in params for n in own)
    if averaged:
        # A resumable checkpoint of a run with ema.decay: its weights are the average (ema.*), as the
        # run's model.ckpt and its evaluation are, not the raw weights of the step.
        params = {**params, **{n: params[f"ema.{n}"] for n in own}}
    missing = [n for n in own if n not in params]
    wrong = [
        f"{n} {tuple(own[n].shape)} in the network, {tuple(params[n].shape)} in the checkpoint"
        for n in own
        if n in params and tuple(own[n].shape) != tuple(params[n].shape)
    ]
    if missing or wrong:
        what = []
        if wrong:
            what.append(f"{len(wrong)} parameter(s) of another shape ({'; '.join(wrong[:3])})")
        if missing:
            what.append(f"{len(missing)} of the network's {len(own)} parameters missing ({', '.join(missing[:3])})")
        raise ConfigError(
            f"{path} does not fit the network of this run ({cfg.model.name}, width {cfg.model.width}, "
            f"{cfg.data.channels} input channel(s)): {' and '.join(what)}. Use a checkpoint of this run, or "
            "pass the run directory the checkpoint was trained in."
        )
    values = usable_weights({n: params[n] for n in own}, own, path)
    ms.load_param_into_net(net, values, strict_load=True)
    return {"path": os.path.abspath(path), "parameters": len(own), "ema": averaged}


@dataclass
class SavedRun:
    """A run rebuilt for use: its config, MindSpore's device target, data, network with weights loaded."""

    cfg: object
    target: str
    data: object
    net: object
    checkpoint: Dict[str, Any]  # {"path", "parameters"}


def open_run(
    run_dir: str,
    ckpt: str,
    cfg: Any,
    batch_size: Optional[int] = None,
    purpose: Optional[str] = None,
    extra: Optional[Dict[str, Any]] = None,
) -> SavedRun:
    """Context, data and network of a run whose config load_config returned, with the checkpoint `ckpt`
    names loaded; cheapest checks first: the checkpoint's name and file before the data is scanned.
    purpose, extra: the command and its settings, for its compile-cache directory (prepare_cache)."""
    path = checkpoint_path(run_dir, ckpt)
    target = set_up_device(cfg)
    params = read_checkpoint(path)
    classes = (read_classes(run_dir) or {}).get("num_classes")
    data, net = build(cfg, batch_size, classes)
    record = load_weights(net, params, path, cfg)
    if purpose is not None:
        prepare_cache(cfg, target, purpose, extra, data, classes or data.num_classes, net)
    return SavedRun(cfg, target, data, net, record)


def inference_net(net: Any, cfg: Any, amp: bool, target: str, out_dir: str) -> Tuple[Any, str]:
    """(net returning FP32 logits, AMP level): at the run's AMP level when amp, else FP32 throughout.

    The run's val_accuracy was measured at its AMP level (O0 on CPU under amp=auto), so amp=True
    reproduces it; the exported network is the FP32 one.
    """
    from runner.amp import build_loss_net, resolve_level  # loads MindSpore
    from runner.config.amp_dtype import resolve_dtype

    level = resolve_level(cfg.amp.level, target) if amp else "O0"
    dtype = resolve_dtype(cfg.amp.get("dtype", "auto"), level, target)
    # As training builds it (amp.dtype=float16 on a CPU: the FP32 body rounded at its edges).
    out, _ = build_loss_net(net, level, list(cfg.amp.keep_fp32), out_dir, dtype=dtype, device_target=target)
    out.set_train(False)
    return out, level
