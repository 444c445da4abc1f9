// Token shards: multi-shard writing and reading, and every way a reader must refuse a dataset.
#include <nlohmann/json.hpp>

#include "data/data_test_util.h"

namespace lockstep::data {
namespace {
using nlohmann::ordered_json;
using testing::TempDir;
using testing::Tokens;
using testing::WriteDataset;

const std::vector<std::vector<uint32_t>> kDocs = {
    Tokens("first document"), Tokens(""), Tokens("third"), Tokens("the fourth one"), Tokens("5")};

ordered_json ReadManifest(const std::filesystem::path& dir) {
  return ordered_json::parse(ReadFileText(dir / "manifest.json"));
}
void WriteManifest(const std::filesystem::path& dir, const ordered_json& j) {
  WriteFileSynced(dir / "manifest.json", j.dump(2));
}
// Rewrites a shard file and the manifest's digest of it, so that only the content is wrong.
void ReplaceShardFile(const std::filesystem::path& dir, size_t shard, const std::string& kind,
                      std::span<const uint8_t> bytes) {
  ordered_json j = ReadManifest(dir);
  WriteFileSynced(dir / j["shards"][shard][kind].get<std::string>(), bytes);
  j["shards"][shard][kind + "_blake2b"] = ToHex(Blake2b256(bytes));
  WriteManifest(dir, j);
}

TEST(Shards, SmallShardLimitSplitsDocumentsAcrossShards) {
  TempDir tmp;
  WriteDataset(tmp / "ds", kDocs, /*max_shard_tokens=*/16);
  const Dataset ds = OpenDataset(tmp / "ds");
  ASSERT_EQ(ds.num_documents(), kDocs.size());
  EXPECT_EQ(ds.shards().size(), 3u);  // 14+0 | 5 | 14+1 tokens
  for (size_t d = 0; d < kDocs.size(); ++d) {
    EXPECT_TRUE(std::ranges::equal(ds.Document(d), kDocs[d])) << d;
  }
  EXPECT_EQ(ds.total_tokens(), 34u);
  EXPECT_EQ(ds.manifest_digest(), Blake2b256(ReadFileBytes(tmp / "ds" / "manifest.json")));
  const ordered_json j = ReadManifest(tmp / "ds");
  EXPECT_EQ(j["format"], "lockstep-shards");
  EXPECT_EQ(j["shards"][1]["bin"], "shard_00001.bin");
  EXPECT_EQ(j["shards"][1]["documents"], 1);
  // The .idx of shard 0: {0, 14, 14} as little-endian uint64.
  const std::vector<uint8_t> idx = ReadFileBytes(tmp / "ds" / "shard_00000.idx");
  ASSERT_EQ(idx.size(), 24u);
  EXPECT_EQ(idx[8], 14);
  EXPECT_EQ(idx[16], 14);
}

TEST(Shards, WriterRefusesOversizedDocumentsNonByteTokensAndEmptyDatasets) {
  TempDir tmp;
  ShardWriter writer(tmp / "a", 4);
  test::ExpectError([&] { writer.AddDocument(Tokens("too long")); },
                    {"document 0", "8 tokens", "4"});
  const std::vector<uint32_t> eod = {'a', kEodToken};
  test::ExpectError([&] { writer.AddDocument(eod); }, {"token 1", "256"});
  test::ExpectError([&] { writer.Finish(ordered_json::object()); }, {"no documents"});
}

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteDataset(dir(), kDocs, 16);
    original_ = ReadFileText(dir() / "manifest.json");
  }
  std::filesystem::path dir() const { return tmp_ / "ds"; }
  // Applies `edit` to the original manifest and expects OpenDataset to fail naming `parts`.
  template <typename Edit>
  void ExpectRejected(Edit&& edit, std::vector<std::string> parts) {
    ordered_json j = ordered_json::parse(original_);
    edit(j);
    WriteManifest(dir(), j);
    parts.push_back((dir() / "manifest.json").string());
    test::ExpectError([&] { OpenDataset(dir()); }, parts);
  }
  TempDir tmp_;
  std::string original_;
};

TEST_F(ManifestTest, MissingField) {
  ExpectRejected([](ordered_json& j) { j.erase("total_tokens"); },
                 {"missing field 'total_tokens'"});
  ExpectRejected([](ordered_json& j) { j["shards"][2].erase("idx_blake2b"); },
                 {"missing field 'shards[2].idx_blake2b'"});
}

TEST_F(ManifestTest, WrongType) {
  ExpectRejected([](ordered_json& j) { j["total_documents"] = "5"; },
                 {"'total_documents'", "\"5\"", "unsigned integer"});
  ExpectRejected([](ordered_json& j) { j["shards"][0]["tokens"] = -14; },
                 {"'shards[0].tokens'", "-14"});
  ExpectRejected([](ordered_json& j) { j["shards"] = ordered_json::object(); },
                 {"'shards'", "non-empty array"});
}

TEST_F(ManifestTest, WrongConstants) {
  ExpectRejected([](ordered_json& j) { j["format_version"] = 1; }, {"'format_version'", "1"});
  // The byte tokenizer's ids are fixed.
  ExpectRejected([](ordered_json& j) { j["vocab_size"] = 50257; }, {"'vocab_size'", "50257"});
  ExpectRejected([](ordered_json& j) { j["eod_token"] = 0; }, {"'eod_token'", "0"});
  ExpectRejected([](ordered_json& j) { j["tokenizer"] = "gpt2"; }, {"'tokenizer'", "gpt2"});
  ExpectRejected([](ordered_json& j) { j["tokenizer"]["kind"] = "gpt2"; },
                 {"'tokenizer.kind'", "gpt2"});
  ExpectRejected([](ordered_json& j) { j["tokenizer"]["name"] = "x"; },
                 {"unknown field 'tokenizer.name'"});
  // A tokenizer file: named without directories, pinned by a digest, ids in range.
  const auto file = [](ordered_json& j) {
    j["tokenizer"] = {{"kind", "file"}, {"name", "tok.model"}, {"blake2b", std::string(64, 'a')}};
  };
  ExpectRejected([&](ordered_json& j) { file(j); j["tokenizer"]["name"] = "../tok.model"; },
                 {"'tokenizer.name'", "without directories"});
  ExpectRejected([&](ordered_json& j) { file(j); j["tokenizer"].erase("blake2b"); },
                 {"missing field 'tokenizer.blake2b'"});
  ExpectRejected([&](ordered_json& j) { file(j); j["vocab_size"] = 1; }, {"'vocab_size'", "1"});
  ExpectRejected([&](ordered_json& j) { file(j); j["eod_token"] = 257; },
                 {"'eod_token'", "257", "below vocab_size 257"});
  // Ids of the shards outside the manifest's vocabulary: the .bin is named.
  ordered_json narrow = ordered_json::parse(original_);
  file(narrow);
  narrow["vocab_size"] = 100;  // "first document" starts with 'f' = 102
  narrow["eod_token"] = 99;
  WriteManifest(dir(), narrow);
  test::ExpectError([&] { OpenDataset(dir()); },
                    {"shard_00000.bin", "token 0 is 102", "below vocab_size 100", "eod_token 99"});
  ExpectRejected([](ordered_json& j) { j["unigram_entropy_nats"] = 9.5; },
                 {"'unigram_entropy_nats'", "9.5"});
  ExpectRejected([](ordered_json& j) { j["checksum"] = 1; }, {"unknown field 'checksum'"});
}

TEST_F(ManifestTest, CountMismatch) {
  ExpectRejected([](ordered_json& j) { j["total_documents"] = 6; },
                 {"'total_documents'", "6", "5 (the sum of shards[].documents)"});
  ExpectRejected([](ordered_json& j) { j["total_tokens"] = 35; }, {"'total_tokens'", "35"});
  // A shard count that disagrees with its file: caught by the file size.
  ExpectRejected(
      [](ordered_json& j) {
        j["shards"][1]["tokens"] = 6;
        j["total_tokens"] = 35;
      },
      {"shard_00001.bin", "20 bytes", "6 tokens"});
}

TEST_F(ManifestTest, BadDigestTextAndFileNames) {
  ExpectRejected([](ordered_json& j) { j["shards"][0]["bin_blake2b"] = "abc"; },
                 {"'shards[0].bin_blake2b'", "'abc'"});
  ExpectRejected([](ordered_json& j) { j["shards"][0]["bin"] = "../elsewhere.bin"; },
                 {"'shards[0].bin'", "../elsewhere.bin"});
}

TEST_F(ManifestTest, NotJson) {
  WriteFileSynced(dir() / "manifest.json", "{\"format\": ");
  test::ExpectError([&] { OpenDataset(dir()); }, {"manifest.json", "invalid JSON"});
}

// The manifest goes through the one strict reader: nesting, a NUL with junk after it and
// duplicate keys are refused (they used to crash, or be accepted).
TEST_F(ManifestTest, HostileJsonIsRefused) {
  const std::string good = ReadFileText(dir() / "manifest.json");
  WriteFileSynced(dir() / "manifest.json", std::string(100000, '[') + std::string(100000, ']'));
  test::ExpectError([&] { OpenDataset(dir()); }, {"manifest.json", "nested deeper than 64"});
  WriteFileSynced(dir() / "manifest.json", good + std::string("\0junk", 5));
  test::ExpectError([&] { OpenDataset(dir()); }, {"manifest.json", "a NUL byte"});
  WriteFileSynced(dir() / "manifest.json", "{\"format\": 1, \"format\": 2}");
  test::ExpectError([&] { OpenDataset(dir()); }, {"manifest.json", "duplicate key"});
}

TEST_F(ManifestTest, FlippedByteInBinNamesShardAndBothDigests) {
  const std::filesystem::path bin = dir() / "shard_00001.bin";
  const std::string expected = ReadManifest(dir())["shards"][1]["bin_blake2b"];
  std::vector<uint8_t> bytes = ReadFileBytes(bin);
  bytes[5] ^= 0x01;
  WriteFileSynced(bin, bytes);
  test::ExpectError([&] { OpenDataset(dir()); },
                    {bin.string(), expected, ToHex(Blake2b256(bytes)), "mismatch"});
}

TEST_F(ManifestTest, TruncatedOrMissingIdxIsNamed) {
  const std::filesystem::path idx = dir() / "shard_00002.idx";
  std::vector<uint8_t> bytes = ReadFileBytes(idx);
  bytes.resize(bytes.size() - 3);
  WriteFileSynced(idx, bytes);
  test::ExpectError([&] { OpenDataset(dir()); }, {idx.string(), "truncated"});
  std::filesystem::remove(idx);
  test::ExpectError([&] { OpenDataset(dir()); }, {idx.string(), "cannot open"});
}

TEST_F(ManifestTest, IdxContentsMustMatchTheBin) {
  const auto idx_bytes = [](std::vector<uint64_t> offsets) {
    std::vector<uint8_t> b(offsets.size() * 8);
    std::memcpy(b.data(), offsets.data(), b.size());
    return b;
  };
  const std::filesystem::path idx = dir() / "shard_00000.idx";
  ReplaceShardFile(dir(), 0, "idx", idx_bytes({0, 15, 14}));
  test::ExpectError([&] { OpenDataset(dir()); }, {idx.string(), "offset 2 is 14"});
  ReplaceShardFile(dir(), 0, "idx", idx_bytes({0, 10, 13}));
  test::ExpectError([&] { OpenDataset(dir()); }, {idx.string(), "last offset is 13", "14"});
  ReplaceShardFile(dir(), 0, "idx", idx_bytes({3, 10, 14}));
  test::ExpectError([&] { OpenDataset(dir()); }, {idx.string(), "offset 0 is 3"});
}

TEST_F(ManifestTest, BinHoldsByteTokensOnly) {
  std::vector<uint8_t> bin = ReadFileBytes(dir() / "shard_00001.bin");
  bin[4 * 2 + 1] = 0x01;  // token 2 becomes 256 + its byte
  ReplaceShardFile(dir(), 1, "bin", bin);
  test::ExpectError([&] { OpenDataset(dir()); }, {"shard_00001.bin", "token 2 is 361"});
}

}  // namespace
}  // namespace lockstep::data
