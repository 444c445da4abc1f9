#include <omp.h>

#include <atomic>

#include "lockstep/core.h"

namespace lockstep {
namespace {
std::atomic<int> g_threads{1};
}  // namespace

void SetThreads(int threads) {
  if (threads < 1 || threads > 1024) Fail("SetThreads: threads = {} (must be 1..1024)", threads);
  g_threads.store(threads);
}

int Threads() { return g_threads.load(); }

// OpenMP (libgomp) runs the loops: tasks are independent outputs, so dynamic scheduling is
// safe and balances uneven tasks (e.g. causal attention rows).
void ParallelFor(int64_t count, void (*body)(int64_t, void*), void* context) {
  const int threads = Threads();
  if (threads == 1 || count <= 1) {
    for (int64_t i = 0; i < count; ++i) body(i, context);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t i = 0; i < count; ++i) body(i, context);
}

}  // namespace lockstep
