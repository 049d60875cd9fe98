// Dense convolutions (DenseForward, DenseBackwardData, DenseBackwardWeights): a layer4 convolution as one
// matmul over the blocked tensors.
#pragma once

#include "conv.h"

namespace {

// ---- Dense convolutions on blocked memory (blocked.dense_op): layers whose every output pixel's window
// covers the whole input (layer4's 3x3 pad-1 convolutions on 2x2 maps). Then the convolution is one
// matmul over the blocked tensors as they lie: one sample of x (N, C/b, H, W, b) is a row of
// X[N, K = C/b*H*W*b], y's rows are Y[N, M = O/b*OH*OW*b] in the same way, and Y = X . W' with
// W'[(cb, h, w, ci), (ob, oh, ow, oi)] = weight[o, c, h - oh*sh + pt, w - ow*sw + pl] (zero where that tap
// is outside the kernel, or c or o is a padded channel). With a stride and no dilation each (input pixel,
// output pixel) pair is joined by at most one tap, so this equals the convolution for any geometry; it is
// only worth it where W' is dense (models/conv.py dense_feasible). Measured in one ResNet-18 training step
// (64 px, batch 64, 2-core EPYC Zen 4, AVX-512, machine loaded ~4): a layer4 3x3 convolution took 8.9 / 8.8
// / 15.1 ms (forward, backward-data, backward-weights, oneDNN's direct kernels) and 3 x 1.3 ms of weight
// reorders; these three matmuls 6.6 ms each, building W' (twice) and folding dW' ~3.5 ms each. W' is built
// again for the backward-data pass rather than handed over from the forward as a workspace output: that
// was slower (forward + backward 30-42 ms against 23-32, 4 alternated runs, same machine and load), its
// 16 MB written into memory MindSpore hands out fresh at each step.
struct Dense {
  int64_t n, c, h, w, o, kh, kw, oh, ow, sh, sw, pt, pl, b, cb, ob, k_dim, m_dim;
  Prim fwd, bwd_data, bwd_weights;
  Md x, y, wp, wpt, yt;  // X, Y (and their gradients), W', W'^T (and dW'^T), dY^T as matmul operands
  // W'^T (or dW'^T): rebuilt at every call, kept between calls so that its pages are not faulted in anew
  // each time (16 MB for ResNet-18's layer4). Calls hold the runtime's exec_m, so one buffer serves.
  std::vector<float> buf;
};
using DenseKey = std::tuple<Geometry, int>;
Cache<DenseKey, Dense> denses;

std::unique_ptr<Dense> make_dense(const DenseKey &key) {
  auto [gm, b] = key;
  auto d = std::make_unique<Dense>();
  d->n = gm.n, d->c = gm.c, d->h = gm.h, d->w = gm.w, d->o = gm.o, d->kh = gm.kh, d->kw = gm.kw;
  d->sh = gm.sh, d->sw = gm.sw, d->pt = gm.pt, d->pl = gm.pl, d->b = b;
  d->oh = out_side(gm.h, gm.kh, gm.sh, gm.pt + gm.pb, 1), d->ow = out_side(gm.w, gm.kw, gm.sw, gm.pl + gm.pr, 1);
  d->cb = (gm.c + b - 1) / b, d->ob = (gm.o + b - 1) / b;
  d->k_dim = d->cb * gm.h * gm.w * b, d->m_dim = d->ob * d->oh * d->ow * b;
  const int64_t n = gm.n, k = d->k_dim, m = d->m_dim;
  // W' is held transposed (M x K, row-major): then building it and folding its gradient walk rows.
  dnnl_dims_t x_d = {n, k}, y_d = {n, m}, wp_d = {k, m}, wpt_d = {m, k}, yt_d = {m, n};
  d->x.init(x_d, dnnl_ab, dnnl_f32, 2);
  d->y.init(y_d, dnnl_ab, dnnl_f32, 2);
  d->wp.init(wp_d, dnnl_ba, dnnl_f32, 2);  // W'^T's buffer read as W'
  d->wpt.init(wpt_d, dnnl_ab, dnnl_f32, 2);
  d->yt.init(yt_d, dnnl_ba, dnnl_f32, 2);  // dY's buffer read as dY^T
  matmul_pd(d->fwd, d->x, d->wp, d->y, "dense convolution matmul");                             // Y = X . W'
  matmul_pd(d->bwd_data, d->y, d->wpt, d->x, "dense convolution backward-data matmul");         // dX = dY . W'^T
  matmul_pd(d->bwd_weights, d->yt, d->x, d->wpt, "dense convolution backward-weights matmul");  // dW'^T = dY^T . X
  d->buf.resize(static_cast<size_t>(k * m));
  return d;
}

std::shared_ptr<Dense> get_dense(const DenseKey &key) {
  return denses.get(key, [&] { return make_dense(key); });
}

// The tap joining input pixel (y, x) and output pixel (oy, ox), as kh * kw + kw; -1: none.
int64_t dense_tap(const Dense *d, int64_t y, int64_t x, int64_t oy, int64_t ox) {
  const int64_t i = y - oy * d->sh + d->pt, j = x - ox * d->sw + d->pl;
  return i >= 0 && i < d->kh && j >= 0 && j < d->kw ? i * d->kw + j : -1;
}

// One block of W'^T (b floats): a constant length where b is oneDNN's 16 or 8, so that it is one or two
// vector moves in each clone below; any other b (none on today's CPUs) element by element.
template <int B>
inline void move_block(float *__restrict dst, const float *__restrict src) {
  for (int i = 0; i < B; ++i) dst[i] = src[i];
}
template <int B>
inline void add_block(float *__restrict dst, const float *__restrict src) {
  for (int i = 0; i < B; ++i) dst[i] += src[i];
}
inline void move_block(float *__restrict dst, const float *__restrict src, int64_t b) {
  if (b == 16) return move_block<16>(dst, src);
  if (b == 8) return move_block<8>(dst, src);
  for (int64_t i = 0; i < b; ++i) dst[i] = src[i];
}
inline void add_block(float *__restrict dst, const float *__restrict src, int64_t b) {
  if (b == 16) return add_block<16>(dst, src);
  if (b == 8) return add_block<8>(dst, src);
  for (int64_t i = 0; i < b; ++i) dst[i] += src[i];
}

// Output channel o's W'^T rows (one per output pixel) from its weights wo (C, kh, kw), staged tap-major in
// t (kh*kw rows of cb*b floats, padded channels zero, then b zeros): each block of a row is one move.
// Why: gathering the blocks straight from (C, kh, kw), one float at a stride of kh*kw, compiled to scalar
// stores (16 to each cache line of a 16 MB matrix) and took 4.4% of a ResNet-18 64 px step (perf, 2-core
// Zen 4). Plain loops, no lambdas: a lambda is a function of its own, compiled without the clone's ISA.
VECTOR_CLONES void build_rows(const Dense *d, int64_t o, const float *wo, float *t, float *wpt) {
  const int64_t b = d->b, k = d->k_dim, kk = d->kh * d->kw, cp = d->cb * b;
  const float *zeros = t + kk * cp;  // b zeros after the staged taps
  std::fill_n(t + kk * cp, b, 0.0f);
  if (o < d->o) {
    for (int64_t c = 0; c < d->c; ++c)
      for (int64_t tap = 0; tap < kk; ++tap) t[tap * cp + c] = wo[c * kk + tap];
    for (int64_t tap = 0; tap < kk; ++tap) std::fill(t + tap * cp + d->c, t + (tap + 1) * cp, 0.0f);
  }
  for (int64_t oy = 0; oy < d->oh; ++oy)
    for (int64_t ox = 0; ox < d->ow; ++ox) {
      float *row = wpt + (((o / b * d->oh + oy) * d->ow + ox) * b + o % b) * k;
      if (o >= d->o) {  // a padded output channel: its rows are zero
        std::fill_n(row, k, 0.0f);
        continue;
      }
      for (int64_t cb = 0; cb < d->cb; ++cb)
        for (int64_t y = 0; y < d->h; ++y)
          for (int64_t x = 0; x < d->w; ++x) {
            const int64_t tap = dense_tap(d, y, x, oy, ox);
            move_block(row + ((cb * d->h + y) * d->w + x) * b, tap < 0 ? zeros : t + tap * cp + cb * b, b);
          }
    }
}

// Output channel o's weight gradient (C, kh, kw) from its rows of dW'^T: each tap sums the blocks of the
// pixel pairs it joins, in t (tap-major, as build_rows stages), then t is written out channel-major. The
// sums run in the order the pairs come, as before this staging: the result is the same to the bit.
VECTOR_CLONES void fold_rows(const Dense *d, int64_t o, const float *dwpt, float *t, float *dwo) {
  const int64_t b = d->b, k = d->k_dim, kk = d->kh * d->kw, cp = d->cb * b;
  std::fill_n(t, kk * cp, 0.0f);
  for (int64_t oy = 0; oy < d->oh; ++oy)
    for (int64_t ox = 0; ox < d->ow; ++ox) {
      const float *row = dwpt + (((o / b * d->oh + oy) * d->ow + ox) * b + o % b) * k;
      for (int64_t cb = 0; cb < d->cb; ++cb)
        for (int64_t y = 0; y < d->h; ++y)
          for (int64_t x = 0; x < d->w; ++x) {
            const int64_t tap = dense_tap(d, y, x, oy, ox);
            if (tap >= 0) add_block(t + tap * cp + cb * b, row + ((cb * d->h + y) * d->w + x) * b, b);
          }
    }
  for (int64_t c = 0; c < d->c; ++c)
    for (int64_t tap = 0; tap < kk; ++tap) dwo[c * kk + tap] = t[tap * cp + c];
}

// W'^T (M x K, the layout both matmuls read it in) from the (O, C, kh, kw) weight, into d->buf, by output
// channel: its writes are sequential, its reads stay in one channel's weights (in L1). Tiles of W' instead
// (b x b per pixel pair) wrote 64 bytes per page: TLB-bound, 3x slower.
void build_dense_weight(Dense *d, const float *weight) {
  per_output(d->ob * d->b, [&](int64_t o) {
    thread_local std::vector<float> t;
    t.resize(static_cast<size_t>((d->kh * d->kw * d->cb + 1) * d->b));
    build_rows(d, o, weight + std::min(o, d->o - 1) * d->c * d->kh * d->kw, t.data(), d->buf.data());
  });
}

// The (O, C, kh, kw) weight gradient from dW'^T in d->buf.
void fold_dense_weight(Dense *d, float *dweight) {
  per_output(d->o, [&](int64_t o) {
    thread_local std::vector<float> t;
    t.resize(static_cast<size_t>(d->kh * d->kw * d->cb * d->b));
    fold_rows(d, o, d->buf.data(), t.data(), dweight + o * d->c * d->kh * d->kw);
  });
}

// The dense convolution's shape from its operator's tensors: x blocked (N, C/b, H, W, b), y blocked
// (N, O/b, OH, OW, b), w (O, C, kh, kw), geometry as `call` reads it (no groups, dilation or "same").
std::shared_ptr<Dense> dense_of(int *ndims, int64_t **shapes, const char **dtypes, void **params, int x_at, int y_at, int w_at,
                int g_at) {
  if (ndims[x_at] != 5 || ndims[y_at] != 5 || ndims[w_at] != 4) throw Failure{"takes blocked x, y and a 4-d weight"};
  for (int i : {x_at, y_at, w_at})
    if (std::strcmp(dtypes[i], "float32") != 0) throw Failure{std::string("takes float32, got ") + dtypes[i]};
  if (ndims[g_at] != 1 || shapes[g_at][0] != 10) throw Failure{"takes 10 geometry values"};
  const int64_t *x = shapes[x_at], *y = shapes[y_at], *w = shapes[w_at], *p = static_cast<int64_t *>(params[g_at]);
  if (p[6] != 1 || p[7] != 1 || p[8] != 1 || p[9]) throw Failure{"has no dilation, groups or pad_mode='same'"};
  const int b = static_cast<int>(x[4]);
  if (y[4] != b || (w[1] + b - 1) / b != x[1] || (w[0] + b - 1) / b != y[1])
    throw Failure{"blocks do not hold the channels"};
  Geometry gm{x[0], w[1], x[2], x[3], w[0], w[2], w[3], p[0], p[1], p[2], p[3], p[4], p[5], 1, 1, 1};
  std::shared_ptr<Dense> d = get_dense(DenseKey{gm, b});
  if (y[0] != d->n || y[2] != d->oh || y[3] != d->ow) throw Failure{"output shape does not match the geometry"};
  return d;
}

}  // namespace

extern "C" {

// Dense convolution forward on blocked memory: x (N, C/b, H, W, b), w (O, C, kh, kw), geometry -> y (N, O/b,
// OH, OW, b), padded channels zero.
int DenseForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return guarded("DenseForward", 4, nparam, [&] {
    std::shared_ptr<Dense> held = dense_of(ndims, shapes, dtypes, params, 0, 3, 1, 2);
    Dense *d = held.get();
    std::lock_guard<std::mutex> g(runtime().exec_m);
    build_dense_weight(d, static_cast<float *>(params[1]));
    run_matmul(d->fwd, d->x, params[0], d->wp, d->buf.data(), d->y, params[3], "dense convolution");
  });
}

// Backward data: dy (blocked), w, x (for its shape), geometry -> dx (blocked; padded channels zero, as W'
// has zero rows for them).
int DenseBackwardData(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return guarded("DenseBackwardData", 5, nparam, [&] {
    std::shared_ptr<Dense> held = dense_of(ndims, shapes, dtypes, params, 2, 0, 1, 3);
    Dense *d = held.get();
    std::lock_guard<std::mutex> g(runtime().exec_m);
    build_dense_weight(d, static_cast<float *>(params[1]));
    run_matmul(d->bwd_data, d->y, params[0], d->wpt, d->buf.data(), d->x, params[4],
               "dense convolution backward-data");
  });
}

// Backward weights: x (blocked), dy (blocked), w (for its shape), geometry -> dw (O, C, kh, kw).
int DenseBackwardWeights(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *,
                         void *) {
  return guarded("DenseBackwardWeights", 5, nparam, [&] {
    std::shared_ptr<Dense> held = dense_of(ndims, shapes, dtypes, params, 0, 1, 2, 3);
    Dense *d = held.get();
    std::lock_guard<std::mutex> g(runtime().exec_m);
    run_matmul(d->bwd_weights, d->yt, params[1], d->x, params[0], d->wpt, d->buf.data(),
               "dense convolution backward-weights");
    fold_dense_weight(d, static_cast<float *>(params[4]));
  });
}
}
