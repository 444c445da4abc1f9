// The check every test of a refusal makes: the call throws lockstep::Error, and its message
// names what the user must change (each of `words`).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "lockstep/core.h"

namespace lockstep::test {

inline void ExpectError(const std::function<void()>& call, const std::vector<std::string>& words) {
  try {
    call();
    ADD_FAILURE() << "no lockstep::Error thrown; expected one mentioning '" << words.front() << "'";
  } catch (const Error& e) {
    for (const std::string& w : words) {
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
          << "'" << w << "' missing from: " << e.what();
    }
  }
}

}  // namespace lockstep::test
