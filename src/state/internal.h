// Helpers shared by the state layer's formats. Every file lockstep reads is checked field by
// field, and every failure names the file (`what`), the field and the value.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/core.h"

namespace lockstep::state_internal {

using Json = nlohmann::json;

// Parses `text`, rejecting duplicate object keys: parsers disagree on which duplicate wins, and
// an audited file must mean the same thing to every reader.
Json ParseJsonStrict(std::string_view text, std::string_view what);

// Fails unless `value` is an object whose keys are exactly `keys`.
void RequireKeys(const Json& value, std::initializer_list<std::string_view> keys,
                 std::string_view what);

// Typed fields of an object already checked by RequireKeys.
uint64_t U64Field(const Json& object, const char* key, std::string_view what);
std::string StringField(const Json& object, const char* key, std::string_view what);
Digest DigestField(const Json& object, const char* key, std::string_view what);

// Fails unless the object's "format" is `format` and its "format_version" is `version` (the
// only version this build reads).
void RequireFormat(const Json& object, std::string_view format, uint64_t version,
                   std::string_view what);

// A JSON value as an unsigned 64-bit integer; `what` names it (e.g. "file: field").
uint64_t AsU64(const Json& value, std::string_view what);
// A value as an error message shows it: its JSON text, cut to at most 80 characters.
std::string Shown(const Json& value);

// The element count of `shape`; fails naming `what` on a negative dimension or on overflow of
// the byte count (count × 4 must fit in 63 bits).
uint64_t ElementCount(const std::vector<int64_t>& shape, std::string_view what);

}  // namespace lockstep::state_internal
