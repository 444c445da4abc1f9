// Subword tokenizers (SentencePiece): training is deterministic, a tokenized dataset holds each
// file's ids and binds the model by its digest, and decoding gives every file back exactly --
// non-ASCII text, whitespace runs, tabs and empty documents included.
#include <nlohmann/json.hpp>

#include <functional>
#include <regex>

#include "common/expect_error.h"
#include "data/data_test_util.h"

namespace lockstep::data {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;

// A varied corpus: several scripts, whitespace runs, tabs, blank lines, digits and punctuation.
std::vector<fs::path> WriteCorpus(const TempDir& tmp) {
  const std::vector<std::string> words = {
      "lockstep", "bitwise", "audit", "replay", "chain", "hash", "über", "naïve", "日本語の文",
      "Ελληνικά", "русский", "emoji🙂", "x=42;", "(a+b)*c", "don't", "3.14159", "",
  };
  std::vector<fs::path> files;
  uint32_t state = 11;
  const auto next = [&](uint32_t n) {
    state = state * 1664525u + 1013904223u;
    return (state >> 8) % n;
  };
  for (int f = 0; f < 4; ++f) {
    std::string text;
    for (int line = 0; line < 150; ++line) {
      const uint32_t n = 1 + next(12);
      for (uint32_t w = 0; w < n; ++w) {
        text += words[next(static_cast<uint32_t>(words.size()))];
        text += std::string(1 + next(3), next(7) == 0 ? '\t' : ' ');  // runs of blanks
      }
      text += next(9) == 0 ? "\n\n" : "\n";
    }
    files.push_back(tmp / fmt::format("text{}.txt", f));
    WriteFileSynced(files.back(), text);
  }
  files.push_back(tmp / "empty.txt");
  WriteFileSynced(files.back(), "");
  return files;
}

TEST(Subword, TrainingIsDeterministicAndDatasetsDecodeToTheirFiles) {
  TempDir tmp;
  const std::vector<fs::path> files = WriteCorpus(tmp);
  for (const char* model : {"unigram", "bpe"}) {
    SCOPED_TRACE(model);
    const fs::path a = TrainTokenizer(files, 340, model, tmp / (std::string(model) + "_a"));
    const fs::path b = TrainTokenizer(files, 340, model, tmp / (std::string(model) + "_b"));
    EXPECT_EQ(ReadFileBytes(a), ReadFileBytes(b)) << "training twice gave different models";

    const std::unique_ptr<Tokenizer> tokenizer = OpenTokenizer(a.parent_path());
    const Vocabulary& v = tokenizer->vocabulary();
    EXPECT_EQ(v.size, 340u);
    EXPECT_EQ(v.tokenizer_file, "tokenizer.model");
    EXPECT_EQ(v.tokenizer_blake2b, Blake2b256(ReadFileBytes(a)));
    EXPECT_EQ(OpenTokenizer(a)->vocabulary(), v);

    const fs::path out = tmp / (std::string(model) + "_shards");
    TokenizeFiles(files, out, kDefaultShardTokens, tokenizer.get());
    const Dataset ds = OpenDataset(out);
    EXPECT_EQ(ds.vocabulary(), v);
    ASSERT_EQ(ds.num_documents(), files.size());
    for (size_t d = 0; d < files.size(); ++d) {
      const std::string text = ReadFileText(files[d]);
      const std::span<const uint32_t> ids = ds.Document(d);
      EXPECT_TRUE(std::ranges::equal(ids, tokenizer->Encode(text, files[d].string()))) << d;
      EXPECT_EQ(tokenizer->Decode(ids), text) << files[d];
      EXPECT_EQ(std::ranges::count(ids, v.eod), 0);
    }
    EXPECT_LT(ds.total_tokens(), ReadFileText(files[0]).size() * files.size() / 2)
        << "subwords should be much fewer than bytes";
    const nlohmann::json manifest = nlohmann::json::parse(ReadFileText(out / "manifest.json"));
    EXPECT_EQ(manifest["tokenizer"]["blake2b"], ToHex(v.tokenizer_blake2b));
  }
}

// The number in a refusal "use --vocab N or more" / "or less".
uint64_t SuggestedVocab(const std::function<void()>& train, const std::string& what) {
  try {
    train();
  } catch (const Error& e) {
    std::smatch m;
    const std::string message = e.what();
    EXPECT_EQ(message.find("SentencePiece"), std::string::npos) << message;  // told in our terms
    if (std::regex_search(message, m, std::regex("use --vocab (\\d+) or " + what))) {
      return std::stoull(m[1].str());
    }
    ADD_FAILURE() << message;
    return 0;
  }
  ADD_FAILURE() << "trained";
  return 0;
}

// A vocabulary the inputs cannot hold, or cannot fill, is refused in --vocab terms with the size
// that works, and that size trains.
TEST(Subword, AVocabularyOfTheWrongSizeIsRefusedWithOneThatWorks) {
  TempDir tmp;
  const std::vector<fs::path> files = WriteCorpus(tmp);
  for (const char* model : {"unigram", "bpe"}) {
    const uint64_t least = SuggestedVocab([&] { TrainTokenizer(files, 8, model, tmp / "a"); },
                                          "more");
    EXPECT_GT(least, 256u) << model;  // the byte pieces at least
    EXPECT_NO_THROW(TrainTokenizer(files, least, model, tmp / (std::string(model) + "-least")));
    const uint64_t most = SuggestedVocab(
        [&] { TrainTokenizer(files, 1 << 20, model, tmp / "b"); }, "less");
    EXPECT_GT(most, least) << model;
    EXPECT_NO_THROW(TrainTokenizer(files, most, model, tmp / (std::string(model) + "-most")));
    EXPECT_FALSE(fs::exists(tmp / "a"));
    EXPECT_FALSE(fs::exists(tmp / "b"));
  }
  // SentencePiece holds the size in a signed 32-bit int.
  test::ExpectError([&] { TrainTokenizer(files, uint64_t{1} << 31, "bpe", tmp / "c"); },
                    {"--vocab 2147483648 is outside 8 .. 2147483647"});
}

TEST(Subword, BadInputsAreRefusedClearly) {
  TempDir tmp;
  const std::vector<fs::path> files = WriteCorpus(tmp);
  test::ExpectError([&] { TrainTokenizer(files, 400, "wordpiece", tmp / "x"); },
                    {"'wordpiece'", "unigram or bpe"});
  EXPECT_FALSE(fs::exists(tmp / "y"));
  WriteFileSynced(tmp / "bad.txt", std::string("ok \xff\xfe bad"));
  test::ExpectError(
      [&] { TrainTokenizer(std::vector<fs::path>{tmp / "bad.txt"}, 400, "unigram", tmp / "z"); },
      {"bad.txt", "byte"});
  // Lines SentencePiece would skip without a word are refused, each named by file and line.
  WriteFileSynced(tmp / "long.txt", "short line\n\n" + std::string(1000001, 'a') + "\n");
  test::ExpectError(
      [&] { TrainTokenizer(std::vector<fs::path>{tmp / "long.txt"}, 400, "unigram", tmp / "l"); },
      {"long.txt line 3", "1000001 bytes", "at most 1000000", "split it"});
  WriteFileSynced(tmp / "reserved.txt", "fine\nblock \u2585 char\n");
  test::ExpectError(
      [&] { TrainTokenizer(std::vector<fs::path>{tmp / "reserved.txt"}, 400, "bpe", tmp / "r"); },
      {"reserved.txt line 2", "U+2585"});
  EXPECT_FALSE(fs::exists(tmp / "l"));
  EXPECT_FALSE(fs::exists(tmp / "r"));
  WriteFileSynced(tmp / "not_a_model", "this is not a protobuf");
  test::ExpectError([&] { OpenTokenizer(tmp / "not_a_model"); },
                    {"not_a_model", "not a SentencePiece model", "ends in .json"});
  test::ExpectError([&] { OpenTokenizer(tmp.path()); }, {"tokenizer.model"});
}

}  // namespace
}  // namespace lockstep::data
