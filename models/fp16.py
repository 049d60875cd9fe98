"""FP16 numerics on the fast FP32 path: activations rounded to float16 at the operator edges.

On a CPU MindSpore's float16 kernels (amp=o2/o3 through `auto_mixed_precision`) are ~15x slower than the
runner's FP32 body (blocked oneDNN, Winograd, dense). With amp.dtype=float16 on a CPU the network keeps its
FP32 body and every activation is rounded to float16 and back where it leaves a convolution, a BatchNorm,
the residual add, and where the image enters: by the operator library's RoundF16 (csrc/fp16.h: one
F16C pass, its own backward) where the CPU has F16C, else (or where `enable` is told fused=False: bench/amp_cpu.py) by a
Cast pair fp32 -> fp16 -> fp32, whose backward is the same pair. Either way the gradients flowing back are
rounded at the same edges. Values above 65504 become inf, small ones flush
as float16 does, so the loss scale, the NaN guard and overflow behave as FP16; the arithmetic inside each
operator is FP32 (float16's products accumulated in FP32, as oneDNN's f16 kernels also accumulate).

`edge(cell, x)` reads the cell's `fp16_edges` flag, a plain attribute (0 unless `enable` set it; a cell
without it counts as 0): a constant of the compiled graph, so the FP32 graph is unchanged.
"""

import logging

from mindspore import dtype as mstype
from mindspore import ops

log = logging.getLogger(__name__)

FLAG = "fp16_edges"
CAST, FUSED = 1, 2  # the flag's values where it rounds: by a Cast pair, or by the library's RoundF16


class _Round:
    """The library's RoundF16 operator (csrc/fp16.h: one F16C pass, its own backward), made once."""

    op = None


def edge(cell, x):
    """x rounded to float16 and back where `cell` computes with FP16 numerics, else x itself."""
    # Literals and the cell's own attributes only: amp=o1's rewrite copies this function into a module of
    # its own, where this module's names are not defined. getattr: under MindSpore's own O2 a BatchNorm is
    # wrapped (amp's _OutputTo16), without the flag.
    how = getattr(cell, "fp16_edges", 0)
    if how == 2:  # FUSED
        return cell.fp16_round(x)
    if how == 1:  # CAST
        return ops.cast(ops.cast(x, mstype.float16), mstype.float32)
    return x


def _fused():
    """RoundF16 where this CPU has F16C and the operator library builds; None (Cast pairs) elsewhere."""
    from runner.models import onednn

    if _Round.op is not None:
        return _Round.op
    if "f16c" not in (onednn.cpu_flags() or ()):
        return None
    try:
        so = onednn.library()
    except Exception as e:  # no compiler, no writable directory: the Cast pairs round alike, slower
        log.info("amp float16 on CPU: rounding by Cast pairs (%s)", e)
        return None
    back = onednn.custom(so, "RoundF16", lambda x: x, lambda x: x)

    def bprop(x, out, dout):
        return (back(dout),)

    _Round.op = onednn.custom(so, "RoundF16", lambda x: x, lambda x: x, bprop)
    return _Round.op


def declare(cells) -> None:
    """Give each cell the flag, off (the network's constructor calls it for the cells `edge` reads)."""
    for cell in cells:
        setattr(cell, FLAG, 0)


def supports(net) -> bool:
    """Whether `net` rounds at its edges (the runner's ResNets); other networks run MindSpore's AMP."""
    return hasattr(net, FLAG)


def enable(net, kept, fused=None) -> list:
    """Turn rounding on in every flagged cell of `net` except those inside a kept cell (amp.keep_fp32).
    fused: round by the library's RoundF16 (None: where it is available), else by Cast pairs.
    Returns the names of the cells left FP32."""
    how = FUSED if (fused is not False and _fused() is not None) else CAST
    kept_ids = set()
    for cell in kept:
        kept_ids.update(id(c) for _, c in cell.cells_and_names())
    left = []
    for name, cell in net.cells_and_names():
        if hasattr(cell, FLAG):
            on = id(cell) not in kept_ids
            setattr(cell, FLAG, how if on else 0)
            if on and how == FUSED:
                cell.fp16_round = _Round.op
            if not on:
                left.append(name)
    return left
