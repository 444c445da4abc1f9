// `lockstep data synth|tokenize|import|inspect`: build token shards and verify them
// (docs/formats/shards.md).
#include "lockstep/data.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/core.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {
namespace {

struct SynthOptions {
  std::string out;
  uint64_t seed = 0;
  uint64_t tokens = data::kDefaultSynthTokens;
  uint64_t shard_tokens = data::kDefaultShardTokens;
};

struct TokenizeOptions {
  std::vector<std::string> inputs;
  std::string out, tokenizer;
  uint64_t shard_tokens = data::kDefaultShardTokens;
};

struct ImportOptions {
  std::string megatron, tokenizer, out;
  uint64_t vocab = 0, eod = 0;
  uint64_t shard_tokens = data::kDefaultShardTokens;
};

struct InspectOptions {
  std::string dir;
  uint64_t show_tokens = 200;
};

void PrintSummary(const data::Dataset& dataset) {
  fmt::print("dataset: {}\n", dataset.dir().string());
  fmt::print("manifest blake2b: {}\n", ToHex(dataset.manifest_digest()));
  const data::Vocabulary& v = dataset.vocabulary();
  if (v.bytes()) {
    fmt::print("tokenizer: bytes (vocab {}, end of document {})\n", v.size, v.eod);
  } else {
    fmt::print("tokenizer: {} (blake2b {}; vocab {}, end of document {})\n", v.tokenizer_file,
               ToHex(v.tokenizer_blake2b), v.size, v.eod);
  }
  fmt::print("source: {}\n", dataset.source());
  fmt::print("tokens: {}  documents: {}  shards: {}\n", dataset.total_tokens(),
             dataset.num_documents(), dataset.shards().size());
  fmt::print("unigram entropy: {:.4f} nats/token (one packed epoch, end-of-document included)\n",
             dataset.unigram_entropy_nats());
}

int RunSynth(const SynthOptions& o) {
  RefuseOutputsOntoInputs({{"--out", o.out}}, {});
  // One updating line on a terminal, one line per report in a log.
  const bool terminal = ::isatty(STDERR_FILENO) == 1;
  const auto show = [terminal](uint64_t done, uint64_t total) {
    fmt::print(stderr, "{}data synth: {} / {} tokens ({:.0f}%){}", terminal ? "\r" : "", done,
               total, 100.0 * static_cast<double>(done) / static_cast<double>(total),
               terminal && done < total ? "" : "\n");
  };
  data::WriteSynthCorpus(o.out, o.seed, o.tokens, show, o.shard_tokens);
  PrintSummary(data::OpenDataset(o.out));  // read back: what was written verifies
  return 0;
}

int RunTokenize(const TokenizeOptions& o) {
  const std::vector<std::filesystem::path> inputs(o.inputs.begin(), o.inputs.end());
  std::vector<NamedPath> read = {{"--tokenizer", o.tokenizer}};
  for (const auto& input : inputs) read.push_back({"--input", input});
  RefuseOutputsOntoInputs({{"--out", o.out}}, read);
  const std::unique_ptr<data::Tokenizer> tokenizer =
      o.tokenizer.empty() ? nullptr : data::OpenTokenizer(o.tokenizer);
  data::TokenizeFiles(inputs, o.out, o.shard_tokens, tokenizer.get());
  if (tokenizer) {
    // The tokenizer file goes into the dataset beside its manifest, which names it and its
    // digest: where generate --data and export find it (docs/tokenizers.md).
    const std::string name = tokenizer->vocabulary().tokenizer_file;
    const std::filesystem::path given = o.tokenizer;
    const std::filesystem::path from = std::filesystem::is_directory(given) ? given / name : given;
    StagedFile copy(std::filesystem::path(o.out) / name, OutputKind::kNewFile);
    copy.file().Write(ReadFileBytes(from));
    copy.Commit();
  }
  const data::Dataset dataset = data::OpenDataset(o.out);
  PrintSummary(dataset);
  if (tokenizer && !data::DatasetTokenizerFile(dataset)) {
    LOCKSTEP_INTERNAL("{}: the tokenizer file copied into the dataset is not found there", o.out);
  }
  return 0;
}

int RunImport(const ImportOptions& o) {
  RefuseOutputsOntoInputs({{"--out", o.out}}, {{"--megatron", o.megatron + ".bin"},
                                               {"--megatron", o.megatron + ".idx"},
                                               {"--tokenizer", o.tokenizer}});
  const data::Vocabulary vocabulary = data::FileVocabulary(o.tokenizer, o.vocab, o.eod);
  // The .bin is read twice (checked, then written): the progress line counts both reads.
  std::optional<ProgressLine> progress;
  uint64_t shown = 0;
  const auto show = [&](uint64_t done, uint64_t total) {
    if (!progress) progress.emplace("data import (check, then write)", total, true);
    progress->Add(done - shown);
    shown = done;
  };
  data::ImportMegatron(o.megatron, o.out, vocabulary, o.shard_tokens, show);
  if (progress) progress->Finish();
  PrintSummary(data::OpenDataset(o.out));
  return 0;
}

int RunInspect(const InspectOptions& o) {
  const data::Dataset dataset = data::OpenDataset(o.dir);  // fails on any mismatch
  PrintSummary(dataset);
  fmt::print("{:<18} {:<18} {:>12} {:>10}  {:<64}  {}\n", "bin", "idx", "tokens", "documents",
             "bin blake2b", "idx blake2b");
  for (const data::ShardInfo& s : dataset.shards()) {
    fmt::print("{:<18} {:<18} {:>12} {:>10}  {}  {}\n", s.bin, s.idx, s.tokens, s.documents,
               ToHex(s.bin_blake2b), ToHex(s.idx_blake2b));
  }
  std::vector<uint64_t> lengths(dataset.num_documents());
  for (uint64_t d = 0; d < lengths.size(); ++d) lengths[d] = dataset.Document(d).size();
  std::sort(lengths.begin(), lengths.end());
  fmt::print("document length (tokens): min {}  median {}  mean {:.1f}  max {}\n", lengths.front(),
             lengths[lengths.size() / 2],
             static_cast<double>(dataset.total_tokens()) / static_cast<double>(lengths.size()),
             lengths.back());
  const std::span<const uint32_t> first = dataset.Document(0);
  const size_t shown = std::min<uint64_t>(first.size(), o.show_tokens);
  if (dataset.vocabulary().bytes()) {
    fmt::print("document 0, first {} of {} tokens: \"{}\"\n", shown, first.size(),
               data::DescribeTokens(first.first(shown)));
  } else {  // ids of a tokenizer lockstep does not decode
    fmt::print("document 0, first {} of {} token ids: {}\n", shown, first.size(),
               fmt::join(first.first(shown), " "));
  }
  fmt::print("verified: manifest fields, file sizes, BLAKE2b digests and document offsets\n");
  return 0;
}

}  // namespace

void AddDataCommands(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "data",
      "build and verify token shards: .bin + .idx + manifest.json with BLAKE2b digests "
      "(docs/formats/shards.md)");
  cmd->require_subcommand(1);

  auto synth = std::make_shared<SynthOptions>();
  CLI::App* s = cmd->add_subcommand(
      "synth",
      "write a deterministic synthetic corpus (a pure function of --seed and --tokens): made-up "
      "words with Zipfian frequencies in sentences from a small grammar, byte-tokenized");
  s->add_option("--out", synth->out, "output directory (must not exist or be empty)")
      ->required()
      ->check(OutputPath(OutputKind::kNewDirectory));
  AddUnsignedOption(s, "--seed", &synth->seed, UINT64_MAX, "corpus seed (Philox key)")
      ->default_str(std::to_string(synth->seed));
  s->add_option("--tokens", synth->tokens,
                "exact number of byte tokens, end-of-document not "
                "counted")
      ->capture_default_str()
      ->check(IntegerIn(1, UINT64_MAX));
  s->add_option("--shard-tokens", synth->shard_tokens, "at most this many tokens per shard")
      ->capture_default_str()
      ->check(IntegerIn(1, UINT64_MAX));
  s->final_callback([synth, exit_code] { *exit_code = RunSynth(*synth); });

  auto tokenize = std::make_shared<TokenizeOptions>();
  CLI::App* t = cmd->add_subcommand(
      "tokenize",
      "tokenize UTF-8 text files, each file one document: at the byte level (its exact bytes), "
      "or with --tokenizer into subword ids; invalid UTF-8 is an error naming the file and byte "
      "offset");
  t->add_option("--input", tokenize->inputs, "text files, one document each, in this order")
      ->required()
      ->expected(1, -1)
      ->check(CLI::ExistingFile);
  t->add_option("--out", tokenize->out, "output directory (must not exist or be empty)")
      ->required()
      ->check(OutputPath(OutputKind::kNewDirectory));
  t->add_option("--shard-tokens", tokenize->shard_tokens, "at most this many tokens per shard")
      ->capture_default_str()
      ->check(IntegerIn(1, UINT64_MAX));
  t->add_option("--tokenizer", tokenize->tokenizer,
                "a SentencePiece model (lockstep tokenizer train), a Hugging Face tokenizer.json "
                "of byte-level BPE, or a directory holding tokenizer.model or tokenizer.json; its "
                "end-of-document token ends documents, and its name and BLAKE2b go into the "
                "manifest (docs/tokenizers.md)")
      ->check(CLI::ExistingPath);
  t->final_callback([tokenize, exit_code] { *exit_code = RunTokenize(*tokenize); });

  auto import = std::make_shared<ImportOptions>();
  CLI::App* m = cmd->add_subcommand(
      "import",
      "import a Megatron-style indexed dataset (PREFIX.bin + PREFIX.idx, the MMIDIDX format) "
      "into lockstep shards: each of its documents one document, a trailing end-of-document "
      "token dropped (the stream adds it back); every size, offset and token is checked first "
      "and a malformed dataset is refused naming the field, leaving nothing behind");
  m->add_option("--megatron", import->megatron,
                "the dataset's path prefix (without .bin / .idx)")
      ->required();
  m->add_option("--tokenizer", import->tokenizer,
                "the tokenizer file the ids come from (tokenizer.json, a SentencePiece model, "
                "...): its name and BLAKE2b go into the manifest, so runs bind it")
      ->required()
      ->check(CLI::ExistingFile);
  m->add_option("--vocab", import->vocab, "the tokenizer's vocabulary size (ids 0 .. N-1)")
      ->required()
      ->check(IntegerIn(0, UINT64_MAX));
  m->add_option("--eod", import->eod,
                "the tokenizer's end-of-document id (it ends every document in the stream and "
                "may not appear inside one)")
      ->required()
      ->check(IntegerIn(0, UINT64_MAX));
  m->add_option("--out", import->out, "output directory (must not exist or be empty)")
      ->required()
      ->check(OutputPath(OutputKind::kNewDirectory));
  m->add_option("--shard-tokens", import->shard_tokens, "at most this many tokens per shard")
      ->capture_default_str()
      ->check(IntegerIn(1, UINT64_MAX));
  m->final_callback([import, exit_code] { *exit_code = RunImport(*import); });

  auto inspect = std::make_shared<InspectOptions>();
  CLI::App* i = cmd->add_subcommand(
      "inspect",
      "verify a dataset (manifest fields, file sizes, BLAKE2b digests, document offsets) and "
      "print its summary, shards, document lengths and the start of document 0; exit 0 only if "
      "everything verifies");
  i->add_option("dir", inspect->dir, "dataset directory (holding manifest.json)")->required();
  i->add_option("--show", inspect->show_tokens, "tokens of document 0 to print")
      ->capture_default_str()
      ->check(IntegerIn(0, UINT64_MAX));
  i->final_callback([inspect, exit_code] { *exit_code = RunInspect(*inspect); });
}

void AddTokenizerCommands(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("tokenizer", "train subword tokenizers (docs/tokenizers.md)");
  cmd->require_subcommand(1);
  struct TrainOptions {
    std::vector<std::string> inputs;
    uint64_t vocab = 0;
    std::string model = "unigram", out;
  };
  auto train = std::make_shared<TrainOptions>();
  CLI::App* t = cmd->add_subcommand(
      "train",
      "train a SentencePiece model on the lines of UTF-8 text files, deterministically (the same "
      "inputs give the same bytes), into OUT/tokenizer.model for `data tokenize --tokenizer`");
  t->add_option("--input", train->inputs, "text files (each line a sentence)")
      ->required()
      ->expected(1, -1)
      ->check(CLI::ExistingFile);
  t->add_option("--vocab", train->vocab, "pieces in the vocabulary")
      ->required()
      ->check(IntegerIn(0, UINT64_MAX));
  t->add_option("--model", train->model, "unigram or bpe")->capture_default_str();
  t->add_option("--out", train->out, "output directory (must not exist or be empty)")
      ->required()
      ->check(OutputPath(OutputKind::kNewDirectory));
  t->final_callback([train, exit_code] {
    const std::vector<std::filesystem::path> inputs(train->inputs.begin(), train->inputs.end());
    std::vector<NamedPath> read;
    for (const auto& input : inputs) read.push_back({"--input", input});
    RefuseOutputsOntoInputs({{"--out", train->out}}, read);
    const std::filesystem::path model =
        data::TrainTokenizer(inputs, train->vocab, train->model, train->out);
    const std::unique_ptr<data::Tokenizer> tokenizer = data::OpenTokenizer(model);
    const data::Vocabulary& v = tokenizer->vocabulary();
    fmt::print("wrote {} ({} pieces, end of document {}, blake2b {})\n", model.string(), v.size,
               v.eod, ToHex(v.tokenizer_blake2b));
    *exit_code = 0;
  });
}

}  // namespace lockstep::cli
