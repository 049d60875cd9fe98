// The runtime every operator family shares: the thread pool oneDNN runs on, the engine and stream, errors,
// memory descriptors, primitives and reorders, the caches (one registry, cleared by ClearCaches), and the
// frame and parallel loops of the operators' calls. operators.cc includes it first.
#pragma once

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

void execute(dnnl_primitive_desc_t pd, dnnl_primitive_t prim, std::vector<dnnl_exec_arg_t> args, const char *what) {
  Mem scratch(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0), nullptr);
  args.push_back({DNNL_ARG_SCRATCHPAD, scratch.m});
  Runtime &rt = runtime();
  check(dnnl_primitive_execute(prim, rt.stream, static_cast<int>(args.size()), args.data()), what);
  check(dnnl_stream_wait(rt.stream), "dnnl_stream_wait");
}

// Every descriptor, primitive and buffer an operator makes for a shape on first use is an entry of a Cache,
// and every Cache is in one registry that ClearCaches empties (models.onednn.clear_caches: the tests call it
// between tests, a long-lived process may between runs). A call holds its entry while it runs, so a clear
// frees an entry in use only when that call ends.
std::mutex &cache_mutex() {
  static std::mutex *m = new std::mutex();  // never destroyed, as the runtime: used until the process ends
  return *m;
}
std::vector<std::function<size_t()>> &cache_clears() {
  static auto *clears = new std::vector<std::function<size_t()>>();
  return *clears;
}

template <class K, class V>
class Cache {
 public:
  Cache() {
    cache_clears().push_back([this] {
      size_t n = entries_.size();
      entries_.clear();
      return n;
    });
  }
  // The entry for key, made by make() (a std::unique_ptr<V>) on its first use. Made under the lock: two
  // kernels MindSpore launches at once must not both build one shape's primitives.
  template <class Make>
  std::shared_ptr<V> get(const K &key, Make make) {
    std::lock_guard<std::mutex> g(cache_mutex());
    auto it = entries_.find(key);
    if (it != entries_.end()) return it->second;
    std::shared_ptr<V> made = make();
    entries_.emplace(key, made);
    return made;
  }

 private:
  std::map<K, std::shared_ptr<V>> entries_;
};

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

// fn(o) for every o < count (output channels, images), in parallel: contiguous shares, one per thread.
void per_output(int64_t count, const std::function<void(int64_t)> &fn) {
  Pool &pool = runtime().pool;
  const int parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(pool.get_num_threads(), count)));
  pool.parallel_for(parts, [&](int i, int np) {
    for (int64_t o = count * i / np; o < count * (i + 1) / np; ++o) fn(o);
  });
}

void matmul_pd(Prim &p, const Md &src, const Md &wei, const Md &dst, const char *what) {
  dnnl_primitive_attr_t attr = user_scratchpad();
  dnnl_status_t st = dnnl_matmul_primitive_desc_create(&p.pd, runtime().engine, src.md, wei.md, nullptr, dst.md, attr);
  dnnl_primitive_attr_destroy(attr);
  check(st, what);
  check(dnnl_primitive_create(&p.prim, p.pd), what);
}

void run_matmul(const Prim &p, const Md &a_md, void *a, const Md &b_md, void *b, const Md &out_md, void *out,
                const char *what) {
  Mem ma(a_md.md, a), mb(b_md.md, b), mo(out_md.md, out);
  execute(p.pd, p.prim, {{DNNL_ARG_SRC, ma.m}, {DNNL_ARG_WEIGHTS, mb.m}, {DNNL_ARG_DST, mo.m}}, what);
}

}  // namespace

extern "C" {

// The threads the operators run on in this process (starts the pool): what a rank was given.
int PoolThreads() {
  try {
    return runtime().pool.get_num_threads();
  } catch (const Failure &) {
    return -1;
  }
}

// Empties every cache (see Cache); returns the entries it dropped. Call it only between runs: the next call
// of each shape builds its primitives anew.
int64_t ClearCaches() {
  std::lock_guard<std::mutex> g(cache_mutex());
  size_t n = 0;
  for (auto &clear : cache_clears()) n += clear();
  return static_cast<int64_t>(n);
}
}
