// The worker pool behind ParallelFor.
//
// Hand-written rather than OpenMP: libgomp's workers spin at every join (its wait policy is
// read once from the environment at load time), and on a machine whose cores are busy with
// other work a spinning worker steals the very core the thread it waits for needs — `--threads
// 2` on a loaded 2-core laptop ran ~8x slower than one thread. These workers spin briefly, then
// sleep on a condition variable. Which thread runs which task never affects results: tasks
// write disjoint outputs (the numerics contract).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "lockstep/core.h"

namespace lockstep {
namespace {

std::atomic<int> g_threads{1};
thread_local bool t_in_parallel_loop = false;  // a nested ParallelFor runs inline
thread_local bool t_serial = false;            // KeepThisThreadSerial

class Pool {
 public:
  static Pool& Get() {
    static Pool pool;
    return pool;
  }

  // Runs body(i, context) for i in [0, count) on the caller and `helpers` workers. Pinned:
  // count == helpers + 1, the caller runs task 0 and worker w (in creation order) task w + 1.
  void Run(int helpers, int64_t count, void (*body)(int64_t, void*), void* context, bool pinned) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);  // one parallel loop at a time
    Grow(helpers);
    error_ = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      body_ = body;
      context_ = context;
      count_ = count;
      // About 32 claims per thread: few enough that claiming is free, many enough that
      // uneven tasks (causal attention) still balance.
      grain_ = std::max<int64_t>(1, count / (32 * (helpers + 1)));
      pinned_ = pinned;
      next_.store(0);
      failed_.store(false);
      wanted_ = helpers;
      joined_ = 0;
      finished_ = 0;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    Work(pinned ? 0 : -1);
    // Wait for every worker that joined this loop (every wanted one, when pinned) to finish.
    std::unique_lock<std::mutex> lock(mutex_);
    if (pinned) {
      done_.wait(lock, [&] { return finished_ == wanted_; });
    } else {
      wanted_ = 0;  // late wakers must not join a loop that is ending
      done_.wait(lock, [&] { return finished_ == joined_; });
    }
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  Pool() = default;
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void Grow(int helpers) {
    while (static_cast<int>(workers_.size()) < helpers) {
      const int index = static_cast<int>(workers_.size());
      workers_.emplace_back([this, index] { WorkerLoop(index); });
    }
  }

  // Runs `task` alone (this thread's task of a pinned loop), or, for task < 0, claims tasks
  // until none are left.
  // An exception is kept (the first) and stops further claims; Run rethrows it after the join.
  void Work(int64_t task) {
    t_in_parallel_loop = true;
    try {
      RequireIeeeFloatingPoint();
      if (task >= 0) {
        body_(task, context_);
      } else {
        // Tasks are claimed in runs of grain_: one claim per task made the threads fight over
        // next_'s cache line, which cost more than a small task itself (a row of RMSNorm).
        for (int64_t i = next_.fetch_add(grain_); i < count_; i = next_.fetch_add(grain_)) {
          const int64_t end = std::min(count_, i + grain_);
          for (int64_t j = i; j < end && !failed_.load(std::memory_order_relaxed); ++j) {
            body_(j, context_);
          }
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true);
      next_.store(count_);
    }
    t_in_parallel_loop = false;
  }

  void WorkerLoop(int index) {
    uint64_t seen = 0;
    for (;;) {
      // Spin briefly for the next loop (back-to-back kernels), then sleep.
      for (int spin = 0; spin < 2000 && generation_seen() == seen; ++spin) {
        std::this_thread::yield();
      }
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_seen() != seen; });
      if (stop_) return;
      seen = generation_seen();
      if (pinned_ ? index >= wanted_ : joined_ >= wanted_) continue;  // not wanted in this loop
      ++joined_;
      const int64_t task = pinned_ ? index + 1 : -1;
      lock.unlock();
      Work(task);
      lock.lock();
      ++finished_;
      if (finished_ == (pinned_ ? wanted_ : joined_)) done_.notify_one();
    }
  }

  uint64_t generation_seen() const { return generation_.load(std::memory_order_acquire); }

  std::mutex run_mutex_, mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  void (*body_)(int64_t, void*) = nullptr;
  void* context_ = nullptr;
  int64_t count_ = 0;
  int64_t grain_ = 1;
  std::atomic<int64_t> next_{0};
  std::atomic<uint64_t> generation_{0};  // written under mutex_, read without it while spinning
  std::atomic<bool> failed_{false};      // a task of this loop threw
  std::exception_ptr error_;             // the first exception of this loop, under mutex_
  int wanted_ = 0, joined_ = 0, finished_ = 0;
  bool pinned_ = false;
  bool stop_ = false;
};

}  // namespace

void SetThreads(int threads) {
  if (threads < 1 || threads > 1024) Fail("SetThreads: threads = {} (must be 1..1024)", threads);
  g_threads.store(threads);
}

int Threads() { return g_threads.load(); }

void KeepThisThreadSerial() { t_serial = true; }

namespace {
// A loop run inline on the calling thread: checked like a pool thread, unless it is nested in a
// loop whose check this thread has passed.
void RunInline(int64_t count, void (*body)(int64_t, void*), void* context) {
  if (!t_in_parallel_loop) RequireIeeeFloatingPoint();
  for (int64_t i = 0; i < count; ++i) body(i, context);
}
}  // namespace

void ParallelFor(int64_t count, void (*body)(int64_t, void*), void* context) {
  const int threads = Threads();
  if (threads == 1 || count <= 1 || t_in_parallel_loop || t_serial) {
    RunInline(count, body, context);
    return;
  }
  const int helpers = static_cast<int>(std::min<int64_t>(threads, count)) - 1;
  Pool::Get().Run(helpers, count, body, context, /*pinned=*/false);
}

void ParallelForEachThread(void (*body)(int64_t, void*), void* context) {
  const int threads = Threads();
  if (threads == 1 || t_in_parallel_loop || t_serial) {
    RunInline(threads, body, context);
    return;
  }
  Pool::Get().Run(threads - 1, threads, body, context, /*pinned=*/true);
}

}  // namespace lockstep
