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

template <size_t N>
std::array<uint8_t, N> BytesFromHex(std::string_view hex, std::string_view what) {
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (hex.size() != 2 * N) {
    Fail("{}: '{}' has {} characters, expected exactly {} lowercase hex digits", what,
         hex.substr(0, 2 * N + 8), hex.size(), 2 * N);
  }
  std::array<uint8_t, N> d;
  for (size_t i = 0; i < N; ++i) {
    const int hi = value(hex[2 * i]), lo = value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      Fail("{}: '{}' has a character other than 0-9a-f at position {}", what, hex,
           hi < 0 ? 2 * i : 2 * i + 1);
    }
    d[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return d;
}
template std::array<uint8_t, 32> BytesFromHex<32>(std::string_view, std::string_view);
template std::array<uint8_t, 64> BytesFromHex<64>(std::string_view, std::string_view);

Digest DigestFromHex(std::string_view hex, std::string_view what) {
  return BytesFromHex<32>(hex, what);
}

// ---- Merkle trees ----------------------------------------------------------------------------

namespace {

Digest NodeHash(const Digest& left, const Digest& right) {
  const uint8_t tag = 0x01;
  return Blake2b().Update({&tag, 1}).Update(left).Update(right).Final();
}

// The largest power of two strictly below n (n >= 2).
size_t SplitPoint(size_t n) {
  size_t k = 1;
  while (k * 2 < n) k *= 2;
  return k;
}

}  // namespace

Digest LeafHash(std::string_view bytes) {
  const uint8_t tag = 0x00;
  return Blake2b().Update({&tag, 1}).Update(bytes).Final();
}

Digest MerkleRoot(std::span<const Digest> leaves) {
  if (leaves.empty()) return Blake2b().Final();
  if (leaves.size() == 1) return leaves[0];
  const size_t k = SplitPoint(leaves.size());
  return NodeHash(MerkleRoot(leaves.first(k)), MerkleRoot(leaves.subspan(k)));
}

std::vector<Digest> InclusionProof(std::span<const Digest> leaves, size_t index) {
  if (index >= leaves.size()) {
    Fail("InclusionProof: leaf {} of a tree of {} leaves", index, leaves.size());
  }
  if (leaves.size() == 1) return {};
  const size_t k = SplitPoint(leaves.size());
  std::vector<Digest> path;
  if (index < k) {
    path = InclusionProof(leaves.first(k), index);
    path.push_back(MerkleRoot(leaves.subspan(k)));
  } else {
    path = InclusionProof(leaves.subspan(k), index - k);
    path.push_back(MerkleRoot(leaves.first(k)));
  }
  return path;
}

bool VerifyInclusion(const Digest& leaf, size_t index, size_t count, std::span<const Digest> proof,
                     const Digest& root) {
  // RFC 9162, section 2.1.3.2.
  if (index >= count) return false;
  size_t fn = index, sn = count - 1;
  Digest r = leaf;
  for (const Digest& p : proof) {
    if (sn == 0) return false;
    if ((fn & 1) != 0 || fn == sn) {
      r = NodeHash(p, r);
      while ((fn & 1) == 0 && fn != 0) {
        fn >>= 1;
        sn >>= 1;
      }
    } else {
      r = NodeHash(r, p);
    }
    fn >>= 1;
    sn >>= 1;
  }
  return sn == 0 && r == root;
}

// ---- Ed25519 -----------------------------------------------------------------------------------

Ed25519Seed NewEd25519Seed() {
  InitSodium();
  Ed25519Seed seed;
  randombytes_buf(seed.data(), seed.size());
  return seed;
}

Ed25519PublicKey PublicKeyOf(const Ed25519Seed& seed) {
  InitSodium();
  Ed25519PublicKey pk;
  std::array<uint8_t, crypto_sign_SECRETKEYBYTES> sk;
  crypto_sign_seed_keypair(pk.data(), sk.data(), seed.data());
  sodium_memzero(sk.data(), sk.size());
  return pk;
}

Ed25519Signature SignMessage(const Ed25519Seed& seed, std::span<const uint8_t> message) {
  InitSodium();
  Ed25519PublicKey pk;
  std::array<uint8_t, crypto_sign_SECRETKEYBYTES> sk;
  crypto_sign_seed_keypair(pk.data(), sk.data(), seed.data());
  Ed25519Signature sig;
  crypto_sign_detached(sig.data(), nullptr, message.data(), message.size(), sk.data());
  sodium_memzero(sk.data(), sk.size());
  return sig;
}

bool VerifySignature(const Ed25519PublicKey& key, std::span<const uint8_t> message,
                     const Ed25519Signature& signature) {
  InitSodium();
  return crypto_sign_verify_detached(signature.data(), message.data(), message.size(),
                                     key.data()) == 0;
}

}  // namespace lockstep
