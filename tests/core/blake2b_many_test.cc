// Blake2b256Many (src/core/blake2b_many.cc): many messages hashed side by side give, on every
// Highway target this CPU runs, exactly libsodium's BLAKE2b-256 of each message, for any count
// (partial lane groups included), for lengths the lane form serves (multiples of 128) and those
// it hands to libsodium, and for messages anywhere: evenly spaced, out of order, before the
// first one, or not a multiple of 8 bytes apart (which libsodium hashes).
#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <sodium.h>

#include <cstdint>
#include <vector>

#include "lockstep/core.h"

namespace lockstep {
namespace {

TEST(Blake2bMany, EqualsLibsodiumOnEveryTargetCountAndLength) {
  ASSERT_GE(sodium_init(), 0);
  // The lane form passed its known answers at start-up (else it names the failure).
  EXPECT_EQ(Blake2bImplementation().find("failed"), std::string::npos) << Blake2bImplementation();
  constexpr size_t kStride = 4096 + 8;  // messages apart, not page-aligned
  constexpr size_t kMaxCount = 19;
  std::vector<uint8_t> data(kStride * kMaxCount);
  uint64_t x = 0x9e3779b97f4a7c15ULL;
  for (uint8_t& b : data) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  std::vector<int64_t> targets;
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) targets.push_back(target);
  ASSERT_FALSE(targets.empty());
  // Message orders: evenly spaced; reversed, so later lanes lie before the first message; and
  // shifted by 4 bytes every other message (not 8-byte congruent: the lane form refuses them).
  const auto layout = [&](int kind, size_t i, size_t count) {
    if (kind == 0) return data.data() + i * kStride;
    if (kind == 1) return data.data() + (count - 1 - i) * kStride;
    return data.data() + i * kStride + (i % 2) * 4;
  };
  for (const int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    for (const size_t bytes : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{256},
                               size_t{1000}, size_t{4096}}) {
      for (int kind = 0; kind < 3; ++kind) {
        for (size_t count = 1; count <= kMaxCount; ++count) {
          std::vector<const uint8_t*> messages;
          for (size_t i = 0; i < count; ++i) messages.push_back(layout(kind, i, count));
          std::vector<Digest> got(count), lanes(count);
          Blake2b256Many(messages, bytes, got.data());
          const bool lane_form = bytes > 0 && bytes % 128 == 0 && (kind < 2 || count == 1);
          if (lane_form) {
            Blake2b256Lanes(messages, bytes, lanes.data());
          } else if (bytes > 0 && bytes % 128 == 0) {
            EXPECT_THROW(Blake2b256Lanes(messages, bytes, lanes.data()), Error);
          }
          for (size_t i = 0; i < count; ++i) {
            Digest want;
            crypto_generichash(want.data(), want.size(), messages[i], bytes, nullptr, 0);
            ASSERT_EQ(got[i], want) << hwy::TargetName(target) << ": layout " << kind
                                    << ", message " << i << " of " << count << ", " << bytes
                                    << " bytes";
            if (lane_form) {
              ASSERT_EQ(lanes[i], want) << hwy::TargetName(target) << ", lanes: layout " << kind
                                        << ", message " << i << " of " << count << ", " << bytes
                                        << " bytes";
            }
          }
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The 256-bit digest of the empty message as Python's hashlib and `b2sum -l 256` give it.
TEST(Blake2bMany, KnownAnswers) {
  const std::string empty_hex = "0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8";
  Digest empty;
  const uint8_t* const nothing = nullptr;
  Blake2b256Many({&nothing, 1}, 0, &empty);
  EXPECT_EQ(ToHex(empty), empty_hex);
}

}  // namespace
}  // namespace lockstep
