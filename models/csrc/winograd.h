// Winograd F(2x2, 3x3): one implementation (WinoF) of the transforms, for the forward, backward-data and
// backward-weights passes (WinofForward, WinofBackwardData, WinogradForward, WinogradBackwardWeights).
#pragma once

#include "conv.h"

namespace {

// ---- Winograd F(2x2, 3x3) forward and backward-data (blocked.conv_op(winograd=True)): 3x3, stride-1, pad-1
// convolutions on blocked maps of 8x8 and more. Each 2x2 output tile is Y = A^T [U . V] A with V = B^T d B
// (d: the tile's 4x4 input window) and U = G g G^T: 16 transform points, at each of them a matmul over the
// channels, which multiplies 16 values per tile and channel pair where the direct kernel multiplies 36.
// Backward-data is the same convolution of dy with the weights turned by 180 degrees and their channels
// swapped. Tiles are cut into chunks that each thread transforms, multiplies (one oneDNN matmul over the 16
// points, on the calling thread) and transforms back while they sit in its L2: every tile's V written out
// for one batched matmul makes the transforms bound by memory. Why: oneDNN 3.10 has no f32 Winograd on CPU,
// and its direct kernels run at the machine's peak already on these layers: only fewer multiplications
// make them faster. Measured in training (ResNet-18 64 px, batch 64, 2-core EPYC Zen 4, AVX-512; medians a
// call, two processes back to back): 16x16 maps, 64 channels, forward 4.6 ms and backward-data 4.7 against
// oneDNN's 5.5 and 5.5; 8x8 maps, 128 channels, 4.5 and 4.4 against 5.0 and 5.1. F(4x4, 3x3) (36 points
// for 16 outputs, 4x fewer multiplies) measured faster alone, but its results are ~10x further from the
// direct kernel's (1e-6 of the scale against 1e-7), and the default configuration's one-epoch loss curve
// moved by 2e-2 from the native path's, where F(2x2, 3x3) leaves it unchanged in its 5th decimal.
struct WinoF {
  int64_t n, ci, co, cip, cop, h, w, b, th, tw, tiles, chunk;
  std::vector<float> u;  // (16, cip, cop): the call's transformed weights, kept so its pages stay faulted in
  Prim mm;               // a chunk's 16 matmuls as one batched matmul, run by one thread
  Md v, uw, m;
  Prim dw_mm;  // backward weights (winof_backward_weights), made at its first call: per chunk, or all tiles
  Md m_t, v_all, du;
  bool dw_whole = false;                     // dU too large for one per thread: every tile at once
  bool dw_failed = false;                    // its matmul could not be made: oneDNN's kernel runs (said once)
  std::vector<std::vector<float>> dw_parts;  // each thread's dU (one, in dw_whole)
  std::vector<float> v_buf, m_buf;           // dw_whole: every tile's V and M, kept (their pages stay faulted in)
};
using WinoFKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;  // n ci co h w b
Cache<WinoFKey, WinoF> winofs;

// The point planes of a chunk's V and M, one row per tile: padded so that the 16 planes do not fall on the
// same L1 sets (their natural distance is a multiple of 4 KB).
int64_t plane_stride(int64_t tiles, int64_t channels) { return tiles * channels + 16; }

std::unique_ptr<WinoF> make_winof(const WinoFKey &key) {
  auto wn = std::make_unique<WinoF>();
  auto [n, ci, co, h, w, b] = key;
  wn->n = n, wn->ci = ci, wn->co = co, wn->h = h, wn->w = w, wn->b = b;
  wn->cip = (ci + b - 1) / b * b, wn->cop = (co + b - 1) / b * b, wn->th = (h + 1) / 2, wn->tw = (w + 1) / 2;
  wn->tiles = n * wn->th * wn->tw;
  // A chunk's V and M (16 planes of tiles x channels each) within ~1.5 MB; at least 32 tiles, so that the
  // matmul's rows are not too few. (1.5 MB measured faster than 0.75 MB, this CPU's 1 MB L2 notwithstanding:
  // layer1's chunked weight gradient 5.7 against 6.4 ms a call in training.)
  wn->chunk = std::max<int64_t>(32, (1536 * 1024 / 4) / (16 * (wn->cip + wn->cop)));
  wn->u.resize(static_cast<size_t>(16 * wn->cip * wn->cop));
  const int64_t c = wn->chunk, vs = plane_stride(c, wn->cip), ms = plane_stride(c, wn->cop);
  dnnl_dims_t v_d = {16, c, wn->cip}, v_s = {vs, wn->cip, 1}, m_d = {16, c, wn->cop}, m_s = {ms, wn->cop, 1};
  dnnl_dims_t u_d = {16, wn->cip, wn->cop};
  wn->v.init_strides(v_d, v_s, 3);
  wn->m.init_strides(m_d, m_s, 3);
  wn->uw.init(u_d, dnnl_abc, dnnl_f32, 3);
  matmul_pd(wn->mm, wn->v, wn->uw, wn->m, "Winograd F(2x2, 3x3) matmul");
  return wn;
}

std::shared_ptr<WinoF> get_winof(const WinoFKey &key) {
  return winofs.get(key, [&] { return make_winof(key); });
}

// Vectors of b channels (GCC's vector extension: one register on AVX-512 for b = 16, split by the
// compiler elsewhere), moved with memcpy: the blocked tensors are aligned to floats only.
// (Returned by value only inside always-inline helpers: GCC's note that their ABI differs by ISA is moot.)
#pragma GCC diagnostic ignored "-Wpsabi"
template <int B>
struct Lanes {
  typedef float v __attribute__((vector_size(B * sizeof(float)), aligned(sizeof(float))));
};
template <int B>
inline __attribute__((always_inline)) typename Lanes<B>::v load(const float *p) {
  typename Lanes<B>::v r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}
template <int B>
inline __attribute__((always_inline)) void store(float *p, typename Lanes<B>::v x) {
  std::memcpy(p, &x, sizeof(x));
}

// V[xi][tile - t0][c] for tiles t0..t0+count of x (blocked, cip channels), in planes of `rows` rows; zeros
// outside the map.
template <int B>
inline __attribute__((always_inline)) void winof_input(const WinoF *wn, const float *x, int64_t t0, int64_t count,
                                                        int64_t rows, float *v) {
  using V = typename Lanes<B>::v;
  const int64_t nb = wn->cip / B, stride = plane_stride(rows, wn->cip), per_image = wn->th * wn->tw;
  const V zero = {};
  for (int64_t t = t0; t < t0 + count; ++t) {
    const int64_t i = t / per_image, ty = t % per_image / wn->tw, tx = t % wn->tw;
    for (int64_t cb = 0; cb < nb; ++cb) {
      const float *plane = x + (i * nb + cb) * wn->h * wn->w * B;
      V r4[4][4];  // d B, row by row
      for (int r = 0; r < 4; ++r) {
        const int64_t y = 2 * ty + r - 1;
        V d[4];
        for (int q = 0; q < 4; ++q) {
          const int64_t xx = 2 * tx + q - 1;
          d[q] = y >= 0 && y < wn->h && xx >= 0 && xx < wn->w ? load<B>(plane + (y * wn->w + xx) * B) : zero;
        }
        r4[r][0] = d[0] - d[2], r4[r][1] = d[1] + d[2], r4[r][2] = d[2] - d[1], r4[r][3] = d[1] - d[3];
      }
      float *out = v + (t - t0) * wn->cip + cb * B;
      for (int j = 0; j < 4; ++j) {
        store<B>(out + j * stride, r4[0][j] - r4[2][j]);
        store<B>(out + (4 + j) * stride, r4[1][j] + r4[2][j]);
        store<B>(out + (8 + j) * stride, r4[2][j] - r4[1][j]);
        store<B>(out + (12 + j) * stride, r4[1][j] - r4[3][j]);
      }
    }
  }
}

// y's tiles t0..t0+count (blocked, cop channels) = A^T M A; the parts of edge tiles outside the map dropped.
template <int B>
inline __attribute__((always_inline)) void winof_output(const WinoF *wn, const float *m, int64_t t0, int64_t count,
                                                         int64_t rows, float *y) {
  using V = typename Lanes<B>::v;
  const int64_t nb = wn->cop / B, stride = plane_stride(rows, wn->cop), per_image = wn->th * wn->tw;
  for (int64_t t = t0; t < t0 + count; ++t) {
    const int64_t i = t / per_image, ty = t % per_image / wn->tw, tx = t % wn->tw;
    for (int64_t ob = 0; ob < nb; ++ob) {
      float *plane = y + (i * nb + ob) * wn->h * wn->w * B;
      const float *p = m + (t - t0) * wn->cop + ob * B;
      V a[2][4];  // A^T M, column by column
      for (int j = 0; j < 4; ++j) {
        const V m0 = load<B>(p + j * stride), m1 = load<B>(p + (4 + j) * stride);
        const V m2 = load<B>(p + (8 + j) * stride), m3 = load<B>(p + (12 + j) * stride);
        a[0][j] = m0 + m1 + m2, a[1][j] = m1 - m2 - m3;
      }
      for (int k = 0; k < 2 && 2 * ty + k < wn->h; ++k) {
        float *row = plane + ((2 * ty + k) * wn->w + 2 * tx) * B;
        store<B>(row, a[k][0] + a[k][1] + a[k][2]);
        if (2 * tx + 1 < wn->w) store<B>(row + B, a[k][1] - a[k][2] - a[k][3]);
      }
    }
  }
}

VECTOR_CLONES void winof_input_any(const WinoF *wn, const float *x, int64_t t0, int64_t count, int64_t rows,
                                   float *v) {
  if (wn->b == 16) return winof_input<16>(wn, x, t0, count, rows, v);
  return winof_input<8>(wn, x, t0, count, rows, v);  // winof_of admits 16 and 8 only
}
VECTOR_CLONES void winof_output_any(const WinoF *wn, const float *m, int64_t t0, int64_t count, int64_t rows,
                                    float *y) {
  if (wn->b == 16) return winof_output<16>(wn, m, t0, count, rows, y);
  return winof_output<8>(wn, m, t0, count, rows, y);
}

// U[xi][c][o] = (G g G^T)[xi] for weight w (O, C, 3, 3): g = w[o][c] (turned: w[o][c] rotated by 180
// degrees, with U indexed [xi][o][c], for backward-data). Padded channels stay zero.
void winof_weights(WinoF *wn, const float *w, bool turned) {
  const int64_t o_n = turned ? wn->ci : wn->co, c_n = turned ? wn->co : wn->ci;  // w's (O, C)
  per_output(o_n, [&](int64_t o) {
    for (int64_t c = 0; c < c_n; ++c) {
      float g[9], t[4][3];
      for (int k = 0; k < 9; ++k) g[k] = w[(o * c_n + c) * 9 + (turned ? 8 - k : k)];
      for (int q = 0; q < 3; ++q) {
        t[0][q] = g[q], t[1][q] = 0.5f * (g[q] + g[3 + q] + g[6 + q]);
        t[2][q] = 0.5f * (g[q] - g[3 + q] + g[6 + q]), t[3][q] = g[6 + q];
      }
      // The matmul's rows are the input's channels: c for the forward, o (dy's channels) for backward-data.
      const int64_t row = turned ? o : c, col = turned ? c : o;
      for (int k = 0; k < 4; ++k) {
        const float r[4] = {t[k][0], 0.5f * (t[k][0] + t[k][1] + t[k][2]), 0.5f * (t[k][0] - t[k][1] + t[k][2]),
                            t[k][2]};
        for (int j = 0; j < 4; ++j) wn->u[((k * 4 + j) * wn->cip + row) * wn->cop + col] = r[j];
      }
    }
  });
}

// This thread's own stream on a pool of one: a matmul on it runs on the calling thread, as a chunk's
// transforms do (the runtime's stream would hand it to the pool that is running the chunks). Null if
// oneDNN could not make it.
dnnl_stream_t serial_stream() {
  thread_local Pool one(1);
  thread_local dnnl_stream_t stream = nullptr;
  if (!stream && dnnl_threadpool_interop_stream_create(&stream, runtime().engine, &one) != dnnl_success)
    stream = nullptr;
  return stream;
}

// out = a . b by matmul p on `stream` (serial_stream); false if oneDNN failed.
bool matmul_on(dnnl_stream_t stream, const Prim &p, const Md &a_md, void *a, const Md &b_md, void *b,
               const Md &out_md, void *out) {
  Mem ma(a_md.md, a), mb(b_md.md, b), mo(out_md.md, out);
  Mem scratch(dnnl_primitive_desc_query_md(p.pd, dnnl_query_scratchpad_md, 0), nullptr);
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, ma.m}, {DNNL_ARG_WEIGHTS, mb.m}, {DNNL_ARG_DST, mo.m},
                             {DNNL_ARG_SCRATCHPAD, scratch.m}};
  return dnnl_primitive_execute(p.prim, stream, 4, args) == dnnl_success;
}

// fn(part, t0, count, stream) for each chunk of wn's tiles (t0..t0+count), the chunks shared out in
// contiguous runs, one per thread (`part`); fn returns false where oneDNN failed. Returns the parts.
int per_chunk(const WinoF *wn, const std::function<bool(int, int64_t, int64_t, dnnl_stream_t)> &fn) {
  const int64_t chunks = (wn->tiles + wn->chunk - 1) / wn->chunk;
  Pool &pool = runtime().pool;
  const int parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(pool.get_num_threads(), chunks)));
  std::atomic<int> failed{0};
  pool.parallel_for(parts, [&](int part, int np) {
    dnnl_stream_t stream = serial_stream();
    for (int64_t ch = chunks * part / np; ch < chunks * (part + 1) / np && stream; ++ch) {
      const int64_t t0 = ch * wn->chunk;
      if (!fn(part, t0, std::min(wn->chunk, wn->tiles - t0), stream)) failed = 1;
    }
    if (!stream) failed = 1;
  });
  if (failed) throw Failure{"a Winograd matmul failed"};
  return parts;
}

// out (blocked, cop channels) = the convolution of in (blocked, cip channels) with the weights in wn->u.
void winof_run(WinoF *wn, const float *in, float *out) {
  per_chunk(wn, [&](int, int64_t t0, int64_t count, dnnl_stream_t stream) {
    thread_local std::vector<float> v, m;
    v.resize(static_cast<size_t>(16 * plane_stride(wn->chunk, wn->cip)));
    m.resize(static_cast<size_t>(16 * plane_stride(wn->chunk, wn->cop)));
    // The last chunk may hold fewer tiles: the matmul runs on all its rows (those past `count` hold an
    // earlier chunk's transforms, or zeros), and the output transform reads only the first `count`.
    winof_input_any(wn, in, t0, count, wn->chunk, v.data());
    if (!matmul_on(stream, wn->mm, wn->v, v.data(), wn->uw, wn->u.data(), wn->m, m.data())) return false;
    winof_output_any(wn, m.data(), t0, count, wn->chunk, out);
    return true;
  });
}

// The Winograd problem of a call: in (blocked, b 16 or 8), out (blocked alike), w (O, C, 3, 3) float32,
// stride 1, pad 1 on every side, no dilation, groups or "same"; in and out of one size. Null: it does not
// apply (then oneDNN's direct kernel runs). turned: backward-data (in is dy, out dx). runner/report/flops.py
// conv_path mirrors this rule.
std::shared_ptr<WinoF> winof_of(int *ndims, int64_t **shapes, const char **dtypes, void **params, int in_at, int out_at, int w_at,
                int g_at, bool turned) {
  if (ndims[in_at] != 5 || ndims[out_at] != 5 || ndims[w_at] != 4 || ndims[g_at] != 1 || shapes[g_at][0] != 10)
    return nullptr;
  for (int i : {in_at, out_at, w_at})
    if (std::strcmp(dtypes[i], "float32") != 0) return nullptr;
  const int64_t *in = shapes[in_at], *out = shapes[out_at], *w = shapes[w_at], *p = static_cast<int64_t *>(params[g_at]);
  const int64_t b = in[4], ci = turned ? w[0] : w[1], co = turned ? w[1] : w[0];
  if ((b != 16 && b != 8) || out[4] != b || w[2] != 3 || w[3] != 3) return nullptr;
  if (p[0] != 1 || p[1] != 1 || p[2] != 1 || p[3] != 1 || p[4] != 1 || p[5] != 1) return nullptr;
  if (p[6] != 1 || p[7] != 1 || p[8] != 1 || p[9]) return nullptr;
  if ((ci + b - 1) / b != in[1] || (co + b - 1) / b != out[1] || out[0] != in[0]) return nullptr;
  if (out[2] != in[2] || out[3] != in[3]) return nullptr;
  return get_winof(WinoFKey{in[0], ci, co, in[2], in[3], b});
}

// A forward or backward-data call (pass FWD or BWD_DATA; where x, y, w and the geometry are among the
// parameters, as `call` takes them) by Winograd where winof_of applies, else by oneDNN's kernel.
int winof_call(const char *name, int want, Pass pass, int x_at, int y_at, int w_at, int g_at, int nparam,
               void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  const bool turned = pass == BWD_DATA;  // backward-data: dy in, dx out
  const int in_at = turned ? y_at : x_at, out_at = turned ? x_at : y_at;
  std::shared_ptr<WinoF> held = nparam == want ? winof_of(ndims, shapes, dtypes, params, in_at, out_at, w_at, g_at, turned)
                                                : nullptr;
  WinoF *wn = held.get();
  if (!wn) return call(name, want, nparam, params, ndims, shapes, dtypes, pass, x_at, y_at, w_at, g_at);
  return guarded(name, want, nparam, [&] {
    std::lock_guard<std::mutex> g(runtime().exec_m);
    winof_weights(wn, static_cast<float *>(params[w_at]), turned);
    winof_run(wn, static_cast<float *>(params[in_at]), static_cast<float *>(params[out_at]));
  });
}

// ---- The weight gradient (WinogradBackwardWeights): the forward is Y = A^T [U . V] A per 2x2 output tile,
// U = G w G^T, V = B^T d B; its exact gradient is dw = G^T dU G with dU = sum over tiles of (A dY A^T) . V,
// 16 matmuls over the tiles, which multiply 16 values per tile and channel pair where the direct kernel
// multiplies 36. Two schedules, the transforms the same (winof_input above, winof_grad below):
// - in chunks, where dU (16, cop, cip) fits 512 KB (layers of few channels, e.g. ResNet-18's 64-channel
//   layer1 on 16x16 maps): each thread transforms a chunk of x's tiles (V) and dy's (M = A g A^T), adds
//   M^T . V into its own dU, all in its L2, and the threads' dU are summed and folded to 3x3 at the end.
//   Measured in training on that layer1: 5.7 ms a call against oneDNN's 6.6 (other processes, same hour).
// - every tile at once, where dU is larger (128 channels and more) on even maps up to 8x8: all tiles'
//   V and M written out, one batched matmul on the pool (a chunk's sum would stream dU through memory once
//   per chunk). Why: oneDNN's direct backward-weights kernel is at its slowest on 4x4 maps (ResNet-18's
//   layer3 at 64 px: 135-210 GFLOP/s against 290-320 for the forward, 2-core Zen 4); this took 4.6-5.5
//   against 5.5-7.2 ms there alone (2 threads, 256 channels, batch 64), ~4.5 against 9.4-10.4 in training.
//   On 8x8 maps (layer2, 128 channels) 6.1-6.5 against 7.2-7.3 in training.
// Elsewhere oneDNN's kernel runs. models/conv.py winograd_dw_runs mirrors this rule for flops.py.
bool winof_dw_fits(const WinoF *wn) { return 16 * wn->cip * wn->cop * 4 <= 512 * 1024; }
bool winof_dw_whole(const WinoF *wn) { return wn->h % 2 == 0 && wn->w % 2 == 0 && wn->h * wn->w <= 64; }

// M[xi][tile - t0][o] = (A g A^T)[xi] for dy's 2x2 tiles g (blocked, cop channels) t0..t0+count, in planes
// of `rows` rows; zeros outside the map (the forward dropped those outputs).
template <int B>
inline __attribute__((always_inline)) void winof_grad(const WinoF *wn, const float *dy, int64_t t0, int64_t count,
                                                       int64_t rows, float *m) {
  using V = typename Lanes<B>::v;
  const int64_t nb = wn->cop / B, stride = plane_stride(rows, wn->cop), per_image = wn->th * wn->tw;
  const V zero = {};
  for (int64_t t = t0; t < t0 + count; ++t) {
    const int64_t i = t / per_image, ty = t % per_image / wn->tw, tx = t % wn->tw;
    for (int64_t ob = 0; ob < nb; ++ob) {
      const float *plane = dy + (i * nb + ob) * wn->h * wn->w * B;
      V g[2][2];
      for (int r = 0; r < 2; ++r)
        for (int q = 0; q < 2; ++q) {
          const int64_t y = 2 * ty + r, xx = 2 * tx + q;
          g[r][q] = y < wn->h && xx < wn->w ? load<B>(plane + (y * wn->w + xx) * B) : zero;
        }
      V a[4][2];  // A g, column by column
      for (int q = 0; q < 2; ++q)
        a[0][q] = g[0][q], a[1][q] = g[0][q] + g[1][q], a[2][q] = g[0][q] - g[1][q], a[3][q] = -g[1][q];
      float *out = m + (t - t0) * wn->cop + ob * B;
      for (int k = 0; k < 4; ++k) {
        store<B>(out + (k * 4) * stride, a[k][0]);
        store<B>(out + (k * 4 + 1) * stride, a[k][0] + a[k][1]);
        store<B>(out + (k * 4 + 2) * stride, a[k][0] - a[k][1]);
        store<B>(out + (k * 4 + 3) * stride, -a[k][1]);
      }
    }
  }
}
VECTOR_CLONES void winof_grad_any(const WinoF *wn, const float *dy, int64_t t0, int64_t count, int64_t rows,
                                  float *m) {
  if (wn->b == 16) return winof_grad<16>(wn, dy, t0, count, rows, m);
  return winof_grad<8>(wn, dy, t0, count, rows, m);
}

// G^T x G for b lanes of 4x4 points x: the 3x3 kernels of `count` (<= b) input channels, written to out
// (count x 3 x 3), as dw holds them.
inline __attribute__((always_inline)) void fold_3x3(const float (&x)[4][4][16], int64_t b, int64_t count,
                                                     float *out) {
  float t[3][4][16], r9[3][3][16];
  for (int q = 0; q < 4; ++q)
    for (int64_t k = 0; k < b; ++k) {
      t[0][q][k] = x[0][q][k] + 0.5f * (x[1][q][k] + x[2][q][k]);
      t[1][q][k] = 0.5f * (x[1][q][k] - x[2][q][k]);
      t[2][q][k] = 0.5f * (x[1][q][k] + x[2][q][k]) + x[3][q][k];
    }
  for (int r = 0; r < 3; ++r)
    for (int64_t k = 0; k < b; ++k) {
      r9[r][0][k] = t[r][0][k] + 0.5f * (t[r][1][k] + t[r][2][k]);
      r9[r][1][k] = 0.5f * (t[r][1][k] - t[r][2][k]);
      r9[r][2][k] = 0.5f * (t[r][1][k] + t[r][2][k]) + t[r][3][k];
    }
  for (int64_t k = 0; k < count; ++k)
    for (int r = 0; r < 3; ++r)
      for (int q = 0; q < 3; ++q) out[k * 9 + r * 3 + q] = r9[r][q][k];
}

// dw[o][c] (3x3) = G^T (sum of the parts' dU)[.][o][c] G for output channel o, b input channels at a time.
VECTOR_CLONES void winof_dweight(const WinoF *wn, const std::vector<std::vector<float>> &parts, int np, int64_t o,
                                 float *dw) {
  const int64_t b = wn->b, c = wn->ci, plane = wn->cop * wn->cip;
  for (int64_t c0 = 0; c0 < c; c0 += b) {
    float x[4][4][16] = {};
    for (int part = 0; part < np; ++part)
      for (int p = 0; p < 16; ++p) {
        const float *src = parts[part].data() + p * plane + o * wn->cip + c0;
        for (int64_t k = 0; k < b; ++k) x[p / 4][p % 4][k] += src[k];
      }
    fold_3x3(x, b, std::min(b, c - c0), dw + (o * c + c0) * 9);
  }
}

// Its matmul, made at the first call: dU[xi] (cop x cip) += M[xi]^T . V[xi] over one chunk's tiles, or
// dU[xi] = M[xi]^T . V[xi] over all tiles (whole).
void winof_dw_pass(WinoF *wn, bool whole) {
  std::lock_guard<std::mutex> g(cache_mutex());
  if (wn->dw_mm.prim) return;
  wn->dw_whole = whole;
  const int64_t c = whole ? wn->tiles : wn->chunk, ms = plane_stride(c, wn->cop), vs = plane_stride(c, wn->cip);
  dnnl_dims_t m_d = {16, wn->cop, c}, m_s = {ms, 1, wn->cop}, u_d = {16, wn->cop, wn->cip};
  dnnl_dims_t v_d = {16, c, wn->cip}, v_s = {vs, wn->cip, 1};
  wn->m_t.init_strides(m_d, m_s, 3);  // held as (16, tiles, O): read transposed
  wn->v_all.init_strides(v_d, v_s, 3);
  wn->du.init(u_d, dnnl_abc, dnnl_f32, 3);
  if (whole) {
    matmul_pd(wn->dw_mm, wn->m_t, wn->v_all, wn->du, "Winograd backward-weights matmul");
    wn->v_buf.resize(static_cast<size_t>(16 * vs));
    wn->m_buf.resize(static_cast<size_t>(16 * ms));
    return;
  }
  dnnl_post_ops_t sum;
  check(dnnl_post_ops_create(&sum), "dnnl_post_ops_create");
  check(dnnl_post_ops_append_sum(sum, 1.0f, 0, dnnl_data_type_undef), "dnnl_post_ops_append_sum");
  dnnl_primitive_attr_t attr = user_scratchpad();
  dnnl_status_t st = dnnl_primitive_attr_set_post_ops(attr, sum);
  dnnl_post_ops_destroy(sum);
  if (st == dnnl_success)
    st = dnnl_matmul_primitive_desc_create(&wn->dw_mm.pd, runtime().engine, wn->m_t.md, wn->v_all.md, nullptr,
                                           wn->du.md, attr);
  dnnl_primitive_attr_destroy(attr);
  check(st, "Winograd backward-weights matmul");
  check(dnnl_primitive_create(&wn->dw_mm.prim, wn->dw_mm.pd), "Winograd backward-weights matmul");
}

// Every tile at once: each thread transforms a contiguous run of tiles into the shared V and M, then one
// matmul on the pool.
void winof_dw_all_tiles(WinoF *wn, const float *x, const float *dy) {
  const int64_t tiles = wn->tiles, runs = (tiles + 31) / 32;
  wn->dw_parts.resize(1);
  wn->dw_parts[0].resize(static_cast<size_t>(16 * wn->cop * wn->cip));
  float *v = wn->v_buf.data(), *m = wn->m_buf.data();
  per_output(runs, [&](int64_t r) {
    const int64_t t0 = r * 32, count = std::min<int64_t>(32, tiles - t0);
    winof_input_any(wn, x, t0, count, tiles, v + t0 * wn->cip);
    winof_grad_any(wn, dy, t0, count, tiles, m + t0 * wn->cop);
  });
  run_matmul(wn->dw_mm, wn->m_t, m, wn->v_all, v, wn->du, wn->dw_parts[0].data(), "Winograd matmul");
}

// dw from x and dy (winof_dw_pass made its matmul).
void winof_backward_weights(WinoF *wn, const float *x, const float *dy, float *dw) {
  if (wn->dw_whole) {
    winof_dw_all_tiles(wn, x, dy);
    per_output(wn->co, [&](int64_t o) { winof_dweight(wn, wn->dw_parts, 1, o, dw); });
    return;
  }
  const size_t du_size = static_cast<size_t>(16 * wn->cop * wn->cip);
  wn->dw_parts.resize(static_cast<size_t>(runtime().pool.get_num_threads()));
  for (auto &du : wn->dw_parts) du.assign(du_size, 0.0f);
  const int parts = per_chunk(wn, [&](int part, int64_t t0, int64_t count, dnnl_stream_t stream) {
    thread_local std::vector<float> v, m;
    const int64_t vs = plane_stride(wn->chunk, wn->cip), ms = plane_stride(wn->chunk, wn->cop);
    v.resize(static_cast<size_t>(16 * vs));
    m.resize(static_cast<size_t>(16 * ms));
    winof_input_any(wn, x, t0, count, wn->chunk, v.data());
    winof_grad_any(wn, dy, t0, count, wn->chunk, m.data());
    if (count < wn->chunk)  // the rows past the last tile must add nothing to the sums
      for (int p = 0; p < 16; ++p) {
        std::fill(v.begin() + p * vs + count * wn->cip, v.begin() + p * vs + wn->chunk * wn->cip, 0.0f);
        std::fill(m.begin() + p * ms + count * wn->cop, m.begin() + p * ms + wn->chunk * wn->cop, 0.0f);
      }
    return matmul_on(stream, wn->dw_mm, wn->m_t, m.data(), wn->v_all, v.data(), wn->du, wn->dw_parts[part].data());
  });
  per_output(wn->co, [&](int64_t o) { winof_dweight(wn, wn->dw_parts, parts, o, dw); });
}

}  // namespace

extern "C" {

// Forward by Winograd F(2x2, 3x3) where winof_of applies (blocked.conv_op(winograd=True) asks for it on the
// layers where it pays), else oneDNN's convolution: x, w, geometry -> y, as ConvForward. Its backward:
// WinofBackwardData and WinogradBackwardWeights.
int WinofForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return winof_call("WinofForward", 4, FWD, 0, 3, 1, 2, nparam, params, ndims, shapes, dtypes);
}

// Backward data by Winograd F(2x2, 3x3), as ConvBackwardData: dy, w, x (for its shape), geometry -> dx.
int WinofBackwardData(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return winof_call("WinofBackwardData", 5, BWD_DATA, 4, 0, 1, 3, nparam, params, ndims, shapes, dtypes);
}

// ConvForward under another name: the forward whose backward is WinogradBackwardWeights (blocked.conv_op).
int WinogradForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return call("WinogradForward", 4, nparam, params, ndims, shapes, dtypes, FWD, 0, 3, 1, 2);
}

// Backward weights as ConvBackwardWeights (x, dy, w for its shape, geometry -> dw), by Winograd where
// winof_of applies and dU fits a thread's share (in chunks) or the map is even and at most 8x8 (every tile
// at once), else oneDNN's kernel: blocked.conv_op(winograd_dw=True) asks for it on the layers where it pays.
int WinogradBackwardWeights(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *,
                            void *) {
  std::shared_ptr<WinoF> held;
  WinoF *wn = nullptr;
  try {
    if (nparam == 5) held = winof_of(ndims, shapes, dtypes, params, 0, 1, 2, 3, false), wn = held.get();
    if (wn && !wn->dw_failed && (winof_dw_fits(wn) || winof_dw_whole(wn))) {
      try {
        winof_dw_pass(wn, !winof_dw_fits(wn));
      } catch (const Failure &) {
        wn->dw_failed = true;
        throw;
      }
    } else {
      wn = nullptr;
    }
  } catch (const Failure &f) {  // a matmul could not be made: oneDNN's direct kernel computes the gradient
    std::fprintf(stderr, "model.conv blocked body: WinogradBackwardWeights: %s; oneDNN's kernel runs\n",
                 f.what.c_str());
    wn = nullptr;
  }
  if (!wn)
    return call("ConvBackwardWeights", 5, nparam, params, ndims, shapes, dtypes, BWD_WEIGHTS, 0, 1, 4, 3);
  return guarded("WinogradBackwardWeights", 5, nparam, [&] {
    std::lock_guard<std::mutex> g(runtime().exec_m);
    winof_backward_weights(wn, static_cast<float *>(params[0]), static_cast<float *>(params[1]),
                           static_cast<float *>(params[4]));
  });
}
}
