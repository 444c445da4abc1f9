// Importing Megatron-style indexed datasets: datasets written by an independent writer
// (tests/data/megatron_writer.py, from the format's public description) import document for
// document; every malformed index or token is refused naming the field, and leaves nothing.
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/data_test_util.h"

namespace lockstep::data {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;

using Documents = std::vector<std::vector<std::vector<uint32_t>>>;  // documents of sequences

bool HavePython() { return std::system("python3 --version > /dev/null 2>&1") == 0; }

// PREFIX.bin / PREFIX.idx written by the independent writer.
void WriteMegatron(const fs::path& prefix, const std::string& dtype, const Documents& documents) {
  const fs::path spec = prefix.string() + ".spec.json";
  WriteFileSynced(spec, nlohmann::json{{"dtype", dtype}, {"documents", documents}}.dump());
  const std::string command = fmt::format("python3 {}/tests/data/megatron_writer.py {} {}",
                                          LOCKSTEP_SOURCE_DIR, prefix.string(), spec.string());
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

constexpr uint32_t kVocab = 500, kEod = 499;

// Documents of several sequences, an empty one, some ending in the end-of-document id (dropped
// on import), one with a sequence of no tokens.
const Documents kDocuments = {
    {{1, 2, 3}, {4, 5, kEod}},
    {},
    {{498, 0, 7, kEod}},
    {{}, {9, 10}},
    {{kEod}},
    {{11}},
};
const std::vector<std::vector<uint32_t>> kImported = {
    {1, 2, 3, 4, 5}, {}, {498, 0, 7}, {9, 10}, {}, {11}};

Vocabulary TestVocabulary(const TempDir& tmp) {
  WriteFileSynced(tmp / "tokenizer.json", "{\"model\": \"a test tokenizer\"}");
  return FileVocabulary(tmp / "tokenizer.json", kVocab, kEod);
}

TEST(Megatron, ImportsEveryDocumentOfEveryIntegerType) {
  if (!HavePython()) GTEST_SKIP() << "python3 is not installed: no independent writer";
  TempDir tmp;
  const Vocabulary vocabulary = TestVocabulary(tmp);
  for (const char* dtype : {"uint16", "int32", "int64"}) {
    SCOPED_TRACE(dtype);
    const fs::path prefix = tmp / (std::string("corpus_") + dtype);
    WriteMegatron(prefix, dtype, kDocuments);
    const fs::path out = tmp / (std::string("shards_") + dtype);
    ImportMegatron(prefix, out, vocabulary, /*max_shard_tokens=*/6);
    const Dataset ds = OpenDataset(out);
    EXPECT_EQ(ds.vocabulary(), vocabulary);
    ASSERT_EQ(ds.num_documents(), kImported.size());
    for (size_t d = 0; d < kImported.size(); ++d) {
      EXPECT_TRUE(std::ranges::equal(ds.Document(d), kImported[d])) << "document " << d;
    }
    EXPECT_GT(ds.shards().size(), 1u);  // documents are never split between shards
    const nlohmann::json manifest = nlohmann::json::parse(ReadFileText(out / "manifest.json"));
    EXPECT_EQ(manifest["tokenizer"],
              (nlohmann::json{{"kind", "file"},
                              {"name", "tokenizer.json"},
                              {"blake2b", ToHex(Blake2b256(ReadFileBytes(tmp / "tokenizer.json")))}}));
    EXPECT_EQ(manifest["vocab_size"], kVocab);
    EXPECT_EQ(manifest["eod_token"], kEod);
    EXPECT_EQ(manifest["source"]["dtype"], dtype);
    EXPECT_EQ(manifest["source"]["bin_blake2b"],
              ToHex(Blake2b256(ReadFileBytes(prefix.string() + ".bin"))));
  }
  // The same data through another dtype gives the same shards (the manifest's source differs).
  const Dataset a = OpenDataset(tmp / "shards_uint16"), b = OpenDataset(tmp / "shards_int64");
  EXPECT_EQ(a.shards().front().bin_blake2b, b.shards().front().bin_blake2b);
}

// Writes a valid dataset, applies `damage` to a copy of its files, and expects the import to be
// refused with every one of `parts` in the message and no output directory.
void ExpectRefused(const TempDir& tmp, const std::string& name, const Documents& documents,
                   const std::function<void(std::vector<uint8_t>& idx, std::vector<uint8_t>& bin)>&
                       damage,
                   const std::vector<std::string>& parts) {
  SCOPED_TRACE(name);
  const fs::path prefix = tmp / name;
  WriteMegatron(prefix, "uint16", documents);
  std::vector<uint8_t> idx = ReadFileBytes(prefix.string() + ".idx");
  std::vector<uint8_t> bin = ReadFileBytes(prefix.string() + ".bin");
  damage(idx, bin);
  WriteFileSynced(prefix.string() + ".idx", idx);
  WriteFileSynced(prefix.string() + ".bin", bin);
  const fs::path out = tmp / (name + "_out");
  test::ExpectError([&] { ImportMegatron(prefix, out, TestVocabulary(tmp)); }, parts);
  EXPECT_FALSE(fs::exists(out));
}

void PutU64(std::vector<uint8_t>& bytes, size_t at, uint64_t value) {
  for (int i = 0; i < 8; ++i) bytes[at + static_cast<size_t>(i)] = static_cast<uint8_t>(value >> (8 * i));
}

TEST(Megatron, MalformedIndexesAndTokensAreRefusedNamingTheField) {
  if (!HavePython()) GTEST_SKIP() << "python3 is not installed: no independent writer";
  TempDir tmp;
  const Documents two = {{{1, 2}}, {{3, 4, 5}}};  // sequences 2 + 3 tokens, documents [0, 1, 2]
  // Offsets in the index of two sequences: header 34, lengths 34..41, pointers 42..57,
  // document_indices 58..81.
  using Bytes = std::vector<uint8_t>;
  ExpectRefused(tmp, "magic", two, [](Bytes& idx, Bytes&) { idx[0] = 'X'; }, {"field magic"});
  ExpectRefused(tmp, "version", two, [](Bytes& idx, Bytes&) { PutU64(idx, 9, 2); },
                {"field version", "2"});
  ExpectRefused(tmp, "float", two, [](Bytes& idx, Bytes&) { idx[17] = 7; },
                {"field dtype", "code 7"});
  ExpectRefused(tmp, "count", two, [](Bytes& idx, Bytes&) { PutU64(idx, 18, 3); },
                {"sequence_count 3", "document_count 3"});
  ExpectRefused(tmp, "huge", two, [](Bytes& idx, Bytes&) { PutU64(idx, 18, uint64_t{1} << 62); },
                {"sequence_count", "more than 2^64"});
  ExpectRefused(tmp, "trailing", two, [](Bytes& idx, Bytes&) { idx.push_back(0); },
                {"trailing bytes"});
  ExpectRefused(tmp, "negative", two, [](Bytes& idx, Bytes&) { idx[34 + 3] = 0x80; },
                {"sequence_lengths[0]", "negative"});
  ExpectRefused(tmp, "pointer", two, [](Bytes& idx, Bytes&) { PutU64(idx, 50, 6); },
                {"sequence_pointers[1]", "byte 6", "end at byte 4"});
  ExpectRefused(tmp, "first_document", two, [](Bytes& idx, Bytes&) { PutU64(idx, 58, 1); },
                {"document_indices[0]", "expected 0"});
  ExpectRefused(tmp, "decreasing", two,
                [](Bytes& idx, Bytes&) {
                  PutU64(idx, 66, 2);
                  PutU64(idx, 74, 1);
                },
                {"document_indices[2]", "1 is not within 2 .. 2"});
  ExpectRefused(tmp, "last_document", two, [](Bytes& idx, Bytes&) { PutU64(idx, 74, 1); },
                {"document_indices", "end at the sequence count 2"});
  ExpectRefused(tmp, "short_bin", two, [](Bytes&, Bytes& bin) { bin.pop_back(); },
                {".bin", "9 bytes", "5 tokens of uint16 (10 bytes)"});
  ExpectRefused(tmp, "token", two, [](Bytes&, Bytes& bin) { bin[6] = 0xF4; bin[7] = 0x01; },
                {"document 1 token 1", "500", "vocabulary of 500"});
  ExpectRefused(tmp, "inner_eod", {{{1, kEod, 2}}},
                [](Bytes&, Bytes&) {}, {"document 0 token 1", "end-of-document id 499 inside"});
  // A document longer than a shard may hold: refused before anything is written.
  {
    const fs::path prefix = tmp / "long";
    WriteMegatron(prefix, "uint16", two);
    test::ExpectError([&] { ImportMegatron(prefix, tmp / "long_out", TestVocabulary(tmp), 2); },
                      {"document 1 has 3 tokens", "more than the 2"});
    EXPECT_FALSE(fs::exists(tmp / "long_out"));
  }
  // Sizes are taken from the index before anything of that size is read or allocated: a
  // document of 2^31 - 1 tokens (its .bin sparse) is refused by its length, and an index of 1 TiB
  // (sparse) whose header says 82 bytes by its size.
  {
    const fs::path prefix = tmp / "huge_document";
    WriteMegatron(prefix, "uint16", two);
    std::vector<uint8_t> idx = ReadFileBytes(prefix.string() + ".idx");
    idx[38] = 0xFF, idx[39] = 0xFF, idx[40] = 0xFF, idx[41] = 0x7F;  // sequence_lengths[1]
    WriteFileSynced(prefix.string() + ".idx", idx);
    fs::resize_file(prefix.string() + ".bin", (uint64_t{2} + 0x7FFFFFFF) * 2);
    test::ExpectError([&] { ImportMegatron(prefix, tmp / "huge_out", TestVocabulary(tmp), 100); },
                      {"document 1 has 2147483647 tokens", "more than the 100"});
    EXPECT_FALSE(fs::exists(tmp / "huge_out"));
    const fs::path big = tmp / "big_index";
    WriteMegatron(big, "uint16", two);
    fs::resize_file(big.string() + ".idx", uint64_t{1} << 40);
    test::ExpectError([&] { ImportMegatron(big, tmp / "big_out", TestVocabulary(tmp), 100); },
                      {"need 82 bytes, the file has 1099511627776", "trailing bytes"});
  }
  // An index shorter than its header.
  ExpectRefused(tmp, "stub", two, [](Bytes& idx, Bytes&) { idx.resize(20); },
                {"shorter than the 34-byte header"});
}

TEST(Megatron, VocabulariesAreCheckedAndRecorded) {
  TempDir tmp;
  WriteFileSynced(tmp / "tok.model", "x");
  test::ExpectError([&] { FileVocabulary(tmp / "tok.model", 1, 0); }, {"vocabulary size 1"});
  test::ExpectError([&] { FileVocabulary(tmp / "tok.model", 10, 10); },
                    {"end-of-document id 10", "below the vocabulary size 10"});
  test::ExpectError([&] { FileVocabulary(tmp / "missing.model", 10, 1); }, {"missing.model"});
  // A shard writer refuses an id outside its vocabulary, and the end-of-document id.
  ShardWriter writer(tmp / "ds", kDefaultShardTokens, FileVocabulary(tmp / "tok.model", 10, 3));
  const std::vector<uint32_t> outside = {1, 10}, eod = {3};
  test::ExpectError([&] { writer.AddDocument(outside); }, {"token 1 is 10", "below 10"});
  test::ExpectError([&] { writer.AddDocument(eod); }, {"end-of-document id 3"});
}

}  // namespace
}  // namespace lockstep::data
