// Subword tokenizers: SentencePiece models, trained and applied with Debian's libsentencepiece
// (a well-kept implementation: nothing here re-implements it). docs/tokenizers.md.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <array>
#include <cstring>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "data/tokenizers.h"

namespace lockstep::data {
namespace {
namespace fs = std::filesystem;

constexpr std::string_view kModelName = "tokenizer.model";

// The lines of the inputs, each file's in order, as SentencePiece's training sentences.
class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(std::vector<std::string> lines) : lines_(std::move(lines)) {}
  bool done() const override { return next_ >= lines_.size(); }
  void Next() override { ++next_; }
  const std::string& value() const override { return lines_[next_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::vector<std::string> lines_;
  size_t next_ = 0;
};

// Loads a model into `processor`: false when libsentencepiece refuses it, by its status or by
// throwing (its trie builder throws on a piece it cannot index, such as an empty one).
bool LoadSentencePiece(sentencepiece::SentencePieceProcessor& processor, std::string_view proto) {
  try {
    return processor.LoadFromSerializedProto(proto).ok();
  } catch (const std::exception&) {
    return false;
  }
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const fs::path& model) {
    const std::vector<uint8_t> bytes = ReadFileBytes(model);
    // SentencePiece's message names its own source lines, nothing the user can change.
    if (!LoadSentencePiece(processor_, std::string_view(reinterpret_cast<const char*>(bytes.data()),
                                                        bytes.size()))) {
      Fail(
          "{}: not a SentencePiece model (a Hugging Face tokenizer is read as one only when its "
          "name ends in .json): give a tokenizer.model that 'lockstep tokenizer train' wrote, a "
          "tokenizer.json, or a directory holding one",
          model.string());
    }
    if (processor_.eos_id() < 0) {
      Fail("{}: the model has no end-of-sentence piece (</s>), which ends documents",
           model.string());
    }
    vocabulary_ = {static_cast<uint32_t>(processor_.GetPieceSize()),
                   static_cast<uint32_t>(processor_.eos_id()), model.filename().string(),
                   Blake2b256(bytes)};
  }

  const Vocabulary& vocabulary() const override { return vocabulary_; }

  std::vector<uint32_t> Encode(std::string_view text, std::string_view what) const override {
    std::vector<int> ids;
    const sentencepiece::util::Status status = processor_.Encode(text, &ids);
    if (!status.ok()) Fail("{}: SentencePiece cannot encode it: {}", what, status.ToString());
    return {ids.begin(), ids.end()};  // ids are below GetPieceSize(): never negative
  }

  std::string Decode(std::span<const uint32_t> ids) const override {
    std::string text;
    const sentencepiece::util::Status status =
        processor_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    if (!status.ok()) Fail("SentencePiece cannot decode the ids: {}", status.ToString());
    return text;
  }

 private:
  sentencepiece::SentencePieceProcessor processor_;
  Vocabulary vocabulary_;
};

// SentencePiece's training errors name its own source lines and options; the two a user meets,
// a vocabulary the inputs cannot hold or cannot fill, are told in --vocab terms with the sizes
// that work (the numbers are in its message), the rest passed on as they are.
[[noreturn]] void FailTraining(const std::string& message, uint64_t vocab,
                               std::string_view model_type) {
  static const std::regex too_small(R"(smaller than required_chars\. \d+ vs (\d+))");
  static const std::regex too_large(R"(too high \(\d+\)\. Please set it to a value <= (\d+))");
  std::smatch m;
  if (std::regex_search(message, m, too_small)) {
    Fail("tokenizer train: --vocab {} is too small for these inputs: their distinct characters, "
         "the 256 byte pieces and the special pieces need at least {}; use --vocab {} or more",
         vocab, m[1].str(), m[1].str());
  }
  if (std::regex_search(message, m, too_large)) {
    Fail("tokenizer train: --vocab {} is more pieces than these inputs can fill with --model {}: "
         "at most {}; use --vocab {} or less, or give more text",
         vocab, model_type, m[1].str(), m[1].str());
  }
  Fail("tokenizer train: SentencePiece failed: {}", message);
}

// The longest line SentencePiece trains on (its max_sentence_length, set below).
constexpr size_t kMaxSentenceBytes = 1000000;

// SentencePiece's trainer skips, without a word, a sentence longer than max_sentence_length and
// one holding U+2585 (the character it marks unknown pieces with): text the model would never
// have seen. Each line is one sentence, so such a line is refused, named, instead.
void RequireTrainableLine(std::string_view line, const fs::path& file, size_t number) {
  if (line.size() > kMaxSentenceBytes) {
    Fail(
        "tokenizer train: {} line {} is {} bytes; SentencePiece trains on lines of at most {} "
        "bytes (each line is one sentence): split it",
        file.string(), number, line.size(), kMaxSentenceBytes);
  }
  if (line.find("\xE2\x96\x85") != std::string_view::npos) {
    Fail(
        "tokenizer train: {} line {} holds U+2585 (\xE2\x96\x85), which SentencePiece reserves "
        "for unknown pieces and would drop the line for: remove or replace it",
        file.string(), number);
  }
}

// A protobuf message's fields in wire order (the encoding is public: varint keys holding the
// field number and wire type). Only what ReadSentencePieceModel needs.
class ProtoFields {
 public:
  ProtoFields(std::string_view bytes, const fs::path& file) : b_(bytes), file_(file) {}
  // The next field: its number, and its value as a varint (wire types 0, 5 as bits) or as
  // bytes (type 2). False at the end.
  bool Next(uint32_t& field, uint64_t& number, std::string_view& bytes) {
    if (i_ >= b_.size()) return false;
    const uint64_t key = Varint();
    field = static_cast<uint32_t>(key >> 3);
    switch (key & 7) {
      case 0:
        number = Varint();
        return true;
      case 1:
        Need(8);
        i_ += 8;
        return true;
      case 2: {
        const uint64_t n = Varint();
        Need(n);
        bytes = b_.substr(i_, n);
        i_ += n;
        return true;
      }
      case 5: {
        Need(4);
        uint32_t v = 0;
        std::memcpy(&v, b_.data() + i_, 4);
        number = v;
        i_ += 4;
        return true;
      }
      default:
        Fail("{}: not a SentencePiece model (protobuf wire type {} at byte {})", file_.string(),
             key & 7, i_);
    }
  }

 private:
  uint64_t Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      Need(1);
      const uint8_t c = static_cast<uint8_t>(b_[i_++]);
      v |= uint64_t{c & 0x7Fu} << shift;
      if ((c & 0x80) == 0) return v;
    }
    Fail("{}: not a SentencePiece model (a varint longer than 10 bytes)", file_.string());
  }
  void Need(uint64_t n) const {
    if (n > b_.size() - i_) Fail("{}: not a SentencePiece model (truncated)", file_.string());
  }
  std::string_view b_;
  const fs::path& file_;
  size_t i_ = 0;
};

}  // namespace

SentencePieceModel ReadSentencePieceModel(const fs::path& file) {
  const std::vector<uint8_t> bytes = ReadFileBytes(file);
  const std::string_view proto(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  sentencepiece::SentencePieceProcessor processor;
  if (!LoadSentencePiece(processor, proto)) {
    Fail("{}: not a SentencePiece model", file.string());
  }
  SentencePieceModel m;
  for (int id = 0; id < processor.GetPieceSize(); ++id) {
    m.pieces.push_back({processor.IdToPiece(id), processor.GetScore(id)});
  }
  m.unk_id = processor.unk_id();
  m.bos_id = processor.bos_id();
  m.eos_id = processor.eos_id();
  m.pad_id = processor.pad_id();
  // ModelProto: 1 pieces, 2 trainer_spec, 3 normalizer_spec (sentencepiece_model.proto).
  ProtoFields top(proto, file);
  uint32_t field = 0;
  uint64_t number = 0;
  std::string_view sub;
  size_t piece = 0;
  static const std::array<const char*, 5> kModelTypes = {"", "unigram", "bpe", "word", "char"};
  m.model_type = "unigram";  // TrainerSpec.model_type's default
  while (top.Next(field, number, sub)) {
    ProtoFields fields(sub, file);
    uint32_t f = 0;
    uint64_t n = 0;
    std::string_view s;
    if (field == 1) {  // SentencePiece: 1 piece, 2 score, 3 type (default NORMAL)
      if (piece >= m.pieces.size()) Fail("{}: more pieces than SentencePiece loads", file.string());
      while (fields.Next(f, n, s)) {
        if (f == 3) {
          if (n < 1 || n > 6) Fail("{}: piece {} has type {}", file.string(), piece, n);
          m.pieces[piece].type = static_cast<SentencePieceModel::PieceType>(n);
        }
      }
      ++piece;
    } else if (field == 2) {  // TrainerSpec: 3 model_type, 24 treat_whitespace_as_suffix,
                              // 35 byte_fallback
      while (fields.Next(f, n, s)) {
        if (f == 3) m.model_type = n < kModelTypes.size() && n > 0 ? kModelTypes[n] : "unknown";
        if (f == 24) m.treat_whitespace_as_suffix = n != 0;
        if (f == 35) m.byte_fallback = n != 0;
      }
    } else if (field == 3) {  // NormalizerSpec: 1 name, 2 precompiled_charsmap,
                              // 3 add_dummy_prefix, 4 remove_extra_whitespaces,
                              // 5 escape_whitespaces
      while (fields.Next(f, n, s)) {
        if (f == 1) m.normalizer_name = std::string(s);
        if (f == 2) m.has_charsmap = !s.empty();
        if (f == 3) m.add_dummy_prefix = n != 0;
        if (f == 4) m.remove_extra_whitespaces = n != 0;
        if (f == 5) m.escape_whitespaces = n != 0;
      }
    }
  }
  if (piece != m.pieces.size()) {
    Fail("{}: {} pieces in the file, {} loaded by SentencePiece", file.string(), piece,
         m.pieces.size());
  }
  return m;
}

std::unique_ptr<Tokenizer> OpenTokenizer(const fs::path& path) {
  fs::path file = path;
  if (fs::is_directory(path)) {
    file = fs::exists(path / kModelName) ? path / kModelName : path / "tokenizer.json";
  }
  if (!fs::exists(file)) {
    Fail("{}: no such tokenizer (a SentencePiece model, a tokenizer.json, or a directory holding "
         "{} or tokenizer.json)",
         file.string(), kModelName);
  }
  if (file.extension() == ".json") return OpenHfTokenizer(file);
  return std::make_unique<SentencePieceTokenizer>(file);
}

fs::path TrainTokenizer(std::span<const fs::path> inputs, uint64_t vocab, std::string_view model_type,
                        const fs::path& out_dir) {
  if (inputs.empty()) Fail("tokenizer train: no input files");
  if (model_type != "unigram" && model_type != "bpe") {
    Fail("tokenizer train: --model '{}' (unigram or bpe)", model_type);
  }
  // SentencePiece reads the size as a signed 32-bit int: the largest is kMaxVocab - 1.
  if (vocab < 8 || vocab >= kMaxVocab) {
    Fail("tokenizer train: --vocab {} is outside 8 .. {}", vocab, kMaxVocab - 1);
  }
  std::vector<std::string> lines;
  for (const fs::path& input : inputs) {
    // Sized before it is read: its bytes, its lines and the trainer's copy must fit.
    const std::vector<uint8_t> bytes = ReadFileBytes(
        input, MemAvailableBytes() / 3,
        "a third of the memory available now (an input is read whole, split into lines and "
        "handed to the trainer)");
    ValidateUtf8(bytes, input.string());
    std::vector<std::string> file_lines =
        Lines(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    for (size_t i = 0; i < file_lines.size(); ++i) {
      std::string& line = file_lines[i];
      RequireTrainableLine(line, input, i + 1);
      if (!line.empty()) lines.push_back(std::move(line));
    }
  }
  if (lines.empty()) Fail("tokenizer train: the inputs hold no text");
  if (fs::exists(out_dir) && (!fs::is_directory(out_dir) || !fs::is_empty(out_dir))) {
    Fail("{}: exists and is not an empty directory", out_dir.string());
  }
  // Deterministic training: one thread, every sentence (no sampling or shuffling), a fixed seed.
  // The same inputs give the same model bytes. The text is taken as it is (no normalization, no
  // whitespace removed, no dummy prefix) and bytes fall back to byte pieces, so decoding a
  // document's ids gives its text back exactly.
  sentencepiece::SetRandomGeneratorSeed(0);
  const std::unordered_map<std::string, std::string> options = {
      {"model_type", std::string(model_type)},
      {"vocab_size", std::to_string(vocab)},
      {"num_threads", "1"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},  // every byte encodes: no id is lost to <unk>
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"max_sentence_length", std::to_string(kMaxSentenceBytes)},
      {"minloglevel", "2"},
  };
  LineIterator sentences(std::move(lines));
  std::string model;
  const sentencepiece::util::Status status =
      sentencepiece::SentencePieceTrainer::Train(options, &sentences, &model);
  if (!status.ok()) FailTraining(status.ToString(), vocab, model_type);
  fs::create_directories(out_dir);
  const fs::path path = out_dir / kModelName;
  WriteFileSynced(path, std::span(reinterpret_cast<const uint8_t*>(model.data()), model.size()));
  SyncDirectory(out_dir);
  return path;
}

}  // namespace lockstep::data
