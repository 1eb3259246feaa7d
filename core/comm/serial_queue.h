#ifndef CORE_COMM_SERIAL_QUEUE_H_
#define CORE_COMM_SERIAL_QUEUE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace mcc {
namespace comm {

// One worker thread running tasks in the order they were pushed. The
// destructor runs what is queued, then joins.
class SerialQueue {
 public:
  SerialQueue() : thread_([this] { Loop(); }) {}
  ~SerialQueue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  SerialQueue(const SerialQueue&) = delete;
  SerialQueue& operator=(const SerialQueue&) = delete;

  void Push(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::thread thread_;  // Last: starts after the members above exist.
};

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_SERIAL_QUEUE_H_
