#include <cstring>

#include "kernels/internal.h"

namespace lockstep::rk {

std::vector<SweepResult> SweepVariants(const std::function<std::vector<float>()>& run,
                                       std::span<const int> thread_counts) {
  const Isa saved_isa = ActiveIsa();
  const int saved_threads = Threads();
  SetIsa(ReferenceIsa());
  SetThreads(1);
  const std::vector<float> expected = run();
  std::vector<SweepResult> results;
  for (const Isa& isa : UsableIsas()) {
    SetIsa(isa);
    for (int threads : thread_counts) {
      SetThreads(threads);
      const std::vector<float> got = run();
      SweepResult r{isa, threads, false, -1, static_cast<int64_t>(got.size())};
      if (got.size() != expected.size()) {
        r.first_diff = 0;
      } else {
        for (size_t i = 0; i < got.size(); ++i) {
          if (std::memcmp(&got[i], &expected[i], sizeof(float)) != 0) {
            r.first_diff = static_cast<int64_t>(i);
            break;
          }
        }
        r.equal = r.first_diff < 0;
      }
      results.push_back(r);
    }
  }
  SetIsa(saved_isa);
  SetThreads(saved_threads);
  return results;
}

}  // namespace lockstep::rk
