// The synthetic corpus: a pure function of (seed, tokens), with structure beyond unigrams.
#include <map>
#include <nlohmann/json.hpp>

#include "data/data_test_util.h"

namespace lockstep::data {
namespace {
using testing::TempDir;

std::map<std::string, std::vector<uint8_t>> Files(const std::filesystem::path& dir) {
  std::map<std::string, std::vector<uint8_t>> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    files[entry.path().filename().string()] = ReadFileBytes(entry.path());
  }
  return files;
}

TEST(Synth, SameSeedSameBytesOtherSeedOtherCorpus) {
  TempDir tmp;
  WriteSynthCorpus(tmp / "a", 7, 60'000, {}, 25'000);
  WriteSynthCorpus(tmp / "b", 7, 60'000, {}, 25'000);
  WriteSynthCorpus(tmp / "c", 8, 60'000, {}, 25'000);
  const auto a = Files(tmp / "a");
  EXPECT_EQ(a.size(), 2 * 3 + 1u);  // 3 shards and the manifest
  EXPECT_EQ(a, Files(tmp / "b"));
  const auto c = Files(tmp / "c");
  EXPECT_NE(a.at("shard_00000.bin"), c.at("shard_00000.bin"));
  EXPECT_NE(a.at("manifest.json"), c.at("manifest.json"));
}

// The generator's output is pinned: any change to it must bump kSynthVersion (src/data/synth.cc)
// and this digest together. (The manifest's bytes also depend on the shards format, whose
// version the manifest carries; docs/formats/shards.md shows one in full.)
TEST(Synth, PinnedOutputOfVersion1) {
  TempDir tmp;
  WriteSynthCorpus(tmp / "ds", 0, 10'000);
  const Dataset ds = OpenDataset(tmp / "ds");
  ASSERT_EQ(ds.shards().size(), 1u);
  EXPECT_EQ(ToHex(ds.shards()[0].bin_blake2b),
            "6e58d54cb70b09743debefa513a55e9cb6cae80f821d5bff3fd080c8a6951b8f");
}

TEST(Synth, ExactTokenCountLowercaseTextAndProgress) {
  TempDir tmp;
  uint64_t last_done = 0, reports = 0;
  WriteSynthCorpus(tmp / "ds", 1, 12'345, [&](uint64_t done, uint64_t total) {
    EXPECT_EQ(total, 12'345u);
    EXPECT_GE(done, last_done);
    last_done = done;
    ++reports;
  });
  EXPECT_EQ(last_done, 12'345u);
  EXPECT_GE(reports, 1u);
  const Dataset ds = OpenDataset(tmp / "ds");
  EXPECT_EQ(ds.total_tokens(), 12'345u);
  EXPECT_GT(ds.num_documents(), 5u);
  EXPECT_NE(ds.source().find("\"seed\":1"), std::string::npos) << ds.source();
  for (uint64_t d = 0; d < ds.num_documents(); ++d) {
    for (uint32_t t : ds.Document(d)) {
      ASSERT_TRUE((t >= 'a' && t <= 'z') || t == ' ' || t == '.' || t == '!' || t == '?')
          << "document " << d << " token " << t;
    }
  }
}

// The stored unigram entropy is the packed epoch's; the bigram conditional entropy
// H(next | previous) lies far below it, so a model has structure to learn.
TEST(Synth, HasStructureBeyondUnigramFrequencies) {
  TempDir tmp;
  WriteSynthCorpus(tmp / "ds", 3, 200'000);
  const Dataset ds = OpenDataset(tmp / "ds");
  std::vector<uint64_t> unigram(kByteVocab), bigram(kByteVocab * kByteVocab);
  uint32_t previous = kEodToken;
  for (uint64_t d = 0; d < ds.num_documents(); ++d) {
    for (uint32_t t : ds.Document(d)) {
      ++unigram[t];
      ++bigram[previous * kByteVocab + t];
      previous = t;
    }
    ++unigram[kEodToken];
    ++bigram[previous * kByteVocab + kEodToken];
    previous = kEodToken;
  }
  const double h1 = EntropyNats(unigram);
  EXPECT_EQ(h1, ds.unigram_entropy_nats());               // same bits: same counts, same order
  const double h_conditional = EntropyNats(bigram) - h1;  // H(X, Y) - H(X)
  EXPECT_GT(h1, 2.5);
  EXPECT_LT(h_conditional, 0.75 * h1)
      << "unigram " << h1 << " bigram conditional " << h_conditional;
}

}  // namespace
}  // namespace lockstep::data
