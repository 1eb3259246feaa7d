#include "core/comm/gloo_process_group.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/comm/backend.h"
#include "core/comm/serial_queue.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "gloo/allgather.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace mcc {
namespace comm {
namespace {

// Slots of our own transfers, clear of gloo's prefixes (0x01..0x08).
constexpr uint64_t kSendRecvSlot = 0xA1ull << 56;
constexpr uint64_t kReduceScatterSlot = 0xA2ull << 56;

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// gloo's Store interface over ours; errors become gloo::IoException.
class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<comm::Store> store, absl::Duration timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_->Set(key, absl::string_view(data.data(), data.size())));
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> v = store_->Get(key, timeout_);
    Check(v.status());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override {
    Check(store_->Wait(keys, timeout_));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    Check(store_->Wait(keys, absl::Milliseconds(timeout.count())));
  }

 private:
  static void Check(const absl::Status& s) {
    if (!s.ok()) throw gloo::IoException(std::string(s.message()));
  }
  std::shared_ptr<comm::Store> store_;
  absl::Duration timeout_;
};

ABSL_CONST_INIT absl::Mutex connect_hook_mu(absl::kConstInit);
std::function<void()>& ConnectHook() {
  static auto* hook = new std::function<void()>;
  return *hook;
}

std::shared_ptr<gloo::transport::Device> SharedDevice() {
  static std::once_flag once;
  static std::shared_ptr<gloo::transport::Device>* device;
  std::call_once(once, [] {
    gloo::transport::tcp::attr attr;
    const char* iface = std::getenv("GLOO_SOCKET_IFNAME");
    const char* master = std::getenv("MASTER_ADDR");
    if (iface != nullptr && *iface != '\0') {
      attr.iface = iface;
    } else if (master == nullptr || *master == '\0' ||
               absl::StartsWith(master, "127.") ||
               std::string(master) == "localhost") {
      attr.hostname = "127.0.0.1";
    } else {
      char host[256] = {0};
      gethostname(host, sizeof(host) - 1);
      attr.hostname = host;
    }
    device = new std::shared_ptr<gloo::transport::Device>(
        gloo::transport::tcp::CreateDevice(attr));
  });
  return *device;
}

template <typename T>
void ReduceInto(T* c, const T* a, const T* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) c[i] = std::max(a[i], b[i]);
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) c[i] = std::min(a[i], b[i]);
      break;
  }
}

template <typename T>
void DivideBy(T* x, int64_t n, int divisor) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] / static_cast<T>(divisor);
}

// The element type reductions run in: 16-bit floats widen to fp32.
DType ReduceType(DType dtype) {
  return dtype == DType::kBFloat16 || dtype == DType::kFloat16 ? DType::kFloat32
                                                               : dtype;
}

void Reduce(DType dtype, void* c, const void* a, const void* b, size_t n,
            ReduceOp op) {
  switch (dtype) {
    case DType::kFloat32:
      ReduceInto(static_cast<float*>(c), static_cast<const float*>(a),
                 static_cast<const float*>(b), n, op);
      break;
    case DType::kInt32:
      ReduceInto(static_cast<int32_t*>(c), static_cast<const int32_t*>(a),
                 static_cast<const int32_t*>(b), n, op);
      break;
    case DType::kInt64:
      ReduceInto(static_cast<int64_t*>(c), static_cast<const int64_t*>(a),
                 static_cast<const int64_t*>(b), n, op);
      break;
    default:
      LOG(FATAL) << "no direct reduction for " << DTypeName(dtype);
  }
}

void Divide(DType dtype, void* x, int64_t n, int divisor) {
  switch (dtype) {
    case DType::kFloat32:
      DivideBy(static_cast<float*>(x), n, divisor);
      break;
    case DType::kInt32:
      DivideBy(static_cast<int32_t*>(x), n, divisor);
      break;
    case DType::kInt64:
      DivideBy(static_cast<int64_t*>(x), n, divisor);
      break;
    default:
      LOG(FATAL) << "no division for " << DTypeName(dtype);
  }
}

template <typename T>
void GlooAllReduce(const std::shared_ptr<gloo::Context>& context, void* ptr,
                   size_t n, ReduceOp op, uint32_t tag,
                   std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions opts(context);
  opts.setOutput<T>(static_cast<T*>(ptr), n);
  opts.setReduceFunction([op](void* c, const void* a, const void* b, size_t k) {
    ReduceInto(static_cast<T*>(c), static_cast<const T*>(a),
               static_cast<const T*>(b), k, op);
  });
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
}

uint32_t Tag(const Call& call) {
  return static_cast<uint32_t>(call.seq & 0x7fffffff);
}

// Outside the range Tag() gives collectives.
constexpr uint32_t kCreationBarrierTag = 0x80000000u;

}  // namespace

// The transport behind CreateGlooProcessGroup (gloo_process_group.h says
// how it behaves).
class GlooBackend : public Backend {
 public:
  // Connects the ranks through `store` (keys prefixed per group).
  static absl::StatusOr<std::unique_ptr<GlooBackend>> Create(
      std::shared_ptr<Store> store, int rank, int size, std::string name,
      std::vector<int> global_ranks, GroupOptions options);
  ~GlooBackend() override;

  absl::string_view type() const override { return "gloo"; }
  Device device() const override { return options().device; }

  std::shared_ptr<Work> DoAllReduce(const Call& call, Tensor t,
                                    ReduceOp op) override;
  std::shared_ptr<Work> DoAllGather(const Call& call, Tensor in,
                                    Tensor out) override;
  std::shared_ptr<Work> DoAllGatherV(
      const Call& call, Tensor in, Tensor out,
      std::vector<int64_t> elements_per_rank) override;
  std::shared_ptr<Work> DoReduceScatter(const Call& call, Tensor in, Tensor out,
                                        ReduceOp op) override;
  std::shared_ptr<Work> DoBroadcast(const Call& call, Tensor t,
                                    int root) override;
  std::shared_ptr<Work> DoAllToAll(const Call& call, Tensor in,
                                   Tensor out) override;
  std::shared_ptr<Work> DoBarrier(const Call& call) override;
  std::shared_ptr<Work> DoSend(const Call& call, Tensor t, int dst,
                               uint32_t tag) override;
  std::shared_ptr<Work> DoRecv(const Call& call, Tensor t, int src,
                               uint32_t tag) override;
  absl::StatusOr<std::unique_ptr<Backend>> CreateSubgroup(
      int rank, int size, std::string name, std::vector<int> global_ranks,
      std::shared_ptr<Store> store, GroupOptions options) override;

 private:
  GlooBackend(int rank, int size, std::string name,
              std::vector<int> global_ranks, std::shared_ptr<Store> store,
              GroupOptions options);
  // Queues fn on the collective thread; gloo's exceptions become the work's
  // error, naming the call.
  std::shared_ptr<Work> Enqueue(const Call& call, std::function<void()> fn);
  void RingReduceScatter(const Call& call, const void* in, void* out,
                         int64_t block, DType dtype, ReduceOp op);

  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<SerialQueue> collectives_;
};

absl::StatusOr<std::unique_ptr<GlooBackend>> GlooBackend::Create(
    std::shared_ptr<Store> store, int rank, int size, std::string name,
    std::vector<int> global_ranks, GroupOptions options) {
  if (!options.device.is_cpu() && !IsHostBacked(options.device.type)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gloo group '", name, "' cannot move tensors on ",
        options.device.ToString(), ": gloo works on host memory (use NCCL)"));
  }
  std::unique_ptr<GlooBackend> group(new GlooBackend(
      rank, size, name, std::move(global_ranks), store, options));
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(ToChrono(options.timeout));
  // Debian's gloo (a 2022 snapshot) can wait forever inside
  // connectFullMesh's Pair::connect when a peer stops after publishing its
  // address (a SIGSTOPped or hung rank at start-up): seen as a job whose
  // other ranks never failed. So the connection runs on a thread of its own
  // and this call gives up at twice the group's timeout (the store wait for
  // the slowest peer and the creation barrier may each take one). A thread
  // that never returns stays blocked in gloo with its own references to
  // the context, the store and the device; the caller fails the job.
  struct Connecting {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    std::string error ABSL_GUARDED_BY(mu);
  };
  auto connecting = std::make_shared<Connecting>();
  std::function<void()> hook;
  {
    absl::MutexLock lock(&connect_hook_mu);
    hook = ConnectHook();
  }
  std::thread([connecting, context, store, size, timeout = options.timeout,
               hook = std::move(hook)] {
    if (hook) hook();
    std::string error;
    try {
      GlooStore gloo_store(std::make_shared<PrefixStore>("gloo", store),
                           timeout);
      std::shared_ptr<gloo::transport::Device> device = SharedDevice();
      context->connectFullMesh(gloo_store, device);
      // A rank's mesh can be complete while a peer is still finishing its
      // side; without this barrier a fast rank that returned and exited
      // would break the slower rank's creation ("Connection closed by
      // peer"). PyTorch's init_process_group ends with a barrier likewise.
      if (size > 1) {
        gloo::BarrierOptions opts(context);
        opts.setTag(kCreationBarrierTag);
        opts.setTimeout(ToChrono(timeout));
        gloo::barrier(opts);
      }
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "unknown error";
    }
    absl::MutexLock lock(&connecting->mu);
    connecting->done = true;
    connecting->error = std::move(error);
  }).detach();
  {
    absl::MutexLock lock(&connecting->mu);
    const absl::Duration limit = options.timeout == absl::InfiniteDuration()
                                     ? absl::InfiniteDuration()
                                     : 2 * options.timeout;
    if (!connecting->mu.AwaitWithTimeout(absl::Condition(&connecting->done),
                                         limit)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "creating gloo group '", name, "' (rank ", rank, " of ", size,
          ") did not connect within ", absl::FormatDuration(limit),
          ": a peer stopped or hung while the group was connecting"));
    }
    if (!connecting->error.empty()) {
      return absl::UnavailableError(
          absl::StrCat("creating gloo group '", name, "' (rank ", rank, " of ",
                       size, ") failed: ", connecting->error));
    }
  }
  group->context_ = std::move(context);
  return group;
}

GlooBackend::GlooBackend(int rank, int size, std::string name,
                         std::vector<int> global_ranks,
                         std::shared_ptr<Store> store, GroupOptions options)
    : Backend(rank, size, std::move(name), std::move(global_ranks),
              std::move(store), std::move(options)),
      collectives_(new SerialQueue) {}

GlooBackend::~GlooBackend() {
  // Finish (or time out) queued work before the context goes away.
  collectives_.reset();
}

std::shared_ptr<Work> GlooBackend::Enqueue(const Call& call,
                                           std::function<void()> fn) {
  auto work = std::make_shared<Work>(call.what, call.timeout);
  collectives_->Push([this, work, call, fn = std::move(fn)] {
    absl::Status broken = broken_status();
    if (!broken.ok()) {
      work->MarkDone(absl::FailedPreconditionError(
          absl::StrCat(call.what,
                       ": the group is unusable after an earlier "
                       "failure: ",
                       broken.message())));
      return;
    }
    try {
      fn();
      work->MarkDone(absl::OkStatus());
    } catch (const std::exception& e) {
      const std::string msg = e.what();
      if (absl::StrContains(msg, "Timed out") ||
          absl::StrContains(msg, "timed out")) {
        work->MarkDone(Fail(
            call, absl::StatusCode::kDeadlineExceeded,
            absl::StrCat("did not complete within its timeout of ",
                         absl::FormatDuration(call.timeout), " (", msg, ")")));
      } else {
        work->MarkDone(Fail(call, absl::StatusCode::kUnavailable,
                            absl::StrCat("communication error: ", msg)));
      }
    }
  });
  return work;
}

std::shared_ptr<Work> GlooBackend::DoAllReduce(const Call& call, Tensor t,
                                               ReduceOp op) {
  t = HostView(t);
  return Enqueue(call, [this, call, t, op] {
    const int n = size();
    if (t.numel() == 0) return;
    const DType rtype = ReduceType(t.dtype());
    Tensor buf = t;
    if (rtype != t.dtype()) buf = t.To(rtype).value();
    if (n > 1) {
      const auto timeout = ToChrono(call.timeout);
      switch (rtype) {
        case DType::kFloat32:
          GlooAllReduce<float>(context_, buf.raw_data(), buf.numel(), op,
                               Tag(call), timeout);
          break;
        case DType::kInt32:
          GlooAllReduce<int32_t>(context_, buf.raw_data(), buf.numel(), op,
                                 Tag(call), timeout);
          break;
        case DType::kInt64:
          GlooAllReduce<int64_t>(context_, buf.raw_data(), buf.numel(), op,
                                 Tag(call), timeout);
          break;
        default:
          LOG(FATAL) << "unreachable";
      }
    }
    if (op == ReduceOp::kAvg) Divide(rtype, buf.raw_data(), buf.numel(), n);
    if (!buf.SharesStorageWith(t)) {
      ConvertElements(buf.raw_data(), rtype, t.raw_data(), t.dtype(),
                      t.numel());
    }
  });
}

std::shared_ptr<Work> GlooBackend::DoAllGather(const Call& call, Tensor in,
                                               Tensor out) {
  in = HostView(in);
  out = HostView(out);
  return Enqueue(call, [this, call, in, out] {
    if (in.nbytes() == 0) return;
    if (size() == 1) {
      std::memcpy(out.raw_data(), in.raw_data(), in.nbytes());
      return;
    }
    gloo::AllgatherOptions opts(context_);
    opts.setInput<char>(static_cast<char*>(in.raw_data()), in.nbytes());
    opts.setOutput<char>(static_cast<char*>(out.raw_data()), out.nbytes());
    opts.setTag(Tag(call));
    opts.setTimeout(ToChrono(call.timeout));
    gloo::allgather(opts);
  });
}

std::shared_ptr<Work> GlooBackend::DoAllGatherV(
    const Call& call, Tensor in, Tensor out,
    std::vector<int64_t> elements_per_rank) {
  in = HostView(in);
  out = HostView(out);
  return Enqueue(call, [this, call, in, out, elements_per_rank] {
    if (out.nbytes() == 0) return;
    if (size() == 1) {
      std::memcpy(out.raw_data(), in.raw_data(), in.nbytes());
      return;
    }
    const size_t esize = DTypeSize(in.dtype());
    std::vector<size_t> bytes;
    for (int64_t e : elements_per_rank) bytes.push_back(e * esize);
    gloo::AllgathervOptions opts(context_);
    opts.setInput<char>(static_cast<char*>(in.raw_data()), in.nbytes());
    opts.setOutput<char>(static_cast<char*>(out.raw_data()), bytes);
    opts.setTag(Tag(call));
    opts.setTimeout(ToChrono(call.timeout));
    gloo::allgatherv(opts);
  });
}

void GlooBackend::RingReduceScatter(const Call& call, const void* in, void* out,
                                    int64_t block, DType dtype, ReduceOp op) {
  // Ring over n ranks: at step s rank r sends block (r - s - 1) to its right
  // neighbour and receives block (r - s - 2) from its left, adding its own
  // input's block to it; the sum is what it sends next step, and after n - 1
  // steps block r, written to `out`, holds every rank's contribution. The
  // input is only read (and `out` may be its block r, as the distributed
  // optimizer's shard is): the partial sums take two blocks of their own
  // when n > 2, where a whole copy of the input was made before.
  // Each block travels in pieces of at most kPieceBytes, the next piece's
  // receive posted before this one is reduced, so the transport moves one
  // while this thread reduces the other. (Whole blocks ran 3-4x slower from
  // 64 MB up: 0.29 GB/s against gloo's all-reduce's 0.8-0.95 GB/s, two ranks
  // on a 2-core VM, //core/comm:bench.)
  constexpr size_t kPieceBytes = size_t{4} << 20;
  const int n = size();
  const int r = rank();
  const size_t esize = DTypeSize(dtype);
  const size_t block_bytes = static_cast<size_t>(block) * esize;
  const int64_t piece = std::max<int64_t>(1, kPieceBytes / esize);
  const int64_t pieces = (block + piece - 1) / piece;
  const size_t piece_bytes =
      static_cast<size_t>(std::min(block, piece)) * esize;
  std::vector<char> tmp(2 * piece_bytes);
  Tensor partial[2];
  if (n > 2) {
    for (Tensor& t : partial) t = Tensor::Empty({block}, dtype);
  }
  const char* input = static_cast<const char*>(in);
  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  const absl::Time deadline = absl::Now() + call.timeout;
  auto remaining = [&] { return ToChrono(deadline - absl::Now()); };
  auto elements = [&](int64_t p) { return std::min(piece, block - p * piece); };
  for (int s = 0; s < n - 1; ++s) {
    const int send_block = ((r - s - 1) % n + n) % n;
    const int recv_block = ((r - s - 2) % n + n) % n;
    // One slot a step: gloo's pair matches a slot's messages in the order
    // they were posted, so the pieces pair up in order.
    const uint64_t slot = kReduceScatterSlot |
                          (static_cast<uint64_t>(Tag(call)) << 16) |
                          static_cast<uint64_t>(s);
    // The first step sends this rank's own block; later ones the sum the
    // step before made.
    char* send_base = s == 0
                          ? const_cast<char*>(input) + send_block * block_bytes
                          : static_cast<char*>(partial[(s - 1) % 2].raw_data());
    char* sum_base = s == n - 2 ? static_cast<char*>(out)
                                : static_cast<char*>(partial[s % 2].raw_data());
    const char* own_base = input + recv_block * block_bytes;
    // What is sent is not written this step: every piece is posted at once.
    // Two receive buffers take turns.
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends;
    for (int64_t p = 0; p < pieces; ++p) {
      sends.push_back(context_->createUnboundBuffer(
          send_base + p * piece * esize, elements(p) * esize));
      sends.back()->send(right, slot);
    }
    std::unique_ptr<gloo::transport::UnboundBuffer> recv[2];
    auto post_recv = [&](int64_t p) {
      recv[p % 2] = context_->createUnboundBuffer(
          tmp.data() + (p % 2) * piece_bytes, elements(p) * esize);
      recv[p % 2]->recv(left, slot);
    };
    post_recv(0);
    if (pieces > 1) post_recv(1);
    for (int64_t p = 0; p < pieces; ++p) {
      if (!recv[p % 2]->waitRecv(remaining())) {
        throw gloo::IoException("reduce-scatter transfer aborted");
      }
      const size_t offset = p * piece * esize;
      Reduce(dtype, sum_base + offset, own_base + offset,
             tmp.data() + (p % 2) * piece_bytes, elements(p), op);
      if (p + 2 < pieces) post_recv(p + 2);
    }
    for (auto& send : sends) {
      if (!send->waitSend(remaining())) {
        throw gloo::IoException("reduce-scatter transfer aborted");
      }
    }
  }
}

std::shared_ptr<Work> GlooBackend::DoReduceScatter(const Call& call, Tensor in,
                                                   Tensor out, ReduceOp op) {
  in = HostView(in);
  out = HostView(out);
  return Enqueue(call, [this, call, in, out, op] {
    if (out.numel() == 0) return;
    const DType rtype = ReduceType(in.dtype());
    const size_t block_bytes = out.numel() * DTypeSize(rtype);
    // The ring reads the input in the reduction type; it writes only the
    // result, which may be the input's own block (the distributed
    // optimizer's shard) but no other part of it.
    Tensor src = in;
    if (rtype != in.dtype()) {
      src = in.To(rtype).value();
    } else if (out.SharesStorageWith(in) &&
               out.raw_data() !=
                   static_cast<char*>(in.raw_data()) + rank() * block_bytes) {
      src = in.Clone();
    }
    Tensor result =
        rtype != out.dtype() ? Tensor::Empty(out.shape(), rtype) : out;
    if (size() == 1) {
      if (result.raw_data() != src.raw_data()) {
        std::memcpy(result.raw_data(), src.raw_data(), block_bytes);
      }
    } else {
      RingReduceScatter(call, src.raw_data(), result.raw_data(), out.numel(),
                        rtype, op);
    }
    if (op == ReduceOp::kAvg) {
      Divide(rtype, result.raw_data(), result.numel(), size());
    }
    if (!result.SharesStorageWith(out)) {
      ConvertElements(result.raw_data(), rtype, out.raw_data(), out.dtype(),
                      out.numel());
    }
  });
}

std::shared_ptr<Work> GlooBackend::DoBroadcast(const Call& call, Tensor t,
                                               int root) {
  t = HostView(t);
  return Enqueue(call, [this, call, t, root] {
    if (t.nbytes() == 0 || size() == 1) return;
    gloo::BroadcastOptions opts(context_);
    opts.setOutput<char>(static_cast<char*>(t.raw_data()), t.nbytes());
    opts.setRoot(root);
    opts.setTag(Tag(call));
    opts.setTimeout(ToChrono(call.timeout));
    gloo::broadcast(opts);
  });
}

std::shared_ptr<Work> GlooBackend::DoAllToAll(const Call& call, Tensor in,
                                              Tensor out) {
  in = HostView(in);
  out = HostView(out);
  return Enqueue(call, [this, call, in, out] {
    if (in.nbytes() == 0) return;
    if (size() == 1) {
      std::memcpy(out.raw_data(), in.raw_data(), in.nbytes());
      return;
    }
    gloo::AlltoallOptions opts(context_);
    opts.setInput<char>(static_cast<char*>(in.raw_data()), in.nbytes());
    opts.setOutput<char>(static_cast<char*>(out.raw_data()), out.nbytes());
    opts.setTag(Tag(call));
    opts.setTimeout(ToChrono(call.timeout));
    gloo::alltoall(opts);
  });
}

std::shared_ptr<Work> GlooBackend::DoBarrier(const Call& call) {
  return Enqueue(call, [this, call] {
    if (size() == 1) return;
    gloo::BarrierOptions opts(context_);
    opts.setTag(Tag(call));
    opts.setTimeout(ToChrono(call.timeout));
    gloo::barrier(opts);
  });
}

namespace {

// Posts a point-to-point transfer now; Work::Wait completes it on the
// waiting thread (gloo's waits may be retried after a timeout).
std::shared_ptr<Work> PostP2p(
    Call call, std::shared_ptr<gloo::Context> context, Tensor t, int peer,
    uint32_t tag, bool is_send,
    std::function<absl::Status(const Call&, absl::StatusCode,
                               absl::string_view)>
        fail) {
  const uint64_t slot = kSendRecvSlot | tag;
  std::shared_ptr<gloo::transport::UnboundBuffer> buf;
  try {
    buf = context->createUnboundBuffer(t.raw_data(), t.nbytes());
    if (is_send) {
      buf->send(peer, slot);
    } else {
      buf->recv(peer, slot);
    }
  } catch (const std::exception& e) {
    return Work::Done(fail(call, absl::StatusCode::kUnavailable, e.what()));
  }
  const absl::Time deadline = absl::Now() + call.timeout;
  auto waiter = [call, context, buf, t, is_send, deadline, fail](
                    absl::Duration timeout, bool* finished) -> absl::Status {
    const absl::Time now = absl::Now();
    const bool final_wait = now + timeout >= deadline;
    // gloo closes the pair when a wait times out, so a zero-timeout poll
    // (Work::IsCompleted) must not reach it: it reports "not yet".
    if (timeout <= absl::ZeroDuration() && !final_wait) {
      return absl::DeadlineExceededError("not finished");
    }
    const absl::Duration wait = final_wait ? deadline - now : timeout;
    try {
      const auto ms = std::chrono::milliseconds(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(wait)));
      const bool done = is_send ? buf->waitSend(ms) : buf->waitRecv(ms);
      *finished = true;
      return done ? absl::OkStatus()
                  : fail(call, absl::StatusCode::kAborted, "aborted");
    } catch (const std::exception& e) {
      const std::string msg = e.what();
      const bool timed_out = absl::StrContains(msg, "imed out");
      if (timed_out && !final_wait) {
        return absl::DeadlineExceededError("not finished");
      }
      *finished = true;
      return fail(
          call,
          timed_out ? absl::StatusCode::kDeadlineExceeded
                    : absl::StatusCode::kUnavailable,
          timed_out
              ? absl::StrCat("did not complete within its timeout of ",
                             absl::FormatDuration(call.timeout), " (", msg, ")")
              : absl::StrCat("communication error: ", msg));
    }
  };
  return std::make_shared<Work>(call.what, call.timeout, std::move(waiter));
}

}  // namespace

std::shared_ptr<Work> GlooBackend::DoSend(const Call& call, Tensor t, int dst,
                                          uint32_t tag) {
  t = HostView(t);
  return PostP2p(
      call, context_, t, dst, tag, /*is_send=*/true,
      [this](const Call& c, absl::StatusCode code, absl::string_view detail) {
        return Fail(c, code, detail);
      });
}

std::shared_ptr<Work> GlooBackend::DoRecv(const Call& call, Tensor t, int src,
                                          uint32_t tag) {
  t = HostView(t);
  return PostP2p(
      call, context_, t, src, tag, /*is_send=*/false,
      [this](const Call& c, absl::StatusCode code, absl::string_view detail) {
        return Fail(c, code, detail);
      });
}

absl::StatusOr<std::unique_ptr<Backend>> GlooBackend::CreateSubgroup(
    int rank, int size, std::string name, std::vector<int> global_ranks,
    std::shared_ptr<Store> store, GroupOptions options) {
  MCC_ASSIGN_OR_RETURN(std::unique_ptr<GlooBackend> backend,
                       Create(std::move(store), rank, size, std::move(name),
                              std::move(global_ranks), std::move(options)));
  return std::unique_ptr<Backend>(std::move(backend));
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> CreateGlooProcessGroup(
    std::shared_ptr<Store> store, int rank, int size, std::string name,
    std::vector<int> global_ranks, GroupOptions options) {
  MCC_ASSIGN_OR_RETURN(
      std::unique_ptr<GlooBackend> backend,
      GlooBackend::Create(std::move(store), rank, size, std::move(name),
                          std::move(global_ranks), std::move(options)));
  return std::make_shared<ProcessGroup>(std::move(backend));
}

namespace internal {

std::function<void()> SetGlooConnectHookForTesting(std::function<void()> hook) {
  absl::MutexLock lock(&connect_hook_mu);
  std::swap(ConnectHook(), hook);
  return hook;
}

}  // namespace internal
}  // namespace comm
}  // namespace mcc
