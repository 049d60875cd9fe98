// The runner's operator library: MindSpore AOT custom operators (ops.Custom func_type="aot") computed by the
// oneDNN library MindSpore itself ships, built by models/onednn.py with g++ against the oneDNN C API headers in
// third_party/onednn.
//
// Why: MindSpore 2.10's Conv2D hands oneDNN plain NCHW memory, on which oneDNN has only a per-image
// im2col + GEMM (AVX2) or reference kernels (AVX-512). Asked for memory formats of its own choice
// ("any"), the same library picks its blocked direct kernels (jit:avx512_core, brgconv), as PyTorch's
// convolutions do; the blocked bodies keep activations in those formats between layers.
//
// One file per operator family, one translation unit: the families share the runtime's internal helpers
// and caches (an anonymous namespace), and one unit lets the compiler inline across them as it did when
// they were one file.
#include "runtime.h"

#include "conv.h"
#include "pool.h"
#include "blocked.h"
#include "dense.h"
#include "winograd.h"
#include "fp16.h"
