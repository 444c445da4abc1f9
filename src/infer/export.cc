// Export of a verified checkpoint to Hugging Face transformers (a directory) and to GGUF v3 (one
// file, for llama.cpp): every tensor and key, and why each architecture is exact, in
// docs/export.md.
//
// The GGUF file is written here by hand: the format is a header, typed key/value pairs, tensor
// descriptors and aligned raw data, and Debian 12 packages no C or C++ library that writes it
// (ggml's gguf.cpp is not packaged, and the Python gguf package is not a C++ dependency).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "lockstep/data.h"
#include "lockstep/infer.h"
#include "lockstep/json.h"
#include "lockstep/kernels.h"

namespace lockstep::infer {
namespace fs = std::filesystem;
using data::Dataset;
using data::kEodToken;
using data::Vocabulary;
using nlohmann::json;

namespace {

// llama.cpp's limit on layers (LLAMA_MAX_LAYERS in the version node-llama-cpp 3.21.1 bundles).
constexpr int64_t kLlamaCppMaxLayers = 512;

bool AnySlidingLayer(const ModelConfig& c) {
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (LayerWindow(c, l) > 0) return true;
  }
  return false;
}

// ---- the tensors, by lockstep name -----------------------------------------------------------

class Params {
 public:
  explicit Params(const ParamStore& store) : store_(store) {}
  std::span<const float> Get(const std::string& name) const {
    for (size_t i = 0; i < store_.size(); ++i) {
      if (store_.Spec(i).name == name) return store_.Tensor(i);
    }
    LOCKSTEP_INTERNAL("export: the checkpoint has no tensor '{}'", name);
  }
  std::span<const float> Layer(int64_t l, LayerTensor which) const {
    return Get(fmt::format("layers.{}.{}", l, kLayerTensorNames[which]));
  }

 private:
  const ParamStore& store_;
};

// The embedding table as the model sees it after the lookup: with `embedding_norm`, every row
// through lockstep's own RmsNormForward with the gain (the kernel works row by row, so these are
// the bits the forward computes for any token); else the table itself.
std::vector<float> EmbeddingTable(const ModelConfig& c, const Params& p) {
  const std::span<const float> table = p.Get("tok_embeddings.weight");
  std::vector<float> out(table.begin(), table.end());
  if (c.embedding_norm) {
    std::vector<float> rstd(static_cast<size_t>(c.vocab));
    rk::RmsNormForward(table, p.Get("emb_norm.weight"), static_cast<float>(c.norm_eps), out, rstd,
                       c.vocab, c.d_model);
  }
  return out;
}

// ---- the dataset's tokenizer ------------------------------------------------------------------

struct Tokenizer {
  enum class Kind { kNone, kBytes, kSentencePiece, kHfJson, kUnknownFile } kind = Kind::kNone;
  Vocabulary vocabulary;
  fs::path file;  // the tokenizer file, for file kinds found in the dataset directory
  std::string note;
};

Tokenizer DatasetTokenizer(const VerifiedModel& m, const fs::path& data) {
  Tokenizer t;
  if (data.empty()) {
    t.note = "no tokenizer written: no --data was given (the dataset names the tokenizer)";
    return t;
  }
  const Dataset dataset = OpenTrainingData(m, data);
  t.vocabulary = dataset.vocabulary();
  if (t.vocabulary.bytes()) {
    t.kind = Tokenizer::Kind::kBytes;
    return t;
  }
  const std::optional<fs::path> file = data::DatasetTokenizerFile(dataset);
  if (!file) {
    t.note = fmt::format(
        "no tokenizer written: the dataset's tokenizer file {} (manifest tokenizer.name) is not "
        "in {}; copy it there to export it",
        t.vocabulary.tokenizer_file, data.string());
    return t;
  }
  t.file = *file;
  const std::string name = t.file.filename().string();
  if (name.ends_with(".model")) {
    t.kind = Tokenizer::Kind::kSentencePiece;
  } else if (name.ends_with(".json")) {
    t.kind = Tokenizer::Kind::kHfJson;
  } else {
    t.kind = Tokenizer::Kind::kUnknownFile;
  }
  return t;
}

// GPT-2's byte-to-character map (the ByteLevel pre-tokenizer's alphabet), as UTF-8: printable
// Latin-1 bytes stand for themselves, the others for U+0100 + n in byte order.
std::string ByteLevelChar(int byte) {
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int code = byte;
  if (!printable(byte)) {
    int n = 0;
    for (int b = 0; b < byte; ++b) n += printable(b) ? 0 : 1;
    code = 256 + n;
  }
  std::string s;
  if (code < 0x80) {
    s += static_cast<char>(code);
  } else {
    s += static_cast<char>(0xC0 | (code >> 6));
    s += static_cast<char>(0x80 | (code & 0x3F));
  }
  return s;
}

// The byte vocabulary's piece for every id below `vocab`: bytes 0..255, the end-of-document
// token, then unused ids (a model's vocab may exceed the data's 257 ids).
constexpr std::string_view kEodPiece = "<|endoftext|>";
std::string BytePiece(int64_t id) {
  if (id < 256) return ByteLevelChar(static_cast<int>(id));
  if (id == kEodToken) return std::string(kEodPiece);
  return fmt::format("<|unused_{}|>", id);
}

// ---- GGUF v3 ------------------------------------------------------------------------------------

enum class GgufType : uint32_t {
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
};
constexpr uint64_t kGgufAlignment = 32;

class GgufWriter {
 public:
  void String(std::string_view key, std::string_view v) {
    Key(key, GgufType::kString);
    Str(v);
  }
  void U32(std::string_view key, int64_t v) {
    Key(key, GgufType::kU32);
    Pod(static_cast<uint32_t>(v));
  }
  void F32(std::string_view key, float v) {
    Key(key, GgufType::kF32);
    Pod(v);
  }
  void Bool(std::string_view key, bool v) {
    Key(key, GgufType::kBool);
    Pod(static_cast<uint8_t>(v));
  }
  void Strings(std::string_view key, const std::vector<std::string>& v) {
    ArrayHead(key, GgufType::kString, v.size());
    for (const std::string& s : v) Str(s);
  }
  void I32s(std::string_view key, const std::vector<int32_t>& v) {
    ArrayHead(key, GgufType::kI32, v.size());
    for (int32_t x : v) Pod(x);
  }
  void F32s(std::string_view key, const std::vector<float>& v) {
    ArrayHead(key, GgufType::kF32, v.size());
    for (float x : v) Pod(x);
  }
  void Bools(std::string_view key, const std::vector<bool>& v) {
    ArrayHead(key, GgufType::kBool, v.size());
    for (bool x : v) Pod(static_cast<uint8_t>(x));
  }
  // A tensor of lockstep shape [rows, cols] (or [n]), F32; `owned` keeps transformed data alive.
  void Tensor(std::string name, std::vector<int64_t> shape, std::span<const float> data) {
    tensors_.push_back({std::move(name), std::move(shape), data});
  }
  void Tensor(std::string name, std::vector<int64_t> shape, std::vector<float> owned) {
    owned_.push_back(std::make_unique<std::vector<float>>(std::move(owned)));
    Tensor(std::move(name), std::move(shape), std::span<const float>(*owned_.back()));
  }
  // The tensors so far, in lockstep's shapes, to narrow before Write.
  std::vector<NamedTensor>& tensors() { return tensors_; }

  void Write(File& file) {
    std::vector<uint8_t> head;
    auto put = [&](const auto& v) {
      const auto* b = reinterpret_cast<const uint8_t*>(&v);
      head.insert(head.end(), b, b + sizeof(v));
    };
    put(uint32_t{0x46554747});  // "GGUF"
    put(uint32_t{3});
    put(static_cast<uint64_t>(tensors_.size()));
    put(kv_count_);
    head.insert(head.end(), kv_.begin(), kv_.end());
    uint64_t offset = 0;
    for (const NamedTensor& t : tensors_) {
      put(static_cast<uint64_t>(t.name.size()));
      head.insert(head.end(), t.name.begin(), t.name.end());
      // GGUF lists dimensions innermost first: [rows, cols] is [cols, rows] there, the same bytes.
      put(static_cast<uint32_t>(t.shape.size()));
      for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) put(static_cast<uint64_t>(*d));
      put(static_cast<uint32_t>(InfoOf(t.data.dtype()).gguf_type));  // F32 0, BF16 30
      put(offset);
      offset += Padded(t.data.bytes().size());
    }
    head.resize(Padded(head.size()), 0);
    file.Write(head);
    static const uint8_t zeros[kGgufAlignment] = {};
    for (const NamedTensor& t : tensors_) {
      const std::span<const std::byte> bytes = t.data.bytes();
      file.Write(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
      file.Write(std::span(zeros, Padded(bytes.size()) - bytes.size()));
    }
  }

 private:
  static uint64_t Padded(uint64_t n) {
    return (n + kGgufAlignment - 1) / kGgufAlignment * kGgufAlignment;
  }
  template <typename T>
  void Pod(T v) {
    const auto* b = reinterpret_cast<const uint8_t*>(&v);
    kv_.insert(kv_.end(), b, b + sizeof(v));
  }
  void Str(std::string_view s) {
    Pod(static_cast<uint64_t>(s.size()));
    kv_.insert(kv_.end(), s.begin(), s.end());
  }
  void Key(std::string_view key, GgufType type) {
    ++kv_count_;
    Str(key);
    Pod(static_cast<uint32_t>(type));
  }
  void ArrayHead(std::string_view key, GgufType type, size_t n) {
    Key(key, GgufType::kArray);
    Pod(static_cast<uint32_t>(type));
    Pod(static_cast<uint64_t>(n));
  }

  std::vector<uint8_t> kv_;
  uint64_t kv_count_ = 0;
  std::vector<NamedTensor> tensors_;
  std::vector<std::unique_ptr<std::vector<float>>> owned_;
};

// ---- GGUF tokenizers ---------------------------------------------------------------------------
// What llama.cpp's vocabulary loader (llama-vocab.cpp in the version node-llama-cpp 3.21.1
// bundles) reads: the reasons each translation is exact are in docs/export.md, "Tokenizer keys".

// llama.cpp's LLAMA_TOKEN_TYPE_* (token_type values).
enum GgufTokenType : int32_t {
  kTypeNormal = 1,
  kTypeUnknown = 2,
  kTypeControl = 3,
  kTypeUserDefined = 4,
  kTypeUnused = 5,
  kTypeByte = 6
};

struct GgufVocab {
  std::string model, pre;  // tokenizer.ggml.model, .pre ("" : not written)
  std::vector<std::string> tokens;
  std::vector<float> scores;  // SentencePiece only
  std::vector<int32_t> types;
  std::vector<std::string> merges;  // gpt2 only
  int64_t bos = -1, eos = -1, unk = -1;
  bool add_space_prefix = false, spm = false;
};

// Fills `tokens` and `types` up to the model's vocabulary with unused placeholders: the ids a
// model has beyond its tokenizer's (the data never holds them). Returns why not, or "".
std::string PadVocab(GgufVocab& v, int64_t n_vocab, std::string_view format) {
  for (auto id = static_cast<int64_t>(v.tokens.size()); id < n_vocab; ++id) {
    v.tokens.push_back(fmt::format(fmt::runtime(format), id));
    v.types.push_back(kTypeUnused);
    if (v.spm) v.scores.push_back(0.0f);
  }
  std::unordered_map<std::string_view, int64_t> seen;
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    if (v.tokens[id].empty()) return fmt::format("id {} has an empty piece", id);
    const auto [it, fresh] = seen.emplace(v.tokens[id], static_cast<int64_t>(id));
    if (!fresh) {  // llama.cpp maps every text to one id
      return fmt::format("ids {} and {} have the same text '{}'", it->second, id, v.tokens[id]);
    }
  }
  return "";
}

size_t Utf8Length(uint8_t lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

// A SentencePiece model as tokenizer.ggml.model "llama" (`target` names it in the reasons), or
// as the tokenizer.json of SentencePieceHfJson (`hf`). Returns why it cannot be, or "".
std::string SentencePieceVocab(const fs::path& file, int64_t n_vocab, GgufVocab& v, bool hf) {
  using Type = data::SentencePieceModel::PieceType;
  const data::SentencePieceModel m = data::ReadSentencePieceModel(file);
  const std::string_view target = hf ? "the tokenizer.json" : "llama.cpp's \"llama\" vocabulary";
  if (m.model_type != "bpe") {
    return fmt::format(
        "{} is a SentencePiece {} model: {} encodes by SentencePiece-BPE's merging of the "
        "best-scored adjacent pair, not by the unigram model's Viterbi search{}; a model trained "
        "with --model bpe exports exactly",
        file.string(), m.model_type, target,
        hf ? ""
           : ", and its unigram vocabulary (\"t5\") has no byte fallback (a character "
             "outside the vocabulary becomes <unk>), so neither gives lockstep's ids");
  }
  if (!m.byte_fallback) {
    return fmt::format("{} was trained without byte_fallback: {} always falls back to bytes",
                       file.string(), target);
  }
  if (m.has_charsmap || m.remove_extra_whitespaces || !m.escape_whitespaces ||
      m.treat_whitespace_as_suffix) {
    return fmt::format(
        "{} normalizes text (normalizer '{}', remove_extra_whitespaces {}, escape_whitespaces {}, "
        "treat_whitespace_as_suffix {}): {} only escapes spaces",
        file.string(), m.normalizer_name, m.remove_extra_whitespaces, m.escape_whitespaces,
        m.treat_whitespace_as_suffix, target);
  }
  v.model = "llama";
  v.spm = true;
  for (size_t id = 0; id < m.pieces.size(); ++id) {
    const auto& p = m.pieces[id];
    try {  // libsentencepiece loads a piece of any bytes; both formats hold UTF-8 text
      data::ValidateUtf8(std::span(reinterpret_cast<const uint8_t*>(p.text.data()), p.text.size()),
                         fmt::format("{}: piece {}", file.string(), id));
    } catch (const Error& e) {
      return e.what();
    }
    if (p.type == Type::kUserDefined || p.type == Type::kUnused) {
      return fmt::format(
          "{}: piece {} ('{}') is {}: SentencePiece matches user-defined pieces before merging "
          "and splits unused ones again, {} does neither alike",
          file.string(), id, p.text, p.type == Type::kUnused ? "unused" : "user-defined", target);
    }
    v.tokens.push_back(p.text);
    v.scores.push_back(p.score);
    v.types.push_back(p.type == Type::kUnknown   ? kTypeUnknown
                      : p.type == Type::kControl ? kTypeControl
                      : p.type == Type::kByte    ? kTypeByte
                                                 : kTypeNormal);
  }
  if (std::string why = PadVocab(v, n_vocab, "<unused_{}>"); !why.empty()) {
    return fmt::format("{}: {}", file.string(), why);
  }
  // SentencePiece merges only into normal pieces; llama.cpp into any token's text (the
  // tokenizer.json's merges are into normal pieces only). They agree unless a merge of two
  // symbols (a character or a piece) can spell a control, unknown, byte or placeholder token:
  // then refuse.
  std::unordered_set<std::string_view> texts(v.tokens.begin(), v.tokens.end());
  const auto symbol = [&](std::string_view t) {
    return texts.contains(t) || (!t.empty() && Utf8Length(static_cast<uint8_t>(t[0])) == t.size());
  };
  for (size_t id = 0; id < v.tokens.size() && !hf; ++id) {
    if (v.types[id] == kTypeNormal) continue;
    const std::string_view t = v.tokens[id];
    for (size_t k = Utf8Length(static_cast<uint8_t>(t[0])); k < t.size();
         k += Utf8Length(static_cast<uint8_t>(t[k]))) {
      if (symbol(t.substr(0, k)) && symbol(t.substr(k))) {
        return fmt::format(
            "{}: the special token {} '{}' can be spelled by merging '{}' and '{}', which "
            "llama.cpp's \"llama\" vocabulary would do and SentencePiece does not",
            file.string(), id, t, t.substr(0, k), t.substr(k));
      }
    }
  }
  v.bos = m.bos_id;
  v.eos = m.eos_id;
  v.unk = m.unk_id;
  v.add_space_prefix = m.add_dummy_prefix;
  return "";
}

// GPT-2's pre-tokenizer pattern and Llama-3's, as tokenizer.json files spell them (the patterns
// src/data/bpe.cc runs), and the llama.cpp pre-tokenizers with the same expressions.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// An imported byte-level BPE tokenizer.json (the subset src/data/bpe.cc accepts) as
// tokenizer.ggml.model "gpt2". Returns why it cannot be, or "".
std::string HfBpeVocab(const fs::path& file, const Vocabulary& vocabulary, int64_t n_vocab,
                       GgufVocab& v) {
  const std::vector<uint8_t> bytes = ReadFileBytes(file);
  const json j = json::parse(bytes.begin(), bytes.end());
  const json& model = j.at("model");
  const json& pre = j.at("pre_tokenizer");
  std::string pattern = "(none)";
  if (pre.value("type", "") == "ByteLevel") {
    if (pre.value("use_regex", true)) pattern = kGpt2Pattern;
  } else if (pre.value("type", "") == "Sequence") {
    for (const json& p : pre.at("pretokenizers")) {
      if (p.value("type", "") == "Split") pattern = p.at("pattern").at("Regex").get<std::string>();
    }
  }
  const bool ignore_merges = model.contains("ignore_merges") &&
                             model["ignore_merges"].is_boolean() &&
                             model["ignore_merges"].get<bool>();
  // Among the names llama.cpp maps to the same expression, the one whose ignore_merges agrees
  // and, where there is one, that leaves decoded text as it is (clean_spaces false).
  if (pattern == kGpt2Pattern && !ignore_merges) {
    v.pre = "trillion";  // GPT-2's expression, clean_spaces false ("gpt-2" cleans spaces)
  } else if (pattern == kLlama3Pattern) {
    v.pre = ignore_merges ? "llama-bpe" : "dbrx";  // both clean spaces when decoding
  } else {
    return fmt::format(
        "{}: the pre-tokenizer pattern {}{} is not one llama.cpp's pre-tokenizers split by "
        "exactly (GPT-2's without ignore_merges, Llama-3's)",
        file.string(), json(pattern).dump(), ignore_merges ? " with ignore_merges" : "");
  }
  v.model = "gpt2";
  const uint32_t size = vocabulary.size;
  std::vector<std::string> tokens(size);
  std::vector<int32_t> types(size, kTypeUnused);
  for (const auto& [piece, id] : model.at("vocab").items()) {
    tokens[id.get<uint32_t>()] = piece;
    types[id.get<uint32_t>()] = kTypeNormal;
  }
  std::vector<std::string> added;
  for (const json& a : j.at("added_tokens")) {
    const auto id = a.at("id").get<uint32_t>();
    tokens[id] = a.at("content").get<std::string>();
    types[id] = a.value("special", false) ? kTypeControl : kTypeUserDefined;
    added.push_back(tokens[id]);
  }
  // lockstep matches added tokens leftmost-longest; llama.cpp one token at a time, longest
  // first. They agree unless two can overlap in a text.
  for (const std::string& a : added) {
    for (const std::string& b : added) {
      if (&a == &b) continue;
      bool overlap = a.find(b) != std::string::npos;
      for (size_t k = 1; k < a.size() && !overlap; ++k) {
        overlap = b.starts_with(std::string_view(a).substr(k));
      }
      if (overlap) {
        return fmt::format(
            "{}: the added tokens '{}' and '{}' can overlap in a text, which "
            "lockstep and llama.cpp resolve differently",
            file.string(), a, b);
      }
    }
  }
  for (uint32_t id = 0; id < size; ++id) {
    if (tokens[id].empty()) tokens[id] = fmt::format("<|unused_{}|>", id);
  }
  v.tokens = std::move(tokens);
  v.types = std::move(types);
  if (std::string why = PadVocab(v, n_vocab, "<|unused_{}|>"); !why.empty()) {
    return fmt::format("{}: {}", file.string(), why);
  }
  for (const json& m : model.at("merges")) {
    v.merges.push_back(m.is_string()
                           ? m.get<std::string>()
                           : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());
  }
  v.bos = v.eos = vocabulary.eod;
  return "";
}

// GGUF's tokenizer keys, when the format expresses the dataset's tokenizer exactly; else
// tokenizer.ggml.model "none" with the vocabulary size. Returns the note for the output.
std::string GgufTokenizer(GgufWriter& g, const std::string& arch, const ModelConfig& c,
                          const Tokenizer& t) {
  GgufVocab v;
  std::string why, what;
  switch (t.kind) {
    case Tokenizer::Kind::kBytes:
      // The byte vocabulary as a byte-level BPE without merges: every byte is the piece of
      // GPT-2's byte alphabet whose id is the byte, so encoding gives the byte ids and decoding
      // the bytes.
      v.model = "gpt2";
      v.pre = "trillion";  // no merges: the split plays no part; decoding keeps spaces as they are
      for (int64_t id = 0; id < c.vocab; ++id) {
        v.tokens.push_back(BytePiece(id));
        v.types.push_back(id < 256 ? kTypeNormal : id == kEodToken ? kTypeControl : kTypeUnused);
      }
      v.bos = v.eos = kEodToken;
      what = fmt::format(
          "the byte vocabulary as tokenizer.ggml.model \"gpt2\" without merges (ids 0-255 the "
          "bytes, {} the end of document)",
          kEodToken);
      break;
    case Tokenizer::Kind::kSentencePiece:
      why = SentencePieceVocab(t.file, c.vocab, v, false);
      what =
          fmt::format("{} (SentencePiece BPE) as tokenizer.ggml.model \"llama\"", t.file.string());
      break;
    case Tokenizer::Kind::kHfJson:
      why = HfBpeVocab(t.file, t.vocabulary, c.vocab, v);
      what = fmt::format("{} as tokenizer.ggml.model \"gpt2\", pre-tokenizer \"{}\"",
                         t.file.string(), v.pre);
      break;
    case Tokenizer::Kind::kUnknownFile:
      why =
          fmt::format("{} is neither a SentencePiece .model nor a tokenizer.json", t.file.string());
      break;
    case Tokenizer::Kind::kNone:
      why = t.note;
      break;
  }
  if (v.model.empty() || !why.empty()) {
    g.String("tokenizer.ggml.model", "none");
    g.U32(arch + ".vocab_size", c.vocab);
    if (t.kind == Tokenizer::Kind::kNone) return t.note + " (tokenizer.ggml.model \"none\")";
    return fmt::format("no tokenizer written (tokenizer.ggml.model \"none\"): {}", why);
  }
  g.String("tokenizer.ggml.model", v.model);
  if (!v.pre.empty()) g.String("tokenizer.ggml.pre", v.pre);
  g.Strings("tokenizer.ggml.tokens", v.tokens);
  if (v.spm) g.F32s("tokenizer.ggml.scores", v.scores);
  g.I32s("tokenizer.ggml.token_type", v.types);
  if (v.model == "gpt2") g.Strings("tokenizer.ggml.merges", v.merges);
  if (v.bos >= 0) g.U32("tokenizer.ggml.bos_token_id", v.bos);
  if (v.eos >= 0) g.U32("tokenizer.ggml.eos_token_id", v.eos);
  if (v.unk >= 0) g.U32("tokenizer.ggml.unknown_token_id", v.unk);
  g.Bool("tokenizer.ggml.add_bos_token", false);  // lockstep adds neither
  g.Bool("tokenizer.ggml.add_eos_token", false);
  if (v.spm) g.Bool("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
  return "tokenizer: " + what;
}

// A bf16-compute-weight model's weights are bfloat16s (Export rounded them): each tensor (each
// matrix: `matrices_only`) whose every value is one (all but an embedding table with the norm
// folded in) made BF16, exactly, its values held in `narrowed`. Returns the note.
std::string NarrowToBf16Tensors(std::vector<NamedTensor>& tensors,
                                std::vector<std::vector<BFloat16>>& narrowed, bool matrices_only) {
  const auto is_bf16 = [](float x) { return (std::bit_cast<uint32_t>(x) & 0xffffu) == 0; };
  for (NamedTensor& named : tensors) {
    if (matrices_only && named.shape.size() != 2) continue;
    const std::span<const float> v = named.data.As<float>();
    if (!std::ranges::all_of(v, is_bf16)) continue;
    std::vector<BFloat16>& b = narrowed.emplace_back(v.size());
    std::ranges::transform(v, b.begin(), [](float x) { return NarrowToBf16(x); });
    named.data = TensorView(b);
  }
  return fmt::format(
      "{} of {} tensors written as BF16 (their values are bfloat16s, model.compute_weights = "
      "bf16), the rest as F32",
      narrowed.size(), tensors.size());
}

// `bf16` (--format gguf-bf16): the matrices of a bf16-compute-weight model as BF16 tensors.
void WriteGguf(const VerifiedModel& m, const std::string& arch, const Tokenizer& tok, bool bf16,
               File& file, std::vector<std::string>& notes) {
  const ModelConfig& c = m.config.model;
  const Params p(m.params);
  GgufWriter g;
  g.String("general.architecture", arch);
  g.String("general.name", m.config.name);
  g.U32("general.file_type", bf16 ? 32 : 0);  // llama.cpp's MOSTLY_BF16, ALL_F32
  g.U32("general.alignment", kGgufAlignment);
  g.U32(arch + ".context_length", c.seq_len);
  g.U32(arch + ".embedding_length", c.d_model);
  g.U32(arch + ".block_count", c.n_layers);
  g.U32(arch + ".feed_forward_length", c.ffn_hidden);
  g.U32(arch + ".attention.head_count", c.n_heads);
  g.U32(arch + ".attention.head_count_kv", c.n_kv_heads);
  g.U32(arch + ".attention.key_length", c.head_dim);
  g.U32(arch + ".attention.value_length", c.head_dim);
  g.U32(arch + ".rope.dimension_count", c.head_dim);
  g.F32(arch + ".rope.freq_base", static_cast<float>(c.rope_theta));
  g.F32(arch + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.norm_eps));
  if (arch == "mimo2") {
    std::vector<bool> sliding;
    for (int64_t l = 0; l < c.n_layers; ++l) sliding.push_back(LayerWindow(c, l) > 0);
    g.U32("mimo2.attention.sliding_window", c.window);
    g.Bools("mimo2.attention.sliding_window_pattern", sliding);
    g.F32("mimo2.rope.freq_base_swa", static_cast<float>(c.rope_theta));
    g.U32("mimo2.expert_feed_forward_length", 0);  // required key; no experts
  }
  notes.push_back(GgufTokenizer(g, arch, c, tok));

  g.Tensor("token_embd.weight", {c.vocab, c.d_model}, EmbeddingTable(c, p));
  if (c.embedding_norm) {
    notes.push_back("emb_norm folded into token_embd.weight (lockstep's RmsNormForward per row)");
  }
  const int64_t q = c.n_heads * c.head_dim, k = c.n_kv_heads * c.head_dim, f = c.ffn_hidden;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l);
    g.Tensor(b + "attn_norm.weight", {c.d_model}, p.Layer(l, kAttnNorm));
    if (arch == "llama") {
      g.Tensor(b + "attn_q.weight", {q, c.d_model},
               PermuteForInterleavedRope(p.Layer(l, kWq), c.n_heads, c.head_dim, c.d_model));
      g.Tensor(b + "attn_k.weight", {k, c.d_model},
               PermuteForInterleavedRope(p.Layer(l, kWk), c.n_kv_heads, c.head_dim, c.d_model));
    } else {
      g.Tensor(b + "attn_q.weight", {q, c.d_model}, p.Layer(l, kWq));
      g.Tensor(b + "attn_k.weight", {k, c.d_model}, p.Layer(l, kWk));
    }
    if (c.qk_norm) {
      g.Tensor(b + "attn_q_norm.weight", {c.head_dim}, std::vector<float>(c.head_dim, 1.0f));
      g.Tensor(b + "attn_k_norm.weight", {c.head_dim}, std::vector<float>(c.head_dim, 1.0f));
    }
    g.Tensor(b + "attn_v.weight", {k, c.d_model}, p.Layer(l, kWv));
    g.Tensor(b + "attn_output.weight", {c.d_model, q}, p.Layer(l, kWo));
    g.Tensor(b + "ffn_norm.weight", {c.d_model}, p.Layer(l, kFfnNorm));
    const std::span<const float> gu = p.Layer(l, kWGateUp);
    g.Tensor(b + "ffn_gate.weight", {f, c.d_model}, gu.first(f * c.d_model));
    g.Tensor(b + "ffn_up.weight", {f, c.d_model}, gu.subspan(f * c.d_model));
    g.Tensor(b + "ffn_down.weight", {c.d_model, f}, p.Layer(l, kWDown));
  }
  g.Tensor("output_norm.weight", {c.d_model}, p.Get("final_norm.weight"));
  g.Tensor("output.weight", {c.vocab, c.d_model}, p.Get("output.weight"));
  std::vector<std::vector<BFloat16>> narrowed;
  if (bf16) notes.push_back(NarrowToBf16Tensors(g.tensors(), narrowed, /*matrices_only=*/true));
  g.Write(file);
}

// ---- Hugging Face ---------------------------------------------------------------------------

void WriteJson(const fs::path& path, const json& j) { WriteFileSynced(path, j.dump(2) + "\n"); }

// The parts of a tokenizer.json that every layout here shares: no added tokens (a special
// piece's string in text is text, as in lockstep and llama.cpp; docs/export.md), no
// pre-tokenizer unless given, no post-processor.
json HfTokenizerJson(json normalizer, json pre_tokenizer, json decoder, json model) {
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", json::array()},
          {"normalizer", std::move(normalizer)},
          {"pre_tokenizer", std::move(pre_tokenizer)},
          {"post_processor", nullptr},
          {"decoder", std::move(decoder)},
          {"model", std::move(model)}};
}

json HfBpeModel(json vocab, json merges, json unk, bool byte_fallback) {
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", std::move(unk)},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", byte_fallback},
          {"byte_fallback", byte_fallback},
          {"ignore_merges", false},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merges)}};
}

// A SentencePiece BPE vocabulary (SentencePieceVocab's, so every check of the GGUF form holds)
// as a tokenizer.json BPE with byte fallback. SentencePiece merges the adjacent pair of symbols
// whose concatenation is the best-scored normal piece, leftmost first; the merges here are every
// split of a normal piece into two normal pieces, ranked by the piece's score, best first (and
// within a piece by the halves' ids). Returns why it cannot be, or "".
std::string SentencePieceHfJson(const GgufVocab& v, json& tokenizer) {
  const std::string space = "\u2581";  // SentencePiece's escaped space
  json vocab = json::object();
  std::unordered_map<std::string_view, int64_t> normal;
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    vocab[v.tokens[id]] = id;
    if (v.types[id] == kTypeNormal) normal.emplace(v.tokens[id], static_cast<int64_t>(id));
  }
  struct Merge {
    float score;
    int64_t left, right;
  };
  std::vector<Merge> merges;
  for (const auto& [piece, id] : normal) {
    for (size_t k = 0; k < piece.size(); k += Utf8Length(static_cast<uint8_t>(piece[k]))) {
      const size_t n = Utf8Length(static_cast<uint8_t>(piece[k]));
      if (!normal.contains(piece.substr(k, n))) {
        // SentencePiece would merge that character into the piece; tokenizer.json's BPE turns a
        // character outside the vocabulary into bytes first.
        return fmt::format(
            "piece {} ('{}') has the character '{}', which is not a normal piece of its own", id,
            piece, piece.substr(k, n));
      }
      if (k == 0) continue;
      const auto left = normal.find(piece.substr(0, k)), right = normal.find(piece.substr(k));
      if (left != normal.end() && right != normal.end()) {
        merges.push_back({v.scores[id], left->second, right->second});
      }
    }
  }
  std::sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return std::tie(b.score, a.left, a.right) < std::tie(a.score, b.left, b.right);
  });
  json ranked = json::array();
  for (const Merge& m : merges) ranked.push_back(v.tokens[m.left] + " " + v.tokens[m.right]);
  const json escape = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space}};
  json normalizer = escape, decoder = json::array();
  if (v.add_space_prefix) {
    normalizer = {{"type", "Sequence"},
                  {"normalizers", {{{"type", "Prepend"}, {"prepend", space}}, escape}}};
  }
  decoder.push_back({{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}});
  decoder.push_back({{"type", "ByteFallback"}});
  decoder.push_back({{"type", "Fuse"}});
  if (v.add_space_prefix) {
    decoder.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  }
  const json unk = v.unk >= 0 ? json(v.tokens[v.unk]) : json(nullptr);
  tokenizer = HfTokenizerJson(normalizer, nullptr, {{"type", "Sequence"}, {"decoders", decoder}},
                              HfBpeModel(std::move(vocab), std::move(ranked), unk, true));
  return "";
}

std::string HfTokenizer(const fs::path& dir, const ModelConfig& c, const Tokenizer& t) {
  json config = {{"model_max_length", c.seq_len},
                 {"add_bos_token", false},
                 {"add_eos_token", false},
                 {"clean_up_tokenization_spaces", false}};
  // lockstep reads the string of a special piece (the byte vocabulary's, a SentencePiece model's
  // control pieces) in text as text, as llama.cpp does; transformers too when told.
  if (t.kind == Tokenizer::Kind::kBytes || t.kind == Tokenizer::Kind::kSentencePiece) {
    config["split_special_tokens"] = true;
  }
  switch (t.kind) {
    case Tokenizer::Kind::kBytes: {
      json vocab = json::object();
      for (int64_t id = 0; id < c.vocab; ++id) vocab[BytePiece(id)] = id;
      const json byte_level = {{"type", "ByteLevel"},
                               {"add_prefix_space", false},
                               {"trim_offsets", false},
                               {"use_regex", false}};
      const json tokenizer =
          HfTokenizerJson(nullptr, byte_level, byte_level,
                          HfBpeModel(std::move(vocab), json::array(), nullptr, false));
      WriteFileSynced(dir / "tokenizer.json", tokenizer.dump() + "\n");
      config["tokenizer_class"] = "PreTrainedTokenizerFast";
      config["eos_token"] = kEodPiece;
      WriteJson(dir / "tokenizer_config.json", config);
      return "tokenizer: the byte vocabulary as a byte-level BPE tokenizer.json without merges";
    }
    case Tokenizer::Kind::kSentencePiece: {
      fs::copy_file(t.file, dir / "tokenizer.model");
      config["tokenizer_class"] = "LlamaTokenizer";
      config["legacy"] = true;  // sentencepiece's own encode, as lockstep tokenized the data
      // The model's own dummy prefix, and no other: transformers 5's LlamaTokenizer adds a
      // leading "▁" unless told not to.
      config["add_prefix_space"] = data::ReadSentencePieceModel(t.file).add_dummy_prefix;
      WriteJson(dir / "tokenizer_config.json", config);
      GgufVocab v;
      json tokenizer;
      std::string why = SentencePieceVocab(t.file, c.vocab, v, true);
      if (why.empty()) why = SentencePieceHfJson(v, tokenizer);
      if (!why.empty()) {
        return fmt::format(
            "tokenizer: {} copied as tokenizer.model (SentencePiece); no tokenizer.json: {}",
            t.file.string(), why);
      }
      WriteFileSynced(dir / "tokenizer.json", tokenizer.dump() + "\n");
      return fmt::format(
          "tokenizer: {} copied as tokenizer.model (SentencePiece) and written as a BPE "
          "tokenizer.json",
          t.file.string());
    }
    case Tokenizer::Kind::kHfJson:
      fs::copy_file(t.file, dir / "tokenizer.json");
      config["tokenizer_class"] = "PreTrainedTokenizerFast";
      WriteJson(dir / "tokenizer_config.json", config);
      return fmt::format("tokenizer: {} copied as tokenizer.json", t.file.string());
    case Tokenizer::Kind::kUnknownFile:
      return fmt::format(
          "no tokenizer written: {} is neither a SentencePiece .model nor a tokenizer.json",
          t.file.string());
    case Tokenizer::Kind::kNone:
      break;
  }
  return t.note;
}

void WriteHf(const VerifiedModel& m, const std::string& arch, const Tokenizer& tok,
             const fs::path& dir, std::vector<std::string>& notes) {
  const ModelConfig& c = m.config.model;
  const Params p(m.params);
  const bool sliding = AnySlidingLayer(c);
  json config = {
      {"architectures", {arch}},
      {"vocab_size", c.vocab},
      {"hidden_size", c.d_model},
      {"intermediate_size", c.ffn_hidden},
      {"num_hidden_layers", c.n_layers},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.n_kv_heads},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"max_position_embeddings", c.seq_len},
      {"rms_norm_eps", c.norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", nullptr},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", c.rope_theta}}},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      {"tie_word_embeddings", false},
      {"initializer_range", c.init_std},
      {"use_cache", true},
      {"torch_dtype", "float32"},
      {"dtype", "float32"},
  };
  if (arch == "LlamaForCausalLM") {
    config["model_type"] = "llama";
    config["pretraining_tp"] = 1;
  } else {
    config["model_type"] = arch == "Qwen2ForCausalLM" ? "qwen2" : "qwen3";
    json types = json::array();
    for (int64_t l = 0; l < c.n_layers; ++l) {
      types.push_back(LayerWindow(c, l) > 0 ? "sliding_attention" : "full_attention");
    }
    config["use_sliding_window"] = sliding;
    config["sliding_window"] = sliding ? json(c.window) : json(nullptr);
    config["max_window_layers"] = c.n_layers;
    config["layer_types"] = types;
  }
  if (tok.kind != Tokenizer::Kind::kNone) {
    config["eos_token_id"] = tok.vocabulary.eod;
    WriteJson(dir / "generation_config.json",
              json{{"eos_token_id", tok.vocabulary.eod}, {"do_sample", false}});
  } else {
    WriteJson(dir / "generation_config.json", json{{"do_sample", false}});
  }
  WriteJson(dir / "config.json", config);

  std::vector<NamedTensor> t;
  std::vector<std::unique_ptr<std::vector<float>>> owned;
  auto keep = [&](std::vector<float> v) -> std::span<const float> {
    owned.push_back(std::make_unique<std::vector<float>>(std::move(v)));
    return *owned.back();
  };
  t.push_back({"model.embed_tokens.weight", {c.vocab, c.d_model}, keep(EmbeddingTable(c, p))});
  if (c.embedding_norm) {
    notes.push_back("emb_norm folded into model.embed_tokens.weight (RmsNormForward per row)");
  }
  const int64_t q = c.n_heads * c.head_dim, k = c.n_kv_heads * c.head_dim, f = c.ffn_hidden;
  const std::span<const float> ones = keep(std::vector<float>(c.head_dim, 1.0f));
  const std::span<const float> zeros = keep(std::vector<float>(std::max(q, k), 0.0f));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = fmt::format("model.layers.{}.", l);
    t.push_back({b + "input_layernorm.weight", {c.d_model}, p.Layer(l, kAttnNorm)});
    t.push_back({b + "self_attn.q_proj.weight", {q, c.d_model}, p.Layer(l, kWq)});
    t.push_back({b + "self_attn.k_proj.weight", {k, c.d_model}, p.Layer(l, kWk)});
    t.push_back({b + "self_attn.v_proj.weight", {k, c.d_model}, p.Layer(l, kWv)});
    if (arch == "Qwen2ForCausalLM") {  // Qwen2 always has q/k/v biases: zeros add nothing
      t.push_back({b + "self_attn.q_proj.bias", {q}, zeros.first(q)});
      t.push_back({b + "self_attn.k_proj.bias", {k}, zeros.first(k)});
      t.push_back({b + "self_attn.v_proj.bias", {k}, zeros.first(k)});
    }
    if (arch == "Qwen3ForCausalLM") {  // QK-norm's gains: lockstep's is gain-free
      t.push_back({b + "self_attn.q_norm.weight", {c.head_dim}, ones});
      t.push_back({b + "self_attn.k_norm.weight", {c.head_dim}, ones});
    }
    t.push_back({b + "self_attn.o_proj.weight", {c.d_model, q}, p.Layer(l, kWo)});
    t.push_back({b + "post_attention_layernorm.weight", {c.d_model}, p.Layer(l, kFfnNorm)});
    const std::span<const float> gu = p.Layer(l, kWGateUp);
    t.push_back({b + "mlp.gate_proj.weight", {f, c.d_model}, gu.first(f * c.d_model)});
    t.push_back({b + "mlp.up_proj.weight", {f, c.d_model}, gu.subspan(f * c.d_model)});
    t.push_back({b + "mlp.down_proj.weight", {c.d_model, f}, p.Layer(l, kWDown)});
  }
  t.push_back({"model.norm.weight", {c.d_model}, p.Get("final_norm.weight")});
  t.push_back({"lm_head.weight", {c.vocab, c.d_model}, p.Get("output.weight")});
  std::vector<std::vector<BFloat16>> narrowed;
  // config.json's dtype stays float32, so transformers widens the BF16 tensors on loading.
  if (c.compute_weights == Storage::kBf16) {
    notes.push_back(NarrowToBf16Tensors(t, narrowed, /*matrices_only=*/false));
  }
  WriteSafetensors(dir / "model.safetensors", t,
                   {{"format", "pt"},
                    {"lockstep_checkpoint_state_hash", ToHex(m.state_hash)},
                    {"lockstep_step", std::to_string(m.step)}});
  notes.push_back(HfTokenizer(dir, c, tok));
}

}  // namespace

std::string ExportArchitecture(const ModelConfig& c, ExportFormat format) {
  if (c.linear != Linear::kFp32) {
    Fail(
        "model.linear = {}: neither format has linears that quantize their input and weight "
        "rows to int8 as lockstep's do (docs/model.md, \"Linears\"); an fp32 export would "
        "compute another model",
        LinearName(c.linear));
  }
  if (c.activations != Storage::kFp32) {
    Fail(
        "model.activations = {}: neither format rounds every activation to bfloat16 between "
        "ops as lockstep does (docs/model.md, \"bf16 storage\"); an export would compute another "
        "model",
        StorageName(c.activations));
  }
  if (format == ExportFormat::kGgufBf16 && c.compute_weights != Storage::kBf16) {
    Fail(
        "model.compute_weights = {}: --format gguf-bf16 writes the matrices of a model that "
        "computes with bfloat16 weights (model.compute_weights = bf16) as BF16, exactly; this "
        "model's weights are not bfloat16s, and rounding them would make another model; "
        "--format gguf writes them as F32",
        StorageName(c.compute_weights));
  }
  const bool sliding = AnySlidingLayer(c);
  if (format == ExportFormat::kHf) {
    if (c.qk_norm) return "Qwen3ForCausalLM";
    return sliding ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
  }
  if (c.n_layers > kLlamaCppMaxLayers) {
    Fail("model.n_layers = {}: llama.cpp holds at most {} layers; --format hf expresses it",
         c.n_layers, kLlamaCppMaxLayers);
  }
  if (sliding && c.qk_norm) {
    Fail(
        "model.window = {} with model.qk_norm = true: no llama.cpp architecture expresses "
        "per-layer sliding-window attention together with a QK-norm exactly (mimo2 has the "
        "windows but no QK-norm; qwen3 the QK-norm but no windows; docs/export.md); --format hf "
        "expresses it",
        c.window);
  }
  if (sliding) return "mimo2";
  return c.qk_norm ? "qwen3" : "llama";
}

std::vector<float> PermuteForInterleavedRope(std::span<const float> w, int64_t heads,
                                             int64_t head_dim, int64_t cols) {
  std::vector<float> out(w.size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const auto src = w.subspan(static_cast<size_t>((h * head_dim + j * half + i) * cols),
                                   static_cast<size_t>(cols));
        std::ranges::copy(src, out.begin() + (h * head_dim + 2 * i + j) * cols);
      }
    }
  }
  return out;
}

ExportResult Export(const VerifiedModel& checkpoint, ExportFormat format, const fs::path& out,
                    const fs::path& data) {
  ExportResult result;
  result.architecture = ExportArchitecture(checkpoint.config.model, format);
  // With bf16 compute weights the model computes with its weights rounded to bfloat16 (the
  // embedding's looked-up rows likewise): those values are the ones written, exactly (hf and
  // gguf-bf16: as BF16; gguf: in F32).
  std::optional<VerifiedModel> rounded;
  if (checkpoint.config.model.compute_weights == Storage::kBf16) {
    rounded = checkpoint;
    rk::RoundToBf16(rounded->params.Flat());
    result.notes.push_back(fmt::format(
        "the weights are written as the model computes with them: rounded to bf16 "
        "(model.compute_weights = bf16){}",
        format == ExportFormat::kGguf
            ? ", each held exactly in F32 (llama.cpp's BF16 product rounds its activations too: "
              "--format gguf-bf16 writes BF16 matrices, half the bytes, for a nearby model)"
        : format == ExportFormat::kGgufBf16
            ? "; llama.cpp's product with a BF16 matrix rounds its activations to bfloat16 too, "
              "so it computes a nearby model, not this one (docs/export.md, \"gguf-bf16\")"
            : ""));
  }
  const VerifiedModel& m = rounded ? *rounded : checkpoint;
  RefuseOutputsOntoInputs({{"--out", out}}, {{"--checkpoint", m.dir}, {"--data", data}});
  const Tokenizer tok = DatasetTokenizer(m, data);
  // The tensors in fp32 (hf also splits w_gate_up, the same bytes), plus headers and tokenizer.
  RequireFreeSpace(out, static_cast<uint64_t>(m.params.NumParameters()) * 4 + (uint64_t{64} << 20),
                   "export");
  // Written under a staging name beside it and renamed: the output appears whole or not at all.
  if (format == ExportFormat::kHf) {
    StagedDirectory staged(out);
    WriteHf(m, result.architecture, tok, staged.path(), result.notes);
    staged.Commit();
  } else {
    StagedFile staged(out, OutputKind::kNewFile);
    WriteGguf(m, result.architecture, tok, format == ExportFormat::kGgufBf16, staged.file(),
              result.notes);
    staged.Commit();
  }
  return result;
}

}  // namespace lockstep::infer
