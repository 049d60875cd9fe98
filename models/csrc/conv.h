// Convolutions (ConvForward, ConvBackwardData, ConvBackwardWeights) on plain NCHW or blocked memory by oneDNN's
// own kernels, each pass's primitive asked for its preferred formats, with reorders at the edges.
#pragma once

#include "runtime.h"

namespace {

enum Pass { FWD = 0, BWD_DATA = 1, BWD_WEIGHTS = 2 };

// Every descriptor and primitive for one convolution shape, created on first use and kept.
struct Conv {
  Md src, wei, dst;  // plain, as MindSpore holds them: NCHW activations, OIHW weights, their own dtypes
  Prim pass[3];
  // Per pass, the plain descriptors of its two inputs and one output, the primitive's own formats of
  // them, and the reorders between the two.
  dnnl_memory_desc_t in_plain[3][2], out_plain[3];
  const_dnnl_memory_desc_t in_md[3][2], out_md[3];
  Reorder in_r[3][2], out_r[3];
};

// The geometry (see Geometry), and the dtypes MindSpore holds x (and dx), y (and dy) and w (and dw) in.
struct Geometry {
  int64_t n, c, h, w, o, kh, kw;
  int64_t sh, sw, pt, pb, pl, pr, dh, dw, g;  // strides, paddings, dilations (1: none), groups
  bool operator<(const Geometry &b) const {
    return std::tie(n, c, h, w, o, kh, kw, sh, sw, pt, pb, pl, pr, dh, dw, g) <
           std::tie(b.n, b.c, b.h, b.w, b.o, b.kh, b.kw, b.sh, b.sw, b.pt, b.pb, b.pl, b.pr, b.dh, b.dw, b.g);
  }
};
// ... and the block sizes of x and y: 0 for plain NCHW, else oneDNN's nChw{b}c (blocked.cc, model.conv
// blocked bodies), which the primitive is asked to run on directly.
using Key = std::tuple<Geometry, dnnl_data_type_t, dnnl_data_type_t, dnnl_data_type_t, int, int>;

// The output side of one dimension, as MindSpore's Conv2D computes it.
int64_t out_side(int64_t in, int64_t k, int64_t s, int64_t pad, int64_t d) { return (in + pad - (k - 1) * d - 1) / s + 1; }

// pad_mode="same" as MindSpore pads: output ceil(in / stride), the odd pad after (bottom, right).
void same_pads(int64_t in, int64_t k, int64_t s, int64_t d, int64_t &before, int64_t &after) {
  int64_t out = (in + s - 1) / s, total = std::max<int64_t>((out - 1) * s + (k - 1) * d + 1 - in, 0);
  before = total / 2;
  after = total - before;
}

Cache<Key, Conv> convs;

std::unique_ptr<Conv> make_conv(const Key &key) {
  auto [gm, x_type, y_type, w_type, x_b, y_b] = key;
  dnnl_engine_t eng = runtime().engine;
  auto cv = std::make_unique<Conv>();
  const int64_t n = gm.n, c = gm.c, o = gm.o, g = gm.g;
  dnnl_dims_t src_d = {n, c, gm.h, gm.w};
  // Grouped weights are 5-d for oneDNN, (G, O/G, C/G, kh, kw): the same memory as MindSpore's
  // (O, C/G, kh, kw) in goihw order.
  dnnl_dims_t wei_d = {o, c, gm.kh, gm.kw}, gwei_d = {g, o / g, c / g, gm.kh, gm.kw};
  const int wei_nd = g > 1 ? 5 : 4;
  const int64_t *wd = g > 1 ? gwei_d : wei_d;
  dnnl_dims_t dst_d = {n, o, out_side(gm.h, gm.kh, gm.sh, gm.pt + gm.pb, gm.dh),
                       out_side(gm.w, gm.kw, gm.sw, gm.pl + gm.pr, gm.dw)};
  dnnl_dims_t strides = {gm.sh, gm.sw}, dilates = {gm.dh - 1, gm.dw - 1};
  dnnl_dims_t pad = {gm.pt, gm.pl}, pad_r = {gm.pb, gm.pr};
  // The primitives compute in float32 (as MindSpore's own CPU Conv2D does under AMP); a float16 tensor
  // is converted by the reorder that brings it into (or out of) the primitive's format.
  cv->src.init(src_d, blocked_tag(x_b), x_type);
  cv->wei.init(wd, g > 1 ? dnnl_goihw : dnnl_oihw, w_type, wei_nd);
  cv->dst.init(dst_d, blocked_tag(y_b), y_type);
  Md src_any(src_d, dnnl_format_tag_any), wei_any(wd, dnnl_format_tag_any, dnnl_f32, wei_nd),
      dst_any(dst_d, dnnl_format_tag_any);
  dnnl_primitive_attr_t attr = user_scratchpad();
  auto create = [&](const_dnnl_memory_desc_t s_md, const_dnnl_memory_desc_t d_md) {
    for (auto &p : cv->pass)
      if (p.pd) dnnl_primitive_desc_destroy(p.pd), p.pd = nullptr;
    dnnl_primitive_desc_t *pd = &cv->pass[FWD].pd;
    dnnl_status_t st = dnnl_convolution_forward_primitive_desc_create(
        pd, eng, dnnl_forward_training, dnnl_convolution_direct, s_md, wei_any.md, nullptr, d_md, strides, dilates,
        pad, pad_r, attr);
    if (st == dnnl_success)
      st = dnnl_convolution_backward_data_primitive_desc_create(&cv->pass[BWD_DATA].pd, eng, dnnl_convolution_direct,
                                                                s_md, wei_any.md, d_md, strides, dilates, pad, pad_r,
                                                                *pd, attr);
    if (st == dnnl_success)
      st = dnnl_convolution_backward_weights_primitive_desc_create(
          &cv->pass[BWD_WEIGHTS].pd, eng, dnnl_convolution_direct, s_md, wei_any.md, nullptr, d_md, strides,
          dilates, pad, pad_r, *pd, attr);
    return st;
  };
  // A blocked body's tensors are asked for as they are (no reorders around the call) where oneDNN has a
  // fast kernel on them for all three passes; else the primitives choose and reorders bridge.
  bool direct = false;
  if (x_b || y_b) {
    const_dnnl_memory_desc_t s_md = x_b ? cv->src.md : src_any.md;
    direct = create(s_md, cv->dst.md) == dnnl_success;
    for (auto &p : cv->pass) direct = direct && fast_impl(p.pd);
  }
  dnnl_status_t st = direct ? dnnl_success : create(src_any.md, dst_any.md);
  dnnl_primitive_attr_destroy(attr);
  check(st, "convolution primitive descriptor");
  // Inputs and output of each pass, as (query, plain descriptor).
  const dnnl_query_t in_q[3][2] = {{dnnl_query_src_md, dnnl_query_weights_md},
                                   {dnnl_query_diff_dst_md, dnnl_query_weights_md},
                                   {dnnl_query_src_md, dnnl_query_diff_dst_md}};
  const dnnl_query_t out_q[3] = {dnnl_query_dst_md, dnnl_query_diff_src_md, dnnl_query_diff_weights_md};
  dnnl_memory_desc_t src = cv->src.md, wei = cv->wei.md, dst = cv->dst.md;
  const dnnl_memory_desc_t in_plain[3][2] = {{src, wei}, {dst, wei}, {src, dst}}, out_plain[3] = {dst, src, wei};
  for (int i = 0; i < 3; ++i) {
    check(dnnl_primitive_create(&cv->pass[i].prim, cv->pass[i].pd), "dnnl_primitive_create (convolution)");
    for (int j = 0; j < 2; ++j) {
      cv->in_plain[i][j] = in_plain[i][j];
      cv->in_md[i][j] = dnnl_primitive_desc_query_md(cv->pass[i].pd, in_q[i][j], 0);
      make_reorder(cv->in_r[i][j], in_plain[i][j], cv->in_md[i][j], eng);
    }
    cv->out_plain[i] = out_plain[i];
    cv->out_md[i] = dnnl_primitive_desc_query_md(cv->pass[i].pd, out_q[i], 0);
    make_reorder(cv->out_r[i], cv->out_md[i], out_plain[i], eng);
  }
  return cv;
}

std::shared_ptr<Conv> get(const Key &key) {
  return convs.get(key, [&] { return make_conv(key); });
}

// Runs pass `i` of `cv`: reads the plain buffers a and b, writes the plain buffer out.
void run(Conv *cv, int i, void *a, void *b, void *out) {
  static const int in_arg[3][2] = {{DNNL_ARG_SRC, DNNL_ARG_WEIGHTS},
                                   {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS},
                                   {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST}};
  static const int out_arg[3] = {DNNL_ARG_DST, DNNL_ARG_DIFF_SRC, DNNL_ARG_DIFF_WEIGHTS};
  Runtime &rt = runtime();
  std::lock_guard<std::mutex> g(rt.exec_m);
  void *plain_in[2] = {a, b};
  std::unique_ptr<Mem> user_in[2], own_in[2];
  dnnl_exec_arg_t args[4];
  for (int j = 0; j < 2; ++j) {
    user_in[j] = std::make_unique<Mem>(cv->in_plain[i][j], plain_in[j]);
    if (cv->in_r[i][j].prim) {
      own_in[j] = std::make_unique<Mem>(cv->in_md[i][j], nullptr);
      reorder(cv->in_r[i][j], user_in[j]->m, own_in[j]->m);
    }
    args[j] = {in_arg[i][j], (own_in[j] ? own_in[j] : user_in[j])->m};
  }
  Mem user_out(cv->out_plain[i], out);
  std::unique_ptr<Mem> own_out;
  if (cv->out_r[i].prim) own_out = std::make_unique<Mem>(cv->out_md[i], nullptr);
  args[2] = {out_arg[i], own_out ? own_out->m : user_out.m};
  Mem scratch(dnnl_primitive_desc_query_md(cv->pass[i].pd, dnnl_query_scratchpad_md, 0), nullptr);
  args[3] = {DNNL_ARG_SCRATCHPAD, scratch.m};
  check(dnnl_primitive_execute(cv->pass[i].prim, rt.stream, 4, args), "convolution");
  if (own_out) reorder(cv->out_r[i], own_out->m, user_out.m);
  check(dnnl_stream_wait(rt.stream), "dnnl_stream_wait");
}

dnnl_data_type_t type_of(const char *dtype) {
  if (std::strcmp(dtype, "float32") == 0) return dnnl_f32;
  if (std::strcmp(dtype, "float16") == 0) return dnnl_f16;
  throw Failure{std::string("takes float32 or float16 tensors, got ") + dtype};
}

// The operators' common frame: argument checks, then pass `i`. x_at, y_at, w_at: where the tensors with
// x's, y's and w's shape and dtype are among the parameters (the output counts); g_at: the int64 tensor
// (stride h, w; pad top, bottom, left, right; dilation h, w; groups; same), same=1: pads as pad_mode="same".
int call(const char *name, int want_params, int nparam, void **params, int *ndims, int64_t **shapes,
         const char **dtypes, int i, int x_at, int y_at, int w_at, int g_at) {
  int out_at = nparam - 1;
  try {
    if (nparam != want_params) throw Failure{"expects " + std::to_string(want_params) + " tensors"};
    // x and y are plain (N, C, H, W), or a blocked body's (N, ceil(C/b), H, W, b): nChw{b}c memory.
    bool x_ok = ndims[x_at] == 4 || ndims[x_at] == 5, y_ok = ndims[y_at] == 4 || ndims[y_at] == 5;
    if (!x_ok || !y_ok || ndims[w_at] != 4) throw Failure{"takes 4-d tensors (N, C, H, W) and (O, C/G, kh, kw)"};
    if (ndims[g_at] != 1 || shapes[g_at][0] != 10) throw Failure{"takes 10 geometry values"};
    const int64_t *x = shapes[x_at], *w = shapes[w_at], *p = static_cast<int64_t *>(params[g_at]);
    const int x_b = ndims[x_at] == 5 ? static_cast<int>(x[4]) : 0, y_b = ndims[y_at] == 5 ? static_cast<int>(shapes[y_at][4]) : 0;
    const int64_t c = x_b ? w[1] * p[8] : x[1];
    if (x_b && (c + x_b - 1) / x_b != x[1]) throw Failure{"blocked input does not hold the weight's channels"};
    Geometry gm{x[0], c, x[2], x[3], w[0], w[2], w[3], p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]};
    if (p[9]) {
      same_pads(gm.h, gm.kh, gm.sh, gm.dh, gm.pt, gm.pb);
      same_pads(gm.w, gm.kw, gm.sw, gm.dw, gm.pl, gm.pr);
    }
    if (gm.g < 1 || gm.c % gm.g || gm.o % gm.g || w[1] * gm.g != gm.c) throw Failure{"groups do not divide the channels"};
    std::shared_ptr<Conv> cv = get(Key{gm, type_of(dtypes[x_at]), type_of(dtypes[y_at]), type_of(dtypes[w_at]), x_b, y_b});
    run(cv.get(), i, params[0], params[1], params[out_at]);
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

// The geometry arrives as one int64 tensor of 10 values after the data inputs (call). Tensors are
// float32 or float16 (AMP), each in its own.
// Forward: x (N, C, H, W), w (O, C/G, kh, kw), geometry -> y (N, O, OH, OW).
int ConvForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return call("ConvForward", 4, nparam, params, ndims, shapes, dtypes, FWD, 0, 3, 1, 2);
}

// Backward data: dy (N, O, OH, OW), w, x (for its shape), geometry -> dx (N, C, H, W).
int ConvBackwardData(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return call("ConvBackwardData", 5, nparam, params, ndims, shapes, dtypes, BWD_DATA, 4, 0, 1, 3);
}

// Backward weights: x, dy, w (for its shape), geometry -> dw (O, C/G, kh, kw).
int ConvBackwardWeights(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *,
                        void *) {
  return call("ConvBackwardWeights", 5, nparam, params, ndims, shapes, dtypes, BWD_WEIGHTS, 0, 1, 4, 3);
}
}
