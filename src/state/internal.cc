#include "state/internal.h"

#include <fmt/ranges.h>

#include <set>
#include <vector>

namespace lockstep::state_internal {

std::string Shown(const Json& value) { return ShownJson(value); }

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

void RequireKeys(const Json& value, std::initializer_list<std::string_view> keys,
                 std::string_view what) {
  if (!value.is_object()) Fail("{}: expected a JSON object, got {}", what, Shown(value));
  for (std::string_view key : keys) {
    if (!value.contains(key)) Fail("{}: missing field \"{}\"", what, key);
  }
  for (const auto& [key, unused] : value.items()) {
    bool known = false;
    for (std::string_view k : keys) known = known || k == key;
    if (!known) Fail("{}: unknown field \"{}\"", what, key);
  }
}

uint64_t AsU64(const Json& value, std::string_view what) {
  // nlohmann parses every non-negative integer literal as number_unsigned; anything else
  // (negative, fractional, string) would otherwise be converted silently.
  if (!value.is_number_unsigned()) {
    Fail("{}: expected an unsigned integer, got {}", what, Shown(value));
  }
  return value.get<uint64_t>();
}

void RequireFormat(const Json& object, std::string_view format, uint64_t version,
                   std::string_view what) {
  const std::string got = StringField(object, "format", what);
  if (got != format) Fail("{}: field \"format\" is '{}', expected '{}'", what, got, format);
  const uint64_t got_version = U64Field(object, "format_version", what);
  if (got_version != version) {
    Fail("{}: field \"format_version\" is {}, this build reads version {}", what, got_version,
         version);
  }
}

uint64_t U64Field(const Json& object, const char* key, std::string_view what) {
  return AsU64(object.at(key), fmt::format("{}: field \"{}\"", what, key));
}

std::string StringField(const Json& object, const char* key, std::string_view what) {
  const Json& value = object.at(key);
  if (!value.is_string())
    Fail("{}: field \"{}\": expected a string, got {}", what, key, Shown(value));
  return value.get<std::string>();
}

Digest DigestField(const Json& object, const char* key, std::string_view what) {
  return DigestFromHex(StringField(object, key, what), fmt::format("{}: field \"{}\"", what, key));
}

}  // namespace lockstep::state_internal
