// model.conv=onednn: a convolution's forward, backward-data and backward-weights passes as MindSpore AOT
// custom operators (ops.Custom func_type="aot"), computed by the oneDNN library MindSpore itself ships.
//
// Why: MindSpore 2.10's Conv2D hands oneDNN plain NCHW memory, on which oneDNN has only a per-image
// im2col + GEMM (AVX2) or reference kernels (AVX-512). Asked for memory formats of its own choice
// ("any"), the same library picks its blocked direct kernels (jit:avx512_core, brgconv), as PyTorch's
// convolutions do. Tensors stay plain NCHW outside: each call reorders in and out of the blocked format.
//
// Built by models/onednn.py with g++ against the oneDNN C API headers in third_party/onednn.
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "oneapi/dnnl/dnnl.h"
#include "oneapi/dnnl/dnnl_threadpool.h"
#include "oneapi/dnnl/dnnl_threadpool_iface.hpp"

namespace {

// MindSpore's oneDNN uses the threadpool runtime: given no threadpool, a primitive runs on one thread.
// A persistent pool in which the calling thread takes part; parallel regions run one at a time.
class Pool : public dnnl::threadpool_interop::threadpool_iface {
 public:
  explicit Pool(int n) : n_(n < 1 ? 1 : n) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() override {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
      ++gen_;
    }
    cv_.notify_all();
    for (auto &t : workers_) t.join();
  }
  int get_num_threads() const override { return n_; }
  bool get_in_parallel() const override { return in_parallel_; }
  uint64_t get_flags() const override { return 0; }  // synchronous: parallel_for returns when all is done
  void parallel_for(int n, const std::function<void(int, int)> &fn) override {
    if (n <= 0) return;
    if (n == 1 || n_ == 1 || in_parallel_) {
      for (int i = 0; i < n; ++i) fn(i, n);
      return;
    }
    std::lock_guard<std::mutex> region(region_m_);
    {
      std::lock_guard<std::mutex> g(m_);
      fn_ = &fn;
      total_ = n;
      next_.store(0);
      done_.store(0);
      ++gen_;
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> g(m_);
    done_cv_.wait(g, [&] { return done_.load() == total_; });
    fn_ = nullptr;
  }

 private:
  void work() {
    in_parallel_ = true;
    for (int i; (i = next_.fetch_add(1)) < total_;) {
      (*fn_)(i, total_);
      if (done_.fetch_add(1) + 1 == total_) {
        std::lock_guard<std::mutex> g(m_);
        done_cv_.notify_all();
      }
    }
    in_parallel_ = false;
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> g(m_);
        cv_.wait(g, [&] { return gen_ != seen; });
        seen = gen_;
        if (stop_) return;
        if (!fn_) continue;
      }
      work();
    }
  }
  int n_;
  std::vector<std::thread> workers_;
  std::mutex m_, region_m_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int, int)> *fn_ = nullptr;
  int total_ = 0;
  std::atomic<int> next_{0}, done_{0};
  uint64_t gen_ = 0;
  bool stop_ = false;
  static thread_local bool in_parallel_;
};
thread_local bool Pool::in_parallel_ = false;

struct Failure {
  std::string what;
};

void check(dnnl_status_t status, const char *what) {
  if (status != dnnl_success) throw Failure{std::string(what) + " failed (oneDNN status " + std::to_string(status) + ")"};
}

int cpus() {  // the CPUs this process may run on (taskset, cgroup cpusets), not all the machine's
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

// Several ranks on one host share its CPUs: the runner gives each rank its share in this variable (read
// once, when the pool starts) so that the ranks' pools together do not oversubscribe the machine.
int threads() {
  int n = cpus();
  if (const char *v = std::getenv("MINDSPORE_RUNNER_ONEDNN_THREADS")) {
    int t = std::atoi(v);
    if (t > 0 && t < n) n = t;
  }
  return n;
}

struct Runtime {
  dnnl_engine_t engine = nullptr;
  dnnl_stream_t stream = nullptr;
  Pool pool{threads()};
  std::mutex exec_m;  // MindSpore may launch two kernels at once; the pool and stream serve one at a time
  Runtime() {
    check(dnnl_engine_create(&engine, dnnl_cpu, 0), "dnnl_engine_create");
    check(dnnl_threadpool_interop_stream_create(&stream, engine, &pool), "dnnl_threadpool_interop_stream_create");
  }
};
Runtime &runtime() {
  static Runtime *rt = new Runtime();  // never destroyed: its threads must outlive static destructors
  return *rt;
}

// A memory descriptor owned by the cache (descriptors are handles in oneDNN 3).
struct Md {
  dnnl_memory_desc_t md = nullptr;
  Md() = default;
  Md(const dnnl_dims_t dims, dnnl_format_tag_t tag, dnnl_data_type_t type = dnnl_f32, int ndims = 4) {
    init(dims, tag, type, ndims);
  }
  void init(const dnnl_dims_t dims, dnnl_format_tag_t tag, dnnl_data_type_t type, int ndims = 4) {
    check(dnnl_memory_desc_create_with_tag(&md, ndims, dims, type, tag), "dnnl_memory_desc_create_with_tag");
  }
  void init_strides(const dnnl_dims_t dims, const dnnl_dims_t strides, int ndims) {
    check(dnnl_memory_desc_create_with_strides(&md, ndims, dims, dnnl_f32, strides),
          "dnnl_memory_desc_create_with_strides");
  }
  Md(const Md &) = delete;
  Md &operator=(const Md &) = delete;
  ~Md() {
    if (md) dnnl_memory_desc_destroy(md);
  }
};

// One primitive and its descriptor (the reorders around it are in Conv).
struct Prim {
  dnnl_primitive_desc_t pd = nullptr;
  dnnl_primitive_t prim = nullptr;
  ~Prim() {
    if (prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
  }
};

struct Reorder {
  dnnl_primitive_t prim = nullptr;  // null: the formats agree, no reorder
  ~Reorder() {
    if (prim) dnnl_primitive_destroy(prim);
  }
};

void make_reorder(Reorder &r, const_dnnl_memory_desc_t from, const_dnnl_memory_desc_t to, dnnl_engine_t eng) {
  if (dnnl_memory_desc_equal(from, to)) return;
  dnnl_primitive_desc_t pd;
  check(dnnl_reorder_primitive_desc_create(&pd, from, eng, to, eng, nullptr), "dnnl_reorder_primitive_desc_create");
  dnnl_status_t s = dnnl_primitive_create(&r.prim, pd);
  dnnl_primitive_desc_destroy(pd);
  check(s, "dnnl_primitive_create (reorder)");
}

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

// The activation format of a blocked body: channels in blocks of b (padded with zeros to a multiple of b).
dnnl_format_tag_t blocked_tag(int b) {
  switch (b) {
    case 0:
      return dnnl_nchw;
    case 4:
      return dnnl_aBcd4b;
    case 8:
      return dnnl_aBcd8b;
    case 16:
      return dnnl_aBcd16b;
    default:
      throw std::runtime_error("block size " + std::to_string(b) + " is not one oneDNN has a format for");
  }
}

// The output side of one dimension, as MindSpore's Conv2D computes it.
int64_t out_side(int64_t in, int64_t k, int64_t s, int64_t pad, int64_t d) { return (in + pad - (k - 1) * d - 1) / s + 1; }

// pad_mode="same" as MindSpore pads: output ceil(in / stride), the odd pad after (bottom, right).
void same_pads(int64_t in, int64_t k, int64_t s, int64_t d, int64_t &before, int64_t &after) {
  int64_t out = (in + s - 1) / s, total = std::max<int64_t>((out - 1) * s + (k - 1) * d + 1 - in, 0);
  before = total / 2;
  after = total - before;
}

std::mutex cache_m;
std::map<Key, std::unique_ptr<Conv>> cache;

// Whether a primitive runs an optimized kernel (not oneDNN's reference or `simple` fallbacks).
bool fast_impl(dnnl_primitive_desc_t pd) {
  const char *impl = nullptr;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl) return false;
  return std::strncmp(impl, "simple", 6) != 0 && std::strncmp(impl, "ref", 3) != 0;
}

dnnl_primitive_attr_t user_scratchpad() {
  // Scratchpad memory passed at each call (run allocates it) rather than held by oneDNN between calls.
  dnnl_primitive_attr_t attr;
  check(dnnl_primitive_attr_create(&attr), "dnnl_primitive_attr_create");
  check(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "set_scratchpad_mode");
  return attr;
}

Conv *get(const Key &key) {
  std::lock_guard<std::mutex> lock(cache_m);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second.get();
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
  Conv *raw = cv.get();
  cache[key] = std::move(cv);
  return raw;
}

// A oneDNN memory over `data` (no copy), destroyed with this object.
struct Mem {
  dnnl_memory_t m = nullptr;
  Mem(const_dnnl_memory_desc_t md, void *data) {
    check(dnnl_memory_create(&m, md, runtime().engine, data ? data : DNNL_MEMORY_ALLOCATE), "dnnl_memory_create");
  }
  Mem(const Mem &) = delete;
  ~Mem() {
    if (m) dnnl_memory_destroy(m);
  }
};

void reorder(const Reorder &r, dnnl_memory_t from, dnnl_memory_t to) {
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
  check(dnnl_primitive_execute(r.prim, runtime().stream, 2, args), "reorder");
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
    Conv *cv = get(Key{gm, type_of(dtypes[x_at]), type_of(dtypes[y_at]), type_of(dtypes[w_at]), x_b, y_b});
    run(cv, i, params[0], params[1], params[out_at]);
    return 0;
  } catch (const Failure &f) {
    std::fprintf(stderr, "model.conv=onednn: %s %s\n", name, f.what.c_str());
  } catch (const std::exception &e) {
    std::fprintf(stderr, "model.conv=onednn: %s: %s\n", name, e.what());
  }
  return 1;
}

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
std::map<PoolKey, std::unique_ptr<Pool2d>> pools;

int64_t same_out(int64_t in, int64_t s) { return (in + s - 1) / s; }

Pool2d *get_pool(const PoolKey &key) {
  std::lock_guard<std::mutex> g(cache_m);
  auto it = pools.find(key);
  if (it != pools.end()) return it->second.get();
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
  Pool2d *raw = pl.get();
  pools[key] = std::move(pl);
  return raw;
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

extern "C" {
// Max pool forward: x (N, C, H, W) float32, (kernel, stride) int64 -> y (N, C, OH, OW), workspace (bytes).
int MaxPoolForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return pool_call("MaxPoolForward", 4, nparam, ndims, dtypes, 0, [&] {
    Pool2d *pl = get_pool(pool_key(shapes[0], ndims[0], params[1]));
    if (shapes[3][0] != static_cast<int64_t>(pl->ws_bytes)) throw Failure{"workspace size mismatch"};
    pool_forward(pl, params[0], params[2], params[3]);
  });
}

// Max pool backward: dy, workspace, x (for its shape), (kernel, stride) -> dx (N, C, H, W).
int MaxPoolBackward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return pool_call("MaxPoolBackward", 5, nparam, ndims, dtypes, 2, [&] {
    Pool2d *pl = get_pool(pool_key(shapes[2], ndims[2], params[3]));
    pool_backward(pl, params[0], params[1], params[4]);
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

// The threads the operators run on in this process (starts the pool): what a rank was given.
int PoolThreads() {
  try {
    return runtime().pool.get_num_threads();
  } catch (const Failure &) {
    return -1;
  }
}
}

// ---- Blocked bodies (models/blocked.py): a ResNet's body kept in oneDNN's nChw{b}c memory between layers.
// A blocked tensor reaches MindSpore as float32 (N, ceil(C/b), H, W, b), channels past C zero; only the
// operators below (and the convolutions and pools above, given 5-d tensors) read one.
namespace {

// Converts one shape between plain NCHW and nChw{b}c; to_blocked picks the direction.
struct Convert {
  Md plain, blocked;
  Reorder to, from;
};
using ConvertKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int>;
std::map<ConvertKey, std::unique_ptr<Convert>> converts;

Convert *get_convert(const ConvertKey &key) {
  std::lock_guard<std::mutex> g(cache_m);
  auto it = converts.find(key);
  if (it != converts.end()) return it->second.get();
  auto [n, c, h, w, b] = key;
  auto cv = std::make_unique<Convert>();
  dnnl_dims_t d = {n, c, h, w};
  cv->plain.init(d, dnnl_nchw, dnnl_f32);
  cv->blocked.init(d, blocked_tag(b), dnnl_f32);
  make_reorder(cv->to, cv->plain.md, cv->blocked.md, runtime().engine);
  make_reorder(cv->from, cv->blocked.md, cv->plain.md, runtime().engine);
  Convert *raw = cv.get();
  converts[key] = std::move(cv);
  return raw;
}

void convert(bool to_blocked, const int64_t *plain, const int64_t *blocked, void *src, void *dst) {
  Convert *cv = get_convert(ConvertKey{plain[0], plain[1], plain[2], plain[3], static_cast<int>(blocked[4])});
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
std::map<BnKey, std::unique_ptr<Bn>> bns;

Bn *get_bn(const BnKey &key) {
  std::lock_guard<std::mutex> g(cache_m);
  auto it = bns.find(key);
  if (it != bns.end()) return it->second.get();
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
  Bn *raw = bn.get();
  bns[key] = std::move(bn);
  return raw;
}

// The key of a BatchNorm on blocked x with c channels; cfg: (relu, epsilon's float64 bits, global).
BnKey bn_key(const int64_t *x, int64_t c, void *cfg) {
  const int64_t *p = static_cast<int64_t *>(cfg);
  if ((c + x[4] - 1) / x[4] != x[1]) throw Failure{"blocked input does not hold gamma's channels"};
  return BnKey{x[0], c, x[2], x[3], static_cast<int>(x[4]), p[0] != 0, p[2] != 0, p[1]};
}

void execute(dnnl_primitive_desc_t pd, dnnl_primitive_t prim, std::vector<dnnl_exec_arg_t> args, const char *what) {
  Mem scratch(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0), nullptr);
  args.push_back({DNNL_ARG_SCRATCHPAD, scratch.m});
  Runtime &rt = runtime();
  check(dnnl_primitive_execute(prim, rt.stream, static_cast<int>(args.size()), args.data()), what);
  check(dnnl_stream_wait(rt.stream), "dnnl_stream_wait");
}

// The elementwise parts of a residual block on blocked memory (any layout: both operands share it).
void elementwise(int64_t count, const std::function<void(int64_t, int64_t)> &fn) {
  Runtime &rt = runtime();
  std::lock_guard<std::mutex> g(rt.exec_m);
  const int parts = std::max<int64_t>(1, std::min<int64_t>(rt.pool.get_num_threads(), count / 4096 + 1));
  rt.pool.parallel_for(parts, [&](int i, int n) { fn(count * i / n, count * (i + 1) / n); });
}

// The residual block's elementwise loops, one copy per vector width (chosen when the library loads: the file
// may be built on one CPU and loaded on another). -O2 alone left them scalar (GCC's very-cheap cost model,
// and the pointers may alias): AddRelu and ReluBackward then took 4% of a ResNet-18 64 px step (6 GB/s).
// Both are exact, so the vector width does not change a result. Clang vectorizes at -O2 by itself; other
// architectures (an aarch64 Ascend host) get the compiler's default.
#if defined(__x86_64__) && defined(__clang__)
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#elif defined(__x86_64__) && defined(__GNUC__)
#define VECTOR_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default"), optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define VECTOR_CLONES
#endif
VECTOR_CLONES void add_relu(const float *__restrict a, const float *__restrict b, float *__restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::max(a[i] + b[i], 0.0f);
}
VECTOR_CLONES void relu_mask(const float *__restrict dy, const float *__restrict y, float *__restrict dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

int64_t elements(int nd, const int64_t *shape) {
  int64_t e = 1;
  for (int i = 0; i < nd; ++i) e *= shape[i];
  return e;
}

int guarded(const char *name, int want, int nparam, const std::function<void()> &body) {
  try {
    if (nparam != want) throw Failure{"expects " + std::to_string(want) + " tensors"};
    body();
    return 0;
  } catch (const Failure &f) {
    std::fprintf(stderr, "model.conv blocked body: %s %s\n", name, f.what.c_str());
  } catch (const std::exception &e) {
    std::fprintf(stderr, "model.conv blocked body: %s: %s\n", name, e.what());
  }
  return 1;
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
std::map<DenseKey, std::unique_ptr<Dense>> denses;

void matmul_pd(Prim &p, const Md &src, const Md &wei, const Md &dst, const char *what) {
  dnnl_primitive_attr_t attr = user_scratchpad();
  dnnl_status_t st = dnnl_matmul_primitive_desc_create(&p.pd, runtime().engine, src.md, wei.md, nullptr, dst.md, attr);
  dnnl_primitive_attr_destroy(attr);
  check(st, what);
  check(dnnl_primitive_create(&p.prim, p.pd), what);
}

Dense *get_dense(const DenseKey &key) {
  std::lock_guard<std::mutex> g(cache_m);
  auto it = denses.find(key);
  if (it != denses.end()) return it->second.get();
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
  Dense *raw = d.get();
  denses[key] = std::move(d);
  return raw;
}

// fn(o) for every o < count (output channels, images), in parallel: contiguous shares, one per thread.
void per_output(int64_t count, const std::function<void(int64_t)> &fn) {
  Pool &pool = runtime().pool;
  const int parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(pool.get_num_threads(), count)));
  pool.parallel_for(parts, [&](int i, int np) {
    for (int64_t o = count * i / np; o < count * (i + 1) / np; ++o) fn(o);
  });
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
Dense *dense_of(int *ndims, int64_t **shapes, const char **dtypes, void **params, int x_at, int y_at, int w_at,
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
  Dense *d = get_dense(DenseKey{gm, b});
  if (y[0] != d->n || y[2] != d->oh || y[3] != d->ow) throw Failure{"output shape does not match the geometry"};
  return d;
}

void run_matmul(const Prim &p, const Md &a_md, void *a, const Md &b_md, void *b, const Md &out_md, void *out,
                const char *what) {
  Mem ma(a_md.md, a), mb(b_md.md, b), mo(out_md.md, out);
  execute(p.pd, p.prim, {{DNNL_ARG_SRC, ma.m}, {DNNL_ARG_WEIGHTS, mb.m}, {DNNL_ARG_DST, mo.m}}, what);
}

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
std::map<WinoFKey, std::unique_ptr<WinoF>> winofs;

// The point planes of a chunk's V and M, one row per tile: padded so that the 16 planes do not fall on the
// same L1 sets (their natural distance is a multiple of 4 KB).
int64_t plane_stride(int64_t tiles, int64_t channels) { return tiles * channels + 16; }

WinoF *get_winof(const WinoFKey &key) {
  std::lock_guard<std::mutex> g(cache_m);
  auto it = winofs.find(key);
  if (it != winofs.end()) return it->second.get();
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
  WinoF *raw = wn.get();
  winofs[key] = std::move(wn);
  return raw;
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
WinoF *winof_of(int *ndims, int64_t **shapes, const char **dtypes, void **params, int in_at, int out_at, int w_at,
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
  WinoF *wn = nparam == want ? winof_of(ndims, shapes, dtypes, params, in_at, out_at, w_at, g_at, turned) : nullptr;
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
  std::lock_guard<std::mutex> g(cache_m);
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
    bn_forward(get_bn(bn_key(shapes[0], shapes[1][0], params[3])), params, shapes, 4, 5, 6, "batch normalization");
  });
}

// BatchNorm with global statistics: x, gamma, beta, running mean, running variance, cfg -> y, workspace.
int BnGlobalForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  return guarded("BnGlobalForward", 8, nparam, [&] {
    if (ndims[0] != 5) throw Failure{"takes a blocked tensor"};
    bn_forward(get_bn(bn_key(shapes[0], shapes[1][0], params[5])), params, shapes, 6, 3, 4,
               "batch normalization (global statistics)");
  });
}

// BatchNorm backward: dy, x, gamma, batch mean, batch variance, workspace, cfg -> dx, dgamma, dbeta.
int BnBackward(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  return guarded("BnBackward", 10, nparam, [&] {
    if (ndims[0] != 5) throw Failure{"takes a blocked tensor"};
    Bn *bn = get_bn(bn_key(shapes[1], shapes[2][0], params[6]));
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

// Dense convolution forward on blocked memory: x (N, C/b, H, W, b), w (O, C, kh, kw), geometry -> y (N, O/b,
// OH, OW, b), padded channels zero.
int DenseForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return guarded("DenseForward", 4, nparam, [&] {
    Dense *d = dense_of(ndims, shapes, dtypes, params, 0, 3, 1, 2);
    std::lock_guard<std::mutex> g(runtime().exec_m);
    build_dense_weight(d, static_cast<float *>(params[1]));
    run_matmul(d->fwd, d->x, params[0], d->wp, d->buf.data(), d->y, params[3], "dense convolution");
  });
}

// Backward data: dy (blocked), w, x (for its shape), geometry -> dx (blocked; padded channels zero, as W'
// has zero rows for them).
int DenseBackwardData(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  return guarded("DenseBackwardData", 5, nparam, [&] {
    Dense *d = dense_of(ndims, shapes, dtypes, params, 2, 0, 1, 3);
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
    Dense *d = dense_of(ndims, shapes, dtypes, params, 0, 1, 2, 3);
    std::lock_guard<std::mutex> g(runtime().exec_m);
    run_matmul(d->bwd_weights, d->yt, params[1], d->x, params[0], d->wpt, d->buf.data(),
               "dense convolution backward-weights");
    fold_dense_weight(d, static_cast<float *>(params[4]));
  });
}

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
  WinoF *wn = nullptr;
  try {
    if (nparam == 5) wn = winof_of(ndims, shapes, dtypes, params, 0, 1, 2, 3, false);
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

// amp.dtype=float16 on a CPU (models/fp16.py): y = float32(float16(x)), rounded to nearest even, infinities
// past 65504 and float16's subnormals as a float16 cast gives them; its own backward (the gradient is rounded
// alike). Self-contained: F16C (every AVX2 CPU has it; Python checks the flag) by a function-level target.
#include <immintrin.h>

__attribute__((target("avx,f16c"))) static void round_f16(const float *x, float *y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) y[i] = _cvtsh_ss(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
}

extern "C" {
int RoundF16(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  return guarded("RoundF16", 2, nparam, [&] {
    const float *x = static_cast<float *>(params[0]);
    float *y = static_cast<float *>(params[1]);
    elementwise(elements(ndims[1], shapes[1]), [&](int64_t lo, int64_t hi) { round_f16(x + lo, y + lo, hi - lo); });
  });
}
}
