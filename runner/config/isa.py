"""The CPU ISA cap: the names oneDNN accepts in ONEDNN_MAX_CPU_ISA, checked with the config before MindSpore
loads (runner/training/environment.py sets the cap)."""

import os
from typing import Any

from runner.errors import ConfigError

ISA_VAR = "ONEDNN_MAX_CPU_ISA"


# The names oneDNN 3.10 (bundled with MindSpore 2.10) accepts in ONEDNN_MAX_CPU_ISA, case-insensitive
# (measured with ONEDNN_VERBOSE=1: "sse41" caps at SSE4.1). Any other value is silently ignored,
# which on an AVX-512 CPU means the ~30-70x slower reference kernels (docs/mindspore-notes.md#cpu-isa).
CPU_ISAS = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16",
    "AVX10_1_512",
    "AVX512_CORE_FP16",
    "AVX10_1_512_AMX",
    "AVX512_CORE_AMX",
    "AVX10_1_512_AMX_FP16",
    "AVX512_CORE_AMX_FP16",
    "AVX10_2_512",
    "AVX10_2_512_AMX_2",
    "DEFAULT",
)


def check_cpu_isa(device: Any) -> None:
    """Raise ConfigError when ONEDNN_MAX_CPU_ISA or device.cpu_isa_cap is not an ISA name oneDNN knows."""
    for where, value in (
        (f"the environment variable {ISA_VAR}", os.environ.get(ISA_VAR)),
        ("device.cpu_isa_cap", device.cpu_isa_cap),
    ):
        if value and value.upper() not in CPU_ISAS and not (where == "device.cpu_isa_cap" and value.lower() == "auto"):
            raise ConfigError(
                f"{where}={value!r} is not a CPU ISA name oneDNN knows (it would ignore it and may pick kernels "
                f"~30x slower). Use one of: {', '.join(CPU_ISAS)} (any case)."
            )
        if ISA_VAR in os.environ:
            return  # the user's variable wins over device.cpu_isa_cap (cap_cpu_isa)
