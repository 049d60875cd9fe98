"""model.conv=onednn: convolutions computed by MindSpore's own oneDNN library on its blocked formats.

MindSpore 2.10's Conv2D gives oneDNN plain NCHW memory, for which oneDNN has a per-image im2col + GEMM
under AVX2 and only reference kernels under AVX-512. Asked for formats of its own choice, the same
library (mindspore/lib/libdnnl.so.3) runs its blocked direct kernels (jit:avx512_core, brgconv; jit:avx2
on AVX2 CPUs), as PyTorch's convolutions do (docs/mindspore-notes.md#cpu-conv-formats). `csrc/` (one file
per operator family, built as one unit) makes the three passes (forward, backward-data, backward-weights)
and the blocked bodies' operators MindSpore AOT custom operators; this module compiles it once per
machine with the system C++ compiler, caches the library beside
`model.conv=auto`'s timings, and builds the forward operator with its backward attached.

The AVX-512 kernels need AVX-512 to be allowed: the runner's AVX2 cap (which MindSpore's own Conv2D
needs) is not applied when the convolutions run here (runner/training/environment.py). `choose` is
model.conv=best, the default: this path wherever it pays and builds, else native with the reason.
"""

import ctypes
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from runner.models.errors import ModelError

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCE = CSRC / "operators.cc"  # the one translation unit: it includes every operator family's file in csrc/
HEADERS = CSRC / "third_party" / "onednn" / "include"
FLAGS = ["-O2", "-std=c++17", "-shared", "-fPIC"]
# The only variables the compiler is given. The rest of the environment must not shape the library:
# GCC and ld read CPATH, CPLUS_INCLUDE_PATH, LIBRARY_PATH, GCC_EXEC_PREFIX, COMPILER_PATH, LD_RUN_PATH ...
# (a header or library found there would be compiled into a file every later run loads). PATH finds
# the assembler and linker, so it is part of the cache key; TMPDIR only holds temporary files.
BUILD_ENV = ("PATH", "TMPDIR")
# dnnl_version()->cpu_runtime of a build for the threadpool runtime, the one the C++ side drives.
THREADPOOL_RUNTIME = 8
HEADERS_VERSION = (3, 9)  # third_party/onednn: the library must be this release or a later 3.x
# At most this many threads for the operators' pool (read when it starts); unset: every CPU this process
# may run on. The runner sets it to each rank's share when several ranks train on one host.
THREADS_VAR = "MINDSPORE_RUNNER_ONEDNN_THREADS"


# model.conv=best takes this path where it was measured to pay: oneDNN's blocked kernels trained ResNet-18
# 2.2x faster than MindSpore's Conv2D with AVX-512 and 1.6x faster with AVX2 + FMA (BENCHMARKS.md,
# "model.conv"). Below AVX2 (SSE4.1-only x86, other architectures) nothing was measured: native.
FAST_ISA_FLAGS = ("avx2", "fma")  # /proc/cpuinfo names; AVX-512 CPUs have them too
SLOW_CAPS = ("SSE41", "AVX")  # ONEDNN_MAX_CPU_ISA values below AVX2
LOST = "native convolutions trained ResNet-18 1.6x (AVX2) to 2.2x (AVX-512) slower than onednn"


@dataclass(frozen=True)
class Choice:
    """What model.conv=best resolved to: the path, why, and what the fallback costs ("" when nothing)."""

    path: str
    reason: str
    cost: str = ""

    def line(self) -> str:
        """The one line a run prints about it."""
        cost = f"; {self.cost}" if self.cost else ""
        return f"model.conv=best runs {self.path} convolutions: {self.reason}{cost}."


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


def cap_allows_fast_isa(cap: Optional[str]) -> bool:
    """Whether a ONEDNN_MAX_CPU_ISA value ("" or None: no cap) lets oneDNN use AVX2 or better."""
    return not cap or cap.upper() not in SLOW_CAPS


def isa_pays(isa_cap: Optional[str], flags: Optional[frozenset] = None) -> bool:
    """Whether onednn is the faster path on this CPU (default: this machine's flags) under this ISA cap."""
    flags = cpu_flags() if flags is None else flags
    return flags is not None and all(f in flags for f in FAST_ISA_FLAGS) and cap_allows_fast_isa(isa_cap)


def choose(isa_cap: Optional[str] = None, flags: Optional[frozenset] = None) -> Choice:
    """model.conv=best on a CPU: onednn where its kernels pay and its library loads (built now if need be).

    `isa_cap` is the ONEDNN_MAX_CPU_ISA the process will run under (None: none); `flags` the CPU's
    (default: this machine's). Decided without importing MindSpore, so the caller can still set the cap.
    """
    flags = cpu_flags() if flags is None else flags
    if flags is None:
        return Choice("native", "this machine's CPU features could not be read (no /proc/cpuinfo)", LOST)
    missing = [f for f in FAST_ISA_FLAGS if f not in flags]
    if missing:
        return Choice(
            "native",
            f"this CPU lacks {' and '.join(f.upper() for f in missing)}, and onednn was measured faster only "
            "with AVX2 or AVX-512 kernels",
        )
    if not cap_allows_fast_isa(isa_cap):
        return Choice("native", f"ONEDNN_MAX_CPU_ISA={isa_cap} keeps oneDNN below the AVX2 kernels onednn needs", LOST)
    try:
        library()
    except ModelError as e:
        # The refusal model.conv=onednn would give, less its advice to pick another model.conv.
        why = str(e).replace(" Use model.conv=native or auto.", "").replace(", or use model.conv=native or auto", "")
        return Choice("native", why.rstrip("."), LOST)
    return Choice("onednn", "this CPU has AVX2 (or better) and the oneDNN operator library is built")


class _Version(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_int),
        ("minor", ctypes.c_int),
        ("patch", ctypes.c_int),
        ("hash", ctypes.c_char_p),
        ("cpu_runtime", ctypes.c_uint),
        ("gpu_runtime", ctypes.c_uint),
    ]


def mindspore_onednn() -> Path:
    """The oneDNN library inside the installed MindSpore, checked to be one this code can drive.

    MindSpore is located, not imported: model.conv=best decides before MindSpore loads (the runner's
    ISA cap depends on the decision, and oneDNN reads it once).
    """
    spec = importlib.util.find_spec("mindspore")
    where = list(spec.submodule_search_locations or []) if spec else []
    if not where:
        raise ModelError("model.conv=onednn calls the oneDNN library MindSpore ships, and MindSpore is not installed.")
    path = Path(where[0]) / "lib" / "libdnnl.so.3"
    if not path.is_file():
        # MindSpore 2.7 ships oneDNN 2.x as lib/libdnnl.so.2 (docs/mindspore-notes.md#versions).
        found = sorted(p.name for p in path.parent.glob("libdnnl.so*"))
        has = f"ships {', '.join(found)}" if found else "ships no oneDNN library"
        raise ModelError(
            f"model.conv=onednn calls the oneDNN 3.x library MindSpore ships (lib/libdnnl.so.3), and MindSpore "
            f"{mindspore_version()} {has}. Use model.conv=native or auto."
        )
    lib = ctypes.CDLL(str(path))
    lib.dnnl_version.restype = ctypes.POINTER(_Version)
    v = lib.dnnl_version().contents
    if v.major != HEADERS_VERSION[0] or v.minor < HEADERS_VERSION[1] or v.cpu_runtime != THREADPOOL_RUNTIME:
        raise ModelError(
            f"model.conv=onednn needs oneDNN 3.{HEADERS_VERSION[1]} or a later 3.x built for the threadpool "
            f"runtime; MindSpore's {path} is {v.major}.{v.minor}.{v.patch} (runtime {v.cpu_runtime}). "
            "Use model.conv=native or auto."
        )
    return path


def mindspore_version() -> str:
    """The installed MindSpore's version from its distribution metadata (no import), or "(unknown version)"."""
    try:
        return importlib.metadata.version("mindspore")
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"


def find_compiler() -> str:
    """The C++ compiler the library is built with: $CXX, else g++ or c++ on PATH (no MindSpore import)."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not compiler or not shutil.which(compiler):
        raise ModelError(
            "model.conv=onednn compiles a small C++ library on first use and found no C++ compiler "
            f"({'CXX=' + compiler if compiler else 'no g++ or c++ on PATH'}). Install one (Debian/Ubuntu: "
            "apt install g++), or use model.conv=native or auto."
        )
    return compiler


def library() -> str:
    """The compiled operator library's path; built on first use, once per source_key and build_key.

    A library built earlier on this machine from the same source, headers, flags and MindSpore is used
    as it is when no compiler is found now: only the first run on a machine needs one.
    """
    path = _find_or_build()
    _in_use.add(path)
    return path


def clear_caches() -> int:
    """Empty the caches of every operator library this process used (the primitives and buffers each shape
    made on first use, csrc/runtime.h Cache); the entries dropped. Between runs or tests only: the next call
    of a shape builds them again."""
    dropped = 0
    for path in _in_use:
        lib = ctypes.CDLL(path)  # already loaded by this process: the same handle, no second copy
        lib.ClearCaches.restype = ctypes.c_int64
        dropped += int(lib.ClearCaches())
    return dropped


def _find_or_build() -> str:
    """library(), found or built."""
    dnnl = mindspore_onednn()
    stem = f"onednn-conv-{source_key(dnnl)[:16]}"
    try:
        compiler = find_compiler()
    except ModelError:
        for where in _private_dirs(create=False):
            for built in sorted(where.glob(f"{stem}-*.so")):
                if _loads(built):
                    return str(built)
        raise
    name = f"{stem}-{build_key(compiler, dnnl)[:16]}.so"
    for where in _private_dirs(create=True):
        if where in _unwritable and not (where / name).is_file():
            continue  # found so earlier in this process: said once, not tried again by each layer
        try:
            if (where / name).is_file() and _loads(where / name):
                return str(where / name)
            return _compile(compiler, dnnl, where / name)  # absent, or truncated by a killed build: (re)build
        except OSError as e:  # read-only (EROFS is no PermissionError), or full: must not stop training; try /tmp
            _unwritable.add(where)
            _warn_once("model.conv=onednn: cannot write %s (%s); trying a temporary directory", where, e)
    raise ModelError(
        "model.conv=onednn: found no private writable directory to build its library in (the cache "
        f"directory {cache_dir()} and {tempfile.gettempdir()}). Use model.conv=native or auto."
    )


def _private_dirs(create: bool):
    """The directories a library may be built in and loaded from: only ones no one else can write."""
    for where in (cache_dir(), Path(tempfile.gettempdir()) / f"mindspore-runner-{os.getuid()}"):
        try:
            if create:
                where.mkdir(mode=0o700, parents=True, exist_ok=True)
            elif not where.is_dir():
                continue
            private = _private(where)
        except OSError as e:  # read-only, or a file where a directory should be ($XDG_CACHE_HOME a file)
            _warn_once("model.conv=onednn: cannot use %s as a directory (%s); trying a temporary directory", where, e)
            continue
        if not private:  # a library loaded into this process must be one only we could write
            _warn_once("model.conv=onednn: %s is writable by others; not building there", where)
            continue
        yield where


# Directories library() could not write in this process, and the warnings already given: every onednn layer
# asks for the library, and a read-only cache is one fact, said once (it was said once per layer).
_unwritable: set = set()
# The libraries library() returned in this process: the ones clear_caches() empties.
_in_use: set = set()
_warned: set = set()


def _warn_once(message: str, where: Path, *args) -> None:
    key = (message, str(where))
    if key not in _warned:
        _warned.add(key)
        log.warning(message, where, *args)


def cache_dir() -> Path:
    """$XDG_CACHE_HOME (or ~/.cache)/mindspore-runner/: the library, and model.conv=auto's timings."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "mindspore-runner"


def source_key(dnnl: Path) -> str:
    """A digest of what the library is built from, whatever the compiler: the source and headers, the
    flags and MindSpore's oneDNN file (path, size, time). A library with this key serves when no
    compiler is found."""
    digest = hashlib.sha256()
    _digest_sources(digest)
    st = dnnl.resolve().stat()
    digest.update(f"{dnnl.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{' '.join(FLAGS)}".encode())
    return digest.hexdigest()


def build_key(compiler: str, dnnl: Path) -> str:
    """A digest of everything that shapes the library: the source and headers, the command line, the
    compiler's and MindSpore's oneDNN files (path, size, time: a changed or replaced one is a new key)
    and the environment the compiler runs in."""
    digest = hashlib.sha256()
    _digest_sources(digest)
    for f in (Path(shutil.which(compiler) or compiler).resolve(), dnnl.resolve()):
        st = f.stat()
        digest.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    digest.update("\0".join(_command(compiler, dnnl, "OUT")).encode())
    digest.update(repr(sorted(_build_env().items())).encode())
    return digest.hexdigest()


def sources() -> list:
    """Every file the library is compiled from: the operator families' files in csrc/ and oneDNN's headers."""
    own = sorted(p for p in CSRC.iterdir() if p.suffix in (".cc", ".h"))
    return own + sorted(p for p in HEADERS.rglob("*") if p.is_file())


def _digest_sources(digest) -> None:
    for h in sources():
        digest.update(str(h.relative_to(CSRC)).encode() + b"\0" + h.read_bytes() + b"\0")


def _build_env() -> dict:
    return {k: os.environ[k] for k in BUILD_ENV if k in os.environ} | {"LC_ALL": "C"}


def _command(compiler: str, dnnl: Path, out: str) -> list:
    return [
        compiler,
        *FLAGS,
        f"-I{HEADERS}",
        str(SOURCE),
        "-o",
        out,
        str(dnnl),
        f"-Wl,-rpath,{dnnl.parent}",
        "-lpthread",
    ]


def _private(directory: Path) -> bool:
    st = directory.stat()
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


OPERATORS = (
    "ConvForward",
    "ConvBackwardData",
    "ConvBackwardWeights",
    "MaxPoolForward",
    "MaxPoolBackward",
    # models/blocked.py's
    "BlockSize",
    "ToBlocked",
    "FromBlocked",
    "BnTrainForward",
    "BnGlobalForward",
    "BnBackward",
    "AddRelu",
    "ReluBackward",
    "WinogradForward",
    "WinogradBackwardWeights",
    "WinofForward",
    "WinofBackwardData",
    "ClearCaches",
)


def _digest_file(path: Path) -> Path:
    """Where the SHA-256 of a built library is kept: beside it, written before the library is renamed in."""
    return Path(f"{path}.sha256")


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _intact(path: Path) -> bool:
    """Whether the file is byte for byte the library that was built (its recorded SHA-256).

    Checked before the file is loaded: dlopen maps a library whose segments run past the end of a cut
    file (a full disk, a copy stopped short), and the first touch of them kills the process with SIGBUS,
    which no Python code can catch. A library without a recorded digest is treated as unknown: rebuilt.
    """
    try:
        return _digest_file(path).read_text().strip() == _sha256(path)
    except OSError:
        return False


def _loads(path: Path) -> bool:
    """Whether the file is the intact library that was built, loadable, with every operator."""
    if not _intact(path):
        return False
    try:
        lib = ctypes.CDLL(str(path))
        return all(hasattr(lib, f) for f in OPERATORS)
    except OSError:
        return False


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGKILL the compiler's process group and wait until none of it is left: a linker that outlived its
    driver would write the temporary library after it was removed, and it would stay in the cache."""
    import signal
    import time

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)


def _compile(compiler: str, dnnl: Path, out: Path) -> str:
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        # Its own process group: the driver's children (cc1plus, as, ld) can then be stopped with it.
        proc = subprocess.Popen(
            _command(compiler, dnnl, tmp),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_build_env(),
            start_new_session=True,
        )
    except BaseException:  # a compiler that cannot start: leave no file behind
        os.unlink(tmp)
        raise
    try:
        _, stderr = proc.communicate()
    except BaseException:  # Ctrl-C, SIGTERM: stop the whole build, then leave no half-built file behind
        _stop_group(proc)
        Path(tmp).unlink(missing_ok=True)
        raise
    if proc.returncode != 0:
        os.unlink(tmp)
        errors = [line for line in stderr.splitlines() if "error" in line][:3] or stderr.splitlines()[-3:]
        raise ModelError(
            f"model.conv=onednn: compiling {SOURCE.name} with {compiler} failed: {' / '.join(errors)}. "
            "Use model.conv=native or auto."
        )
    # The digest first, then the library: a reader that finds the library finds its digest too. Builds
    # racing on one name write the same bytes (the key covers all that shapes them); a mismatch from
    # an interleaving only costs the next run a rebuild.
    digest = _digest_file(out)
    digest_tmp = Path(f"{tmp}.sha256")
    try:
        digest_tmp.write_text(_sha256(Path(tmp)) + "\n")
        os.replace(digest_tmp, digest)
    except OSError:
        os.unlink(tmp)
        digest_tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out)  # atomic: a concurrent run sees the whole library or none
    log.info("model.conv=onednn: built %s", out)
    return str(out)


def custom(so: str, func: str, out_shape, out_dtype, bprop=None, reads: tuple = ()):
    """The AOT operator `func` of library `so`, its outputs' shapes and dtypes given by out_shape and out_dtype.

    reads: the values out_shape takes from its closure rather than from its inputs' shapes (a stride, a
    block size). They become an attribute of the operator because PyNative caches an operator's inferred
    output shapes by its name, attributes and input shapes: a stride-2 convolution run after a stride-1 one
    on the same input shape was handed the stride-1 output's shape, and a buffer of that size.
    """
    from mindspore import ops

    op = ops.Custom(f"{so}:{func}", out_shape=out_shape, out_dtype=out_dtype, func_type="aot", bprop=bprop)
    if reads:
        op.add_prim_attr("shape_reads", repr(tuple(reads)))
    return op


def forward_op(kernel, stride, padding, dilation=(1, 1), same: bool = False):
    """The forward operator (x, w, geometry) -> y of one convolution, with its backward (dx, dw) attached.

    kernel, stride, dilation: (h, w); padding: (top, bottom, left, right), ignored when `same` (pads as
    MindSpore's pad_mode="same"). The geometry input is `geometry(...)` of the same values: an AOT
    operator receives only tensors. Tensors may be float32 or float16; the output has x's dtype, the
    weight gradient w's.
    """
    from mindspore import ops

    so = library()
    (kh, kw), (sh, sw), (pt, pb, pl, pr), (dh, dw) = kernel, stride, padding, dilation

    def side(n, k, s, before, after, d):
        return -(-n // s) if same else (n + before + after - (k - 1) * d - 1) // s + 1

    def y_shape(x, w, g):
        return [x[0], w[0], side(x[2], kh, sh, pt, pb, dh), side(x[3], kw, sw, pl, pr, dw)]

    backward_data = custom(so, "ConvBackwardData", lambda dy, w, x, g: x, lambda dy, w, x, g: x)
    backward_weights = custom(so, "ConvBackwardWeights", lambda x, dy, w, g: w, lambda x, dy, w, g: w)

    def bprop(x, w, g, out, dout):
        return backward_data(dout, w, x, g), backward_weights(x, dout, w, g), ops.zeros_like(g)

    reads = (kernel, stride, padding, dilation, same)
    return custom(so, "ConvForward", y_shape, lambda x, w, g: x, bprop, reads)


def geometry(stride, padding, dilation=(1, 1), groups: int = 1, same: bool = False):
    """The operators' last input: stride (h, w), padding (top, bottom, left, right), dilation (h, w),
    groups and the pad_mode="same" flag, as one int64 tensor (a constant of the graph)."""
    from mindspore import Tensor

    return Tensor(np.array([*stride, *padding, *dilation, groups, int(same)], np.int64))


def max_pool_op(kernel_size: int, stride: int):
    """Max pooling (x, (kernel, stride)) -> (y, workspace) as MindSpore's pad_mode="same" computes it, with
    its backward attached: the workspace holds each window's argmax, so the backward does not recompute
    the forward. float32 only (the FP32 network, and amp=o1's, which keeps pooling in float32)."""

    so = library()
    lib = ctypes.CDLL(so)  # verified by library(): the digest matched before anything loaded it
    lib.MaxPoolWorkspaceBytes.restype = ctypes.c_int64
    lib.MaxPoolWorkspaceBytes.argtypes = [ctypes.c_int64] * 6

    def shapes(x, ks):
        n, c, h, w = x
        workspace = lib.MaxPoolWorkspaceBytes(n, c, h, w, kernel_size, stride)
        if workspace < 0:
            raise ModelError(f"model.conv=onednn: oneDNN has no max pooling for input {tuple(x)}")
        return [n, c, -(-h // stride), -(-w // stride)], [workspace]

    return pool_with_workspace(so, shapes, kernel_size, stride)


def pool_with_workspace(so: str, shapes, kernel_size: int, stride: int, block: int = 0):
    """(MaxPoolForward with its backward attached, the (kernel, stride) tensor it takes): shapes(x, ks) gives
    the output's and the workspace's shapes, plain or blocked in blocks of `block` (models/blocked.py)."""
    from mindspore import Tensor, ops
    from mindspore import dtype as mstype

    backward = custom(so, "MaxPoolBackward", lambda dy, ws, x, ks: x, lambda dy, ws, x, ks: x)

    def bprop(x, ks, out, dout):
        return backward(dout[0], out[1], x, ks), ops.zeros_like(ks)

    out_dtype = lambda x, ks: (x, mstype.uint8)  # noqa: E731
    forward = custom(so, "MaxPoolForward", shapes, out_dtype, bprop, (kernel_size, stride, block))
    return forward, Tensor(np.array([kernel_size, stride], np.int64))
