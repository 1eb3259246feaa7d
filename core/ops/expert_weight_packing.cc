#include "core/ops/expert_weight_packing.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/ops/gemm.h"
#include "core/status_macros.h"
#include "dnnl.hpp"

namespace mcc {
namespace ops {
namespace internal {
namespace {

using dims = dnnl::memory::dims;
using dnnl_dt = dnnl::memory::data_type;

dnnl::engine& Engine() {
  static auto* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

dnnl::stream& ThreadStream() {
  thread_local std::unique_ptr<dnnl::stream> stream;
  if (stream == nullptr) stream = std::make_unique<dnnl::stream>(Engine());
  return *stream;
}

dnnl_dt DnnlType(DType d) {
  return d == DType::kBFloat16 ? dnnl_dt::bf16 : dnnl_dt::f32;
}

// A matmul of m rows reading weights [K, N] in the blocked layout `weights`
// (usable: oneDNN chose brgemm and that layout for it).
struct PackedMatmul {
  bool usable = false;
  dnnl::matmul prim;
  dnnl::memory::desc weights;
  dnnl::memory::desc scratchpad;
};

// Input dtype, output dtype, m, n, k, beta.
using MatmulKey = std::tuple<int, int, int64_t, int64_t, int64_t, float>;

struct MatmulTable {
  std::mutex mu;
  absl::flat_hash_map<MatmulKey, std::shared_ptr<const PackedMatmul>> prims;
};

MatmulTable& Matmuls() {
  static auto* table = new MatmulTable;
  return *table;
}

// The primitive for m rows: brgemm with oneDNN's preferred ("any") weights
// layout; per process, at most kPackedMaxRows per (dtypes, n, k, beta).
std::shared_ptr<const PackedMatmul> MatmulFor(DType in, DType out, int64_t m,
                                              int64_t n, int64_t k,
                                              float beta) {
  const MatmulKey key(static_cast<int>(in), static_cast<int>(out), m, n, k,
                      beta);
  MatmulTable& table = Matmuls();
  {
    std::lock_guard<std::mutex> lock(table.mu);
    auto it = table.prims.find(key);
    if (it != table.prims.end()) return it->second;
  }
  auto made = std::make_shared<PackedMatmul>();
  const dnnl::memory::desc a({m, k}, DnnlType(in), dims{k, 1});
  const dnnl::memory::desc b({k, n}, DnnlType(in),
                             dnnl::memory::format_tag::any);
  const dnnl::memory::desc c({m, n}, DnnlType(out), dims{n, 1});
  dnnl::primitive_attr attr;
  // The caller's buffer, one per thread (as core/ops/gemm.cc: oneDNN's own
  // is shared by the threads running one primitive).
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr,
                                          Engine());
    const std::string impl = pd.impl_info_str();
    // Only brgemm reads the blocked weights without copying them again;
    // another implementation (an AVX2-only CPU) gains nothing here.
    if (impl.rfind("brg", 0) == 0) {
      made->usable = true;
      made->prim = dnnl::matmul(pd);
      made->weights = pd.weights_desc();
      made->scratchpad = pd.scratchpad_desc();
    }
  } catch (const dnnl::error&) {
    made->usable = false;  // No primitive for it: the unpacked path runs.
  }
  std::lock_guard<std::mutex> lock(table.mu);
  return table.prims.emplace(key, std::move(made)).first->second;
}

// Buffers of ended scopes, kept for the next scope's packs of the same size
// (the next training step's): a fresh 32 MiB buffer cost more in page
// faults (or, with 2 MiB pages, in the kernel's compaction) than the
// packing itself.
struct BufferPool {
  std::mutex mu;
  std::multimap<size_t, void*> idle;
  int64_t idle_bytes = 0;
};

BufferPool& Pool() {
  static auto* pool = new BufferPool;
  return *pool;
}

struct ReturnToPool {
  size_t bytes = 0;
  void operator()(void* p) const {
    BufferPool& pool = Pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    pool.idle.emplace(bytes, p);
    pool.idle_bytes += static_cast<int64_t>(bytes);
  }
};

using PooledBuffer = std::unique_ptr<void, ReturnToPool>;

// `bytes` (a multiple of 2 MiB): an idle buffer of that size, else a new
// one asking for 2 MiB pages; null if out of memory.
PooledBuffer TakeBuffer(size_t bytes) {
  BufferPool& pool = Pool();
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    auto it = pool.idle.find(bytes);
    if (it != pool.idle.end()) {
      void* p = it->second;
      pool.idle.erase(it);
      pool.idle_bytes -= static_cast<int64_t>(bytes);
      return PooledBuffer(p, ReturnToPool{bytes});
    }
  }
  void* p = std::aligned_alloc(size_t{2} << 20, bytes);
  if (p == nullptr) return PooledBuffer(nullptr, ReturnToPool{bytes});
  madvise(p, bytes, MADV_HUGEPAGE);  // A hint: ignored if refused.
  return PooledBuffer(p, ReturnToPool{bytes});
}

// One weight tensor [G, ., .] in one transposition: each op(w_g) [K, N]
// in the blocked layout, packed on first use.
struct WeightPack {
  Tensor w;  // Holds the storage: its address stays this weight's.
  dnnl::memory::desc layout;
  // op(w_g) as stored ([K, N] with w's strides) into `layout`: one
  // primitive for every expert (creating one per expert cost ~0.1 ms each).
  dnnl::memory::desc plain;
  dnnl::reorder pack;
  // All experts' packs in one buffer, expert g's at g * stride, made when
  // packed[g] is set.
  PooledBuffer buffer;
  size_t stride = 0;
  std::vector<bool> packed;
};

// Address, G, dims 1 and 2, dtype, transposition.
using PackKey = std::tuple<const void*, int64_t, int64_t, int64_t, int, bool>;

}  // namespace

class ExpertWeightPacks {
 public:
  // The packed op(w_g), made on first use; null where the layout of the
  // reference primitive is not brgemm's.
  absl::StatusOr<const void*> Get(const Tensor& w, bool trans_w, int64_t g,
                                  dnnl::memory::desc* layout) {
    const int64_t k = trans_w ? w.size(2) : w.size(1);
    const int64_t n = trans_w ? w.size(1) : w.size(2);
    const PackKey key(w.raw_data(), w.size(0), w.size(1), w.size(2),
                      static_cast<int>(w.dtype()), trans_w);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = packs_.find(key);
    if (it == packs_.end()) {
      WeightPack pack;
      pack.w = w;
      // The layout the largest packed group's primitive asks for; every
      // row count's is checked against it before use.
      const std::shared_ptr<const PackedMatmul> ref =
          MatmulFor(w.dtype(), DType::kFloat32, kPackedMaxRows, n, k, 0.0f);
      if (ref->usable) {
        pack.layout = ref->weights;
        pack.plain = dnnl::memory::desc({k, n}, DnnlType(w.dtype()),
                                        trans_w ? dims{1, k} : dims{n, 1});
        pack.pack = dnnl::reorder(dnnl::reorder::primitive_desc(
            Engine(), pack.plain, Engine(), pack.layout));
        pack.stride = (pack.layout.get_size() + 63) / 64 * 64;
        constexpr size_t kHugePage = size_t{2} << 20;
        const size_t total =
            (w.size(0) * pack.stride + kHugePage - 1) / kHugePage * kHugePage;
        pack.buffer = TakeBuffer(total);
        if (pack.buffer == nullptr) {
          return absl::ResourceExhaustedError(
              absl::StrCat("GroupedGemm: no memory for packed expert weights (",
                           total, " bytes)"));
        }
        pack.packed.assign(w.size(0), false);
      }
      it = packs_.emplace(key, std::move(pack)).first;
    }
    WeightPack& pack = it->second;
    if (pack.packed.empty()) return nullptr;
    *layout = pack.layout;
    char* dst = static_cast<char*>(pack.buffer.get()) + g * pack.stride;
    if (!pack.packed[g]) {
      const size_t bytes = pack.stride;
      const size_t elem = w.dtype() == DType::kFloat32 ? 4 : 2;
      const char* src = static_cast<const char*>(w.raw_data()) +
                        g * w.size(1) * w.size(2) * elem;
      dnnl::memory from(pack.plain, Engine(), const_cast<char*>(src));
      dnnl::memory to(pack.layout, Engine(), dst);
      SyncGemmOmpThreads();
      pack.pack.execute(ThreadStream(), from, to);
      ThreadStream().wait();
      pack.packed[g] = true;
      ++matrices_;
      bytes_ += static_cast<int64_t>(bytes);
    }
    return static_cast<const void*>(dst);
  }

  int64_t matrices() const {
    std::lock_guard<std::mutex> lock(mu_);
    return matrices_;
  }
  int64_t bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }

 private:
  mutable std::mutex mu_;  // Worker threads of one call pack side by side.
  std::map<PackKey, WeightPack> packs_;
  int64_t matrices_ = 0, bytes_ = 0;
};

namespace {
thread_local ExpertWeightPacks* t_current = nullptr;
}  // namespace

ExpertWeightPacks* CurrentExpertWeightPacks() { return t_current; }

absl::StatusOr<bool> PackedExpertGemm(ExpertWeightPacks* packs, const Tensor& w,
                                      bool trans_w, int64_t g, const Tensor& xg,
                                      Tensor* yg, float beta) {
  const int64_t m = xg.size(0);
  const DType in = xg.dtype(), out = yg->dtype();
  if (packs == nullptr || m < 1 || m > kPackedMaxRows ||
      !xg.device().is_cpu()) {
    return false;
  }
  // bf16 packs run oneDNN's native kernels: not where the process pinned
  // the widened path (MCC_BF16_GEMM_PATH=widened).
  if (in != DType::kFloat32 &&
      !(in == DType::kBFloat16 && NativeBf16Available() &&
        CurrentBf16PathPolicy() != Bf16PathPolicy::kWidened)) {
    return false;
  }
  if (out != DType::kFloat32 && out != in) return false;
  // fp32's data gradient (w as stored, [K, N]) ran as fast unpacked
  // (moe_layer_bench, 64 x 64 rows: 76-82% of dense either way): no pack.
  if (in == DType::kFloat32 && !trans_w) return false;
  const int64_t k = xg.size(1), n = yg->size(1);
  const std::shared_ptr<const PackedMatmul> mm =
      MatmulFor(in, out, m, n, k, beta);
  if (!mm->usable) return false;
  dnnl::memory::desc layout;
  MCC_ASSIGN_OR_RETURN(const void* packed, packs->Get(w, trans_w, g, &layout));
  if (packed == nullptr || !(layout == mm->weights)) return false;

  SyncGemmOmpThreads();
  thread_local std::vector<uint8_t> scratch;
  const size_t scratch_bytes = mm->scratchpad.get_size();
  if (scratch.size() < scratch_bytes) scratch.resize(scratch_bytes);
  dnnl::memory am(dnnl::memory::desc({m, k}, DnnlType(in), dims{k, 1}),
                  Engine(), const_cast<void*>(xg.raw_data()));
  dnnl::memory bm(layout, Engine(), const_cast<void*>(packed));
  dnnl::memory cm(dnnl::memory::desc({m, n}, DnnlType(out), dims{n, 1}),
                  Engine(), yg->raw_data());
  dnnl::memory sm(mm->scratchpad, Engine(), scratch.data());
  mm->prim.execute(ThreadStream(), {{DNNL_ARG_SRC, am},
                                    {DNNL_ARG_WEIGHTS, bm},
                                    {DNNL_ARG_DST, cm},
                                    {DNNL_ARG_SCRATCHPAD, sm}});
  ThreadStream().wait();
  return true;
}

}  // namespace internal

bool ExpertWeightPackingAvailable(DType dtype) {
  if (dtype == DType::kBFloat16 &&
      (!NativeBf16Available() ||
       internal::CurrentBf16PathPolicy() == Bf16PathPolicy::kWidened)) {
    return false;
  }
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) return false;
  return internal::MatmulFor(dtype, DType::kFloat32, kPackedMaxRows, 64, 64,
                             0.0f)
      ->usable;
}

int64_t IdleExpertWeightPackBytes() {
  internal::BufferPool& pool = internal::Pool();
  std::lock_guard<std::mutex> lock(pool.mu);
  return pool.idle_bytes;
}

void FreeIdleExpertWeightPacks() {
  internal::BufferPool& pool = internal::Pool();
  std::lock_guard<std::mutex> lock(pool.mu);
  for (const auto& [bytes, p] : pool.idle) std::free(p);
  pool.idle.clear();
  pool.idle_bytes = 0;
}

ScopedExpertWeightPacking::ScopedExpertWeightPacking()
    : packs_(std::make_unique<internal::ExpertWeightPacks>()),
      saved_(internal::t_current) {
  internal::t_current = packs_.get();
}

ScopedExpertWeightPacking::~ScopedExpertWeightPacking() {
  internal::t_current = saved_;
}

int64_t ScopedExpertWeightPacking::packed_matrices() const {
  return packs_->matrices();
}

int64_t ScopedExpertWeightPacking::packed_bytes() const {
  return packs_->bytes();
}

}  // namespace ops
}  // namespace mcc
