// BLAKE2b-256 of many equal-length messages at once, one message per vector lane (4 on AVX2,
// 8 on AVX-512): the state hash's chunks are independent messages of 1 MiB, and hashing them
// side by side is several times faster per core than one stream at a time, which no Debian
// library offers (libsodium and libb2 hash one message per call, with the message's own words
// across the lanes; OpenSSL 3.0 cannot make a 32-byte BLAKE2b). RFC 7693 defines every step
// below; the result is the same digest libsodium gives, byte for byte (tested on every target,
// and checked against libsodium on known inputs before the first use: Blake2bImplementation).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/blake2b_many.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/cache_control.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

HWY_BEFORE_NAMESPACE();
namespace lockstep::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// RFC 7693, section 2.6 (IV) and 2.7 (SIGMA).
static constexpr uint64_t kIv[8] = {0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL,
                                    0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
                                    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
                                    0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};
static constexpr uint8_t kSigma[10][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0}};

template <class V>
static HWY_INLINE void G(V& a, V& b, V& c, V& d, V x, V y) {
  a = hn::Add(hn::Add(a, b), x);
  d = hn::RotateRight<32>(hn::Xor(d, a));
  c = hn::Add(c, d);
  b = hn::RotateRight<24>(hn::Xor(b, c));
  a = hn::Add(hn::Add(a, b), y);
  d = hn::RotateRight<16>(hn::Xor(d, a));
  c = hn::Add(c, d);
  b = hn::RotateRight<63>(hn::Xor(b, c));
}

// `count` (1 .. Lanes(d)) messages, each `bytes` long (a positive multiple of 128), hashed side
// by side; digest of message l to out + 32 * l. The messages may lie anywhere whose distance from
// the first is a multiple of 8 bytes. Message words are gathered across the lanes, little-endian
// as RFC 7693 reads them; lanes past `count` hash the last message again, and their digests are
// dropped.
void HashLanes(const uint8_t* const* messages, size_t count, size_t bytes, uint8_t* out) {
  const hn::ScalableTag<uint64_t> d;
  const hn::RebindToSigned<decltype(d)> di;
  using V = hn::Vec<decltype(d)>;
  const size_t lanes = hn::Lanes(d);
  // Lane l's word w of a block is at (the first message's block) + offset[l] + w, in 8-byte units.
  // (Addresses as integers: the messages are separate objects, which pointer subtraction is not
  // defined between.)
  HWY_ALIGN int64_t offsets[hn::MaxLanes(di)];
  const auto address = [](const uint8_t* p) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)); };
  for (size_t l = 0; l < lanes; ++l) {
    offsets[l] = (address(messages[std::min(l, count - 1)]) - address(messages[0])) / 8;
  }
  const auto lane_offsets = hn::Load(di, offsets);
  const uint8_t* const base = messages[0];
  V h[8];
  for (int i = 0; i < 8; ++i) h[i] = hn::Set(d, kIv[i]);
  h[0] = hn::Xor(h[0], hn::Set(d, uint64_t{0x01010020}));  // digest 32, no key, fanout 1, depth 1
  for (size_t at = 0; at < bytes; at += 128) {
    const auto* block = reinterpret_cast<const int64_t*>(base + at);
    // Each lane reads its own stream, 128 bytes a block: ask for the lines kAhead bytes on, as
    // the gathers alone leave the hardware prefetcher behind (bench_hash, data in DRAM: 3.9
    // GiB/s a core without, 4.3-4.5 with).
    constexpr size_t kAhead = 2048;
    if (at + kAhead < bytes) {
      for (size_t l = 0; l < lanes; ++l) {
        hwy::Prefetch(base + at + kAhead + 8 * offsets[l]);
        hwy::Prefetch(base + at + kAhead + 64 + 8 * offsets[l]);
      }
    }
    V m[16];
    for (int w = 0; w < 16; ++w) {
      m[w] = hn::BitCast(d, hn::GatherIndex(di, block + w, lane_offsets));
    }
    V v[16];
    for (int i = 0; i < 8; ++i) {
      v[i] = h[i];
      v[i + 8] = hn::Set(d, kIv[i]);
    }
    v[12] = hn::Xor(v[12], hn::Set(d, static_cast<uint64_t>(at + 128)));  // bytes so far (< 2^64)
    if (at + 128 == bytes) v[14] = hn::Not(v[14]);                        // the last block
    for (int r = 0; r < 12; ++r) {
      const uint8_t* s = kSigma[r % 10];
      G(v[0], v[4], v[8], v[12], m[s[0]], m[s[1]]);
      G(v[1], v[5], v[9], v[13], m[s[2]], m[s[3]]);
      G(v[2], v[6], v[10], v[14], m[s[4]], m[s[5]]);
      G(v[3], v[7], v[11], v[15], m[s[6]], m[s[7]]);
      G(v[0], v[5], v[10], v[15], m[s[8]], m[s[9]]);
      G(v[1], v[6], v[11], v[12], m[s[10]], m[s[11]]);
      G(v[2], v[7], v[8], v[13], m[s[12]], m[s[13]]);
      G(v[3], v[4], v[9], v[14], m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; ++i) h[i] = hn::Xor(h[i], hn::Xor(v[i], v[i + 8]));
  }
  // The digest is h[0..3], little-endian, per lane.
  HWY_ALIGN uint64_t words[4][hn::MaxLanes(d)];
  for (int i = 0; i < 4; ++i) hn::Store(h[i], d, words[i]);
  for (size_t l = 0; l < count && l < lanes; ++l) {
    for (int i = 0; i < 4; ++i) {
      for (int b = 0; b < 8; ++b) out[32 * l + 8 * i + b] = static_cast<uint8_t>(words[i][l] >> (8 * b));
    }
  }
}

size_t LaneCount() { return hn::Lanes(hn::ScalableTag<uint64_t>()); }
const char* TargetHere() { return hwy::TargetName(HWY_TARGET); }

}  // namespace lockstep::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <chrono>
#include <vector>

#include <fmt/format.h>
#include <sodium.h>

#include "lockstep/core.h"

namespace lockstep {
HWY_EXPORT(HashLanes);
HWY_EXPORT(LaneCount);
HWY_EXPORT(TargetHere);

namespace {

void Sodium(const uint8_t* message, size_t bytes, uint8_t* out) {
  crypto_generichash(out, 32, message, bytes, nullptr, 0);
}

// Which implementation hashes equal messages fastest here, decided once: the lane-parallel
// form on the best Highway target, if it reproduces libsodium's digests on test messages and
// is faster, else libsodium.
struct Choice {
  bool lanes = false;
  std::string name;
};

Choice Choose() {
  if (sodium_init() < 0) Fail("libsodium: sodium_init failed");
  const size_t lanes = HWY_DYNAMIC_DISPATCH(LaneCount)();
  const std::string target = HWY_DYNAMIC_DISPATCH(TargetHere)();
  if (lanes < 2) return {false, "libsodium (one message at a time)"};
  // Known answers: lanes messages of 128 bytes and of 64 KiB, against libsodium.
  constexpr size_t kLong = size_t{64} << 10;
  std::vector<uint8_t> data(lanes * kLong);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  std::vector<const uint8_t*> messages;
  for (size_t l = 0; l < lanes; ++l) messages.push_back(data.data() + l * kLong);
  std::vector<uint8_t> got(32 * lanes), want(32 * lanes);
  for (const size_t bytes : {size_t{128}, kLong}) {
    HWY_DYNAMIC_DISPATCH(HashLanes)(messages.data(), lanes, bytes, got.data());
    for (size_t l = 0; l < lanes; ++l) Sodium(data.data() + l * kLong, bytes, want.data() + 32 * l);
    if (got != want) {
      return {false, fmt::format("libsodium (the {}-lane {} form failed its known answers)", lanes,
                                 target)};
    }
  }
  // Measured: the better of three rounds each over the same lanes x 64 KiB.
  const auto seconds = [&](auto&& hash) {
    double best = 1e9;
    for (int round = 0; round < 3; ++round) {
      const auto start = std::chrono::steady_clock::now();
      hash();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
  };
  const double vector = seconds(
      [&] { HWY_DYNAMIC_DISPATCH(HashLanes)(messages.data(), lanes, kLong, got.data()); });
  const double sodium = seconds([&] {
    for (size_t l = 0; l < lanes; ++l) Sodium(data.data() + l * kLong, kLong, want.data() + 32 * l);
  });
  if (vector < sodium) {
    return {true, fmt::format("{} lanes of {} ({:.1f}x libsodium on this CPU)", lanes, target,
                              sodium / vector)};
  }
  return {false, fmt::format("libsodium ({:.1f}x the {}-lane {} form on this CPU)", vector / sodium,
                             lanes, target)};
}

const Choice& Chosen() {
  static const Choice choice = Choose();
  return choice;
}

// Whether the lane form can hash these messages: a positive multiple of 128 bytes each, all a
// multiple of 8 bytes apart.
bool LaneFormServes(std::span<const uint8_t* const> messages, size_t bytes) {
  const auto address = [](const uint8_t* p) { return reinterpret_cast<uintptr_t>(p); };
  return bytes > 0 && bytes % 128 == 0 && std::ranges::all_of(messages, [&](const uint8_t* m) {
           return (address(m) - address(messages[0])) % 8 == 0;  // unsigned: wraps, stays exact mod 8
         });
}

}  // namespace

const std::string& Blake2bImplementation() { return Chosen().name; }

void Blake2b256Lanes(std::span<const uint8_t* const> messages, size_t bytes, Digest* out) {
  if (!LaneFormServes(messages, bytes)) {
    Fail("Blake2b256Lanes: {} messages of {} bytes (needs a positive multiple of 128 bytes, and "
         "messages a multiple of 8 bytes apart)",
         messages.size(), bytes);
  }
  const size_t lanes = HWY_DYNAMIC_DISPATCH(LaneCount)();
  for (size_t i = 0; i < messages.size(); i += lanes) {
    HWY_DYNAMIC_DISPATCH(HashLanes)(messages.data() + i, std::min(lanes, messages.size() - i),
                                    bytes, out[i].data());
  }
}

void Blake2b256Many(std::span<const uint8_t* const> messages, size_t bytes, Digest* out) {
  size_t i = 0;
  if (Chosen().lanes && !messages.empty() && LaneFormServes(messages, bytes)) {
    // A group that fills at least half the lanes beats libsodium one message at a time.
    const size_t lanes = HWY_DYNAMIC_DISPATCH(LaneCount)(), count = messages.size();
    const size_t many = count >= lanes / 2 ? count : count - count % lanes;
    Blake2b256Lanes(messages.first(many), bytes, out);
    i = many;
  }
  for (; i < messages.size(); ++i) Sodium(messages[i], bytes, out[i].data());
}

}  // namespace lockstep
#endif
