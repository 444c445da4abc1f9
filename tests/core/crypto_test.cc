// Philox against Random123's known-answer vectors (kat_vectors, "philox4x32 10" lines);
// BLAKE2b-256 and SHA-256 against the RFC 7693 / FIPS 180-2 "abc" examples.
#include <gtest/gtest.h>

#include <filesystem>

#include "lockstep/core.h"

namespace lockstep {
namespace {

TEST(Philox, Random123KnownAnswers) {
  struct Kat {
    PhiloxCounter ctr;
    PhiloxKey key;
    PhiloxCounter want;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) EXPECT_EQ(Philox4x32(k.ctr, k.key), k.want);
}

std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(Hash, Blake2b256AndSha256KnownAnswers) {
  EXPECT_EQ(ToHex(Blake2b256(Bytes(""))),
            "0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8");
  EXPECT_EQ(ToHex(Blake2b256(Bytes("abc"))),
            "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319");
  EXPECT_EQ(ToHex(Sha256(Bytes("abc"))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // Streaming equals one shot, and the integer helpers are little-endian.
  EXPECT_EQ(Blake2b().Update("a").Update("bc").Final(), Blake2b256(Bytes("abc")));
  const uint8_t le[8] = {1, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(Blake2b().UpdateU64(1).Final(), Blake2b256(le));
}

TEST(Hash, HexRoundTripAndStrictParsing) {
  const Digest d = Blake2b256(Bytes("x"));
  EXPECT_EQ(DigestFromHex(ToHex(d), "test"), d);
  EXPECT_THROW(DigestFromHex(ToHex(d).substr(0, 16), "--expect-hash"), Error);
  std::string upper = ToHex(d);
  upper[0] = 'A';
  try {
    DigestFromHex(upper, "--expect-hash");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--expect-hash"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("position 0"), std::string::npos);
  }
}

TEST(Files, WriteSyncedThenReadBackAndErrorsNameThePath) {
  const auto dir = std::filesystem::temp_directory_path() / "lockstep_core_files_test";
  std::filesystem::create_directories(dir);
  WriteFileSynced(dir / "a.txt", std::string_view("hello"));
  SyncDirectory(dir);
  EXPECT_EQ(ReadFileText(dir / "a.txt"), "hello");
  try {
    ReadFileBytes(dir / "missing.bin");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.bin"), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lockstep
