// lockstep data: corpus -> token shards (+ manifest with digests) -> the canonical stream.
//
// Formats: docs/formats/shards.md (files) and docs/formats/stream.md (shuffle, packing and
// windows). Everything here is a pure function of its inputs: the stream's window i depends on
// (seed, manifest, seq_len, i) only, never on how many threads or processes read it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/core.h"

namespace lockstep::data {

// ---- tokenizer: byte level ------------------------------------------------------------------
// Token id b (0..255) is the byte b; kEodToken ends every document in the stream. The .bin
// files hold byte tokens only: documents are separated by the .idx offsets, not by kEodToken.
inline constexpr uint32_t kEodToken = 256;
inline constexpr uint32_t kByteVocab = 257;

// Fails naming `what` and the byte offset of the first malformed sequence (overlong forms,
// surrogates and code points above U+10FFFF are malformed, as in RFC 3629).
void ValidateUtf8(std::span<const uint8_t> bytes, std::string_view what);
std::vector<uint32_t> TokenizeBytes(std::span<const uint8_t> bytes);
// Printable rendering for humans: printable ASCII as is, '\n' and '\t' escaped, other bytes as
// \xNN, kEodToken as "<eod>".
std::string DescribeTokens(std::span<const uint32_t> tokens);

// ---- vocabularies ----------------------------------------------------------------------------
// What a dataset's token ids mean (docs/formats/shards.md, "tokenizer"): the built-in byte
// tokenizer, or the tokenizer in a file (a SentencePiece model, a tokenizer.json, ...) pinned by
// its BLAKE2b-256, so the manifest's digest -- and with it the run descriptor -- binds it.
struct Vocabulary {
  uint32_t size = kByteVocab;
  uint32_t eod = kEodToken;  // ends every document in the stream; never inside a .bin
  // Empty for the byte tokenizer; else the tokenizer file's name (informational) and digest.
  std::string tokenizer_file;
  Digest tokenizer_blake2b{};

  bool bytes() const { return tokenizer_file.empty(); }
  bool operator==(const Vocabulary&) const = default;
  // Fails naming `where` (and the document's number, when given) and the token unless every id
  // of a document is below `size` and not `eod` (which the stream puts between documents).
  void CheckDocument(std::span<const uint32_t> ids, std::string_view where,
                     std::optional<uint64_t> document = std::nullopt) const;
};
// Token ids are below 2^31 (a model's embedding rows are indexed by them).
inline constexpr uint32_t kMaxVocab = uint32_t{1} << 31;
// The vocabulary of a tokenizer file: its name and BLAKE2b-256, with `size` ids of which `eod`
// ends documents. Fails naming the file, or the value out of range.
Vocabulary FileVocabulary(const std::filesystem::path& tokenizer, uint64_t size, uint64_t eod);

// ln(x) for finite x > 0 from IEEE +, -, *, / in a fixed order, so the entropies stored in
// manifests have the same bits on every machine (libm's log is not correctly rounded).
double DeterministicLog(double x);
// Entropy in nats of the distribution given by `counts`, summed in index order.
double EntropyNats(std::span<const uint64_t> counts);

// ---- shards
// -------------------------------------------------------------------------------------- One
// manifest "shards" entry.
struct ShardInfo {
  std::string bin, idx;  // file names inside the dataset directory
  uint64_t tokens = 0, documents = 0;
  Digest bin_blake2b{}, idx_blake2b{};
};

inline constexpr uint64_t kDefaultShardTokens = uint64_t{64} << 20;  // 64 Mi tokens = 256 MiB

// Writes a dataset into `dir` (created; must not exist or be empty). Documents go into the
// current shard until the next one would push it past max_shard_tokens; then the shard's .bin
// and .idx are written (fsynced) and a new shard begins. A document longer than
// max_shard_tokens is refused. Finish() writes manifest.json last and syncs the directory, so
// a directory with a manifest is complete.
class ShardWriter {
 public:
  explicit ShardWriter(std::filesystem::path dir, uint64_t max_shard_tokens = kDefaultShardTokens,
                       Vocabulary vocabulary = {});
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Every token must be below the vocabulary's size and not its end-of-document id (with the
  // byte tokenizer: 0..255). Empty documents are allowed.
  void AddDocument(std::span<const uint32_t> tokens);
  uint64_t tokens_written() const { return total_tokens_; }
  // `source` (any JSON object) is stored as the manifest's informational "source" field.
  void Finish(const nlohmann::ordered_json& source);

 private:
  void FlushShard();

  std::filesystem::path dir_;
  uint64_t max_shard_tokens_;
  std::vector<uint32_t> tokens_;   // current shard
  std::vector<uint64_t> offsets_;  // current shard's .idx, starting with 0
  std::vector<ShardInfo> shards_;
  Vocabulary vocabulary_;
  std::vector<uint64_t> counts_;  // per token id, of one packed epoch
  uint64_t total_tokens_ = 0, total_documents_ = 0;
  bool finished_ = false;
};

// ---- reading shards --------------------------------------------------------------------------
// A verified dataset, held in memory (the corpora lockstep trains on here are tens of MB).
class Dataset {
 public:
  const std::filesystem::path& dir() const { return dir_; }
  const std::vector<ShardInfo>& shards() const { return shards_; }
  const Vocabulary& vocabulary() const { return vocabulary_; }
  uint64_t total_tokens() const { return tokens_.size(); }
  uint64_t num_documents() const { return doc_starts_.size() - 1; }
  // Document d, counting over all shards in manifest order.
  std::span<const uint32_t> Document(uint64_t d) const;
  // Informational: the unigram entropy (nats) of one packed epoch, as stored in the manifest.
  double unigram_entropy_nats() const { return unigram_entropy_nats_; }
  // Informational: the manifest's "source" object (how the corpus was made), as compact JSON.
  const std::string& source() const { return source_; }
  // The BLAKE2b-256 of manifest.json's bytes: it pins every shard through their digests.
  const Digest& manifest_digest() const { return manifest_digest_; }

 private:
  friend Dataset OpenDataset(const std::filesystem::path& dir);
  std::filesystem::path dir_;
  std::vector<ShardInfo> shards_;
  Vocabulary vocabulary_;
  std::vector<uint32_t> tokens_;      // all shards concatenated
  std::vector<uint64_t> doc_starts_;  // global, num_documents + 1 entries
  double unigram_entropy_nats_ = 0;
  std::string source_ = "{}";
  Digest manifest_digest_{};
};

// Loads DIR/manifest.json, validates every field, checks every file's size and BLAKE2b digest
// and every .idx against its .bin and the manifest. Fails naming the file, the field and the
// value (for a digest mismatch: the shard file, the manifest's digest and the actual one).
Dataset OpenDataset(const std::filesystem::path& dir);
// The dataset's tokenizer file (manifest tokenizer.name, in its directory), its BLAKE2b checked
// against the manifest's tokenizer.blake2b (fails naming the file, that digest and the
// directory); nothing when the file is not there or the vocabulary is the bytes (no file).
std::optional<std::filesystem::path> DatasetTokenizerFile(const Dataset& dataset);

// ---- building corpora ------------------------------------------------------------------------
inline constexpr uint64_t kDefaultSynthTokens = 4'000'000;
// Called now and then with (tokens done, tokens total) during long work.
using Progress = std::function<void(uint64_t done, uint64_t total)>;

// A synthetic corpus of exactly `tokens` byte tokens, a pure function of (seed, tokens): a
// seeded lexicon of made-up words with Zipfian frequencies in word classes, sentences from a
// small grammar with noun -> verb preferences, in lowercase ASCII. Generated with Philox only.
void WriteSynthCorpus(const std::filesystem::path& out, uint64_t seed, uint64_t tokens,
                      const Progress& progress = {},
                      uint64_t max_shard_tokens = kDefaultShardTokens);

// ---- subword tokenizers (docs/tokenizers.md) ------------------------------------------------
// A tokenizer lockstep applies to text: its vocabulary (the manifest's tokenizer, size and
// end-of-document id) and its encoder.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual const Vocabulary& vocabulary() const = 0;
  // The ids of `text` (valid UTF-8); `what` names the text in errors.
  virtual std::vector<uint32_t> Encode(std::string_view text, std::string_view what) const = 0;
  virtual std::string Decode(std::span<const uint32_t> ids) const = 0;
};
// A SentencePiece model file (its end-of-sentence piece </s> ends documents), a Hugging Face
// tokenizer.json of byte-level BPE (docs/tokenizers.md), or a directory holding tokenizer.model
// or tokenizer.json. Fails naming the file and the field.
std::unique_ptr<Tokenizer> OpenTokenizer(const std::filesystem::path& file_or_dir);
// The pieces and the encoding options of a SentencePiece model file, for an exporter that writes
// the vocabulary in another format (src/infer/export.cc). Piece texts, scores and the special
// ids come from libsentencepiece; the piece types and the trainer's and normalizer's options,
// which its C++ API does not expose (Debian ships no sentencepiece_model.pb.h), from the
// model's protobuf fields read here. Fails naming the file.
struct SentencePieceModel {
  // SentencePiece's ModelProto.SentencePiece.Type values.
  enum class PieceType {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6
  };
  struct Piece {
    std::string text;
    float score = 0;
    PieceType type = PieceType::kNormal;
  };
  std::vector<Piece> pieces;  // by id
  std::string model_type;     // "unigram", "bpe", "word" or "char"
  bool byte_fallback = false, treat_whitespace_as_suffix = false;
  std::string normalizer_name;
  bool has_charsmap = false;  // a normalization table (empty for "identity")
  bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
  int unk_id = -1, bos_id = -1, eos_id = -1, pad_id = -1;  // -1: none
};
SentencePieceModel ReadSentencePieceModel(const std::filesystem::path& model);
// Trains a SentencePiece model ("unigram" or "bpe") of `vocab` pieces on the lines of the inputs
// (valid UTF-8, in order), deterministically: the same inputs give the same bytes. The text is
// not normalized and bytes fall back to byte pieces, so any text encodes without <unk> and
// decodes back to itself. Writes out_dir/tokenizer.model (out_dir must not exist
// or be empty) and returns its path.
std::filesystem::path TrainTokenizer(std::span<const std::filesystem::path> inputs, uint64_t vocab,
                                     std::string_view model_type,
                                     const std::filesystem::path& out_dir);

// Each input file becomes one document: its exact bytes as byte tokens (decoding gives the file
// back), or with a tokenizer its ids. Files must be valid UTF-8; an empty file is an empty
// document.
void TokenizeFiles(std::span<const std::filesystem::path> inputs, const std::filesystem::path& out,
                   uint64_t max_shard_tokens = kDefaultShardTokens,
                   const Tokenizer* tokenizer = nullptr);

// A Megatron-style indexed dataset (PREFIX.idx and PREFIX.bin, the "MMIDIDX" format of
// Megatron-LM's indexed_dataset.py) as lockstep shards in `out`: each of its documents (the
// sequences document_indices groups) one document, its tokens checked against `vocabulary`, a
// last token equal to vocabulary.eod dropped (the stream adds it back). Every size and offset of
// the index is checked, and every token, before `out` is created: a malformed dataset is refused
// naming the file, the field (or document and token) and the value, and leaves nothing.
// `progress` counts bytes of the .bin, which is read twice (checked, then written).
void ImportMegatron(const std::filesystem::path& prefix, const std::filesystem::path& out,
                    const Vocabulary& vocabulary, uint64_t max_shard_tokens = kDefaultShardTokens,
                    const Progress& progress = {});

// ---- the canonical stream (docs/formats/stream.md) ---------------------------------------------
// Epoch e is every document exactly once, in the order of a Fisher-Yates shuffle driven by
// Philox keyed from `seed`, each followed by the vocabulary's end-of-document id; epochs follow one another without end.
// Window i is the seq_len + 1 tokens at positions [i * seq_len, i * seq_len + seq_len + 1):
// inputs are its first seq_len tokens, targets its last seq_len, and consecutive windows share
// one token. The dataset must outlive the stream. Window() is safe to call from many threads.
class TokenStream {
 public:
  TokenStream(const Dataset& dataset, uint64_t seed, uint32_t seq_len);
  ~TokenStream();
  // Epochs kept shuffled (each: its document order and packed starts, 12 bytes per document):
  // a window spanning an epoch boundary touches two.
  static constexpr size_t kCachedEpochs = 2;

  uint32_t seq_len() const { return seq_len_; }
  uint64_t seed() const { return seed_; }
  // Tokens in one packed epoch: total tokens + one end-of-document token per document.
  uint64_t epoch_tokens() const { return epoch_tokens_; }
  // Writes window i into out (out.size() must be seq_len + 1). O(log documents) per epoch
  // touched, plus one O(documents) shuffle per epoch not among the two most recently used.
  void Window(uint64_t i, std::span<uint32_t> out) const;
  // The shuffled document order of epoch e (global document indices).
  std::vector<uint32_t> EpochOrder(uint64_t epoch) const;

 private:
  struct Epoch;
  std::shared_ptr<const Epoch> GetEpoch(uint64_t epoch) const;

  const Dataset& dataset_;
  uint64_t seed_;
  uint32_t seq_len_;
  uint64_t epoch_tokens_;
  mutable std::mutex cache_mutex_;
  mutable std::vector<std::shared_ptr<const Epoch>> cache_;  // most recently used first
};

}  // namespace lockstep::data
