#include "checkpoint/comm_dist_context.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace mcc {
namespace {

// Bytes travel as int32 words, padded to whole words.
int64_t Words(int64_t bytes) { return (bytes + 3) / 4; }

absl::StatusOr<std::vector<std::string>> AllGather(comm::ProcessGroup* group,
                                                   const std::string& mine) {
  const int n = group->size();
  Tensor size =
      Tensor::Full({1}, static_cast<double>(mine.size()), DType::kInt64);
  Tensor sizes = Tensor::Empty({n}, DType::kInt64);
  MCC_RETURN_IF_ERROR(group->AllGatherSync(size, &sizes));
  // Peers' counts are checked before anything is sized by them.
  const std::vector<int64_t> bytes(sizes.data<int64_t>(),
                                   sizes.data<int64_t>() + n);
  MCC_RETURN_IF_ERROR(CheckAllGatherSizes(bytes));
  std::vector<int64_t> words(n);
  int64_t total = 0;
  for (int r = 0; r < n; ++r) {
    words[r] = Words(bytes[r]);
    total += words[r];
  }
  Tensor in = Tensor::Zeros({words[group->rank()]}, DType::kInt32);
  std::memcpy(in.raw_data(), mine.data(), mine.size());
  Tensor out = Tensor::Empty({total}, DType::kInt32);
  MCC_RETURN_IF_ERROR(group->AllGatherVSync(in, &out, words));
  std::vector<std::string> all(n);
  const char* p = static_cast<const char*>(out.raw_data());
  for (int r = 0; r < n; ++r) {
    all[r].assign(p, bytes[r]);
    p += words[r] * 4;
  }
  return all;
}

absl::StatusOr<std::string> SendRecv(comm::ProcessGroup* group,
                                     const std::string& mine, int to, int from,
                                     int64_t max_bytes) {
  const int n = group->size();
  if (to < 0 || to >= n || from < 0 || from >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint send_recv: partners ", to, " and ", from,
                     " outside the group of ", n));
  }
  Tensor size =
      Tensor::Full({1}, static_cast<double>(mine.size()), DType::kInt64);
  Tensor their_size = Tensor::Empty({1}, DType::kInt64);
  MCC_RETURN_IF_ERROR(group->BatchP2PSync(
      {comm::P2POp::Send(size, to), comm::P2POp::Recv(their_size, from)}));
  // The peer's count sizes the buffer: checked first.
  const int64_t bytes = their_size.data<int64_t>()[0];
  if (bytes < 0 || bytes > max_bytes) {
    return absl::DataLossError(
        absl::StrCat("checkpoint send_recv: rank ", from, " announced ", bytes,
                     " bytes (allowed: 0 to ", max_bytes, ")"));
  }
  Tensor in = Tensor::Zeros({Words(mine.size())}, DType::kInt32);
  if (!mine.empty()) std::memcpy(in.raw_data(), mine.data(), mine.size());
  Tensor out = Tensor::Empty({Words(bytes)}, DType::kInt32);
  std::vector<comm::P2POp> ops;
  if (in.numel() > 0) ops.push_back(comm::P2POp::Send(in, to));
  if (out.numel() > 0) ops.push_back(comm::P2POp::Recv(out, from));
  if (!ops.empty()) MCC_RETURN_IF_ERROR(group->BatchP2PSync(std::move(ops)));
  return std::string(static_cast<const char*>(out.raw_data()), bytes);
}

}  // namespace

DistContext MakeProcessGroupDistContext(comm::ProcessGroup* group) {
  if (group == nullptr || group->size() == 1) return DistContext::Single();
  DistContext d;
  d.rank = group->rank();
  d.world_size = group->size();
  d.barrier = [group]() { return group->Barrier()->Wait(); };
  d.all_gather = [group](const std::string& mine) {
    return AllGather(group, mine);
  };
  d.send_recv = [group](const std::string& mine, int to, int from,
                        int64_t max_bytes) {
    return SendRecv(group, mine, to, from, max_bytes);
  };
  return d;
}

}  // namespace mcc
