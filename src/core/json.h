// The one JSON reader for everything lockstep reads from disk or the network (DESIGN.md, lesson
// 13). nlohmann::json parses without a depth bound and serialises recursively, and its
// iterator input stops at nothing a C string would not: so the text is checked first.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace lockstep {

// Deeper nesting is refused before parsing (no lockstep format nests beyond 4).
inline constexpr int kMaxJsonDepth = 64;
// Larger JSON texts are refused (the largest lockstep writes, a safetensors header of a big
// model, is a few MiB).
inline constexpr size_t kMaxJsonBytes = size_t{64} << 20;

// Parses `text` strictly: no NUL byte, at most kMaxJsonBytes, nesting at most kMaxJsonDepth,
// no duplicate object keys (parsers disagree on which duplicate wins, and an audited file must
// mean one thing to every reader), nothing after the value but whitespace. Every failure is an
// Error naming `what` and the problem.
nlohmann::json ParseJsonStrict(std::string_view text, std::string_view what);

// A value as an error message shows it: its JSON text, cut to at most 80 characters.
std::string ShownJson(const nlohmann::json& value);

}  // namespace lockstep
