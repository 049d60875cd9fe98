"""Consumer of the `device` and `mode` groups: process environment, MindSpore context and seeds."""

import logging
import os

from runner.config.isa import CPU_ISAS, ISA_VAR
from runner.errors import ConfigError
from runner.models import onednn
from runner.models.onednn import cpu_flags

log = logging.getLogger("runner")
# MindSpore is imported in setup() only: cap_cpu_isa must run first (oneDNN reads its ISA cap once).


def choose_conv(cfg) -> dict:
    """model.conv as this process runs it, decided before MindSpore loads: {asked, path, reason, cost, onednn_pays}.

    `best` (the default) is onednn where its kernels pay and its library loads, else native, said once
    in one line (models/onednn.py choose); every other value is taken as asked. `onednn_pays`: whether
    this CPU (under its ISA cap) is one where onednn is the faster path, for the run's advice.
    """
    asked = str(getattr(cfg.model.conv, "value", cfg.model.conv))
    cap = os.environ.get(ISA_VAR)
    if cap is None and str(cfg.device.cpu_isa_cap).lower() != "auto":
        cap = str(cfg.device.cpu_isa_cap)
    cpu = cfg.device.target not in ("gpu", "ascend")
    pays = cpu and onednn.isa_pays(cap)
    if asked != "best":
        return {"asked": asked, "path": asked, "reason": "as configured", "cost": "", "onednn_pays": pays}
    if not cpu:
        choice = {"path": "native", "reason": f"MindSpore's Conv2D is the fast path on {cfg.device.target}", "cost": ""}
    else:
        made = onednn.choose(cap)
        (log.warning if made.cost else log.info)(made.line())  # a warning only when the fallback costs speed
        choice = {"path": made.path, "reason": made.reason, "cost": made.cost}
    return {"asked": asked, **choice, "onednn_pays": pays}


def cap_cpu_isa(device, conv: str = "native") -> dict:
    """Set ONEDNN_MAX_CPU_ISA before MindSpore loads when the target may be the CPU; return what was done.

    oneDNN inside MindSpore 2.10 picks a reference convolution kernel on AVX-512 CPUs, ~70x slower
    than the AVX2 GEMM kernel it picks under the cap (docs/mindspore-notes.md#cpu-isa). `conv` is
    model.conv: with "onednn" no convolution goes through MindSpore's Conv2D, and the blocked kernels
    that path asks oneDNN for are AVX-512's, so cpu_isa_cap=auto sets no cap. A value the user set wins.
    """
    if ISA_VAR in os.environ:
        return {"value": os.environ[ISA_VAR], "set_by": "user"}
    cap = device.cpu_isa_cap
    if cap.lower() == "auto":
        cap = "" if conv == "onednn" else "AVX2"
    if device.target in ("gpu", "ascend") or not cap:
        return {"value": None, "set_by": None}
    os.environ[ISA_VAR] = cap
    return {"value": cap, "set_by": "runner"}


# What the first run in this process gave MindSpore that it cannot change later: the ISA oneDNN read
# and the device target. The command line runs one run per process; the Python API may run several.
_first_run: dict = {}


def effective_isa(cap) -> str:
    """ONEDNN_MAX_CPU_ISA as it acts on this CPU: "" (no cap) also for a cap at or above what an AVX2-only
    CPU has, so that the AVX2 cap of native convolutions and the no cap of onednn ones are the same there."""
    cap = (cap or "").upper()
    if cap in ("", "DEFAULT") or cap not in CPU_ISAS:
        return ""

    flags = cpu_flags() or frozenset()
    if "avx512f" in flags:
        return cap
    best = "AVX2_VNNI" if "avx_vnni" in flags else "AVX2" if "avx2" in flags else "AVX" if "avx" in flags else "SSE41"
    return "" if CPU_ISAS.index(cap) >= CPU_ISAS.index(best) else cap


def check_same_process(device, training: bool = True) -> None:
    """Refuse a second run in this process that needs another device target than the first, or (training)
    another CPU ISA cap; a finished run's evaluate/predict/export only warns about the ISA.

    oneDNN reads ONEDNN_MAX_CPU_ISA once, when MindSpore first runs a CPU kernel, and MindSpore binds
    its device at the first graph. The ISA changes which convolution kernels run, so their speed, not
    their results: a training run would report the speed of kernels it did not ask for, an evaluation
    only takes longer.
    """
    isa, target = effective_isa(os.environ.get(ISA_VAR)), device.target
    first = _first_run.setdefault("settings", (isa, target))
    if "auto" not in (target, first[1]) and target != first[1]:
        raise ConfigError(
            f"device={target}: an earlier run in this Python process already bound MindSpore to device={first[1]}, "
            "and MindSpore cannot change its device target within a process. Run it in its own process (the "
            "runner-train command)."
        )
    if isa == first[0]:
        return
    if not training:
        log.warning(
            "%s=%s here, but oneDNN in this process runs with %s since an earlier run (it reads it once): the "
            "results are the same, the convolutions may be slower.",
            ISA_VAR,
            isa or "(none)",
            first[0] or "(none)",
        )
        return
    raise ConfigError(
        f"This run needs {ISA_VAR}={isa or '(none)'} (device.cpu_isa_cap, model.conv), but an earlier run in "
        f"this Python process started MindSpore with {first[0] or '(none)'}, and oneDNN reads it only once per "
        "process: this run would train with, and report the speed of, the earlier kernels. Run it in its own "
        "process (the runner-train command, or a sweep, whose jobs each get one)."
    )


def setup(device, mode, seed: int, training: bool = True) -> str:
    """Configure MindSpore's context (the `device` and `mode` groups) and seed every generator; return the target.

    training: False for a finished run's evaluate/predict/export (check_same_process)."""
    check_same_process(device, training)
    import mindspore as ms

    kwargs = {"mode": ms.GRAPH_MODE if mode.name == "graph" else ms.PYNATIVE_MODE}
    if device.target != "auto":
        kwargs["device_target"] = device.target.upper() if device.target != "ascend" else "Ascend"
        kwargs["device_id"] = device.id
    try:
        ms.set_context(**kwargs)
    except (RuntimeError, ValueError) as e:
        raise _unusable(device, str(e)) from None
    ms.set_seed(seed)
    target = ms.get_context("device_target")
    if training:
        _check_jit_level(mode, target)
    return target


def _unusable(device, reason: str) -> ConfigError:
    return ConfigError(
        f"device={device.target} is not usable with this MindSpore installation ({reason.strip().splitlines()[0]}). "
        "Use device=auto or device=cpu, or install MindSpore's build for that device."
    )


def _check_jit_level(mode, target: str) -> None:
    if mode.name != "pynative" and str(mode.jit_level) == "O2" and target != "Ascend":
        raise ConfigError(
            f"mode.jit_level=O2 sinks the whole graph to an Ascend device, and this run's device is {target}: "
            "use mode.jit_level=O0 (kernel by kernel), O1 (with fusion) or auto."
        )


def check_device(device, mode) -> None:
    """What setup() refuses, checked without setting MindSpore's context (dry_run=true): a device this
    MindSpore build has no working plugin for, mode.jit_level=O2 off Ascend. MindSpore is imported only
    when the answer needs it (the CPU is in every build)."""
    if device.target in ("auto", "cpu") and str(mode.jit_level) != "O2":
        return
    import mindspore as ms
    from mindspore._c_expression import MSContext

    context = MSContext.get_instance()
    if device.target in ("gpu", "ascend"):
        target = "GPU" if device.target == "gpu" else "Ascend"
        if not context.is_pkg_support_device(target):
            usable = [t for t in ("CPU", "GPU", "Ascend") if context.is_pkg_support_device(t)]
            raise _unusable(device, f"it loaded no {target} plugin; it runs on {', '.join(usable)}")
    else:
        target = "CPU" if device.target == "cpu" else ms.get_context("device_target")
    _check_jit_level(mode, target)
