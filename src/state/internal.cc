#include "state/internal.h"

#include <fmt/ranges.h>

#include <set>
#include <vector>

namespace lockstep::state_internal {

uint64_t ElementCount(const std::vector<int64_t>& shape, std::string_view what) {
  constexpr uint64_t kMaxElements = (uint64_t{1} << 61) - 1;  // so that bytes fit in int64
  uint64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) Fail("{}: negative dimension {} in shape [{}]", what, dim, fmt::join(shape, ", "));
    const auto d = static_cast<uint64_t>(dim);
    if (d != 0 && count > kMaxElements / d) {
      Fail("{}: shape [{}] has more than 2^61 elements", what, fmt::join(shape, ", "));
    }
    count *= d;
  }
  return count;
}

}  // namespace lockstep::state_internal
