// `lockstep data import --megatron`: a Megatron-style indexed dataset (PREFIX.bin / PREFIX.idx,
// the "MMIDIDX" format) read into lockstep shards. Every size and offset of the index is checked
// in exact integer arithmetic before anything is written, and every token before the output
// exists, so a malformed dataset leaves nothing behind. Layout: docs/formats/shards.md, "Importing
// a Megatron indexed dataset".
#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/data.h"

namespace lockstep::data {
namespace {
namespace fs = std::filesystem;

constexpr std::array<uint8_t, 9> kMagic = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr uint64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, two counts

struct TokenType {
  const char* name;
  uint64_t bytes;
  bool is_signed;
};

// The dtype codes of the format's integer types; 6 and 7 are floating point (their order differs
// between Megatron versions), which no token id is.
std::optional<TokenType> TokenTypeOf(uint8_t code) {
  switch (code) {
    case 1: return TokenType{"uint8", 1, false};
    case 2: return TokenType{"int8", 1, true};
    case 3: return TokenType{"int16", 2, true};
    case 4: return TokenType{"int32", 4, true};
    case 5: return TokenType{"int64", 8, true};
    case 8: return TokenType{"uint16", 2, false};
    default: return std::nullopt;
  }
}

uint64_t U64At(std::span<const uint8_t> bytes, uint64_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | bytes[at + static_cast<uint64_t>(i)];
  return v;
}

// a * b + c, or nullopt on overflow of 64 bits.
std::optional<uint64_t> MulAdd(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t product = 0, sum = 0;
  if (__builtin_mul_overflow(a, b, &product) || __builtin_add_overflow(product, c, &sum)) {
    return std::nullopt;
  }
  return sum;
}

// A validated index: per sequence its token count and first token; per document its first and
// one-past-last sequence.
struct Index {
  TokenType type{};
  std::vector<uint64_t> lengths;      // tokens per sequence
  std::vector<uint64_t> first_token;  // sequence starts, in tokens (from the byte pointers)
  std::vector<uint64_t> documents;    // document_indices: documents + 1 sequence indices
  uint64_t total_tokens = 0;
};

Index ReadIndex(const fs::path& idx_path, const fs::path& bin_path) {
  const std::string what = idx_path.string();
  // The header first: the file is read whole only once it is known to be as long as the header
  // says (a forged count is refused, not read into memory).
  std::vector<uint8_t> bytes;
  {
    const File idx = File::OpenForReading(idx_path);
    bytes.resize(std::min<uint64_t>(kHeaderBytes, idx.Size()));
    idx.ReadAt(0, bytes);
    if (bytes.size() < kHeaderBytes) {
      Fail("{}: {} bytes, shorter than the {}-byte header of an MMIDIDX index", what, idx.Size(),
           kHeaderBytes);
    }
    if (!std::equal(kMagic.begin(), kMagic.end(), bytes.begin())) {
      Fail("{}: field magic: not \"MMIDIDX\\x00\\x00\" (not a Megatron indexed dataset index)",
           what);
    }
    const uint64_t version = U64At(bytes, 9);
    if (version != 1) Fail("{}: field version: {}, only version 1 is known", what, version);
    const uint64_t sequences = U64At(bytes, 18), document_entries = U64At(bytes, 26);
    // sequence_lengths (int32), sequence_pointers (int64), document_indices (int64): exactly.
    const std::optional<uint64_t> with_sequences = MulAdd(sequences, 12, kHeaderBytes);
    const std::optional<uint64_t> expected =
        with_sequences ? MulAdd(document_entries, 8, *with_sequences) : std::nullopt;
    if (!expected || *expected != idx.Size()) {
      Fail("{}: fields sequence_count {} and document_count {} need {} bytes, the file has {}{}",
           what, sequences, document_entries,
           expected ? std::to_string(*expected) : std::string("more than 2^64"), idx.Size(),
           expected && *expected < idx.Size() ? " (trailing bytes: a multimodal index?)" : "");
    }
  }
  bytes = ReadFileBytes(idx_path);
  if (bytes.size() < kHeaderBytes) Fail("{}: changed while it was read", what);
  const uint8_t code = bytes[17];
  const std::optional<TokenType> type = TokenTypeOf(code);
  if (!type) {
    Fail("{}: field dtype: code {} is not an integer type (1 uint8, 2 int8, 3 int16, 4 int32, "
         "5 int64, 8 uint16)",
         what, code);
  }
  const uint64_t sequences = U64At(bytes, 18), document_entries = U64At(bytes, 26);
  if (bytes.size() != kHeaderBytes + 12 * sequences + 8 * document_entries) {
    Fail("{}: changed while it was read", what);
  }
  Index index;
  index.type = *type;
  const uint64_t lengths_at = kHeaderBytes, pointers_at = lengths_at + 4 * sequences,
                 documents_at = pointers_at + 8 * sequences;
  uint64_t next_pointer = 0, tokens = 0;
  for (uint64_t s = 0; s < sequences; ++s) {
    const uint64_t at = lengths_at + 4 * s;
    const auto length = static_cast<int32_t>(bytes[at] | bytes[at + 1] << 8 | bytes[at + 2] << 16 |
                                             static_cast<uint32_t>(bytes[at + 3]) << 24);
    if (length < 0) Fail("{}: field sequence_lengths[{}]: {} is negative", what, s, length);
    const uint64_t pointer = U64At(bytes, pointers_at + 8 * s);
    if (pointer != next_pointer) {
      Fail("{}: field sequence_pointers[{}]: byte {}, but the sequences before it end at byte {} "
           "(sequences must follow each other in the .bin)",
           what, s, pointer, next_pointer);
    }
    index.lengths.push_back(static_cast<uint64_t>(length));
    index.first_token.push_back(tokens);
    tokens += static_cast<uint64_t>(length);  // < 2^31 · 2^64/12 sequences: cannot wrap
    const std::optional<uint64_t> end = MulAdd(tokens, type->bytes, 0);
    if (!end) Fail("{}: field sequence_lengths: the tokens overflow 64 bits", what);
    next_pointer = *end;
  }
  index.total_tokens = tokens;
  for (uint64_t d = 0; d < document_entries; ++d) {
    const uint64_t sequence = U64At(bytes, documents_at + 8 * d);
    const uint64_t previous = d == 0 ? 0 : index.documents.back();
    if (d == 0 && sequence != 0) {
      Fail("{}: field document_indices[0]: {}, expected 0", what, sequence);
    }
    if (sequence < previous || sequence > sequences) {
      Fail("{}: field document_indices[{}]: {} is not within {} .. {} (document starts must not "
           "decrease and are sequence indices)",
           what, d, sequence, previous, sequences);
    }
    index.documents.push_back(sequence);
  }
  if (index.documents.size() < 2 || index.documents.back() != sequences) {
    Fail("{}: field document_indices: must list at least one document and end at the sequence "
         "count {} (it ends at {})",
         what, sequences, index.documents.empty() ? 0 : index.documents.back());
  }
  const File bin = File::OpenForReading(bin_path);
  if (bin.Size() != next_pointer) {
    Fail("{}: {} bytes, but {} describes {} tokens of {} ({} bytes)", bin_path.string(),
         bin.Size(), what, tokens, type->name, next_pointer);
  }
  return index;
}

// The tokens of document d as ids, checked against the vocabulary; a last token equal to the
// end-of-document id is dropped (the stream puts it back). Fails naming the .bin, the document,
// the position and the value. The document's bytes are added to `bin_hash` when given, and
// their count to `bytes_read`.
// Document d's tokens [begin, end) of the .bin, from the index alone.
std::pair<uint64_t, uint64_t> DocumentRange(const Index& index, uint64_t d) {
  const uint64_t first = index.documents[d], last = index.documents[d + 1];
  const uint64_t begin = first < last ? index.first_token[first] : 0;
  const uint64_t end = first < last ? index.first_token[last - 1] + index.lengths[last - 1] : 0;
  return {begin, end};
}

std::vector<uint32_t> DocumentTokens(const Index& index, const File& bin, uint64_t d,
                                     const Vocabulary& vocabulary, Blake2b* bin_hash,
                                     uint64_t& bytes_read) {
  const auto [begin, end] = DocumentRange(index, d);
  std::vector<uint8_t> raw((end - begin) * index.type.bytes);
  bin.ReadAt(begin * index.type.bytes, raw);
  if (bin_hash != nullptr) bin_hash->Update(raw);
  bytes_read += raw.size();
  std::vector<uint32_t> tokens(end - begin);
  for (size_t t = 0; t < tokens.size(); ++t) {
    uint64_t value = 0;
    for (uint64_t b = index.type.bytes; b-- > 0;) value = value << 8 | raw[t * index.type.bytes + b];
    const bool negative =
        index.type.is_signed && (value >> (8 * index.type.bytes - 1) & 1) != 0;
    if (negative || value >= vocabulary.size) {
      const int64_t shown =
          negative ? static_cast<int64_t>(value | ~uint64_t{0} << (8 * index.type.bytes - 1))
                   : static_cast<int64_t>(value);
      Fail("{}: document {} token {} (token {} of the file) is {}, outside the vocabulary of {} "
           "ids",
           bin.path().string(), d, t, begin + t, shown, vocabulary.size);
    }
    tokens[t] = static_cast<uint32_t>(value);
  }
  if (!tokens.empty() && tokens.back() == vocabulary.eod) tokens.pop_back();
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] == vocabulary.eod) {
      Fail("{}: document {} token {} (token {} of the file) is the end-of-document id {} inside "
           "the document (only its last token may be)",
           bin.path().string(), d, t, begin + t, vocabulary.eod);
    }
  }
  return tokens;
}

}  // namespace

void ImportMegatron(const fs::path& prefix, const fs::path& out, const Vocabulary& vocabulary,
                    uint64_t max_shard_tokens, const Progress& progress) {
  const fs::path idx_path = prefix.string() + ".idx", bin_path = prefix.string() + ".bin";
  const Index index = ReadIndex(idx_path, bin_path);
  const File bin = File::OpenForReading(bin_path);
  const uint64_t documents = index.documents.size() - 1;
  // Progress in bytes of the .bin, which is read twice.
  const uint64_t total = 2 * index.total_tokens * index.type.bytes;
  uint64_t read = 0;
  // Every token is checked before the output exists, so a bad dataset leaves nothing behind. The
  // documents cover the .bin in order, so this pass also gives its digest for the manifest.
  Blake2b bin_hash;
  for (uint64_t d = 0; d < documents; ++d) {
    // Sized from the index before a token of it is read or allocated.
    const auto [begin, end] = DocumentRange(index, d);
    if (end - begin > max_shard_tokens) {
      Fail("{}: document {} has {} tokens, more than the {} a shard may hold (--shard-tokens)",
           bin_path.string(), d, end - begin, max_shard_tokens);
    }
    DocumentTokens(index, bin, d, vocabulary, &bin_hash, read);
    if (progress) progress(read, total);
  }
  const Digest bin_digest = bin_hash.Final();
  ShardWriter writer(out, max_shard_tokens, vocabulary);
  for (uint64_t d = 0; d < documents; ++d) {
    writer.AddDocument(DocumentTokens(index, bin, d, vocabulary, nullptr, read));
    if (progress) progress(read, total);
  }
  writer.Finish({{"imported_from", "megatron indexed dataset"},
                 {"prefix", prefix.filename().string()},
                 {"dtype", index.type.name},
                 {"sequences", index.lengths.size()},
                 {"documents", documents},
                 {"tokens", index.total_tokens},
                 {"idx_blake2b", ToHex(Blake2b256(ReadFileBytes(idx_path)))},
                 {"bin_blake2b", ToHex(bin_digest)}});
}

}  // namespace lockstep::data
