// Generation and receipts end to end (docs/inference.md, docs/formats/receipt.md): a receipt is
// the same bytes at any thread count and on the OpenCL device and re-executes to MATCH; edited
// receipts are refused naming the first difference; signatures bind the receipt to a key; a
// request's output does not depend on the rest of its batch; the receipt never lands on an input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/run_lockstep.h"
#include "common/tokenizers_js.h"
#include "lockstep/core.h"
#include "lockstep/data.h"
#include "lockstep/infer.h"
#include "lockstep/state.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using test::Lockstep;
using test::Result;

class Generate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("lockstep_generate_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const std::string& cmd : {"data synth --out " + Path("data") + " --seed 7 --tokens 200000",
                                   "keygen --out " + Path("key"), "keygen --out " + Path("other"),
                                   "train --config tiny --data " + Path("data") + " --out " +
                                       Path("run") + " --steps 20 --no-progress"}) {
      const Result r = Lockstep(cmd);
      ASSERT_EQ(r.exit_code, 0) << cmd << ": " << r.output;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string Path(const std::string& name) { return (dir_ / name).string(); }
  static std::string Checkpoint(int step) {
    return Path("run/checkpoints/step_0000000" + std::to_string(step));
  }
  // Sampling on, so that the seed and every logit matter.
  static std::string GenerateArgs(const std::string& receipt) {
    return "generate --checkpoint " + Checkpoint(20) + " --data " + Path("data") +
           " --prompt 'the ' --max-tokens 24 --temperature 0.9 --top-k 64 --top-p 0.95 "
           "--seed 11 --receipt " +
           Path(receipt);
  }
  static Result Verify(const std::string& receipt, const std::string& extra = "") {
    return Lockstep("verify-generation " + Path(receipt) + " --checkpoint " + Checkpoint(20) + " " +
                    extra);
  }
  static json Read(const std::string& name) { return json::parse(ReadFileText(Path(name))); }
  static void Write(const std::string& name, const json& j) {
    std::ofstream(Path(name)) << j.dump(2) << "\n";
  }
  static inline fs::path dir_;
};

TEST_F(Generate, AReceiptIsTheSameAtAnyThreadCountAndOnTheDeviceAndVerifies) {
  for (const auto& [name, extra] : std::map<std::string, std::string>{
           {"r1.json", ""}, {"r2.json", " --threads 2"}, {"rcl.json", " --device opencl"}}) {
    const Result r = Lockstep(GenerateArgs(name) + extra);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const std::string one = ReadFileText(Path("r1.json"));
  EXPECT_EQ(ReadFileText(Path("r2.json")), one);
  EXPECT_EQ(ReadFileText(Path("rcl.json")), one);
  EXPECT_EQ(Read("r1.json")["receipt"]["requests"][0]["output_tokens"].size(), 24u);
  Result v = Verify("r1.json");
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_NE(v.output.find("MATCH: 1 request(s), 24 output token(s)"), std::string::npos)
      << v.output;
  v = Verify("r1.json", "--device opencl --threads 2");
  EXPECT_EQ(v.exit_code, 0) << v.output;
}

TEST_F(Generate, EditedReceiptsAreRefusedNamingTheFirstDifference) {
  ASSERT_EQ(Lockstep(GenerateArgs("base.json")).exit_code, 0);
  const json base = Read("base.json");
  const json& request = base["receipt"]["requests"][0];
  const size_t prompt = request["prompt_tokens"].size();
  // A token: the logits agree there, the token does not.
  json token = base;
  json& out = token["receipt"]["requests"][0]["output_tokens"];
  out[5] = (out[5].get<uint32_t>() + 1) % 256;
  Write("token.json", token);
  Result v = Verify("token.json");
  EXPECT_EQ(v.exit_code, 1) << v.output;
  EXPECT_NE(v.output.find("position " + std::to_string(prompt + 5) +
                          " (output token 5): the "
                          "receipt has token"),
            std::string::npos)
      << v.output;
  // A logits digest.
  json logits = base;
  logits["receipt"]["requests"][0]["logits_chain"][3] = std::string(64, 'a');
  Write("logits.json", logits);
  v = Verify("logits.json");
  EXPECT_EQ(v.exit_code, 1) << v.output;
  EXPECT_NE(v.output.find("the logits at position " + std::to_string(prompt + 3) +
                          " (output token 3) differ"),
            std::string::npos)
      << v.output;
  // The seed: the logits of the first token agree; a later token or digest does not.
  json seed = base;
  seed["receipt"]["sampling"]["seed"] = "12";
  Write("seed.json", seed);
  v = Verify("seed.json");
  EXPECT_EQ(v.exit_code, 1) << v.output;
  EXPECT_NE(v.output.find("MISMATCH: request 0 (id 0): "), std::string::npos) << v.output;
  // Another checkpoint of the same run.
  v = Lockstep("verify-generation " + Path("base.json") + " --checkpoint " + Checkpoint(10));
  EXPECT_EQ(v.exit_code, 1) << v.output;
  EXPECT_NE(v.output.find("the receipt is of the checkpoint with state hash " +
                          base["receipt"]["checkpoint"]["state_hash"].get<std::string>()),
            std::string::npos)
      << v.output;
  // A field that is not in the format is refused before anything runs.
  json extra = base;
  extra["receipt"]["device"] = "cpu";
  Write("extra.json", extra);
  v = Verify("extra.json");
  EXPECT_EQ(v.exit_code, 2) << v.output;
  EXPECT_NE(v.output.find("device"), std::string::npos) << v.output;
}

// A batch and a receipt are bounded the same way (infer::kMaxRequests), and two requests with
// one id are refused by both, found by sorting (a batch of the most requests is refused at once).
TEST_F(Generate, BatchesAndReceiptsShareOneBoundAndRefuseSharedIds) {
  const std::string generate =
      "generate --checkpoint " + Checkpoint(20) + " --max-tokens 2 --batch ";
  {
    std::ofstream batch(Path("too_many.jsonl"));
    for (int i = 0; i <= 4096; ++i) batch << "{\"prompt_tokens\": [1]}\n";
  }
  Result r = Lockstep(generate + Path("too_many.jsonl"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("4097 lines, more requests than one generation may hold (4096)"),
            std::string::npos)
      << r.output;
  {
    std::ofstream batch(Path("shared.jsonl"));
    for (int i = 0; i < 4096; ++i) {
      batch << "{\"id\": \"" << (i == 5 || i == 4000 ? 7 : 100000 + i)
            << "\", \"prompt_tokens\": [1]}\n";
    }
  }
  r = Lockstep(generate + Path("shared.jsonl"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("lines 6 and 4001 have the same id 7"), std::string::npos) << r.output;
  {
    std::ofstream batch(Path("two.jsonl"));
    batch << "{\"id\": \"3\", \"prompt_tokens\": [1]}\n{\"id\": \"4\", \"prompt_tokens\": [2]}\n";
  }
  r = Lockstep(generate + Path("two.jsonl") + " --receipt " + Path("two.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json shared = Read("two.json");
  shared["receipt"]["requests"][1]["id"] = "3";
  Write("two_shared.json", shared);
  Result v = Verify("two_shared.json");
  EXPECT_EQ(v.exit_code, 2) << v.output;
  EXPECT_NE(v.output.find("requests[0] and requests[1] have the same id 3"), std::string::npos)
      << v.output;
  json many = Read("two.json");
  for (int i = 0; i < 4095; ++i)
    many["receipt"]["requests"].push_back(many["receipt"]["requests"][0]);
  Write("many.json", many);
  v = Verify("many.json");
  EXPECT_EQ(v.exit_code, 2) << v.output;
  EXPECT_NE(v.output.find("4097 requests, more than one generation may hold (4096)"),
            std::string::npos)
      << v.output;
}

// The documented SentencePiece pipeline (docs/tokenizers.md): tokenizer train (a BPE model with
// `bpe`), data tokenize --tokenizer (which puts the model into the dataset beside its manifest)
// and train, into sp, sp_data and sp_run.
void TrainOnASentencePieceDataset(const std::function<std::string(const std::string&)>& path,
                                  bool bpe) {
  {
    // Words of pseudo-random letters, enough for a model of tiny's 512 pieces (a tokenizer of
    // fewer pieces than the model's vocabulary would leave ids it cannot decode).
    std::ofstream text(path("sp.txt"));
    uint64_t state = 7;
    const auto next = [&](uint64_t n) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return (state >> 33) % n;
    };
    std::vector<std::string> words(3000);
    for (std::string& w : words) {
      for (uint64_t k = 0, n = 2 + next(6); k < n; ++k) w += static_cast<char>('a' + next(26));
    }
    for (int line = 0; line < 2000; ++line) {
      for (int k = 0; k < 12; ++k) text << words[next(words.size())] << (k == 11 ? "\n" : " ");
    }
  }
  for (const std::string& cmd :
       {"tokenizer train --input " + path("sp.txt") + " --vocab 512 --out " + path("sp") +
            (bpe ? " --model bpe" : ""),
        "data tokenize --tokenizer " + path("sp") + " --input " + path("sp.txt") + " --out " +
            path("sp_data"),
        "train --config tiny --data " + path("sp_data") + " --out " + path("sp_run") +
            " --steps 2 --no-progress"}) {
    const Result r = Lockstep(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << ": " << r.output;
  }
}

// The SentencePiece pipeline reaches generate --data with a text prompt, and its export for
// transformers says it adds no "▁" of its own.
TEST_F(Generate, TheSentencePiecePipelineReachesGenerate) {
  TrainOnASentencePieceDataset(Path, false);
  EXPECT_EQ(ReadFileText(Path("sp_data/tokenizer.model")),
            ReadFileText(Path("sp/tokenizer.model")));
  const Result g = Lockstep("generate --checkpoint " + Path("sp_run/checkpoints/step_000000002") +
                            " --data " + Path("sp_data") + " --prompt 'abc de' --max-tokens 4");
  EXPECT_EQ(g.exit_code, 0) << g.output;
  EXPECT_NE(g.output.find(" generated, stopped at "), std::string::npos) << g.output;
  // Exported for transformers, the tokenizer says it adds no "▁" of its own (the model's
  // add_dummy_prefix, false for lockstep's trainer): transformers 5 added one where unsaid.
  const Result e = Lockstep("export --checkpoint " + Path("sp_run/checkpoints/step_000000002") +
                            " --data " + Path("sp_data") + " --format hf --out " + Path("sp_hf"));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const json config = Read("sp_hf/tokenizer_config.json");
  EXPECT_EQ(config["add_prefix_space"], false) << config.dump();
  EXPECT_EQ(config["split_special_tokens"], true) << config.dump();
  EXPECT_EQ(config["tokenizer_class"], "LlamaTokenizer") << config.dump();
  EXPECT_EQ(ReadFileText(Path("sp_hf/tokenizer.model")), ReadFileText(Path("sp/tokenizer.model")));
}

// Texts that every exported tokenizer is checked on against @huggingface/tokenizers: non-ASCII
// text, emoji, whitespace runs, control bytes, the empty text, and the strings of special pieces,
// which are text on every side (docs/export.md).
const std::vector<std::string> kTokenizerTexts = {
    "naïve über 日本語の文 Ελληνικά русский",
    "emoji 🙂🎉 and e\u0301 combining",
    "   runs\t\tof   white\n\n\r\nspace  ",
    "control \x01\x7f bytes",
    "",
    "one <|endoftext|> two <|unused_300|>",
    "<s> and </s>, <unk>, <0x41>, \u2581x \u2581\u2581"};

// @huggingface/tokenizers' ids of `texts` under the tokenizer.json `tokenizer`, written into
// files under `dir`. Fails the test (and returns nothing) when node fails.
json HuggingFaceIds(const std::string& module, const fs::path& tokenizer,
                    const std::vector<std::string>& texts, const fs::path& dir) {
  std::string files;
  for (size_t i = 0; i < texts.size(); ++i) {
    const fs::path file = dir / ("text" + std::to_string(i) + ".txt");
    WriteFileSynced(file, texts[i]);
    files += " " + file.string();
  }
  const Result js = test::Shell("node " + std::string(LOCKSTEP_SOURCE_DIR) +
                                "/tests/data/hf_encode.mjs " + module + " " + tokenizer.string() +
                                files + " > " + (dir / "hf_ids.json").string());
  EXPECT_EQ(js.exit_code, 0) << js.output;
  if (js.exit_code != 0) return json();
  return json::parse(ReadFileText(dir / "hf_ids.json"));
}

// @huggingface/tokenizers' ids of `texts` under `tokenizer_json` are lockstep's under the
// SentencePiece model `model` (a file or its directory). Returns those ids.
json ExpectLockstepsIds(const std::string& module, const fs::path& tokenizer_json,
                        const fs::path& model, const std::vector<std::string>& texts,
                        const fs::path& dir) {
  const json ids = HuggingFaceIds(module, tokenizer_json, texts, dir);
  EXPECT_EQ(ids.size(), texts.size());
  if (ids.size() != texts.size()) return ids;
  const std::unique_ptr<data::Tokenizer> sp = data::OpenTokenizer(model);
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(ids[i], json(sp->Encode(texts[i], "text"))) << "text " << i;
  }
  return ids;
}

// A SentencePiece BPE model exported for transformers is also a tokenizer.json, which
// @huggingface/tokenizers (the independent implementation, run by node) reads as lockstep
// reads the model: lockstep's ids on the texts above and on the whole training text (every merge
// the model has), and a special piece's string in text is text.
TEST_F(Generate, AnExportedSentencePieceTokenizerGivesLockstepsIdsInHuggingFaceTokenizers) {
  const std::string module = test::TokenizersJs();
  if (module.empty()) {
    GTEST_SKIP() << "node or @huggingface/tokenizers@" << test::kTokenizersJsVersion
                 << " is not available (npm unreachable?): the ids are not compared";
  }
  // Its own names: a test process may run the pipeline test before it.
  const auto path = [](const std::string& name) { return Path("js_" + name); };
  TrainOnASentencePieceDataset(path, true);
  const Result e = Lockstep("export --checkpoint " + path("sp_run/checkpoints/step_000000002") +
                            " --data " + path("sp_data") + " --format hf --out " + path("sp_hf"));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("written as a BPE tokenizer.json"), std::string::npos) << e.output;
  std::vector<std::string> texts = kTokenizerTexts;
  texts.push_back(ReadFileText(path("sp.txt")));
  texts.push_back("a" + texts.back().substr(0, 2000) + " ");
  const json ids = ExpectLockstepsIds(module, path("sp_hf/tokenizer.json"),
                                      path("sp/tokenizer.model"), texts, Path(""));
  ASSERT_EQ(ids.size(), texts.size());
  // The special pieces' strings are text: no id of a control or unknown piece.
  for (const json& id : ids[6]) EXPECT_GT(id.get<uint32_t>(), 2u);
}

TEST_F(Generate, ASignedReceiptVerifiesUnderItsKeyAndAForgedOneIsRefused) {
  const Result g = Lockstep(GenerateArgs("signed.json") + " --sign-key " + Path("key"));
  ASSERT_EQ(g.exit_code, 0) << g.output;
  Result v = Verify("signed.json", "--trusted-key " + Path("key.pub"));
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_NE(v.output.find("signed by"), std::string::npos) << v.output;
  v = Verify("signed.json", "--trusted-key " + Path("other.pub"));
  EXPECT_EQ(v.exit_code, 2) << v.output;
  EXPECT_NE(v.output.find("not the trusted key"), std::string::npos) << v.output;
  // Edited after signing: a token changed, the signature kept.
  json forged = Read("signed.json");
  json& out = forged["receipt"]["requests"][0]["output_tokens"];
  out[0] = (out[0].get<uint32_t>() + 1) % 256;
  Write("forged.json", forged);
  v = Verify("forged.json");
  EXPECT_EQ(v.exit_code, 2) << v.output;
  EXPECT_NE(v.output.find("the signature does not verify"), std::string::npos) << v.output;
  // An unsigned receipt under --trusted-key.
  ASSERT_EQ(Lockstep(GenerateArgs("unsigned.json")).exit_code, 0);
  v = Verify("unsigned.json", "--trusted-key " + Path("key.pub"));
  EXPECT_EQ(v.exit_code, 2) << v.output;
  EXPECT_NE(v.output.find("not signed"), std::string::npos) << v.output;
}

// A receipt's tokenizer and eod are checked against the checkpoint's dataset with --data, and a
// MATCH without it says they were not; a combination generate never writes (a tokenizer without
// eod: a generation with --data re-signed as if it had not stopped at the end of a document) is
// refused; sampling values outside generate's ranges, and a byte order mark, are refused.
TEST_F(Generate, AReceiptBindsItsTokenizerAndEodAndGeneratesRanges) {
  ASSERT_EQ(Lockstep(GenerateArgs("bound.json")).exit_code, 0);
  const json base = Read("bound.json");
  ASSERT_EQ(base["receipt"]["tokenizer"], json({{"kind", "bytes"}}));
  Result v = Verify("bound.json");
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_NE(v.output.find("tokenizer bytes and eod 256 not checked (give --data"),
            std::string::npos)
      << v.output;
  v = Verify("bound.json", "--data " + Path("data"));
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_NE(v.output.find("tokenizer bytes and eod 256 are the dataset's (--data)"),
            std::string::npos)
      << v.output;

  json no_eod = base;
  no_eod["receipt"]["eod"] = nullptr;
  Write("no_eod.json", no_eod);
  v = Verify("no_eod.json");
  EXPECT_EQ(v.exit_code, 2) << v.output;
  EXPECT_NE(v.output.find("tokenizer is {\"kind\":\"bytes\"} but eod is null"), std::string::npos)
      << v.output;

  json other_eod = base;
  other_eod["receipt"]["eod"] = 257;
  Write("other_eod.json", other_eod);
  v = Verify("other_eod.json", "--data " + Path("data"));
  EXPECT_EQ(v.exit_code, 1) << v.output;
  EXPECT_NE(v.output.find("MISMATCH: the receipt's tokenizer is bytes with eod 257; the "
                          "checkpoint's dataset (--data) has bytes with eod 256"),
            std::string::npos)
      << v.output;
  json other_file = base;
  other_file["receipt"]["tokenizer"] = {
      {"kind", "file"}, {"name", "tokenizer.json"}, {"blake2b", std::string(64, 'a')}};
  Write("other_file.json", other_file);
  v = Verify("other_file.json", "--data " + Path("data"));
  EXPECT_EQ(v.exit_code, 1) << v.output;
  EXPECT_NE(v.output.find("the receipt's tokenizer is file tokenizer.json"), std::string::npos)
      << v.output;

  // The prompts as ids, without the dataset: neither is bound, and MATCH says so.
  std::ofstream(Path("ids.jsonl")) << "{\"prompt_tokens\": [116, 104]}\n";
  const Result g = Lockstep("generate --checkpoint " + Checkpoint(20) + " --batch " +
                            Path("ids.jsonl") + " --max-tokens 4 --receipt " + Path("ids.json"));
  ASSERT_EQ(g.exit_code, 0) << g.output;
  v = Verify("ids.json", "--data " + Path("data"));
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_NE(v.output.find("no tokenizer and no eod (the prompts were given as ids)"),
            std::string::npos)
      << v.output;

  for (const auto& [key, value] :
       std::vector<std::pair<std::string, json>>{{"max_tokens", 0},
                                                 {"max_tokens", (uint64_t{1} << 40) + 1},
                                                 {"top_k", (uint64_t{1} << 31) + 1},
                                                 {"temperature", "-0"},
                                                 {"temperature", "nan"},
                                                 {"temperature", "inf"},
                                                 {"top_p", "0"},
                                                 {"top_p", "1.5"}}) {
    json bad = base;
    bad["receipt"]["sampling"][key] = value;
    Write("bad_sampling.json", bad);
    v = Verify("bad_sampling.json");
    EXPECT_EQ(v.exit_code, 2) << key << " = " << value.dump() << ": " << v.output;
    EXPECT_NE(v.output.find("sampling: " + key + " = "), std::string::npos) << v.output;
  }

  std::ofstream(Path("bom.json")) << "\xEF\xBB\xBF" << ReadFileText(Path("bound.json"));
  v = Verify("bom.json");
  EXPECT_EQ(v.exit_code, 2) << v.output;
  EXPECT_NE(v.output.find("byte order mark"), std::string::npos) << v.output;
}

// A dataset of a short text tokenized by the fuzz corpus's SentencePiece model `model` and tiny
// trained one step on it, exported for transformers: into NAME_sp (the model), NAME_data,
// NAME_run and NAME_hf. Returns the export's result.
Result ExportOnACorpusModel(const std::function<std::string(const std::string&)>& path,
                            const std::string& model, const std::string& name) {
  fs::create_directories(path(name + "_sp"));
  fs::copy_file(fs::path(LOCKSTEP_SOURCE_DIR) / "tests/fuzz/corpus/sentencepiece" / model,
                path(name + "_sp/tokenizer.model"));
  WriteFileSynced(path(name + ".txt"), "abc de fg hij naïve über\nbe ab\n");
  for (const std::string& cmd : {"data tokenize --tokenizer " + path(name + "_sp") + " --input " +
                                     path(name + ".txt") + " --out " + path(name + "_data"),
                                 "train --config tiny --data " + path(name + "_data") + " --out " +
                                     path(name + "_run") + " --steps 1 --no-progress"}) {
    const Result r = Lockstep(cmd);
    EXPECT_EQ(r.exit_code, 0) << cmd << ": " << r.output;
    if (r.exit_code != 0) return r;
  }
  return Lockstep("export --checkpoint " + path(name + "_run/checkpoints/step_000000001") +
                  " --data " + path(name + "_data") + " --format hf --out " + path(name + "_hf"));
}

// A SentencePiece BPE model that adds a dummy prefix (tests/fuzz/corpus/sentencepiece's, a
// `tokenizer train --model bpe` model with the normalizer's add_dummy_prefix set): its
// tokenizer.json prepends the "▁" and @huggingface/tokenizers still gives lockstep's ids.
TEST_F(Generate, AnExportedSentencePieceTokenizerWithADummyPrefixGivesLockstepsIds) {
  const std::string module = test::TokenizersJs();
  if (module.empty()) {
    GTEST_SKIP() << "node or @huggingface/tokenizers@" << test::kTokenizersJsVersion
                 << " is not available (npm unreachable?): the ids are not compared";
  }
  const Result e = ExportOnACorpusModel(Path, "bpe-dummy-prefix.model", "prefix");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  ASSERT_TRUE(data::ReadSentencePieceModel(Path("prefix_sp/tokenizer.model")).add_dummy_prefix);
  EXPECT_EQ(Read("prefix_hf/tokenizer_config.json")["add_prefix_space"], true);
  std::vector<std::string> texts = kTokenizerTexts;
  texts.push_back("abcdef ghij abc de fg hij abcd");
  ExpectLockstepsIds(module, Path("prefix_hf/tokenizer.json"), Path("prefix_sp"), texts, Path(""));
}

// libsentencepiece loads a model whose piece is not UTF-8 (here piece 'be' as the bytes ff fe, the
// fuzz corpus's regression input): the export writes it nowhere and says why, naming the piece,
// where it failed with a JSON library's message naming neither.
TEST_F(Generate, AnExportedTokenizerWithAPieceThatIsNotUtf8IsNotWritten) {
  const Result e = ExportOnACorpusModel(Path, "regression-invalid-utf8-piece.model", "bad");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("no tokenizer.json: " + Path("bad_data/tokenizer.model") + ": piece "),
            std::string::npos)
      << e.output;
  EXPECT_NE(e.output.find("invalid UTF-8"), std::string::npos) << e.output;
  EXPECT_FALSE(fs::exists(Path("bad_hf/tokenizer.json")));
  EXPECT_TRUE(fs::exists(Path("bad_hf/tokenizer.model")));
}

// A model that computes with bf16 weights is exported for transformers as BF16 tensors holding
// exactly the values it computes with (the checkpoint's weights rounded to bfloat16), except the
// embedding table with the embedding norm folded in, whose values are not bfloat16s (F32);
// config.json's dtype stays float32, so transformers widens them on loading.
TEST_F(Generate, ABf16WeightModelIsExportedForTransformersAsBf16Tensors) {
  std::string config = ReadFileText(fs::path(LOCKSTEP_SOURCE_DIR) / "configs/tiny.yaml");
  ASSERT_NE(config.find("model:\n"), std::string::npos);
  config.replace(config.find("model:\n"), 7, "model:\n  compute_weights: bf16\n");
  WriteFileSynced(Path("tiny-bf16w.yaml"), config);
  for (const std::string& cmd :
       {"train --config " + Path("tiny-bf16w.yaml") + " --data " + Path("data") + " --out " +
            Path("bf16w") + " --steps 2 --no-progress",
        "export --checkpoint " + Path("bf16w/checkpoints/step_000000002") + " --format hf --out " +
            Path("bf16w_hf")}) {
    const Result r = Lockstep(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << ": " << r.output;
    if (cmd.starts_with("export")) {
      EXPECT_NE(r.output.find("tensors written as BF16"), std::string::npos) << r.output;
    }
  }
  EXPECT_EQ(Read("bf16w_hf/config.json")["torch_dtype"], "float32");
  const infer::VerifiedModel model = infer::LoadVerified(Path("bf16w/checkpoints/step_000000002"));
  const SafetensorsFile file = ParseSafetensors(ReadFileBytes(Path("bf16w_hf/model.safetensors")),
                                                "model.safetensors", SafetensorsDtypes::kAny);
  int64_t bf16 = 0;
  for (const NamedTensor& t : file.tensors()) {
    if (t.name == "model.embed_tokens.weight") {
      EXPECT_EQ(t.data.dtype(), Dtype::kF32);
      continue;
    }
    EXPECT_EQ(t.data.dtype(), Dtype::kBF16) << t.name;
    bf16 += t.data.dtype() == Dtype::kBF16;
  }
  EXPECT_EQ(bf16, static_cast<int64_t>(file.tensors().size()) - 1);
  // The head, bit for bit: the checkpoint's weights, each rounded to the nearest bfloat16.
  const std::span<const BFloat16> head = file.Get("lm_head.weight").data.As<BFloat16>();
  const std::span<const float> master = model.params.Tensor(model.params.Find("output.weight"));
  ASSERT_EQ(head.size(), master.size());
  size_t rounded = 0;
  for (size_t i = 0; i < head.size(); ++i) {
    ASSERT_EQ(head[i].bits, NarrowToBf16(master[i]).bits) << i;
    rounded += WidenBf16(head[i]) != master[i];
  }
  EXPECT_GT(rounded, head.size() / 2);  // the master is not bfloat16 itself
}

// The byte vocabulary exported for transformers is read by @huggingface/tokenizers (the
// independent implementation of tokenizer.json, run by node) as lockstep reads it: every byte its
// own id, the strings of special pieces (<|endoftext|>) included.
TEST_F(Generate, AnExportedByteTokenizerGivesLockstepsIdsInHuggingFaceTokenizers) {
  const std::string module = test::TokenizersJs();
  if (module.empty()) {
    GTEST_SKIP() << "node or @huggingface/tokenizers@" << test::kTokenizersJsVersion
                 << " is not available (npm unreachable?): the ids are not compared";
  }
  const Result e = Lockstep("export --checkpoint " + Checkpoint(20) + " --data " + Path("data") +
                            " --format hf --out " + Path("hf_bytes"));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_EQ(Read("hf_bytes/tokenizer_config.json")["split_special_tokens"], true);
  const json ids =
      HuggingFaceIds(module, Path("hf_bytes/tokenizer.json"), kTokenizerTexts, Path(""));
  ASSERT_EQ(ids.size(), kTokenizerTexts.size());
  for (size_t i = 0; i < kTokenizerTexts.size(); ++i) {
    std::vector<uint32_t> bytes;
    for (const char c : kTokenizerTexts[i]) bytes.push_back(static_cast<uint8_t>(c));
    EXPECT_EQ(ids[i], json(bytes)) << "text " << i;
  }
}

// Output lines of a --batch run, by request id.
std::map<std::string, json> ById(const std::string& output) {
  std::map<std::string, json> by_id;
  for (const std::string& line : Lines(output)) {
    if (line.starts_with("{")) {
      const json j = json::parse(line);
      by_id[j["id"].get<std::string>()] = j;
    }
  }
  return by_id;
}

TEST_F(Generate, ARequestsOutputDoesNotDependOnTheRestOfItsBatch) {
  std::ofstream(Path("batch.jsonl")) << R"({"id": "9", "prompt": "the "})"
                                     << "\n"
                                     << R"({"id": "4", "prompt": "a long prompt of words "})"
                                     << "\n"
                                     << R"({"id": "7", "prompt_tokens": [116, 104]})"
                                     << "\n";
  std::ofstream(Path("reversed.jsonl")) << R"({"id": "7", "prompt_tokens": [116, 104]})"
                                        << "\n"
                                        << R"({"id": "4", "prompt": "a long prompt of words "})"
                                        << "\n"
                                        << R"({"id": "9", "prompt": "the "})"
                                        << "\n";
  std::ofstream(Path("alone.jsonl")) << R"({"id": "9", "prompt": "the "})"
                                     << "\n";
  const std::string common = " --checkpoint " + Checkpoint(20) + " --data " + Path("data") +
                             " --max-tokens 20 --temperature 1 --seed 3";
  std::map<std::string, std::map<std::string, json>> runs;
  for (const std::string name : {"batch", "reversed", "alone"}) {
    const Result r = Lockstep("generate --batch " + Path(name + ".jsonl") + common);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    runs[name] = ById(r.output);
  }
  ASSERT_EQ(runs["batch"].size(), 3u);
  EXPECT_EQ(runs["batch"], runs["reversed"]);
  EXPECT_EQ(runs["alone"]["9"], runs["batch"]["9"]);
  EXPECT_EQ(runs["batch"]["9"]["output_tokens"].size(), 20u);
}

TEST_F(Generate, TheReceiptNeverLandsOnAnInput) {
  std::ofstream(Path("prompt.bin"), std::ios::binary).write("\x74\0\0\0\x68\0\0\0", 8);
  const std::string before = ReadFileText(Path("prompt.bin"));
  Result r = Lockstep("generate --checkpoint " + Checkpoint(20) + " --prompt-tokens " +
                      Path("prompt.bin") + " --receipt " + Path("prompt.bin"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("would write over what it reads"), std::string::npos) << r.output;
  EXPECT_EQ(ReadFileText(Path("prompt.bin")), before);
  r = Lockstep("generate --checkpoint " + Checkpoint(20) + " --prompt-tokens " +
               Path("prompt.bin") + " --receipt " + Checkpoint(20) + "/receipt.json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("lies inside the input --checkpoint"), std::string::npos) << r.output;
  r = Lockstep("generate --checkpoint " + Checkpoint(20) + " --prompt 'x'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--prompt needs --data"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace lockstep
