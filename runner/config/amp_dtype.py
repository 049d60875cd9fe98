"""`amp.dtype`: which 16-bit type AMP computes in on each device, decided before MindSpore loads.

auto: float16 on GPU/Ascend. On a CPU `amp=auto` stays O0 (FP32): there is no bfloat16 body yet, and
float16 on a CPU buys FP16 numerics, not speed (docs/amp.md). With an explicit level (amp=o2) auto means
float16, which on a CPU runs the fast FP32 body with its activations rounded to float16 at the operator
edges (models/fp16.py). bfloat16: MindSpore's `auto_mixed_precision(dtype=bfloat16)` on GPU/Ascend; on a
CPU it is refused (exit 2): MindSpore's CPU kernels have no bfloat16 and the runner's bfloat16 operators
are not built yet, and without `avx512_bf16`/`amx_bf16` every bfloat16 product would be emulated.
"""

import glob
import logging
from typing import Optional

log = logging.getLogger("runner")

NATIVE_BF16 = ("avx512_bf16", "amx_bf16")


def cpu_flags() -> Optional[frozenset]:
    """The CPU's feature flags from /proc/cpuinfo (Linux); None where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def native_bf16(flags: Optional[frozenset]) -> bool:
    return any(f in (flags or ()) for f in NATIVE_BF16)


def likely_cpu(target: str) -> bool:
    """Whether device.target runs on the CPU: cpu, or auto on a machine without a GPU or Ascend device node."""
    target = str(target).lower()
    if target == "cpu":
        return True
    return target == "auto" and not (glob.glob("/dev/nvidia[0-9]*") or glob.glob("/dev/davinci[0-9]*"))


def bf16_cpu_problem(flags: Optional[frozenset]) -> str:
    """The one sentence amp.dtype=bfloat16 on a CPU is refused with."""
    if native_bf16(flags):
        have = [f for f in NATIVE_BF16 if f in (flags or ())]
        return (
            f"amp.dtype=bfloat16 on a CPU: this CPU has {'/'.join(have)}, but MindSpore's CPU kernels have no "
            "bfloat16 and the runner's bfloat16 operators are not built yet (issue 38); use amp.dtype=float16 "
            "(FP16 numerics at FP32 speed) or amp=o0"
        )
    return (
        "amp.dtype=bfloat16 on a CPU: this CPU lacks avx512_bf16 and amx_bf16, so every bfloat16 product would be "
        "emulated in FP32 plus conversions (oneDNN: 3-4x slower than FP32), and MindSpore's CPU kernels have no "
        "bfloat16 at all; use amp.dtype=float16 (FP16 numerics at FP32 speed) or amp=o0"
    )


def amp_problems(cfg, flags: Optional[frozenset] = None):
    """Problems of the amp group for this machine (config/checks.py lists them with the others)."""
    if str(cfg.amp.dtype) == "bfloat16" and likely_cpu(cfg.device.target):
        yield bf16_cpu_problem(cpu_flags() if flags is None else flags)


def resolve_dtype(dtype: str, level: str, device_target: str) -> str:
    """The dtype AMP at `level` (resolved: O0..O3) computes in on `device_target` ("CPU", "GPU", "Ascend"):
    "float32" at O0, else "float16" or "bfloat16"."""
    if level == "O0":
        return "float32"
    dtype = str(dtype)
    if dtype == "auto":
        if device_target == "CPU" and native_bf16(cpu_flags()):
            log.info(
                "amp.dtype=auto: float16 on this CPU; its bfloat16 (%s) is unused: bfloat16 kernels are not built yet.",
                "/".join(NATIVE_BF16),
            )
        return "float16"
    return dtype
