#include "models/moe/token_dispatcher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/status_macros.h"

namespace mcc {
namespace moe {
namespace {

// dst rows [dst_row, dst_row + n) = src rows [src_row, src_row + n).
absl::Status CopyRows(const Tensor& src, int64_t src_row, const Tensor& dst,
                      int64_t dst_row, int64_t n) {
  if (n == 0) return absl::OkStatus();
  MCC_ASSIGN_OR_RETURN(Tensor from, src.Slice(src_row, src_row + n));
  MCC_ASSIGN_OR_RETURN(Tensor to, dst.Slice(dst_row, dst_row + n));
  return to.CopyFrom(from);
}

absl::Status CheckRows(const char* what, const Tensor& t, int64_t rows) {
  if (t.dim() != 2 || t.size(0) != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("TokenDispatcher::", what, ": rows ", t.Describe(),
                     " must be [", rows, ", hidden] as planned"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenDispatcherType> ParseTokenDispatcherType(
    absl::string_view name) {
  if (name == "alltoall") return TokenDispatcherType::kAllToAll;
  if (name == "allgather") return TokenDispatcherType::kAllGather;
  return absl::InvalidArgumentError(absl::StrCat(
      "token dispatcher type '", name, "' is not one of: alltoall, allgather"));
}

const char* TokenDispatcherTypeName(TokenDispatcherType type) {
  return type == TokenDispatcherType::kAllToAll ? "alltoall" : "allgather";
}

absl::StatusOr<std::unique_ptr<TokenDispatcher>> TokenDispatcher::Create(
    TokenDispatcherType type, comm::ProcessGroup* group, int64_t num_experts) {
  if (group == nullptr || group->size() < 2) {
    return absl::InvalidArgumentError(
        "TokenDispatcher: needs an expert-model-parallel group of 2 or more "
        "ranks");
  }
  if (num_experts < 1 || num_experts % group->size() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("TokenDispatcher: num_experts ", num_experts,
                     " is not a multiple of the expert-model-parallel size ",
                     group->size()));
  }
  return std::unique_ptr<TokenDispatcher>(
      new TokenDispatcher(type, group, num_experts, /*replicated=*/false));
}

absl::StatusOr<std::unique_ptr<TokenDispatcher>>
TokenDispatcher::CreateReplicated(comm::ProcessGroup* group,
                                  int64_t num_experts) {
  if (group == nullptr || group->size() < 2 || num_experts < 1) {
    return absl::InvalidArgumentError(
        "TokenDispatcher: the replicated form needs a group of 2 or more "
        "ranks and at least one expert");
  }
  return std::unique_ptr<TokenDispatcher>(
      new TokenDispatcher(TokenDispatcherType::kAllGather, group, num_experts,
                          /*replicated=*/true));
}

int64_t TokenDispatcher::SourceOffset(const DispatchPlan& plan, int s,
                                      int64_t e) const {
  const int64_t* c = plan.counts.data() + s * num_experts_;
  int64_t off = 0;
  for (int64_t i = 0; i < e; ++i) off += c[i];
  return off;
}

absl::StatusOr<DispatchPlan> TokenDispatcher::Plan(
    const std::vector<int64_t>& tokens_per_expert) const {
  ScopedOpTimer op_timer("MoeDispatchPlan");
  const int64_t e = num_experts_;
  if (static_cast<int64_t>(tokens_per_expert.size()) != e) {
    return absl::InvalidArgumentError(
        absl::StrCat("TokenDispatcher::Plan: ", tokens_per_expert.size(),
                     " counts for ", e, " experts"));
  }
  const int p = group_->size(), me = group_->rank();
  MCC_ASSIGN_OR_RETURN(Tensor mine, Tensor::FromInts(tokens_per_expert, {e}));
  MCC_ASSIGN_OR_RETURN(mine, mine.To(group_->device()));
  Tensor all = Tensor::Empty({p * e}, DType::kInt64, group_->device());
  MCC_RETURN_IF_ERROR(group_->AllGatherSync(mine, &all));
  MCC_ASSIGN_OR_RETURN(Tensor host, all.To(Device::CPU()));
  DispatchPlan plan;
  const int64_t* c = host.data<int64_t>();
  plan.counts.assign(c, c + p * e);
  for (int64_t i = 0; i < e; ++i) plan.rows += c[me * e + i];
  plan.local_counts.assign(local_experts_, 0);
  for (int s = 0; s < p; ++s) {
    for (int64_t j = 0; j < local_experts_; ++j) {
      plan.local_counts[j] += c[s * e + first_expert() + j];
    }
  }
  for (int64_t n : plan.local_counts) plan.local_rows += n;
  return plan;
}

absl::StatusOr<Tensor> TokenDispatcher::Dispatch(
    const Tensor& rows, const DispatchPlan& plan) const {
  ScopedOpTimer op_timer("MoeDispatch");
  MCC_RETURN_IF_ERROR(CheckRows("Dispatch", rows, plan.rows));
  const int p = group_->size(), me = group_->rank();
  const int64_t e = num_experts_, el = local_experts_, h = rows.size(1);
  const int64_t first = first_expert();
  Tensor out = Tensor::Empty({plan.local_rows, h}, rows.dtype(), rows.device());
  if (type_ == TokenDispatcherType::kAllGather) {
    std::vector<int64_t> per_rank(p, 0), base(p, 0);
    int64_t total = 0;
    for (int s = 0; s < p; ++s) {
      per_rank[s] = SourceOffset(plan, s, e);
      base[s] = total;
      total += per_rank[s];
    }
    if (total == 0) return out;
    Tensor all = Tensor::Empty({total, h}, rows.dtype(), rows.device());
    MCC_RETURN_IF_ERROR(group_->AllGatherVSync(rows, &all, per_rank));
    int64_t pos = 0;
    for (int64_t j = 0; j < el; ++j) {
      for (int s = 0; s < p; ++s) {
        const int64_t n = plan.counts[s * e + first + j];
        MCC_RETURN_IF_ERROR(CopyRows(
            all, base[s] + SourceOffset(plan, s, first + j), out, pos, n));
        pos += n;
      }
    }
    return out;
  }
  // All-to-all-v: source s's rows for this rank land at recv_off[s], in its
  // order (by local expert), then are regrouped by local expert.
  std::vector<int64_t> recv_rows(p, 0), recv_off(p, 0);
  int64_t m = 0;
  for (int s = 0; s < p; ++s) {
    for (int64_t j = 0; j < el; ++j)
      recv_rows[s] += plan.counts[s * e + first + j];
    recv_off[s] = m;
    m += recv_rows[s];
  }
  Tensor recv = Tensor::Empty({m, h}, rows.dtype(), rows.device());
  std::vector<comm::P2POp> ops;
  for (int d = 0; d < p; ++d) {
    const int64_t begin = SourceOffset(plan, me, d * el);
    const int64_t n = SourceOffset(plan, me, (d + 1) * el) - begin;
    if (d == me) {
      MCC_RETURN_IF_ERROR(CopyRows(rows, begin, recv, recv_off[me], n));
    } else if (n > 0) {
      MCC_ASSIGN_OR_RETURN(Tensor block, rows.Slice(begin, begin + n));
      ops.push_back(comm::P2POp::Send(block, d));
    }
  }
  for (int s = 0; s < p; ++s) {
    if (s == me || recv_rows[s] == 0) continue;
    MCC_ASSIGN_OR_RETURN(Tensor block,
                         recv.Slice(recv_off[s], recv_off[s] + recv_rows[s]));
    ops.push_back(comm::P2POp::Recv(block, s));
  }
  if (!ops.empty()) MCC_RETURN_IF_ERROR(group_->BatchP2PSync(std::move(ops)));
  int64_t pos = 0;
  for (int64_t j = 0; j < el; ++j) {
    for (int s = 0; s < p; ++s) {
      const int64_t n = plan.counts[s * e + first + j];
      const int64_t src = recv_off[s] + SourceOffset(plan, s, first + j) -
                          SourceOffset(plan, s, first);
      MCC_RETURN_IF_ERROR(CopyRows(recv, src, out, pos, n));
      pos += n;
    }
  }
  return out;
}

absl::StatusOr<Tensor> TokenDispatcher::Combine(
    const Tensor& local_rows, const DispatchPlan& plan) const {
  ScopedOpTimer op_timer("MoeCombine");
  MCC_RETURN_IF_ERROR(CheckRows("Combine", local_rows, plan.local_rows));
  const int p = group_->size(), me = group_->rank();
  const int64_t e = num_experts_, el = local_experts_, h = local_rows.size(1);
  const int64_t first = first_expert();
  const DType dt = local_rows.dtype();
  const Device dev = local_rows.device();
  if (type_ == TokenDispatcherType::kAllGather) {
    int64_t most = 0;
    for (int s = 0; s < p; ++s) most = std::max(most, SourceOffset(plan, s, e));
    if (most == 0) return Tensor::Empty({0, h}, dt, dev);
    // Source s's rows at [s * most, s * most + its rows). Split experts:
    // only this rank's experts' rows are nonzero here, so the sum over ranks
    // is a placement; replicated: the sum of the ranks' partial outputs.
    Tensor spread = Tensor::Zeros({p * most, h}, dt, dev);
    int64_t pos = 0;
    for (int64_t j = 0; j < el; ++j) {
      for (int s = 0; s < p; ++s) {
        const int64_t n = plan.counts[s * e + first + j];
        MCC_RETURN_IF_ERROR(
            CopyRows(local_rows, pos, spread,
                     s * most + SourceOffset(plan, s, first + j), n));
        pos += n;
      }
    }
    Tensor mine = Tensor::Empty({most, h}, dt, dev);
    if (!replicated_ && DTypeSize(dt) == 2 && h % 2 == 0) {
      // A placement is exact in any type: summed as int32 words (two 16-bit
      // values of one row, every other rank's word zero), the bits arrive
      // as sent. A 16-bit sum would be widened to fp32 first, moving twice
      // the bytes (moe_dispatch_bench: bf16 allgather combine cost more CPU
      // time than fp32's).
      auto words = [&](Tensor& t) {
        return Tensor::FromExternal(t.raw_data(), {t.numel() / 2},
                                    DType::kInt32, dev,
                                    std::make_shared<Tensor>(t));
      };
      Tensor spread_words = words(spread), mine_words = words(mine);
      MCC_RETURN_IF_ERROR(group_->ReduceScatterSync(spread_words, &mine_words,
                                                    comm::ReduceOp::kSum));
      return mine.Slice(0, plan.rows);
    }
    MCC_RETURN_IF_ERROR(
        group_->ReduceScatterSync(spread, &mine, comm::ReduceOp::kSum));
    return mine.Slice(0, plan.rows);
  }
  // Back to source-major order, then the all-to-all-v in reverse.
  std::vector<int64_t> send_rows(p, 0), send_off(p, 0);
  int64_t m = 0;
  for (int s = 0; s < p; ++s) {
    for (int64_t j = 0; j < el; ++j)
      send_rows[s] += plan.counts[s * e + first + j];
    send_off[s] = m;
    m += send_rows[s];
  }
  Tensor back = Tensor::Empty({m, h}, dt, dev);
  int64_t pos = 0;
  for (int64_t j = 0; j < el; ++j) {
    for (int s = 0; s < p; ++s) {
      const int64_t n = plan.counts[s * e + first + j];
      const int64_t dst = send_off[s] + SourceOffset(plan, s, first + j) -
                          SourceOffset(plan, s, first);
      MCC_RETURN_IF_ERROR(CopyRows(local_rows, pos, back, dst, n));
      pos += n;
    }
  }
  Tensor out = Tensor::Empty({plan.rows, h}, dt, dev);
  std::vector<comm::P2POp> ops;
  for (int s = 0; s < p; ++s) {
    if (s == me || send_rows[s] == 0) continue;
    MCC_ASSIGN_OR_RETURN(Tensor block,
                         back.Slice(send_off[s], send_off[s] + send_rows[s]));
    ops.push_back(comm::P2POp::Send(block, s));
  }
  for (int d = 0; d < p; ++d) {
    const int64_t begin = SourceOffset(plan, me, d * el);
    const int64_t n = SourceOffset(plan, me, (d + 1) * el) - begin;
    if (d == me) {
      MCC_RETURN_IF_ERROR(CopyRows(back, send_off[me], out, begin, n));
    } else if (n > 0) {
      MCC_ASSIGN_OR_RETURN(Tensor block, out.Slice(begin, begin + n));
      ops.push_back(comm::P2POp::Recv(block, d));
    }
  }
  if (!ops.empty()) MCC_RETURN_IF_ERROR(group_->BatchP2PSync(std::move(ops)));
  return out;
}

}  // namespace moe
}  // namespace mcc
