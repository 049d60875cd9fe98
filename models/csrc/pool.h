// Max pooling with its workspace (MaxPoolForward, MaxPoolBackward), on plain or blocked memory.
#pragma once

#include "runtime.h"

namespace {

// Max pooling with a workspace (the argmax of each window), so that the backward pass reads where each
// maximum was instead of recomputing the forward (MindSpore's CPU MaxPoolGrad does), on a memory format
// oneDNN has a fast kernel for: plain NCHW if its implementation there is a jit one, else NHWC
// (oneDNN's plain-NCHW pooling is `simple_nchw` on some builds), with reorders at the edges.
// Padding as MindSpore's pad_mode="same": output ceil(in / stride), the odd pad at the bottom/right.
struct Pool2d {
  Md src, dst;          // plain NCHW, as MindSpore holds them
  Md own_src, own_dst;  // the format the primitives run on (the same as plain when that is fast)
  Prim fwd, bwd;
  Reorder src_in, dst_out, dst_in, src_out;  // plain -> own (x, dy), own -> plain (y, dx)
  size_t ws_bytes = 0;
};

using PoolKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int>;  // N C H W k s, block
Cache<PoolKey, Pool2d> pools;

int64_t same_out(int64_t in, int64_t s) { return (in + s - 1) / s; }

std::unique_ptr<Pool2d> make_pool(const PoolKey &key) {
  auto [n, c, h, w, k, s, b] = key;
  dnnl_engine_t eng = runtime().engine;
  auto pl = std::make_unique<Pool2d>();
  int64_t oh = same_out(h, s), ow = same_out(w, s);
  int64_t ph = std::max<int64_t>((oh - 1) * s + k - h, 0), pw = std::max<int64_t>((ow - 1) * s + k - w, 0);
  dnnl_dims_t src_d = {n, c, h, w}, dst_d = {n, c, oh, ow};
  dnnl_dims_t strides = {s, s}, kernel = {k, k}, dil = {0, 0}, pad_l = {ph / 2, pw / 2};
  dnnl_dims_t pad_r = {ph - ph / 2, pw - pw / 2};
  // A blocked body's pool (b > 0) runs on its nChw{b}c memory as it is; c counts the padded channels.
  pl->src.init(src_d, blocked_tag(b), dnnl_f32);
  pl->dst.init(dst_d, blocked_tag(b), dnnl_f32);
  dnnl_primitive_attr_t attr = user_scratchpad();
  dnnl_status_t st = dnnl_success;
  for (dnnl_format_tag_t tag : {blocked_tag(b), dnnl_nhwc}) {
    if (pl->fwd.pd) dnnl_primitive_desc_destroy(pl->fwd.pd), pl->fwd.pd = nullptr;
    if (pl->own_src.md) dnnl_memory_desc_destroy(pl->own_src.md), pl->own_src.md = nullptr;
    if (pl->own_dst.md) dnnl_memory_desc_destroy(pl->own_dst.md), pl->own_dst.md = nullptr;
    pl->own_src.init(src_d, tag, dnnl_f32);
    pl->own_dst.init(dst_d, tag, dnnl_f32);
    st = dnnl_pooling_forward_primitive_desc_create(&pl->fwd.pd, eng, dnnl_forward_training, dnnl_pooling_max,
                                                    pl->own_src.md, pl->own_dst.md, strides, kernel, dil, pad_l,
                                                    pad_r, attr);
    if (st == dnnl_success && fast_impl(pl->fwd.pd)) break;
  }
  if (st == dnnl_success)
    st = dnnl_pooling_backward_primitive_desc_create(&pl->bwd.pd, eng, dnnl_pooling_max, pl->own_src.md,
                                                     pl->own_dst.md, strides, kernel, dil, pad_l, pad_r, pl->fwd.pd,
                                                     attr);
  dnnl_primitive_attr_destroy(attr);
  check(st, "pooling primitive descriptor");
  check(dnnl_primitive_create(&pl->fwd.prim, pl->fwd.pd), "dnnl_primitive_create (pooling)");
  check(dnnl_primitive_create(&pl->bwd.prim, pl->bwd.pd), "dnnl_primitive_create (pooling backward)");
  make_reorder(pl->src_in, pl->src.md, pl->own_src.md, eng);
  make_reorder(pl->dst_out, pl->own_dst.md, pl->dst.md, eng);
  make_reorder(pl->dst_in, pl->dst.md, pl->own_dst.md, eng);
  make_reorder(pl->src_out, pl->own_src.md, pl->src.md, eng);
  pl->ws_bytes = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pl->fwd.pd, dnnl_query_workspace_md, 0));
  return pl;
}

std::shared_ptr<Pool2d> get_pool(const PoolKey &key) {
  return pools.get(key, [&] { return make_pool(key); });
}

// `plain` into a memory of `own`'s format: the same buffer when no reorder is needed.
std::unique_ptr<Mem> into(const Reorder &r, const_dnnl_memory_desc_t own, Mem &plain) {
  if (!r.prim) return nullptr;
  auto m = std::make_unique<Mem>(own, nullptr);
  reorder(r, plain.m, m->m);
  return m;
}

void pool_forward(Pool2d *pl, void *x, void *y, void *ws) {
  Runtime &rt = runtime();
  std::lock_guard<std::mutex> g(rt.exec_m);
  Mem user_x(pl->src.md, x), user_y(pl->dst.md, y);
  auto own_x = into(pl->src_in, pl->own_src.md, user_x);
  std::unique_ptr<Mem> own_y = pl->dst_out.prim ? std::make_unique<Mem>(pl->own_dst.md, nullptr) : nullptr;
  Mem work(dnnl_primitive_desc_query_md(pl->fwd.pd, dnnl_query_workspace_md, 0), ws);
  Mem scratch(dnnl_primitive_desc_query_md(pl->fwd.pd, dnnl_query_scratchpad_md, 0), nullptr);
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, own_x ? own_x->m : user_x.m},
                             {DNNL_ARG_DST, own_y ? own_y->m : user_y.m},
                             {DNNL_ARG_WORKSPACE, work.m},
                             {DNNL_ARG_SCRATCHPAD, scratch.m}};
  check(dnnl_primitive_execute(pl->fwd.prim, rt.stream, 4, args), "pooling");
  if (own_y) reorder(pl->dst_out, own_y->m, user_y.m);
  check(dnnl_stream_wait(rt.stream), "dnnl_stream_wait");
}

void pool_backward(Pool2d *pl, void *dy, void *ws, void *dx) {
  Runtime &rt = runtime();
  std::lock_guard<std::mutex> g(rt.exec_m);
  Mem user_dy(pl->dst.md, dy), user_dx(pl->src.md, dx);
  auto own_dy = into(pl->dst_in, pl->own_dst.md, user_dy);
  std::unique_ptr<Mem> own_dx = pl->src_out.prim ? std::make_unique<Mem>(pl->own_src.md, nullptr) : nullptr;
  Mem work(dnnl_primitive_desc_query_md(pl->fwd.pd, dnnl_query_workspace_md, 0), ws);
  Mem scratch(dnnl_primitive_desc_query_md(pl->bwd.pd, dnnl_query_scratchpad_md, 0), nullptr);
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_DIFF_DST, own_dy ? own_dy->m : user_dy.m},
                             {DNNL_ARG_DIFF_SRC, own_dx ? own_dx->m : user_dx.m},
                             {DNNL_ARG_WORKSPACE, work.m},
                             {DNNL_ARG_SCRATCHPAD, scratch.m}};
  check(dnnl_primitive_execute(pl->bwd.prim, rt.stream, 4, args), "pooling backward");
  if (own_dx) reorder(pl->src_out, own_dx->m, user_dx.m);
  check(dnnl_stream_wait(rt.stream), "dnnl_stream_wait");
}

// The pool's two int64 parameters (kernel, stride) from a tensor of two.
// x: (N, C, H, W), or a blocked (N, C/b, H, W, b).
PoolKey pool_key(const int64_t *x, int ndims, void *ks) {
  const int64_t *p = static_cast<int64_t *>(ks);
  if (ndims == 5) return PoolKey{x[0], x[1] * x[4], x[2], x[3], p[0], p[1], static_cast<int>(x[4])};
  return PoolKey{x[0], x[1], x[2], x[3], p[0], p[1], 0};
}

int pool_call(const char *name, int want, int nparam, int *ndims, const char **dtypes, int x_at,
              const std::function<void()> &body) {
  try {
    if (nparam != want) throw Failure{"expects " + std::to_string(want) + " tensors"};
    if (ndims[x_at] != 4 && ndims[x_at] != 5) throw Failure{"takes a 4-d tensor (N, C, H, W) or a blocked 5-d one"};
    if (std::strcmp(dtypes[x_at], "float32") != 0) throw Failure{std::string("takes float32, got ") + dtypes[x_at]};
    body();
    return 0;
  } catch (const Failure &f) {
    std::fprintf(stderr, "model.conv=onednn: %s %s\n", name, f.what.c_str());
  } catch (const std::exception &e) {
    std::fprintf(stderr, "model.conv=onednn: %s: %s\n", name, e.what());
  }
  return 1;
}

}  // namespace

extern "C" {
// Max pool forward: x (N, C, H, W) float32, (kernel, stride) int64 -> y (N, C, OH, OW), workspace (bytes).
int MaxPoolForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return pool_call("MaxPoolForward", 4, nparam, ndims, dtypes, 0, [&] {
    std::shared_ptr<Pool2d> pl = get_pool(pool_key(shapes[0], ndims[0], params[1]));
    if (shapes[3][0] != static_cast<int64_t>(pl->ws_bytes)) throw Failure{"workspace size mismatch"};
    pool_forward(pl.get(), params[0], params[2], params[3]);
  });
}

// Max pool backward: dy, workspace, x (for its shape), (kernel, stride) -> dx (N, C, H, W).
int MaxPoolBackward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return pool_call("MaxPoolBackward", 5, nparam, ndims, dtypes, 2, [&] {
    std::shared_ptr<Pool2d> pl = get_pool(pool_key(shapes[2], ndims[2], params[3]));
    pool_backward(pl.get(), params[0], params[1], params[4]);
  });
}

// The workspace bytes of a max pool on an (n, c, h, w) float32 input: its output's shape in Python.
int64_t MaxPoolWorkspaceBytes(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t s) {
  try {
    return static_cast<int64_t>(get_pool(PoolKey{n, c, h, w, k, s, 0})->ws_bytes);
  } catch (const Failure &) {
    return -1;
  }
}

// The workspace bytes of a max pool on blocked (n, c/b, h, w, b) memory (c: padded channels).
int64_t BlockedMaxPoolWorkspaceBytes(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t s, int64_t b) {
  try {
    return static_cast<int64_t>(get_pool(PoolKey{n, c, h, w, k, s, static_cast<int>(b)})->ws_bytes);
  } catch (const std::exception &) {
    return -1;
  } catch (const Failure &) {
    return -1;
  }
}
}
