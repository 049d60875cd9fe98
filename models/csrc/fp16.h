// RoundF16: float16 numerics at float32 speed (amp.dtype=float16 on a CPU).
#pragma once

#include "runtime.h"

// amp.dtype=float16 on a CPU (models/fp16.py): y = float32(float16(x)), rounded to nearest even, infinities
// past 65504 and float16's subnormals as a float16 cast gives them; its own backward (the gradient is rounded
// alike). Self-contained: F16C (every AVX2 CPU has it; Python checks
// the flag) by a function-level target on x86-64.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void round_f16(const float *x, float *y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) y[i] = _cvtsh_ss(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
}
constexpr bool kRoundsF16 = true;
#elif defined(__aarch64__)
// An Ascend host's CPU: its float16 conversions are instructions the compiler emits for __fp16.
void round_f16(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(static_cast<__fp16>(x[i]));
}
constexpr bool kRoundsF16 = true;
#else
// Elsewhere the library still builds (every other operator is portable); RoundF16 says why it cannot run.
void round_f16(const float *, float *, int64_t) {}
constexpr bool kRoundsF16 = false;
#endif

}  // namespace

extern "C" {
int RoundF16(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  return guarded("RoundF16", 2, nparam, [&] {
    if (!kRoundsF16) throw Failure{"has no float16 conversion for this CPU architecture"};
    const float *x = static_cast<float *>(params[0]);
    float *y = static_cast<float *>(params[1]);
    elementwise(elements(ndims[1], shapes[1]), [&](int64_t lo, int64_t hi) { round_f16(x + lo, y + lo, hi - lo); });
  });
}
}
