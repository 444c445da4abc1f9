// The memory plan's arithmetic (docs/audit.md, "Memory plan").
#include <string>

#include "lockstep/audit.h"

namespace lockstep::audit {
uint64_t MemoryPlan::total() const {
  uint64_t sum = resident_at_planning;
  for (const auto& [what, bytes] : parts) sum += bytes;
  return sum;
}

std::string MemoryPlan::Describe() const {
  std::string text = fmt::format("planned peak RSS {} = resident now {}", MiB(total()),
                                 MiB(resident_at_planning));
  for (const auto& [what, bytes] : parts) text += fmt::format(" + {} {}", what, MiB(bytes));
  return text;
}

}  // namespace lockstep::audit
