// Decimal integers in text (include/lockstep/core.h): the one strict reader of an unsigned
// number that options, batch files and receipts share.
#include <algorithm>
#include <charconv>

#include "lockstep/core.h"

namespace lockstep {

std::optional<uint64_t> ParseDecimalU64(std::string_view text) {
  const bool digits = std::ranges::all_of(text, [](char c) { return c >= '0' && c <= '9'; });
  if (text.empty() || !digits || (text.size() > 1 && text[0] == '0')) return std::nullopt;
  uint64_t value = 0;
  if (std::from_chars(text.data(), text.data() + text.size(), value).ec != std::errc()) {
    return std::nullopt;  // past 2^64 - 1
  }
  return value;
}

}  // namespace lockstep
