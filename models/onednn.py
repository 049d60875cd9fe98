"""model.conv=onednn: convolutions computed by MindSpore's own oneDNN library on its blocked formats.

MindSpore 2.10's Conv2D gives oneDNN plain NCHW memory, for which oneDNN has a per-image im2col + GEMM
under AVX2 and only reference kernels under AVX-512. Asked for formats of its own choice, the same
library (mindspore/lib/libdnnl.so.3) runs its blocked direct kernels (jit:avx512_core, brgconv), as
PyTorch's convolutions do (docs/mindspore-notes.md#cpu-conv-formats). `csrc/onednn_conv.cc` makes the
three passes (forward, backward-data, backward-weights) MindSpore AOT custom operators; this module
compiles it once per machine with the system C++ compiler (about 2 s), caches the library beside
`model.conv=auto`'s timings, and builds the forward operator with its backward attached.

Those kernels need AVX-512 to be allowed: the runner's AVX2 cap (which MindSpore's own Conv2D needs)
is not applied when the convolutions run here (runner/training/environment.py).
"""

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from runner.models.errors import ModelError

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCE = CSRC / "onednn_conv.cc"
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
    """The oneDNN library inside the installed MindSpore, checked to be one this code can drive."""
    import mindspore

    path = Path(mindspore.__file__).parent / "lib" / "libdnnl.so.3"
    if not path.is_file():
        raise ModelError(
            f"model.conv=onednn calls the oneDNN library MindSpore ships, and this MindSpore has none at {path}. "
            "Use model.conv=native or auto."
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
    """The compiled operator library's path; built on first use, once per build_key (source, MindSpore, compiler)."""
    from runner.models.conv import cache_path

    compiler = find_compiler()
    dnnl = mindspore_onednn()
    name = f"onednn-conv-{build_key(compiler, dnnl)[:16]}.so"
    for where in (cache_path().parent, Path(tempfile.gettempdir()) / f"mindspore-runner-{os.getuid()}"):
        try:
            where.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:  # read-only, or a file where a directory should be ($XDG_CACHE_HOME a file)
            log.warning("model.conv=onednn: cannot use %s as a directory (%s); trying a temporary directory", where, e)
            continue
        try:
            if not _private(where):  # a library loaded into this process must be one only we could write
                log.warning("model.conv=onednn: %s is writable by others; not building there", where)
                continue
            if (where / name).is_file() and _loads(where / name):
                return str(where / name)
            return _compile(compiler, dnnl, where / name)  # absent, or truncated by a killed build: (re)build
        except PermissionError as e:  # a read-only cache (home) must not stop training: build in /tmp
            log.warning("model.conv=onednn: cannot write %s (%s); trying a temporary directory", where, e)
    raise ModelError(
        "model.conv=onednn: found no private writable directory to build its library in (the cache "
        f"directory {cache_path().parent} and {tempfile.gettempdir()}). Use model.conv=native or auto."
    )


def build_key(compiler: str, dnnl: Path) -> str:
    """A digest of everything that shapes the library: the source and headers, the command line, the
    compiler's and MindSpore's oneDNN files (path, size, time: a changed or replaced one is a new key)
    and the environment the compiler runs in."""
    digest = hashlib.sha256()
    for h in [SOURCE, *sorted(p for p in HEADERS.rglob("*") if p.is_file())]:
        digest.update(str(h.relative_to(CSRC)).encode() + b"\0" + h.read_bytes() + b"\0")
    for f in (Path(shutil.which(compiler) or compiler).resolve(), dnnl.resolve()):
        st = f.stat()
        digest.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    digest.update("\0".join(_command(compiler, dnnl, "OUT")).encode())
    digest.update(repr(sorted(_build_env().items())).encode())
    return digest.hexdigest()


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


def _loads(path: Path) -> bool:
    """Whether the file is a loadable library with the three operators."""
    try:
        lib = ctypes.CDLL(str(path))
        return all(hasattr(lib, f) for f in ("ConvForward", "ConvBackwardData", "ConvBackwardWeights"))
    except OSError:
        return False


def _compile(compiler: str, dnnl: Path, out: Path) -> str:
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run(_command(compiler, dnnl, tmp), capture_output=True, text=True, env=_build_env())
    except BaseException:  # Ctrl-C or a compiler that cannot start: leave no half-built file behind
        os.unlink(tmp)
        raise
    if proc.returncode != 0:
        os.unlink(tmp)
        errors = [line for line in proc.stderr.splitlines() if "error" in line][:3] or proc.stderr.splitlines()[-3:]
        raise ModelError(
            f"model.conv=onednn: compiling {SOURCE.name} with {compiler} failed: {' / '.join(errors)}. "
            "Use model.conv=native or auto."
        )
    os.replace(tmp, out)  # atomic: a concurrent run sees the whole library or none
    log.info("model.conv=onednn: built %s", out)
    return str(out)


def forward_op(kernel_size: int, stride: int, padding: int):
    """The forward operator (x, w, stride, padding) -> y, with its backward (dx, dw) attached.

    Stride and padding are passed as int64 tensors of one element (`scalars`): an AOT operator receives
    only tensors. Tensors may be float32 or float16; the output has x's dtype, the weight gradient w's.
    """
    from mindspore import ops

    from runner.models.conv import conv_output_size

    so = library()

    def y_shape(x, w, s, p):
        return [
            x[0],
            w[0],
            conv_output_size(x[2], kernel_size, stride, padding),
            conv_output_size(x[3], kernel_size, stride, padding),
        ]

    backward_data = ops.Custom(
        f"{so}:ConvBackwardData",
        out_shape=lambda dy, w, x, s, p: x,
        out_dtype=lambda dy, w, x, s, p: x,
        func_type="aot",
    )
    backward_weights = ops.Custom(
        f"{so}:ConvBackwardWeights",
        out_shape=lambda x, dy, w, s, p: w,
        out_dtype=lambda x, dy, w, s, p: w,
        func_type="aot",
    )

    def bprop(x, w, s, p, out, dout):
        return backward_data(dout, w, x, s, p), backward_weights(x, dout, w, s, p), ops.zeros_like(s), ops.zeros_like(p)

    return ops.Custom(
        f"{so}:ConvForward", out_shape=y_shape, out_dtype=lambda x, w, s, p: x, func_type="aot", bprop=bprop
    )


def scalars(stride: int, padding: int):
    """Stride and padding as the operator's last two inputs."""
    from mindspore import Tensor

    return Tensor(np.array([stride], np.int64)), Tensor(np.array([padding], np.int64))
