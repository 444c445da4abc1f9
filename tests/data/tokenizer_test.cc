// The byte tokenizer: UTF-8 validation, `data tokenize` round trips, deterministic entropy.
#include <cmath>
#include <nlohmann/json.hpp>

#include "data/data_test_util.h"

namespace lockstep::data {
namespace {
using testing::TempDir;

std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(Utf8, AcceptsEveryLengthOfCharacter) {
  EXPECT_NO_THROW(ValidateUtf8(Bytes("plain ascii\n"), "t"));
  EXPECT_NO_THROW(
      ValidateUtf8(Bytes("h\xc3\xa9llo \xe2\x98\x83 \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf"), "t"));
  EXPECT_NO_THROW(ValidateUtf8(Bytes(""), "t"));
}

TEST(Utf8, RejectsMalformedSequencesNamingTheOffset) {
  const struct {
    std::string text;
    std::string offset;
  } cases[] = {
      {"abc\xff", "offset 3"},             // never a lead byte
      {"a\xc0\x80", "offset 1"},           // overlong NUL
      {"ab\xe0\x80\x80", "offset 2"},      // overlong 3-byte form
      {"\xed\xa0\x80", "offset 0"},        // UTF-16 surrogate
      {"xx\xf4\x90\x80\x80", "offset 2"},  // above U+10FFFF
      {"ok \xe2\x98", "offset 3"},         // truncated at the end
      {"\xc3(", "offset 0"},               // bad continuation
      {"\x80", "offset 0"},                // lone continuation byte
  };
  for (const auto& c : cases) {
    test::ExpectError([&] { ValidateUtf8(Bytes(c.text), "file.txt"); },
                      {"file.txt", "invalid UTF-8", c.offset});
  }
}

TEST(Tokenize, RoundTripsFilesIncludingMultibyteAndEmpty) {
  TempDir tmp;
  const std::vector<std::string> texts = {
      "hello, world\n", "", "na\xc3\xafve \xe2\x98\x83 \xf0\x9f\x98\x80\n\nsecond paragraph",
      std::string("nul\0byte", 8)};
  std::vector<std::filesystem::path> files;
  for (size_t k = 0; k < texts.size(); ++k) {
    files.push_back(tmp / fmt::format("in{}.txt", k));
    WriteFileSynced(files.back(), texts[k]);
  }
  TokenizeFiles(files, tmp / "out");
  const Dataset ds = OpenDataset(tmp / "out");
  ASSERT_EQ(ds.num_documents(), texts.size());
  uint64_t total = 0;
  for (size_t k = 0; k < texts.size(); ++k) {
    const std::span<const uint32_t> doc = ds.Document(k);
    EXPECT_EQ(std::string(doc.begin(), doc.end()), texts[k]) << "document " << k;
    total += texts[k].size();
  }
  EXPECT_EQ(ds.total_tokens(), total);
  EXPECT_NE(ds.source().find("in2.txt"), std::string::npos) << ds.source();
}

TEST(Tokenize, InvalidUtf8NamesFileAndOffsetAndWritesNothing) {
  TempDir tmp;
  WriteFileSynced(tmp / "good.txt", "fine");
  WriteFileSynced(tmp / "bad.txt", "caf\xe9 au lait");  // Latin-1, not UTF-8
  const std::vector<std::filesystem::path> files = {tmp / "good.txt", tmp / "bad.txt"};
  test::ExpectError([&] { TokenizeFiles(files, tmp / "out"); }, {"bad.txt", "byte offset 3"});
  EXPECT_FALSE(std::filesystem::exists(tmp / "out"));
}

TEST(Tokenize, RefusesANonEmptyOutputDirectory) {
  TempDir tmp;
  WriteFileSynced(tmp / "a.txt", "a");
  const std::vector<std::filesystem::path> files = {tmp / "a.txt"};
  test::ExpectError([&] { TokenizeFiles(files, tmp.path()); },
                    {tmp.path().string(), "not an empty directory"});
}

TEST(Tokens, DescribeEscapesControlBytesAndEod) {
  const std::vector<uint32_t> tokens = {'a', '\n', 0x01, '\\', kEodToken, 0xe2};
  EXPECT_EQ(DescribeTokens(tokens), "a\\n\\x01\\\\<eod>\\xe2");
}

TEST(Entropy, DeterministicLogIsWithinAnUlpOrTwoOfLibm) {
  EXPECT_EQ(DeterministicLog(1.0), 0.0);
  for (double x : {1e-300, 1e-9, 0.001, 0.3, 0.5, 0.7071, 0.99999, 1.5, 2.0, 257.0, 1e7, 1e300}) {
    const double want = std::log(x);
    EXPECT_NEAR(DeterministicLog(x), want, 4 * std::abs(want) * 0x1p-52 + 1e-300) << x;
  }
  EXPECT_THROW(DeterministicLog(0.0), Error);
  EXPECT_THROW(DeterministicLog(-1.0), Error);
}

TEST(Entropy, OfUniformAndDegenerateCounts) {
  const std::vector<uint64_t> uniform = {5, 5, 5, 5}, single = {0, 9, 0};
  EXPECT_NEAR(EntropyNats(uniform), std::log(4.0), 1e-15);
  EXPECT_EQ(EntropyNats(single), 0.0);
}

}  // namespace
}  // namespace lockstep::data
