// Token shards: the .bin/.idx/manifest.json format of docs/formats/shards.md, written by
// ShardWriter and verified field by field, byte by byte by OpenDataset.
#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "lockstep/data.h"
#include "lockstep/json.h"

namespace lockstep::data {
namespace {
static_assert(std::endian::native == std::endian::little,
              "shards are little-endian and are read and written by memcpy");

using nlohmann::json;
using nlohmann::ordered_json;

constexpr std::string_view kManifestName = "manifest.json";
constexpr std::string_view kFormat = "lockstep-shards";
constexpr uint64_t kFormatVersion = kShardsFormatVersion;
// Shuffle draws index documents with 32-bit counters (docs/formats/stream.md).
constexpr uint64_t kMaxDocuments = uint64_t{1} << 32;

// The bytes of little-endian values (const or writable, as the values are).
template <typename T>
auto AsBytes(std::span<T> values) {
  using Byte = std::conditional_t<std::is_const_v<T>, const uint8_t, uint8_t>;
  return std::span<Byte>(reinterpret_cast<Byte*>(values.data()), values.size_bytes());
}

// ---- manifest validation: every error names the manifest, the field and the value -------------
class ManifestFields {
 public:
  explicit ManifestFields(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void Bad(std::string_view field, const json& value,
                        std::string_view expected) const {
    std::string shown = value.dump();
    if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
    Fail("{}: field '{}' is {}, expected {}", file_, field, shown, expected);
  }

  void RejectUnknown(const json& object, std::string_view prefix,
                     std::initializer_list<std::string_view> known) const {
    for (const auto& [key, value] : object.items()) {
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        Fail("{}: unknown field '{}{}' in format_version {}", file_, prefix, key, kFormatVersion);
      }
    }
  }

  const json& Get(const json& object, std::string_view prefix, const char* key) const {
    const auto it = object.find(key);
    if (it == object.end()) Fail("{}: missing field '{}{}'", file_, prefix, key);
    return *it;
  }

  uint64_t Unsigned(const json& object, std::string_view prefix, const char* key) const {
    const json& v = Get(object, prefix, key);
    if (!v.is_number_unsigned()) Bad(fmt::format("{}{}", prefix, key), v, "an unsigned integer");
    return v.get<uint64_t>();
  }

  std::string String(const json& object, std::string_view prefix, const char* key) const {
    const json& v = Get(object, prefix, key);
    if (!v.is_string()) Bad(fmt::format("{}{}", prefix, key), v, "a string");
    return v.get<std::string>();
  }

  void Expect(const json& object, const char* key, const json& expected) const {
    const json& v = Get(object, "", key);
    if (v != expected) Bad(key, v, expected.dump());
  }

  // A plain file name inside the dataset directory with the given extension: no directories,
  // so a manifest cannot make the reader open files elsewhere.
  std::string FileName(const json& object, std::string_view prefix, const char* key,
                       std::string_view extension) const {
    const json& v = Get(object, prefix, key);
    const std::string name = String(object, prefix, key);
    if (name.size() <= extension.size() || name.front() == '.' ||
        name.find_first_of("/\\") != std::string::npos || !name.ends_with(extension)) {
      Bad(fmt::format("{}{}", prefix, key), v,
          fmt::format("a file name ending in {} without directories", extension));
    }
    return name;
  }

  Digest DigestField(const json& object, std::string_view prefix, const char* key) const {
    return DigestFromHex(String(object, prefix, key),
                         fmt::format("{}: field '{}{}'", file_, prefix, key));
  }

  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

ShardInfo ParseShardEntry(const ManifestFields& m, const json& entry, size_t k) {
  const std::string prefix = fmt::format("shards[{}].", k);
  if (!entry.is_object()) m.Bad(fmt::format("shards[{}]", k), entry, "an object");
  m.RejectUnknown(entry, prefix,
                  {"bin", "idx", "tokens", "documents", "bin_blake2b", "idx_blake2b"});
  ShardInfo s;
  s.bin = m.FileName(entry, prefix, "bin", ".bin");
  s.idx = m.FileName(entry, prefix, "idx", ".idx");
  s.tokens = m.Unsigned(entry, prefix, "tokens");
  s.documents = m.Unsigned(entry, prefix, "documents");
  if (s.documents >= kMaxDocuments) {
    m.Bad(prefix + "documents", entry["documents"], fmt::format("fewer than {}", kMaxDocuments));
  }
  s.bin_blake2b = m.DigestField(entry, prefix, "bin_blake2b");
  s.idx_blake2b = m.DigestField(entry, prefix, "idx_blake2b");
  return s;
}

// A shard file, open, its size checked against the manifest's count of its elements.
File OpenSized(const std::filesystem::path& path, uint64_t elements, size_t element_size,
               std::string_view what, const ManifestFields& m) {
  File file = File::OpenForReading(path);
  const uint64_t size = file.Size();
  if (size % element_size != 0 || size / element_size != elements) {
    Fail("{}: {} bytes, but {} lists {} {} ({} bytes each): the file is truncated or corrupt",
         path.string(), size, m.file(), elements, what, element_size);
  }
  return file;
}

// Reads a sized shard file straight into `out` (no copy: shards are little-endian, as is every
// machine lockstep builds for) and checks its digest against the manifest.
void ReadVerified(const File& file, std::span<uint8_t> out, const Digest& expected,
                  const ManifestFields& m, std::string_view field) {
  const std::filesystem::path& path = file.path();
  file.ReadAt(0, out);
  if (file.Size() != out.size()) {
    Fail("{}: changed size while read ({} bytes now, {} read)", path.string(), file.Size(),
         out.size());
  }
  const Digest actual = Blake2b256(out);
  if (actual != expected) {
    Fail("{}: BLAKE2b-256 mismatch: {} field '{}' expects {}, the file has {}", path.string(),
         m.file(), field, ToHex(expected), ToHex(actual));
  }
}


// "tokenizer", "vocab_size" and "eod_token".
Vocabulary ParseVocabulary(const ManifestFields& m, const json& j) {
  const json& t = m.Get(j, "", "tokenizer");
  if (!t.is_object()) m.Bad("tokenizer", t, "an object");
  const std::string kind = m.String(t, "tokenizer.", "kind");
  Vocabulary v;
  if (kind == "bytes") {
    m.RejectUnknown(t, "tokenizer.", {"kind"});
    m.Expect(j, "vocab_size", kByteVocab);
    m.Expect(j, "eod_token", kEodToken);
    return v;
  }
  if (kind != "file") m.Bad("tokenizer.kind", t["kind"], "\"bytes\" or \"file\"");
  m.RejectUnknown(t, "tokenizer.", {"kind", "name", "blake2b"});
  v.tokenizer_file = m.String(t, "tokenizer.", "name");
  if (v.tokenizer_file.empty() || v.tokenizer_file.find_first_of("/\\") != std::string::npos) {
    m.Bad("tokenizer.name", t["name"], "a file name without directories");
  }
  v.tokenizer_blake2b = m.DigestField(t, "tokenizer.", "blake2b");
  const uint64_t size = m.Unsigned(j, "", "vocab_size");
  if (size < 2 || size > kMaxVocab) {
    m.Bad("vocab_size", j["vocab_size"], fmt::format("2 .. {}", kMaxVocab));
  }
  const uint64_t eod = m.Unsigned(j, "", "eod_token");
  if (eod >= size) m.Bad("eod_token", j["eod_token"], fmt::format("below vocab_size {}", size));
  v.size = static_cast<uint32_t>(size);
  v.eod = static_cast<uint32_t>(eod);
  return v;
}

}  // namespace

// ---- writing ------------------------------------------------------------------------------------
namespace {

// The manifest's "tokenizer" object (docs/formats/shards.md).
ordered_json TokenizerJson(const Vocabulary& v) {
  if (v.bytes()) return {{"kind", "bytes"}};
  return {{"kind", "file"}, {"name", v.tokenizer_file}, {"blake2b", ToHex(v.tokenizer_blake2b)}};
}

// Fails naming `what` unless the vocabulary is the byte tokenizer's or a file's within range.
void CheckVocabulary(const Vocabulary& v, std::string_view what) {
  if (v.bytes()) {
    if (v.size != kByteVocab || v.eod != kEodToken) {
      Fail("{}: the byte tokenizer has {} ids and end of document {}, not {} and {}", what,
           kByteVocab, kEodToken, v.size, v.eod);
    }
    return;
  }
  if (v.size < 2 || v.size > kMaxVocab) {
    Fail("{}: vocabulary size {} is outside 2 .. {}", what, v.size, kMaxVocab);
  }
  if (v.eod >= v.size) {
    Fail("{}: end-of-document id {} is not below the vocabulary size {}", what, v.eod, v.size);
  }
  if (v.tokenizer_file.find_first_of("/\\") != std::string::npos) {
    Fail("{}: tokenizer name '{}' must be a file name without directories", what,
         v.tokenizer_file);
  }
}

}  // namespace

void Vocabulary::CheckDocument(std::span<const uint32_t> ids, std::string_view where,
                               std::optional<uint64_t> document) const {
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] >= size || ids[t] == eod) {
      Fail("{}: {}token {} is {}; documents hold ids below {} other than the end-of-document id "
           "{}",
           where, document ? fmt::format("document {} ", *document) : std::string(), t, ids[t],
           size, eod);
    }
  }
}

Vocabulary FileVocabulary(const std::filesystem::path& tokenizer, uint64_t size, uint64_t eod) {
  if (size < 2 || size > kMaxVocab) {
    Fail("vocabulary size {} is outside 2 .. {}", size, kMaxVocab);
  }
  if (eod >= size) Fail("end-of-document id {} is not below the vocabulary size {}", eod, size);
  Vocabulary v{static_cast<uint32_t>(size), static_cast<uint32_t>(eod),
               tokenizer.filename().string(), Blake2b256(ReadFileBytes(tokenizer))};
  if (v.tokenizer_file.empty()) Fail("{}: not a tokenizer file name", tokenizer.string());
  return v;
}

ShardWriter::ShardWriter(std::filesystem::path dir, uint64_t max_shard_tokens,
                         Vocabulary vocabulary)
    : dir_(std::move(dir)),
      max_shard_tokens_(max_shard_tokens),
      vocabulary_(std::move(vocabulary)),
      counts_(vocabulary_.size) {
  if (max_shard_tokens_ == 0) Fail("{}: max_shard_tokens must be positive", dir_.string());
  CheckVocabulary(vocabulary_, dir_.string());
  std::error_code ec;
  if (std::filesystem::exists(dir_, ec)) {
    if (!std::filesystem::is_directory(dir_, ec) || !std::filesystem::is_empty(dir_, ec)) {
      Fail("{}: exists and is not an empty directory; shards are written into a new or empty one",
           dir_.string());
    }
  } else if (!std::filesystem::create_directories(dir_, ec)) {
    Fail("{}: cannot create directory: {}", dir_.string(), ec.message());
  }
  offsets_.push_back(0);
}

void ShardWriter::AddDocument(std::span<const uint32_t> tokens) {
  if (finished_) Fail("{}: AddDocument after Finish", dir_.string());
  if (tokens.size() > max_shard_tokens_) {
    Fail("{}: document {} has {} tokens, more than the {} a shard may hold", dir_.string(),
         total_documents_, tokens.size(), max_shard_tokens_);
  }
  if (total_documents_ + 1 >= kMaxDocuments) {
    Fail("{}: more than {} documents", dir_.string(), kMaxDocuments - 1);
  }
  vocabulary_.CheckDocument(tokens, dir_.string(), total_documents_);
  if (tokens_.size() + tokens.size() > max_shard_tokens_) FlushShard();
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  offsets_.push_back(tokens_.size());
  for (uint32_t t : tokens) ++counts_[t];
  ++counts_[vocabulary_.eod];  // the stream follows every document with it
  total_tokens_ += tokens.size();
  ++total_documents_;
}

void ShardWriter::FlushShard() {
  if (offsets_.size() == 1) return;  // no documents in this shard
  ShardInfo s;
  const std::string stem = fmt::format("shard_{:05d}", shards_.size());
  s.bin = stem + ".bin";
  s.idx = stem + ".idx";
  s.tokens = tokens_.size();
  s.documents = offsets_.size() - 1;
  const auto bin = AsBytes(std::span<const uint32_t>(tokens_));
  const auto idx = AsBytes(std::span<const uint64_t>(offsets_));
  s.bin_blake2b = Blake2b256(bin);
  s.idx_blake2b = Blake2b256(idx);
  WriteFileSynced(dir_ / s.bin, bin);
  WriteFileSynced(dir_ / s.idx, idx);
  shards_.push_back(std::move(s));
  tokens_.clear();
  offsets_.assign(1, 0);
}

void ShardWriter::Finish(const ordered_json& source) {
  if (finished_) Fail("{}: Finish called twice", dir_.string());
  if (total_documents_ == 0) Fail("{}: no documents to write", dir_.string());
  if (!source.is_object()) Fail("{}: the manifest's source must be a JSON object", dir_.string());
  FlushShard();
  ordered_json manifest;
  manifest["format"] = kFormat;
  manifest["format_version"] = kFormatVersion;
  manifest["tokenizer"] = TokenizerJson(vocabulary_);
  manifest["vocab_size"] = vocabulary_.size;
  manifest["eod_token"] = vocabulary_.eod;
  manifest["total_tokens"] = total_tokens_;
  manifest["total_documents"] = total_documents_;
  manifest["unigram_entropy_nats"] = EntropyNats(counts_);
  manifest["source"] = source;
  ordered_json& shards = manifest["shards"] = ordered_json::array();
  for (const ShardInfo& s : shards_) {
    shards.push_back({{"bin", s.bin},
                      {"idx", s.idx},
                      {"tokens", s.tokens},
                      {"documents", s.documents},
                      {"bin_blake2b", ToHex(s.bin_blake2b)},
                      {"idx_blake2b", ToHex(s.idx_blake2b)}});
  }
  WriteFileSynced(dir_ / kManifestName, manifest.dump(2) + "\n");
  SyncDirectory(dir_);
  finished_ = true;
}

// ---- reading ------------------------------------------------------------------------------------
std::span<const uint32_t> Dataset::Document(uint64_t d) const {
  if (d >= num_documents()) {
    Fail("{}: document {} requested, the dataset has {}", dir_.string(), d, num_documents());
  }
  return std::span(tokens_).subspan(doc_starts_[d], doc_starts_[d + 1] - doc_starts_[d]);
}

Dataset OpenDataset(const std::filesystem::path& dir) {
  const std::filesystem::path manifest_path = dir / kManifestName;
  const std::vector<uint8_t> manifest_bytes = ReadFileBytes(manifest_path);
  const ManifestFields m(manifest_path.string());
  const json j = ParseJsonStrict(
      std::string_view(reinterpret_cast<const char*>(manifest_bytes.data()), manifest_bytes.size()),
      m.file());
  if (!j.is_object()) m.Bad("(top level)", j, "an object");
  m.Expect(j, "format", kFormat);
  m.Expect(j, "format_version", kFormatVersion);
  m.RejectUnknown(j, "",
                  {"format", "format_version", "tokenizer", "vocab_size", "eod_token",
                   "total_tokens", "total_documents", "unigram_entropy_nats", "source", "shards"});
  const Vocabulary vocabulary = ParseVocabulary(m, j);
  const uint64_t total_tokens = m.Unsigned(j, "", "total_tokens");
  const uint64_t total_documents = m.Unsigned(j, "", "total_documents");
  if (total_documents == 0 || total_documents >= kMaxDocuments) {
    m.Bad("total_documents", j["total_documents"], fmt::format("1 to {}", kMaxDocuments - 1));
  }
  const json& entropy = m.Get(j, "", "unigram_entropy_nats");
  if (!entropy.is_number() || !(entropy.get<double>() >= 0) ||
      !(entropy.get<double>() <= DeterministicLog(vocabulary.size) + 1e-9)) {
    m.Bad("unigram_entropy_nats", entropy, fmt::format("a number in [0, ln {}]", vocabulary.size));
  }
  if (j.contains("source") && !j["source"].is_object()) m.Bad("source", j["source"], "an object");
  const json& shard_list = m.Get(j, "", "shards");
  if (!shard_list.is_array() || shard_list.empty()) {
    m.Bad("shards", shard_list, "a non-empty array");
  }

  Dataset dataset;
  dataset.dir_ = dir;
  dataset.vocabulary_ = vocabulary;
  dataset.manifest_digest_ = Blake2b256(manifest_bytes);
  dataset.unigram_entropy_nats_ = entropy.get<double>();
  if (j.contains("source")) dataset.source_ = j["source"].dump();
  uint64_t sum_tokens = 0, sum_documents = 0;
  for (size_t k = 0; k < shard_list.size(); ++k) {
    ShardInfo s = ParseShardEntry(m, shard_list[k], k);
    if (sum_tokens + s.tokens < sum_tokens || sum_tokens + s.tokens > total_tokens) {
      m.Bad("total_tokens", total_tokens,
            fmt::format("the sum of shards[].tokens, which exceeds it at shards[{}]", k));
    }
    sum_tokens += s.tokens;
    sum_documents += s.documents;  // no overflow: each is below 2^32
    dataset.shards_.push_back(std::move(s));
  }
  if (sum_tokens != total_tokens) {
    m.Bad("total_tokens", total_tokens, fmt::format("{} (the sum of shards[].tokens)", sum_tokens));
  }
  if (sum_documents != total_documents) {
    m.Bad("total_documents", total_documents,
          fmt::format("{} (the sum of shards[].documents)", sum_documents));
  }

  // Every file's size is checked before anything of the manifest's size is allocated; then each
  // shard is read into its place in the dataset, so the tokens are held once.
  std::vector<std::pair<File, File>> files;
  for (size_t k = 0; k < dataset.shards_.size(); ++k) {
    const ShardInfo& s = dataset.shards_[k];
    files.emplace_back(OpenSized(dir / s.bin, s.tokens, sizeof(uint32_t), "tokens", m),
                       OpenSized(dir / s.idx, s.documents + 1, sizeof(uint64_t),
                                 "document offsets + 1", m));
  }
  dataset.tokens_.reserve(total_tokens);
  dataset.doc_starts_.reserve(total_documents + 1);
  dataset.doc_starts_.push_back(0);
  for (size_t k = 0; k < dataset.shards_.size(); ++k) {
    const ShardInfo& s = dataset.shards_[k];
    const std::filesystem::path bin_path = dir / s.bin, idx_path = dir / s.idx;
    const uint64_t base = dataset.tokens_.size();
    dataset.tokens_.resize(base + s.tokens);
    const std::span<uint32_t> tokens = std::span(dataset.tokens_).subspan(base);
    ReadVerified(files[k].first, AsBytes(tokens), s.bin_blake2b, m,
                 fmt::format("shards[{}].bin_blake2b", k));
    std::vector<uint64_t> offsets(s.documents + 1);
    ReadVerified(files[k].second, AsBytes(std::span(offsets)), s.idx_blake2b, m,
                 fmt::format("shards[{}].idx_blake2b", k));
    if (offsets.front() != 0) {
      Fail("{}: offset 0 is {}, expected 0", idx_path.string(), offsets.front());
    }
    for (size_t d = 1; d < offsets.size(); ++d) {
      if (offsets[d] < offsets[d - 1]) {
        Fail("{}: offset {} is {}, less than offset {} ({}): offsets must not decrease",
             idx_path.string(), d, offsets[d], d - 1, offsets[d - 1]);
      }
    }
    if (offsets.back() != s.tokens) {
      Fail("{}: the last offset is {}, expected the shard's token count {} ({})", idx_path.string(),
           offsets.back(), s.tokens, bin_path.string());
    }
    for (size_t t = 0; t < tokens.size(); ++t) {
      if (tokens[t] >= vocabulary.size || tokens[t] == vocabulary.eod) {
        Fail("{}: token {} is {}; .bin files hold ids below vocab_size {} other than eod_token "
             "{}",
             bin_path.string(), t, tokens[t], vocabulary.size, vocabulary.eod);
      }
    }
    for (size_t d = 1; d < offsets.size(); ++d) dataset.doc_starts_.push_back(base + offsets[d]);
  }
  return dataset;
}

std::optional<std::filesystem::path> DatasetTokenizerFile(const Dataset& dataset) {
  const Vocabulary& v = dataset.vocabulary();
  const std::filesystem::path file = dataset.dir() / v.tokenizer_file;
  std::error_code ec;
  if (v.bytes() || !std::filesystem::is_regular_file(file, ec)) return std::nullopt;
  if (Blake2b256(ReadFileBytes(file)) != v.tokenizer_blake2b) {
    Fail("{}: its BLAKE2b is not the {} that {}'s manifest records (tokenizer.blake2b)",
         file.string(), ToHex(v.tokenizer_blake2b), dataset.dir().string());
  }
  return file;
}

}  // namespace lockstep::data
