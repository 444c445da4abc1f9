#include "lockstep/json.h"

#include <fmt/format.h>

#include <set>
#include <vector>

#include "lockstep/core.h"

namespace lockstep {

nlohmann::json ParseJsonStrict(std::string_view text, std::string_view what) {
  using Json = nlohmann::json;
  if (text.size() > kMaxJsonBytes) {
    Fail("{}: {} bytes of JSON (at most {})", what, text.size(), kMaxJsonBytes);
  }
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    Fail("{}: a NUL byte at offset {} (JSON text holds none)", what, nul);
  }
  if (text.starts_with("\xEF\xBB\xBF")) {
    Fail("{}: begins with a UTF-8 byte order mark (JSON text has none)", what);
  }
  // Nesting depth, outside strings, before the recursive parts of nlohmann::json see it.
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        Fail("{}: nested deeper than {} levels at offset {}", what, kMaxJsonDepth, i);
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto track_keys = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) open_objects.emplace_back();
    if (event == Json::parse_event_t::object_end) open_objects.pop_back();
    if (event == Json::parse_event_t::key && duplicate.empty() &&
        !open_objects.back().insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  Json value;
  try {
    value = Json::parse(text.begin(), text.end(), track_keys);
  } catch (const Json::exception& e) {
    Fail("{}: invalid JSON: {}", what, e.what());
  }
  if (!duplicate.empty()) Fail("{}: duplicate key \"{}\"", what, duplicate.substr(0, 80));
  return value;
}

// Cut short so that a wrong array of a million entries is not a million-character message.
std::string ShownJson(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

void RequireKeys(const nlohmann::json& value, std::initializer_list<std::string_view> keys,
                 std::string_view what) {
  if (!value.is_object()) Fail("{}: expected a JSON object, got {}", what, ShownJson(value));
  for (std::string_view key : keys) {
    if (!value.contains(key)) Fail("{}: missing field \"{}\"", what, key);
  }
  for (const auto& [key, unused] : value.items()) {
    bool known = false;
    for (std::string_view k : keys) known = known || k == key;
    if (!known) Fail("{}: unknown field \"{}\"", what, key);
  }
}

uint64_t AsU64(const nlohmann::json& value, std::string_view what) {
  // nlohmann parses every non-negative integer literal as number_unsigned; anything else
  // (negative, fractional, string) would otherwise be converted silently.
  if (!value.is_number_unsigned()) {
    Fail("{}: expected an unsigned integer, got {}", what, ShownJson(value));
  }
  return value.get<uint64_t>();
}

void RequireFormat(const nlohmann::json& object, std::string_view format, uint64_t version,
                   std::string_view what) {
  const std::string got = StringField(object, "format", what);
  if (got != format) Fail("{}: field \"format\" is '{}', expected '{}'", what, got, format);
  const uint64_t got_version = U64Field(object, "format_version", what);
  if (got_version != version) {
    Fail("{}: field \"format_version\" is {}, this build reads version {}", what, got_version,
         version);
  }
}

uint64_t U64Field(const nlohmann::json& object, const char* key, std::string_view what) {
  return AsU64(object.at(key), fmt::format("{}: field \"{}\"", what, key));
}

std::string StringField(const nlohmann::json& object, const char* key, std::string_view what) {
  const nlohmann::json& value = object.at(key);
  if (!value.is_string())
    Fail("{}: field \"{}\": expected a string, got {}", what, key, ShownJson(value));
  return value.get<std::string>();
}

Digest DigestField(const nlohmann::json& object, const char* key, std::string_view what) {
  return DigestFromHex(StringField(object, key, what), fmt::format("{}: field \"{}\"", what, key));
}

}  // namespace lockstep
