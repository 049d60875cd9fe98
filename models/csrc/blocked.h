// ---- Blocked bodies (models/blocked.py): a ResNet's body kept in oneDNN's nChw{b}c memory between layers.
// A blocked tensor reaches MindSpore as float32 (N, ceil(C/b), H, W, b), channels past C zero; only the
// operators below (and the convolutions and pools above, given 5-d tensors) read one.
#pragma once

#include "runtime.h"

namespace {

// Converts one shape between plain NCHW and nChw{b}c; to_blocked picks the direction.
struct Convert {
  Md plain, blocked;
  Reorder to, from;
};
using ConvertKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int>;
Cache<ConvertKey, Convert> converts;

std::unique_ptr<Convert> make_convert(const ConvertKey &key) {
  auto [n, c, h, w, b] = key;
  auto cv = std::make_unique<Convert>();
  dnnl_dims_t d = {n, c, h, w};
  cv->plain.init(d, dnnl_nchw, dnnl_f32);
  cv->blocked.init(d, blocked_tag(b), dnnl_f32);
  make_reorder(cv->to, cv->plain.md, cv->blocked.md, runtime().engine);
  make_reorder(cv->from, cv->blocked.md, cv->plain.md, runtime().engine);
  return cv;
}

std::shared_ptr<Convert> get_convert(const ConvertKey &key) {
  return converts.get(key, [&] { return make_convert(key); });
}

void convert(bool to_blocked, const int64_t *plain, const int64_t *blocked, void *src, void *dst) {
  std::shared_ptr<Convert> cv = get_convert(ConvertKey{plain[0], plain[1], plain[2], plain[3], static_cast<int>(blocked[4])});
  if ((plain[1] + blocked[4] - 1) / blocked[4] != blocked[1]) throw Failure{"blocked shape does not hold the channels"};
  Runtime &rt = runtime();
  std::lock_guard<std::mutex> g(rt.exec_m);
  Mem a(to_blocked ? cv->plain.md : cv->blocked.md, src), z(to_blocked ? cv->blocked.md : cv->plain.md, dst);
  reorder(to_blocked ? cv->to : cv->from, a.m, z.m);
  check(dnnl_stream_wait(rt.stream), "dnnl_stream_wait");
}

// BatchNorm (scale and shift: gamma, beta) on a blocked tensor, its ReLU fused where asked: with batch
// statistics (computed, and given out) or global ones (the running statistics, given in: evaluation, and
// a frozen BatchNorm that still passes gradients back). Both keep the ReLU's mask for the backward.
struct Bn {
  Md data, stat;
  Prim fwd, bwd;
  size_t ws_bytes = 0;
};
// N C H W b relu global, epsilon's bits
using BnKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int, bool, bool, int64_t>;
Cache<BnKey, Bn> bns;

std::unique_ptr<Bn> make_bn(const BnKey &key) {
  auto [n, c, h, w, b, relu, global, eps_bits] = key;
  double eps;
  std::memcpy(&eps, &eps_bits, sizeof eps);
  dnnl_engine_t eng = runtime().engine;
  auto bn = std::make_unique<Bn>();
  dnnl_dims_t d = {n, c, h, w}, cd = {c};
  bn->data.init(d, blocked_tag(b), dnnl_f32);
  bn->stat.init(cd, dnnl_a, dnnl_f32, 1);
  unsigned flags = dnnl_use_scale | dnnl_use_shift | (relu ? dnnl_fuse_norm_relu : 0U) | (global ? dnnl_use_global_stats : 0U);
  dnnl_primitive_attr_t attr = user_scratchpad();
  dnnl_status_t st = dnnl_batch_normalization_forward_primitive_desc_create(
      &bn->fwd.pd, eng, dnnl_forward_training, bn->data.md, bn->data.md,
      static_cast<float>(eps), flags, attr);
  if (st == dnnl_success)
    st = dnnl_batch_normalization_backward_primitive_desc_create(&bn->bwd.pd, eng, dnnl_backward, bn->data.md,
                                                                 bn->data.md, bn->data.md, static_cast<float>(eps),
                                                                 flags, bn->fwd.pd, attr);
  dnnl_primitive_attr_destroy(attr);
  check(st, "batch normalization primitive descriptor");
  check(dnnl_primitive_create(&bn->fwd.prim, bn->fwd.pd), "dnnl_primitive_create (batch normalization)");
  check(dnnl_primitive_create(&bn->bwd.prim, bn->bwd.pd), "dnnl_primitive_create (bn backward)");
  bn->ws_bytes = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(bn->fwd.pd, dnnl_query_workspace_md, 0));
  return bn;
}

std::shared_ptr<Bn> get_bn(const BnKey &key) {
  return bns.get(key, [&] { return make_bn(key); });
}

// The key of a BatchNorm on blocked x with c channels; cfg: (relu, epsilon's float64 bits, global).
BnKey bn_key(const int64_t *x, int64_t c, void *cfg) {
  const int64_t *p = static_cast<int64_t *>(cfg);
  if ((c + x[4] - 1) / x[4] != x[1]) throw Failure{"blocked input does not hold gamma's channels"};
  return BnKey{x[0], c, x[2], x[3], static_cast<int>(x[4]), p[0] != 0, p[2] != 0, p[1]};
}

// The block size oneDNN chooses for a ResNet convolution's activations on this CPU (16 with AVX-512, 8
// with AVX2), if it runs fast kernels for all three passes on nChw{b}c; 0 where it does not.
int choose_block() {
  dnnl_engine_t eng = runtime().engine;
  dnnl_dims_t d = {32, 64, 16, 16}, wd = {64, 64, 3, 3}, strides = {1, 1}, dil = {0, 0}, pad = {1, 1};
  Md any(d, dnnl_format_tag_any), wany(wd, dnnl_format_tag_any);
  int chosen = 0;
  dnnl_primitive_desc_t pd = nullptr;
  if (dnnl_convolution_forward_primitive_desc_create(&pd, eng, dnnl_forward_training, dnnl_convolution_direct, any.md,
                                                     wany.md, nullptr, any.md, strides, dil, pad, pad,
                                                     nullptr) == dnnl_success) {
    const_dnnl_memory_desc_t dst = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    for (int b : {16, 8, 4}) {
      Md blocked(d, blocked_tag(b));
      if (dnnl_memory_desc_equal(dst, blocked.md)) chosen = b;
    }
    dnnl_primitive_desc_destroy(pd);
  }
  // oneDNN may prefer NHWC for "any" (brgconv); its blocked direct kernels are then asked for by name.
  for (int b : {chosen, 16, 8}) {
    if (!b) continue;
    Md blocked(d, blocked_tag(b));
    bool fast = true;
    dnnl_primitive_desc_t f = nullptr, bd = nullptr, bw = nullptr;
    fast = dnnl_convolution_forward_primitive_desc_create(&f, eng, dnnl_forward_training, dnnl_convolution_direct,
                                                          blocked.md, wany.md, nullptr, blocked.md, strides, dil, pad,
                                                          pad, nullptr) == dnnl_success &&
           fast_impl(f);
    fast = fast &&
           dnnl_convolution_backward_data_primitive_desc_create(&bd, eng, dnnl_convolution_direct, blocked.md, wany.md,
                                                                blocked.md, strides, dil, pad, pad, f,
                                                                nullptr) == dnnl_success &&
           fast_impl(bd);
    fast = fast &&
           dnnl_convolution_backward_weights_primitive_desc_create(&bw, eng, dnnl_convolution_direct, blocked.md,
                                                                   wany.md, nullptr, blocked.md, strides, dil, pad,
                                                                   pad, f, nullptr) == dnnl_success &&
           fast_impl(bw);
    for (auto p : {f, bd, bw})
      if (p) dnnl_primitive_desc_destroy(p);
    if (fast) return b;
  }
  return 0;
}

}  // namespace

extern "C" {

// The block size of this CPU's blocked bodies (see choose_block); 0: none; -1: oneDNN failed.
int BlockSize() {
  try {
    static int b = choose_block();
    return b;
  } catch (const Failure &) {
    return -1;
  }
}

// Plain (N, C, H, W), like (C) (only its shape counts) -> blocked (N, C/b, H, W, b), float32.
int ToBlocked(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  return guarded("ToBlocked", 3, nparam, [&] {
    if (ndims[0] != 4 || ndims[2] != 5) throw Failure{"takes (N, C, H, W) to (N, C/b, H, W, b)"};
    convert(true, shapes[0], shapes[2], params[0], params[2]);
  });
}

// Blocked (N, C/b, H, W, b), like (C) -> plain (N, C, H, W), float32.
int FromBlocked(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  return guarded("FromBlocked", 3, nparam, [&] {
    if (ndims[0] != 5 || ndims[2] != 4) throw Failure{"takes (N, C/b, H, W, b) to (N, C, H, W)"};
    convert(false, shapes[2], shapes[0], params[0], params[2]);
  });
}

// The workspace (the fused ReLU's mask) at `at` added to a BatchNorm's arguments, where it has one; the
// returned memory must outlive the execution.
static std::unique_ptr<Mem> bn_workspace(Bn *bn, void *at, std::vector<dnnl_exec_arg_t> &args) {
  if (!bn->ws_bytes) return nullptr;
  auto ws = std::make_unique<Mem>(dnnl_primitive_desc_query_md(bn->fwd.pd, dnnl_query_workspace_md, 0), at);
  args.push_back({DNNL_ARG_WORKSPACE, ws->m});
  return ws;
}

// BatchNorm forward on the blocked tensor at params[x]: statistics computed (training) or read (global) at
// params[mean], params[var]; gamma, beta at params[1], params[2]; y at params[y]; the workspace (the fused
// ReLU's mask; bytes) at params[7].
static void bn_forward(Bn *bn, void **params, int64_t **shapes, int y_at, int mean_at, int var_at, const char *what) {
  if (shapes[7][0] < static_cast<int64_t>(bn->ws_bytes)) throw Failure{"workspace too small"};
  std::lock_guard<std::mutex> g(runtime().exec_m);
  Mem x(bn->data.md, params[0]), y(bn->data.md, params[y_at]), gamma(bn->stat.md, params[1]),
      beta(bn->stat.md, params[2]), mean(bn->stat.md, params[mean_at]), var(bn->stat.md, params[var_at]);
  std::vector<dnnl_exec_arg_t> args = {{DNNL_ARG_SRC, x.m},       {DNNL_ARG_DST, y.m},
                                       {DNNL_ARG_SCALE, gamma.m}, {DNNL_ARG_SHIFT, beta.m},
                                       {DNNL_ARG_MEAN, mean.m},   {DNNL_ARG_VARIANCE, var.m}};
  std::unique_ptr<Mem> ws = bn_workspace(bn, params[7], args);
  execute(bn->fwd.pd, bn->fwd.prim, args, what);
}

// BatchNorm training forward: x, gamma (C), beta (C), cfg (relu, eps bits) -> y, batch mean (C), batch
// variance (C, biased, as normalization uses it), workspace.
int BnTrainForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  return guarded("BnTrainForward", 8, nparam, [&] {
    if (ndims[0] != 5) throw Failure{"takes a blocked tensor"};
    bn_forward(get_bn(bn_key(shapes[0], shapes[1][0], params[3])).get(), params, shapes, 4, 5, 6, "batch normalization");
  });
}

// BatchNorm with global statistics: x, gamma, beta, running mean, running variance, cfg -> y, workspace.
int BnGlobalForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  return guarded("BnGlobalForward", 8, nparam, [&] {
    if (ndims[0] != 5) throw Failure{"takes a blocked tensor"};
    bn_forward(get_bn(bn_key(shapes[0], shapes[1][0], params[5])).get(), params, shapes, 6, 3, 4,
               "batch normalization (global statistics)");
  });
}

// BatchNorm backward: dy, x, gamma, batch mean, batch variance, workspace, cfg -> dx, dgamma, dbeta.
int BnBackward(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  return guarded("BnBackward", 10, nparam, [&] {
    if (ndims[0] != 5) throw Failure{"takes a blocked tensor"};
    std::shared_ptr<Bn> held = get_bn(bn_key(shapes[1], shapes[2][0], params[6]));
    Bn *bn = held.get();
    std::lock_guard<std::mutex> g(runtime().exec_m);
    Mem dy(bn->data.md, params[0]), x(bn->data.md, params[1]), gamma(bn->stat.md, params[2]),
        mean(bn->stat.md, params[3]), var(bn->stat.md, params[4]), dx(bn->data.md, params[7]),
        dgamma(bn->stat.md, params[8]), dbeta(bn->stat.md, params[9]);
    std::vector<dnnl_exec_arg_t> args = {{DNNL_ARG_DIFF_DST, dy.m},      {DNNL_ARG_SRC, x.m},
                                         {DNNL_ARG_SCALE, gamma.m},      {DNNL_ARG_MEAN, mean.m},
                                         {DNNL_ARG_VARIANCE, var.m},     {DNNL_ARG_DIFF_SRC, dx.m},
                                         {DNNL_ARG_DIFF_SCALE, dgamma.m}, {DNNL_ARG_DIFF_SHIFT, dbeta.m}};
    std::unique_ptr<Mem> ws = bn_workspace(bn, params[5], args);
    execute(bn->bwd.pd, bn->bwd.prim, args, "batch normalization backward");
  });
}

// The workspace bytes of a BatchNorm on blocked (n, c, h, w) memory with block b.
int64_t BnWorkspaceBytes(int64_t n, int64_t c, int64_t h, int64_t w, int64_t b, int64_t relu, int64_t eps_bits,
                         int64_t global) {
  try {
    return static_cast<int64_t>(
        get_bn(BnKey{n, c, h, w, static_cast<int>(b), relu != 0, global != 0, eps_bits})->ws_bytes);
  } catch (const std::exception &) {
    return -1;
  } catch (const Failure &) {
    return -1;
  }
}

// a, b (same shape) -> relu(a + b): the end of a residual block.
int AddRelu(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  return guarded("AddRelu", 3, nparam, [&] {
    const float *a = static_cast<float *>(params[0]), *b = static_cast<float *>(params[1]);
    float *y = static_cast<float *>(params[2]);
    elementwise(elements(ndims[2], shapes[2]),
                [&](int64_t lo, int64_t hi) { add_relu(a + lo, b + lo, y + lo, hi - lo); });
  });
}

// dy, y (relu's output) -> dy where y > 0, else 0: the gradient of both of AddRelu's inputs.
int ReluBackward(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  return guarded("ReluBackward", 3, nparam, [&] {
    const float *dy = static_cast<float *>(params[0]), *y = static_cast<float *>(params[1]);
    float *dx = static_cast<float *>(params[2]);
    elementwise(elements(ndims[2], shapes[2]),
                [&](int64_t lo, int64_t hi) { relu_mask(dy + lo, y + lo, dx + lo, hi - lo); });
  });
}
}
