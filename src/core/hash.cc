#include <sodium.h>

#include <cstring>

#include "lockstep/core.h"

namespace lockstep {
namespace {
static_assert(sizeof(crypto_generichash_state) <= 384, "Blake2b::state_ too small");

void InitSodium() {
  static const bool ok = sodium_init() >= 0;
  if (!ok) Fail("libsodium: sodium_init failed");
}

crypto_generichash_state* State(std::array<uint8_t, 384>& raw) {
  return reinterpret_cast<crypto_generichash_state*>(raw.data());
}
}  // namespace

Blake2b::Blake2b() {
  InitSodium();
  crypto_generichash_init(State(state_), nullptr, 0, 32);
}

Blake2b& Blake2b::Update(std::span<const uint8_t> bytes) {
  if (finalized_) Fail("Blake2b: Update after Final");
  crypto_generichash_update(State(state_), bytes.data(), bytes.size());
  return *this;
}

Blake2b& Blake2b::Update(std::string_view text) {
  return Update(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

Blake2b& Blake2b::Update(std::span<const float> values) {
  static_assert(std::endian::native == std::endian::little, "lockstep assumes little-endian");
  return Update(std::span(reinterpret_cast<const uint8_t*>(values.data()), values.size_bytes()));
}

Blake2b& Blake2b::UpdateU64(uint64_t value) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(value >> (8 * i));
  return Update(std::span<const uint8_t>(b, 8));
}

Blake2b& Blake2b::UpdateU32(uint32_t value) {
  uint8_t b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<uint8_t>(value >> (8 * i));
  return Update(std::span<const uint8_t>(b, 4));
}

Digest Blake2b::Final() {
  if (finalized_) Fail("Blake2b: Final called twice");
  finalized_ = true;
  Digest d;
  crypto_generichash_final(State(state_), d.data(), d.size());
  return d;
}

Digest Blake2b256(std::span<const uint8_t> bytes) { return Blake2b().Update(bytes).Final(); }

Digest Sha256(std::span<const uint8_t> bytes) {
  InitSodium();
  Digest d;
  crypto_hash_sha256(d.data(), bytes.data(), bytes.size());
  return d;
}

std::string ToHex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 15]);
  }
  return s;
}

Digest DigestFromHex(std::string_view hex, std::string_view what) {
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (hex.size() != 64) {
    Fail("{}: '{}' has {} characters, expected exactly 64 lowercase hex digits", what, hex,
         hex.size());
  }
  Digest d;
  for (size_t i = 0; i < 32; ++i) {
    const int hi = value(hex[2 * i]), lo = value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      Fail("{}: '{}' has a character other than 0-9a-f at position {}", what, hex,
           hi < 0 ? 2 * i : 2 * i + 1);
    }
    d[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return d;
}

}  // namespace lockstep
