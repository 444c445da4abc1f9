// The memory plan's arithmetic (docs/audit.md, "Memory plan").
#include <string>

#include "lockstep/audit.h"

namespace lockstep::audit {
namespace {

std::string Bytes(uint64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

}  // namespace

uint64_t MemoryPlan::total() const {
  uint64_t sum = resident_at_planning;
  for (const auto& [what, bytes] : parts) sum += bytes;
  return sum;
}

std::string MemoryPlan::Describe() const {
  std::string text = fmt::format("planned peak RSS {} = resident now {}", Bytes(total()),
                                 Bytes(resident_at_planning));
  for (const auto& [what, bytes] : parts) text += fmt::format(" + {} {}", what, Bytes(bytes));
  return text;
}

}  // namespace lockstep::audit
