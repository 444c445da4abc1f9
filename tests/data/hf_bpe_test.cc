// tokenizer.json byte-level BPE (GPT-2 and Llama-3 layouts): lockstep's ids are those of the
// independent JavaScript implementation, @huggingface/tokenizers (run by node), on a varied
// corpus -- several scripts, whitespace runs, tabs, CRLF, Unicode spaces, emoji, an added token
// inside the text, empty documents -- and decoding gives every file back.
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/tokenizers_js.h"
#include "data/data_test_util.h"

namespace lockstep::data {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;

using test::TokenizersJs;
constexpr const char* kModuleVersion = test::kTokenizersJsVersion;

bool Shell(const std::string& command) { return std::system(command.c_str()) == 0; }

std::vector<fs::path> WriteCorpus(const TempDir& tmp, bool with_added_token) {
  const std::vector<std::string> words = {
      "lockstep", "bitwise", "audit", "Replay", "CHAIN", "hash", "über", "naïve", "日本語の文",
      "Ελληνικά", "русский", "emoji🙂🎉", "x=42;", "(a+b)*c", "don't", "I'll", "3.14159",
      "1234567", "e\u0301", "\u00a0nbsp", "wide\u3000space", "tab\there", "--", "...", "",
  };
  uint32_t state = 5;
  const auto next = [&](uint32_t n) {
    state = state * 1664525u + 1013904223u;
    return (state >> 8) % n;
  };
  std::vector<fs::path> files;
  for (int f = 0; f < 4; ++f) {
    std::string text;
    for (int line = 0; line < 80; ++line) {
      const uint32_t n = 1 + next(10);
      for (uint32_t w = 0; w < n; ++w) {
        text += words[next(static_cast<uint32_t>(words.size()))];
        text += std::string(1 + next(4) / 3, next(6) == 0 ? '\t' : ' ');
      }
      if (with_added_token && next(20) == 0) text += "<|endoftext|>";
      text += next(7) == 0 ? "\r\n" : (next(5) == 0 ? "\n\n   " : "\n");
    }
    files.push_back(tmp / fmt::format("doc{}.txt", f));
    WriteFileSynced(files.back(), text);
  }
  files.push_back(tmp / "empty.txt");
  WriteFileSynced(files.back(), "");
  return files;
}

std::string Join(const std::vector<fs::path>& files) {
  std::string s;
  for (const fs::path& f : files) s += " " + f.string();
  return s;
}

TEST(HfBpe, IdsAreThoseOfTheIndependentImplementation) {
  if (!Shell("python3 --version > /dev/null 2>&1")) GTEST_SKIP() << "python3 is not installed";
  const std::string module = TokenizersJs();
  if (module.empty()) {
    GTEST_SKIP() << "node or @huggingface/tokenizers@" << kModuleVersion
                 << " is not available (npm unreachable?): the ids are not compared";
  }
  TempDir tmp;
  const std::vector<fs::path> files = WriteCorpus(tmp, /*with_added_token=*/true);
  for (const char* style : {"gpt2", "llama3"}) {
    SCOPED_TRACE(style);
    const fs::path json = tmp / (std::string(style) + ".json");
    ASSERT_TRUE(Shell(fmt::format("python3 {}/tests/data/make_bpe_tokenizer.py {} 300 {}{}",
                                LOCKSTEP_SOURCE_DIR, style, json.string(), Join(files))));
    const fs::path ids_path = tmp / (std::string(style) + ".ids.json");
    ASSERT_TRUE(Shell(fmt::format("node {}/tests/data/hf_encode.mjs {} {}{} > {}",
                                LOCKSTEP_SOURCE_DIR, module, json.string(), Join(files),
                                ids_path.string())));
    const nlohmann::json expected = nlohmann::json::parse(ReadFileText(ids_path));
    ASSERT_EQ(expected.size(), files.size());

    const std::unique_ptr<Tokenizer> tokenizer = OpenTokenizer(json);
    const Vocabulary& v = tokenizer->vocabulary();
    EXPECT_EQ(v.tokenizer_file, json.filename().string());
    EXPECT_EQ(v.eod, v.size - 1);  // <|endoftext|>, added after the vocabulary
    size_t total = 0;
    for (size_t f = 0; f < files.size(); ++f) {
      const std::string text = ReadFileText(files[f]);
      const std::vector<uint32_t> ids = tokenizer->Encode(text, files[f].string());
      EXPECT_EQ(nlohmann::json(ids), expected[f]) << files[f];
      EXPECT_EQ(tokenizer->Decode(ids), text) << files[f];
      total += ids.size();
    }
    EXPECT_GT(total, 1000u);
  }
}

// A long document of varied text, built deterministically: words in several scripts, and runs
// of `run` bytes at most -- letters without a space (one pre-token: \p{L}+), spaces, tabs and
// newlines, a non-ASCII letter -- in lines; every line starts with "w", and a "\n" followed by a
// letter is a pre-token boundary of both layouts' patterns.
std::string LongDocument(size_t bytes, size_t run) {
  const std::vector<std::string> words = {
      "lockstep", "über",          "naïve",           "日本語の文", "Ελληνικά",
      "русский",  "emoji🙂🎉", "x=42;",           "don't",      "3.14159",
      "e\u0301",  "\u00a0nbsp",    "wide\u3000space", "--"};
  uint32_t state = 11;
  const auto next = [&](uint32_t n) {
    state = state * 1664525u + 1013904223u;
    return (state >> 8) % n;
  };
  std::string text;
  while (text.size() < bytes) {
    text += "w";
    switch (next(40)) {
      case 0:
        text += std::string(run - next(static_cast<uint32_t>(run / 2)), 'a');
        break;
      case 1:
        text += " " + std::string(run - next(static_cast<uint32_t>(run / 2)), ' ') + "x";
        break;
      case 2:
        text += "\t" + std::string(run / 4, '\t') + std::string(run / 4, '\n');
        break;
      case 3:
        for (size_t k = run / 2 - next(static_cast<uint32_t>(run / 4)); k > 0; --k) text += "é";
        break;
      default:
        for (uint32_t w = 1 + next(12); w > 0; --w)
          text += " " + words[next(static_cast<uint32_t>(words.size()))];
    }
    text += "\n";
  }
  return text;
}

// The ids of a document (several MiB, with pre-tokens of up to 1 MiB) are those of its parts
// encoded one by one, and those of the independent implementation. Encoding is linear in the text
// and O(n log n) in a pre-token: a quadratic one would not finish here.
TEST(HfBpe, LongDocumentsAreTheirPartsAndThoseOfTheIndependentImplementation) {
  if (!Shell("python3 --version > /dev/null 2>&1")) GTEST_SKIP() << "python3 is not installed";
  TempDir tmp;
  // Learned on text with runs of letters, so that merges join long runs ("a a", "aa aa", ...).
  const fs::path corpus = tmp / "corpus.txt";
  WriteFileSynced(corpus, LongDocument(64 << 10, 64));
  const std::string big = LongDocument(4 << 20, 1 << 20), small = LongDocument(1 << 20, 2048);
  const fs::path small_path = tmp / "small.txt";
  WriteFileSynced(small_path, small);
  const std::string module = TokenizersJs();
  for (const char* style : {"gpt2", "llama3"}) {
    SCOPED_TRACE(style);
    const fs::path json = tmp / (std::string(style) + ".json");
    ASSERT_TRUE(Shell(fmt::format("python3 {}/tests/data/make_bpe_tokenizer.py {} 400 {} {}",
                                  LOCKSTEP_SOURCE_DIR, style, json.string(), corpus.string())));
    const std::unique_ptr<Tokenizer> tokenizer = OpenTokenizer(json);
    for (const std::string* text : {&big, &small}) {
      const std::vector<uint32_t> ids = tokenizer->Encode(*text, "document");
      std::vector<uint32_t> parts;  // 1 to 5 lines at a time, each encoded alone
      for (size_t at = 0, n = 0; at < text->size(); ++n) {
        size_t end = at;
        for (size_t lines = n % 5 + 1; lines > 0 && end < text->size(); --lines) {
          end = text->find("\nw", end);
          end = end == std::string::npos ? text->size() : end + 1;
        }
        const std::vector<uint32_t> part = tokenizer->Encode(text->substr(at, end - at), "part");
        parts.insert(parts.end(), part.begin(), part.end());
        at = end;
      }
      EXPECT_EQ(ids, parts) << text->size();
      EXPECT_EQ(tokenizer->Decode(ids), *text);
    }
    // @huggingface/tokenizers is itself quadratic in a pre-token's length: compared on the
    // document with runs of 2 KiB.
    if (module.empty()) continue;
    const fs::path ids_path = tmp / (std::string(style) + ".ids.json");
    ASSERT_TRUE(
        Shell(fmt::format("node {}/tests/data/hf_encode.mjs {} {} {} > {}", LOCKSTEP_SOURCE_DIR,
                          module, json.string(), small_path.string(), ids_path.string())));
    const nlohmann::json expected = nlohmann::json::parse(ReadFileText(ids_path));
    ASSERT_EQ(expected.size(), 1u);
    EXPECT_EQ(nlohmann::json(tokenizer->Encode(small, "small.txt")), expected[0]);
  }
  if (module.empty()) {
    GTEST_SKIP()
        << "node or @huggingface/tokenizers@" << kModuleVersion
        << " is not available: the long document's ids were checked against its parts only";
  }
}

TEST(HfBpe, DatasetsBindTheTokenizerAndUnsupportedFilesAreRefused) {
  if (!Shell("python3 --version > /dev/null 2>&1")) GTEST_SKIP() << "python3 is not installed";
  TempDir tmp;
  const std::vector<fs::path> files = WriteCorpus(tmp, /*with_added_token=*/false);
  const fs::path json = tmp / "tokenizer.json";
  ASSERT_TRUE(Shell(fmt::format("python3 {}/tests/data/make_bpe_tokenizer.py gpt2 200 {}{}",
                              LOCKSTEP_SOURCE_DIR, json.string(), Join(files))));
  const std::unique_ptr<Tokenizer> tokenizer = OpenTokenizer(tmp.path());  // the directory
  TokenizeFiles(files, tmp / "shards", kDefaultShardTokens, tokenizer.get());
  const Dataset ds = OpenDataset(tmp / "shards");
  EXPECT_EQ(ds.vocabulary(), tokenizer->vocabulary());
  EXPECT_EQ(ds.vocabulary().tokenizer_blake2b, Blake2b256(ReadFileBytes(json)));
  for (size_t d = 0; d < files.size(); ++d) {
    EXPECT_EQ(tokenizer->Decode(ds.Document(d)), ReadFileText(files[d])) << d;
  }

  // The end-of-document token inside a text cannot be part of a document.
  WriteFileSynced(tmp / "eot.txt", "one<|endoftext|>two");
  test::ExpectError(
      [&] {
        TokenizeFiles(std::vector<fs::path>{tmp / "eot.txt"}, tmp / "eot", kDefaultShardTokens,
                      tokenizer.get());
      },
      {"end-of-document id"});
  EXPECT_FALSE(fs::exists(tmp / "eot"));

  // A pattern that backtracks without end on a text stops at PCRE2's bound, named as such.
  {
    nlohmann::json slow = nlohmann::json::parse(ReadFileText(json));
    slow["pre_tokenizer"] = {{"type", "Sequence"},
                             {"pretokenizers",
                              {{{"type", "Split"},
                                {"pattern", {{"Regex", "(a+)+$"}}},
                                {"behavior", "Isolated"},
                                {"invert", false}},
                               {{"type", "ByteLevel"}, {"use_regex", false}}}}};
    WriteFileSynced(tmp / "slow.json", slow.dump());
    WriteFileSynced(tmp / "slow.txt", std::string(40, 'a') + "!");
    const std::unique_ptr<Tokenizer> backtracking = OpenTokenizer(tmp / "slow.json");
    test::ExpectError(
        [&] {
          TokenizeFiles(std::vector<fs::path>{tmp / "slow.txt"}, tmp / "slow", kDefaultShardTokens,
                        backtracking.get());
        },
        {"slow.txt", "Split pattern gave up searching from byte 0", "match limit", "slow.json"});
    EXPECT_FALSE(fs::exists(tmp / "slow"));
  }

  // What this reader does not implement is refused naming the field.
  nlohmann::json j = nlohmann::json::parse(ReadFileText(json));
  const auto refused = [&](const std::function<void(nlohmann::json&)>& edit,
                           const std::vector<std::string>& parts) {
    nlohmann::json copy = j;
    edit(copy);
    WriteFileSynced(tmp / "edited.json", copy.dump());
    test::ExpectError([&] { OpenTokenizer(tmp / "edited.json"); }, parts);
  };
  refused([](nlohmann::json& t) { t["model"]["type"] = "WordPiece"; }, {"model.type", "WordPiece"});
  refused([](nlohmann::json& t) { t["normalizer"] = {{"type", "NFKC"}}; }, {"normalizer", "NFKC"});
  refused([](nlohmann::json& t) { t["pre_tokenizer"] = {{"type", "Whitespace"}}; },
          {"pre_tokenizer", "Whitespace"});
  refused([](nlohmann::json& t) { t["model"]["merges"][0] = "nosuchpiece x"; },
          {"model.merges\"[0]", "not in the vocabulary"});
  refused([](nlohmann::json& t) { t["added_tokens"] = nlohmann::json::array(); },
          {"added_tokens", "end-of-document"});
  refused([](nlohmann::json& t) { t["model"]["vocab"].erase("!"); },
          {"model.vocab", "byte 33"});
  // Two pieces on one id: the id could not be decoded.
  refused([](nlohmann::json& t) { t["model"]["vocab"]["zzqx"] = t["model"]["vocab"]["!"]; },
          {"model.vocab", "\"zzqx\" has id", "which \"!\" has already"});
  refused(
      [](nlohmann::json& t) {
        t["added_tokens"].push_back({{"id", t["model"]["vocab"]["!"]}, {"content", "<|x|>"}});
      },
      {"added_tokens", "\"<|x|>\" has id", "an id names one piece"});
  refused(
      [](nlohmann::json& t) {
        t["pre_tokenizer"] = {{"type", "Sequence"},
                              {"pretokenizers",
                               {{{"type", "Split"},
                                 {"pattern", {{"Regex", "(unclosed"}}},
                                 {"behavior", "Isolated"},
                                 {"invert", false}},
                                {{"type", "ByteLevel"}, {"use_regex", false}}}}};
      },
      {"Split pattern", "does not compile"});
}

}  // namespace
}  // namespace lockstep::data
