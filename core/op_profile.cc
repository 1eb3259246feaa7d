#include "core/op_profile.h"

#include <algorithm>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace mcc {
namespace {

struct Totals {
  std::mutex mu;
  absl::flat_hash_map<const char*, OpProfile::Entry> by_op;
};

Totals& GetTotals() {
  static auto* totals = new Totals;
  return *totals;
}

}  // namespace

std::atomic<bool> OpProfile::enabled_{false};
thread_local int ScopedOpTimer::depth_ = 0;

void OpProfile::Add(const char* op, double seconds) {
  Totals& t = GetTotals();
  std::lock_guard<std::mutex> lock(t.mu);
  Entry& e = t.by_op[op];
  if (e.calls == 0) e.op = op;
  ++e.calls;
  e.seconds += seconds;
}

std::vector<OpProfile::Entry> OpProfile::Snapshot() {
  Totals& t = GetTotals();
  std::vector<Entry> out;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    for (const auto& [op, e] : t.by_op) out.push_back(e);
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.op < b.op;
  });
  return out;
}

void OpProfile::Reset() {
  Totals& t = GetTotals();
  std::lock_guard<std::mutex> lock(t.mu);
  t.by_op.clear();
}

std::string OpProfile::Format(const std::vector<Entry>& entries,
                              double total_seconds, int max_entries) {
  const double total = std::max(total_seconds, 1e-12);
  std::vector<std::string> parts;
  double in_ops = 0, rest = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    in_ops += entries[i].seconds;
    if (static_cast<int>(i) < max_entries) {
      parts.push_back(absl::StrFormat("%s %.1f ms (%.1f%%)", entries[i].op,
                                      1e3 * entries[i].seconds,
                                      100 * entries[i].seconds / total));
    } else {
      rest += entries[i].seconds;
    }
  }
  if (rest > 0) {
    parts.push_back(absl::StrFormat("%d other ops %.1f ms (%.1f%%)",
                                    entries.size() - max_entries, 1e3 * rest,
                                    100 * rest / total));
  }
  const double outside = std::max(0.0, total_seconds - in_ops);
  parts.push_back(absl::StrFormat("outside ops %.1f ms (%.1f%%)", 1e3 * outside,
                                  100 * outside / total));
  return absl::StrJoin(parts, ", ");
}

}  // namespace mcc
