#ifndef CHECKPOINT_IN_PROCESS_GROUP_H_
#define CHECKPOINT_IN_PROCESS_GROUP_H_

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "checkpoint/dist_context.h"

namespace mcc {

// World-size ranks as threads of one process, for tests: Context(r) gives
// rank r's DistContext, whose barrier and all-gather meet the other threads.
class InProcessGroup {
 public:
  explicit InProcessGroup(int world_size);
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  DistContext Context(int rank);

 private:
  std::vector<std::string> AllGather(int rank, const std::string& mine);

  const int world_size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> slots_;
  std::vector<std::string> result_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

}  // namespace mcc

#endif  // CHECKPOINT_IN_PROCESS_GROUP_H_
