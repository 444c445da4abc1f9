#include <fmt/format.h>

#include "fuzz/fuzz_target.h"
#include "lockstep/data.h"
#include "lockstep/infer.h"

namespace {
// Text prompts become their bytes (the reader's job is the lines, the keys and the ids).
class BytesTokenizer final : public lockstep::data::Tokenizer {
 public:
  const lockstep::data::Vocabulary& vocabulary() const override { return vocabulary_; }
  std::vector<uint32_t> Encode(std::string_view text, std::string_view) const override {
    return {text.begin(), text.end()};
  }
  std::string Decode(std::span<const uint32_t>) const override { return {}; }

 private:
  lockstep::data::Vocabulary vocabulary_;
};
}  // namespace

// A --batch file (infer::ParseBatch), without a tokenizer and with one: what it accepts has
// 1 .. kMaxRequests requests with distinct ids.
LOCKSTEP_FUZZ_TARGET({
  static const BytesTokenizer tokenizer;
  for (const lockstep::data::Tokenizer* t :
       {static_cast<const BytesTokenizer*>(nullptr), &tokenizer}) {
    try {
      const std::vector<lockstep::infer::Request> r = lockstep::infer::ParseBatch(text, t, "fuzz");
      if (r.empty() || r.size() > lockstep::infer::kMaxRequests ||
          lockstep::infer::FirstSharedId(r)) {
        __builtin_trap();
      }
    } catch (const lockstep::Error&) {
    }
  }
})
