// Hugging Face tokenizer.json files of byte-level BPE (the GPT-2 and Llama-3 families): the
// pre-tokenizer's regular expression (PCRE2, Debian's libpcre2, in Unicode mode), the byte-to-
// character table, and BPE merges by rank. No C/C++ library reads tokenizer.json (the reference
// implementation is the Rust `tokenizers` crate), so this is written here, for the subset of the
// format that byte-level BPE models use; anything else is refused naming the field. Checked
// against the independent @huggingface/tokenizers (JavaScript) in tests/data/hf_bpe_test.cc.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/tokenizers.h"
#include "lockstep/json.h"

namespace lockstep::data {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// GPT-2's pre-tokenizer pattern (the ByteLevel pre-tokenizer's with use_regex).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// End-of-document candidates among the added special tokens, in this order.
constexpr std::array<std::string_view, 4> kEodNames = {"<|endoftext|>", "<|end_of_text|>",
                                                       "</s>", "<eos>"};

// A field of a tokenizer.json object: its string, or "" when absent or not a string (then it
// matches no supported value and the caller refuses it by name).
std::string StringOf(const json& object, const char* key) {
  return object.is_object() && object.contains(key) && object[key].is_string()
             ? object[key].get<std::string>()
             : std::string();
}

// A boolean field: `otherwise` when absent or null; anything but true or false is refused.
bool FlagOf(const json& object, const char* key, bool otherwise, const std::string& what) {
  if (!object.is_object() || !object.contains(key) || object[key].is_null()) return otherwise;
  if (!object[key].is_boolean()) {
    Fail("{}: field \"{}\": {} is not true or false", what, key, object[key].dump().substr(0, 80));
  }
  return object[key].get<bool>();
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for code points
// 256 upwards in byte order; each as its UTF-8 text.
std::array<std::string, 256> ByteChars() {
  std::array<std::string, 256> chars;
  const auto utf8 = [](uint32_t c) {
    std::string s;
    if (c < 0x80) {
      s += static_cast<char>(c);
    } else if (c < 0x800) {
      s += static_cast<char>(0xC0 | c >> 6);
      s += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      s += static_cast<char>(0xE0 | c >> 12);
      s += static_cast<char>(0x80 | (c >> 6 & 0x3F));
      s += static_cast<char>(0x80 | (c & 0x3F));
    }
    return s;
  };
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    chars[b] = utf8(printable ? b : next++);
  }
  return chars;
}

// A compiled pattern; matches are found left to right, each after the previous one.
class Regex {
 public:
  static constexpr uint32_t kMatchLimit = 10'000'000, kDepthLimit = 100'000;

  Regex(std::string_view pattern, const std::string& what) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      Fail("{}: the pattern does not compile at offset {}: {}", what, offset,
           reinterpret_cast<const char*>(message));
    }
    data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
    // A bound on the work of one match, so that a hostile pattern (catastrophic backtracking)
    // is an error, not a hang.
    context_ = pcre2_match_context_create(nullptr);
    pcre2_set_match_limit(context_, kMatchLimit);
    pcre2_set_depth_limit(context_, kDepthLimit);
  }
  ~Regex() {
    pcre2_match_context_free(context_);
    pcre2_match_data_free(data_);
    pcre2_code_free(code_);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The pieces of `text` (the reference's Isolated split): each match, and the text between
  // matches. An empty match is no piece. `offset`: where `text` starts in the document (errors
  // name the byte of the document).
  std::vector<std::string_view> Split(std::string_view text, size_t offset) const {
    std::vector<std::string_view> pieces;
    size_t at = 0, last = 0;  // where the search resumes; where the last piece ended
    // PCRE2 checks the UTF-8 of the subject from the start offset to its end on every call: done
    // on each, that is quadratic in the text. The first call checks it all; the others skip it.
    uint32_t options = 0;
    while (at <= text.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at,
                                 options, data_, context_);
      options = PCRE2_NO_UTF_CHECK;
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof message);
        // The limits set above (match limit, depth limit) are the errors text can cause.
        Fail(
            "the pre_tokenizer's Split pattern gave up searching from byte {} ({}): it backtracks "
            "too much on this text for lockstep's bound (match limit {}, depth limit {}); simplify "
            "the "
            "pattern (possessive quantifiers, atomic groups) or the text",
            offset + at, reinterpret_cast<const char*>(message), kMatchLimit, kDepthLimit);
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data_);
      const size_t begin = ovector[0], end = ovector[1];
      if (end == begin) {  // step over one UTF-8 character
        at = begin + 1;
        while (at < text.size() && (static_cast<uint8_t>(text[at]) & 0xC0) == 0x80) ++at;
        continue;
      }
      if (begin > last) pieces.push_back(text.substr(last, begin - last));
      pieces.push_back(text.substr(begin, end - begin));
      last = at = end;
    }
    if (last < text.size()) pieces.push_back(text.substr(last));
    return pieces;
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* data_ = nullptr;
  pcre2_match_context* context_ = nullptr;
};

class HfBpeTokenizer final : public Tokenizer {
 public:
  explicit HfBpeTokenizer(const fs::path& path) : path_(path.string()), byte_chars_(ByteChars()) {
    const std::vector<uint8_t> bytes = ReadFileBytes(path);
    const json j = ParseJsonStrict(
        std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path_);
    if (!j.is_object()) Fail("{}: not a JSON object", path_);
    ReadModel(j);
    ReadPreTokenizer(j);
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      Fail("{}: field \"normalizer\": {} is not supported (byte-level BPE uses none)", path_,
           j["normalizer"].dump().substr(0, 120));
    }
    ReadAddedTokens(j);
    uint32_t size = 0;
    for (const auto& [piece, id] : vocab_) size = std::max(size, id + 1);
    for (const auto& [content, id] : added_) size = std::max(size, id + 1);
    std::optional<uint32_t> eod;
    for (const std::string_view name : kEodNames) {
      if (const auto it = special_.find(std::string(name)); it != special_.end()) {
        eod = it->second;
        break;
      }
    }
    if (!eod) {
      Fail("{}: field \"added_tokens\": no special end-of-document token (one of {})", path_,
           fmt::join(kEodNames, ", "));
    }
    vocabulary_ = {size, *eod, path.filename().string(), Blake2b256(bytes)};
  }

  const Vocabulary& vocabulary() const override { return vocabulary_; }

  std::vector<uint32_t> Encode(std::string_view text, std::string_view what) const override {
    try {
      return EncodeText(text);
    } catch (const Error& e) {
      Fail("{}: {} (tokenizer {})", what, e.what(), path_);
    }
  }

 private:
  std::vector<uint32_t> EncodeText(std::string_view text) const {
    std::vector<uint32_t> ids;
    PieceCache cache;
    // Added tokens are matched first, longest first at each position, as the reference does.
    size_t at = 0, plain = 0;
    while (at <= text.size()) {
      std::optional<std::pair<size_t, uint32_t>> found;  // length, id
      if (at < text.size() && added_first_byte_[static_cast<uint8_t>(text[at])]) {
        for (const auto& [content, id] : added_by_length_) {
          if (text.substr(at, content.size()) == content) {
            found = {content.size(), id};
            break;
          }
        }
      }
      if (found || at == text.size()) {
        EncodePlain(text.substr(plain, at - plain), plain, cache, ids);
        if (!found) break;
        ids.push_back(found->second);
        at += found->first;
        plain = at;
      } else {
        ++at;
      }
    }
    return ids;
  }

 public:
  std::string Decode(std::span<const uint32_t> ids) const override {
    std::string chars;
    for (const uint32_t id : ids) {
      const auto it = id_to_piece_.find(id);
      if (it == id_to_piece_.end()) Fail("{}: no token with id {}", path_, id);
      chars += it->second;
    }
    // Pieces of added tokens are their text; the others map characters back to bytes.
    std::string text;
    for (size_t at = 0; at < chars.size();) {
      size_t n = 1;
      while (at + n < chars.size() && (static_cast<uint8_t>(chars[at + n]) & 0xC0) == 0x80) ++n;
      const auto byte = char_to_byte_.find(chars.substr(at, n));
      text += byte == char_to_byte_.end() ? chars.substr(at, n) : std::string(1, static_cast<char>(byte->second));
      at += n;
    }
    return text;
  }

 private:
  void ReadModel(const json& j) {
    if (!j.contains("model") || !j["model"].is_object()) Fail("{}: no object \"model\"", path_);
    const json& m = j["model"];
    if (StringOf(m, "type") != "BPE") {
      Fail("{}: field \"model.type\": {} (only BPE is supported)", path_,
           m.contains("type") ? m["type"].dump() : "missing");
    }
    for (const char* key : {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"}) {
      if (m.contains(key) && !m[key].is_null() && m[key] != json("")) {
        Fail("{}: field \"model.{}\": {} is not supported (byte-level BPE leaves it empty)",
             path_, key, m[key].dump());
      }
    }
    if (FlagOf(m, "byte_fallback", false, path_ + ": model")) {
      Fail("{}: field \"model.byte_fallback\": true is not supported", path_);
    }
    ignore_merges_ = FlagOf(m, "ignore_merges", false, path_ + ": model");
    if (!m.contains("vocab") || !m["vocab"].is_object()) Fail("{}: no object \"model.vocab\"", path_);
    for (const auto& [piece, id] : m["vocab"].items()) {
      if (!id.is_number_unsigned() || id.get<uint64_t>() >= kMaxVocab) {
        Fail("{}: field \"model.vocab\": \"{}\" has id {}", path_, piece, id.dump());
      }
      vocab_[piece] = static_cast<uint32_t>(id.get<uint64_t>());
      NameId(static_cast<uint32_t>(id.get<uint64_t>()), piece, "model.vocab");
    }
    if (!m.contains("merges") || !m["merges"].is_array()) Fail("{}: no array \"model.merges\"", path_);
    const json& merges = m["merges"];
    for (size_t r = 0; r < merges.size(); ++r) {
      std::string left, right;
      if (merges[r].is_string()) {
        const std::string text = merges[r].get<std::string>();
        const size_t space = text.find(' ');
        if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
          Fail("{}: field \"model.merges\"[{}]: \"{}\" is not two pieces", path_, r, text);
        }
        left = text.substr(0, space), right = text.substr(space + 1);
      } else if (merges[r].is_array() && merges[r].size() == 2 && merges[r][0].is_string() &&
                 merges[r][1].is_string()) {
        left = merges[r][0].get<std::string>(), right = merges[r][1].get<std::string>();
      } else {
        Fail("{}: field \"model.merges\"[{}]: {} is not two pieces", path_, r, merges[r].dump());
      }
      const auto a = vocab_.find(left), b = vocab_.find(right), ab = vocab_.find(left + right);
      if (a == vocab_.end() || b == vocab_.end() || ab == vocab_.end()) {
        Fail("{}: field \"model.merges\"[{}]: \"{} {}\" names a piece not in the vocabulary",
             path_, r, left, right);
      }
      merges_.emplace(PairKey(a->second, b->second), std::pair<uint32_t, uint32_t>(r, ab->second));
    }
    for (int b = 0; b < 256; ++b) {
      if (!vocab_.contains(byte_chars_[static_cast<size_t>(b)])) {
        Fail("{}: field \"model.vocab\": byte {} has no piece (not a byte-level BPE)", path_, b);
      }
      char_to_byte_[byte_chars_[static_cast<size_t>(b)]] = static_cast<uint8_t>(b);
      byte_ids_[static_cast<size_t>(b)] = vocab_.at(byte_chars_[static_cast<size_t>(b)]);
    }
  }

  void ReadPreTokenizer(const json& j) {
    const json& p = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
    const auto byte_level = [&](const json& b, bool allow_regex) {
      if (FlagOf(b, "add_prefix_space", false, path_ + ": pre_tokenizer")) {
        Fail("{}: field \"pre_tokenizer\": add_prefix_space true is not supported", path_);
      }
      const bool use_regex = FlagOf(b, "use_regex", true, path_ + ": pre_tokenizer");
      if (use_regex && !allow_regex) {
        Fail("{}: field \"pre_tokenizer\": a Split followed by ByteLevel with use_regex", path_);
      }
      if (use_regex) pattern_ = std::make_unique<Regex>(kGpt2Pattern, path_ + ": GPT-2 pattern");
    };
    if (StringOf(p, "type") == "ByteLevel") {
      byte_level(p, true);
      return;
    }
    if (StringOf(p, "type") == "Sequence" &&
        p.contains("pretokenizers") && p["pretokenizers"].is_array() &&
        p["pretokenizers"].size() == 2) {
      const json& split = p["pretokenizers"][0];
      const json& bytes = p["pretokenizers"][1];
      if (StringOf(split, "type") == "Split" && StringOf(split, "behavior") == "Isolated" &&
          !FlagOf(split, "invert", false, path_ + ": pre_tokenizer") &&
          split.contains("pattern") && split["pattern"].is_object() &&
          split["pattern"].contains("Regex") && split["pattern"]["Regex"].is_string() &&
          StringOf(bytes, "type") == "ByteLevel") {
        pattern_ = std::make_unique<Regex>(split["pattern"]["Regex"].get<std::string>(),
                                           path_ + ": field \"pre_tokenizer\" Split pattern");
        byte_level(bytes, false);
        return;
      }
    }
    Fail("{}: field \"pre_tokenizer\": {} is not supported (ByteLevel, or a Sequence of an "
         "Isolated Split by regex and ByteLevel)",
         path_, p.dump().substr(0, 120));
  }

  // Id `id` names `piece`: refused when it already names another (its ids could not be decoded).
  // The same piece under the same id in both model.vocab and added_tokens is usual, and fine.
  void NameId(uint32_t id, const std::string& piece, std::string_view field) {
    const auto [it, inserted] = id_to_piece_.emplace(id, piece);
    if (!inserted && it->second != piece) {
      Fail("{}: field \"{}\": \"{}\" has id {}, which \"{}\" has already: an id names one piece",
           path_, field, piece, id, it->second);
    }
  }

  void ReadAddedTokens(const json& j) {
    if (!j.contains("added_tokens")) return;
    if (!j["added_tokens"].is_array()) Fail("{}: field \"added_tokens\" is not an array", path_);
    for (const json& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_unsigned() ||
          !t.contains("content") || !t["content"].is_string() ||
          t["id"].get<uint64_t>() >= kMaxVocab) {
        Fail("{}: field \"added_tokens\": {} needs an id and a content", path_, t.dump());
      }
      for (const char* key : {"lstrip", "rstrip", "single_word"}) {
        if (FlagOf(t, key, false, path_ + ": added_tokens")) {
          Fail("{}: field \"added_tokens\": {}: {} true is not supported", path_, t["content"].dump(), key);
        }
      }
      const std::string content = t["content"].get<std::string>();
      if (content.empty()) Fail("{}: field \"added_tokens\": an empty content", path_);
      const auto id = static_cast<uint32_t>(t["id"].get<uint64_t>());
      added_[content] = id;
      NameId(id, content, "added_tokens");
      if (FlagOf(t, "special", false, path_ + ": added_tokens")) special_[content] = id;
    }
    for (const auto& [content, id] : added_) {
      added_by_length_.emplace_back(content, id);
      added_first_byte_[static_cast<uint8_t>(content[0])] = true;
    }
    std::ranges::stable_sort(added_by_length_, [](const auto& a, const auto& b) {
      return a.first.size() > b.first.size();
    });
  }

  static uint64_t PairKey(uint32_t a, uint32_t b) { return uint64_t{a} << 32 | b; }

  // The ids of the pieces of one text already encoded (piece text -> ids), so that a word
  // met again is looked up, not merged again. Keys view the text being encoded, so a cache lives
  // for one Encode call; pieces over kPieceBytes are not kept, and the cache is emptied when it
  // holds kEntries pieces or kIds ids: a few MiB at most, whatever the document.
  struct PieceCache {
    static constexpr size_t kPieceBytes = 128, kEntries = size_t{1} << 16, kIds = size_t{1} << 20;
    std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> spans;  // first, count
    std::vector<uint32_t> ids;
  };

  // Text without added tokens: pre-tokenized, each piece's bytes as characters, then merged.
  void EncodePlain(std::string_view text, size_t offset, PieceCache& cache,
                   std::vector<uint32_t>& ids) const {
    if (text.empty()) return;
    const std::vector<std::string_view> pieces =
        pattern_ ? pattern_->Split(text, offset) : std::vector<std::string_view>{text};
    std::vector<uint32_t> symbols;
    for (const std::string_view piece : pieces) {
      const bool cacheable = piece.size() <= PieceCache::kPieceBytes;
      if (cacheable) {
        if (const auto it = cache.spans.find(piece); it != cache.spans.end()) {
          const auto first = cache.ids.begin() + it->second.first;
          ids.insert(ids.end(), first, first + it->second.second);
          continue;
        }
      }
      EncodePiece(piece, symbols);
      ids.insert(ids.end(), symbols.begin(), symbols.end());
      if (!cacheable) continue;
      if (cache.spans.size() == PieceCache::kEntries ||
          cache.ids.size() + symbols.size() > PieceCache::kIds) {
        cache.spans.clear();
        cache.ids.clear();
      }
      cache.spans.emplace(piece,
                          std::pair<uint32_t, uint32_t>(static_cast<uint32_t>(cache.ids.size()),
                                                        static_cast<uint32_t>(symbols.size())));
      cache.ids.insert(cache.ids.end(), symbols.begin(), symbols.end());
    }
  }

  // The ids of one pre-token.
  void EncodePiece(std::string_view piece, std::vector<uint32_t>& symbols) const {
    symbols.clear();
    if (ignore_merges_) {
      std::string word;
      for (const char c : piece) word += byte_chars_[static_cast<uint8_t>(c)];
      if (const auto it = vocab_.find(word); it != vocab_.end()) {
        symbols.push_back(it->second);
        return;
      }
    }
    for (const char c : piece) symbols.push_back(byte_ids_[static_cast<uint8_t>(c)]);
    Merge(symbols);
  }

  // Applies merges as the reference's Word::merge_all does: always the pair of lowest rank, the
  // leftmost of equal ones, one at a time. A min-heap of (rank, position) over a linked list of
  // the symbols, stale entries skipped: O(n log n) in the piece's bytes, however long the piece
  // (a run of letters without a space is one piece).
  void Merge(std::vector<uint32_t>& symbols) const {
    const size_t n = symbols.size();
    if (n < 2) return;
    std::vector<uint32_t> prev(n), next(n);  // neighbours; kNone at the ends
    constexpr uint32_t kNone = UINT32_MAX;
    for (size_t i = 0; i < n; ++i) {
      prev[i] = i == 0 ? kNone : static_cast<uint32_t>(i - 1);
      next[i] = i + 1 < n ? static_cast<uint32_t>(i + 1) : kNone;
    }
    // rank, left position, left id, right id, merged id
    using Entry = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
    const auto push = [&](uint32_t left) {
      if (next[left] == kNone) return;
      const uint32_t a = symbols[left], b = symbols[next[left]];
      if (const auto it = merges_.find(PairKey(a, b)); it != merges_.end()) {
        heap.emplace(it->second.first, left, a, b, it->second.second);
      }
    };
    for (uint32_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      const auto [rank, left, a, b, merged] = heap.top();
      heap.pop();
      // Stale: the left symbol was merged into its left neighbour (then it is gone: kMerged) or
      // with its right one (then it is another id), or its right neighbour changed.
      const uint32_t right = next[left];
      if (symbols[left] != a || right == kNone || symbols[right] != b) continue;
      symbols[left] = merged;
      symbols[right] = kMerged;
      next[left] = next[right];
      if (next[right] != kNone) prev[next[right]] = left;
      if (prev[left] != kNone) push(prev[left]);
      push(left);
    }
    std::erase(symbols, kMerged);
  }

  static constexpr uint32_t kMerged = UINT32_MAX;  // no id: ids are below kMaxVocab

  std::string path_;
  std::array<std::string, 256> byte_chars_;
  std::array<uint32_t, 256> byte_ids_{};  // each byte's piece's id
  std::unordered_map<std::string, uint8_t> char_to_byte_;
  std::unordered_map<std::string, uint32_t> vocab_;
  std::unordered_map<uint32_t, std::string> id_to_piece_;
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merges_;  // pair -> rank, merged id
  std::map<std::string, uint32_t> added_, special_;
  std::vector<std::pair<std::string, uint32_t>> added_by_length_;
  std::array<bool, 256> added_first_byte_{};  // the bytes an added token can start with
  std::unique_ptr<Regex> pattern_;
  bool ignore_merges_ = false;
  Vocabulary vocabulary_;
};

}  // namespace

std::unique_ptr<Tokenizer> OpenHfTokenizer(const fs::path& path) {
  return std::make_unique<HfBpeTokenizer>(path);
}

}  // namespace lockstep::data
