// The one strict JSON reader (include/lockstep/json.h; docs/architecture.md, "Lessons that became
// tests"): deep nesting, NUL bytes, oversize texts, duplicate keys and trailing junk are refused
// with an Error naming the source, never a crash or a silent acceptance.
#include <gtest/gtest.h>

#include <string>

#include "lockstep/core.h"
#include "lockstep/json.h"

namespace lockstep {
namespace {

std::string ErrorOf(std::string_view text) {
  try {
    ParseJsonStrict(text, "f.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonStrict, RefusesWhatALenientParserAccepts) {
  const std::string deep(100000, '[');
  EXPECT_NE(ErrorOf(deep + std::string(100000, ']')).find("f.json: nested deeper than 64"),
            std::string::npos);
  EXPECT_NE(ErrorOf(std::string("{\"a\": 1}\0junk", 13)).find("f.json: a NUL byte at offset 8"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"a": 1, "a": 2})").find("duplicate key \"a\""), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"a": {"b": 1, "b": 1}})").find("duplicate key \"b\""), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"a": 1} x)").find("invalid JSON"), std::string::npos);
  EXPECT_NE(ErrorOf("\xEF\xBB\xBF{\"a\": 1}").find("f.json: begins with a UTF-8 byte order mark"),
            std::string::npos);
  EXPECT_NE(ErrorOf(std::string(kMaxJsonBytes + 1, ' ')).find("bytes of JSON"), std::string::npos);
  // Brackets inside strings are not nesting; 64 levels are fine.
  EXPECT_EQ(ErrorOf("[\"" + std::string(1000, '[') + "\"]"), "");
  EXPECT_EQ(ErrorOf(std::string(64, '[') + std::string(64, ']')), "");
  EXPECT_NE(ErrorOf(std::string(65, '[') + std::string(65, ']')), "");
  EXPECT_EQ(ErrorOf(R"({"a": "x\"[[[", "b": [1, 2]})"), "");
}

TEST(JsonStrict, ShownValuesAreShort) {
  const nlohmann::json big = nlohmann::json::array({std::string(1000, 'x')});
  EXPECT_EQ(ShownJson(big).size(), 80u);
}

}  // namespace
}  // namespace lockstep
