// The byte-level tokenizer (`lockstep data tokenize`), UTF-8 validation and the entropy helpers.
#include <cmath>
#include <nlohmann/json.hpp>

#include "lockstep/data.h"

namespace lockstep::data {

// Hand-written because no UTF-8 library is among lockstep's Debian dependencies and the check is
// the 20 lines of RFC 3629's table (section 4); only validation is needed, never decoding.
void ValidateUtf8(std::span<const uint8_t> bytes, std::string_view what) {
  size_t i = 0;
  while (i < bytes.size()) {
    const uint8_t lead = bytes[i];
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t length = 0;
    uint8_t second_min = 0x80, second_max = 0xBF;  // the range of the byte after the lead
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) second_min = 0xA0;  // overlong
      if (lead == 0xED) second_max = 0x9F;  // UTF-16 surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) second_min = 0x90;  // overlong
      if (lead == 0xF4) second_max = 0x8F;  // above U+10FFFF
    } else {
      Fail("{}: invalid UTF-8 at byte offset {}: byte 0x{:02x} cannot start a character", what, i,
           lead);
    }
    for (size_t k = 1; k < length; ++k) {
      if (i + k == bytes.size()) {
        Fail("{}: invalid UTF-8 at byte offset {}: the data ends inside a {}-byte character", what,
             i, length);
      }
      const uint8_t b = bytes[i + k];
      const bool ok = k == 1 ? (b >= second_min && b <= second_max) : (b >= 0x80 && b <= 0xBF);
      if (!ok) {
        Fail(
            "{}: invalid UTF-8 at byte offset {}: byte 0x{:02x} at offset {} does not continue "
            "the character starting with 0x{:02x}",
            what, i, b, i + k, lead);
      }
    }
    i += length;
  }
}

std::vector<uint32_t> TokenizeBytes(std::span<const uint8_t> bytes) {
  return std::vector<uint32_t>(bytes.begin(), bytes.end());
}

std::string DescribeTokens(std::span<const uint32_t> tokens) {
  std::string s;
  for (uint32_t t : tokens) {
    if (t == kEodToken) {
      s += "<eod>";
    } else if (t > 0xFF) {
      s += fmt::format("<invalid token {}>", t);
    } else if (t == '\n') {
      s += "\\n";
    } else if (t == '\t') {
      s += "\\t";
    } else if (t == '\\') {
      s += "\\\\";
    } else if (t >= 0x20 && t < 0x7F) {
      s.push_back(static_cast<char>(t));
    } else {
      s += fmt::format("\\x{:02x}", t);
    }
  }
  return s;
}

double DeterministicLog(double x) {
  if (!(x > 0) || !std::isfinite(x)) Fail("DeterministicLog: argument {} is not finite and > 0", x);
  // x = m * 2^e with m in [sqrt(1/2), sqrt(2)); frexp is exact on every libm.
  int e = 0;
  double m = std::frexp(x, &e);
  if (m < 0.70710678118654752440) {
    m *= 2;
    e -= 1;
  }
  // ln m = 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...), s = (m - 1) / (m + 1), |s| < 0.1716, so
  // s^2 < 0.0295 and 14 terms leave a truncation error far below one ulp. Horner from the
  // smallest term; every operation is a correctly rounded IEEE one (-ffp-contract=off).
  const double s = (m - 1) / (m + 1);
  const double s2 = s * s;
  double series = 0;
  for (int k = 13; k >= 0; --k) series = series * s2 + 1.0 / (2 * k + 1);
  constexpr double kLn2 = 0.693147180559945309417;
  return static_cast<double>(e) * kLn2 + 2 * s * series;
}

double EntropyNats(std::span<const uint64_t> counts) {
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  if (total == 0) Fail("EntropyNats: all {} counts are zero", counts.size());
  // H = -sum p ln p with p = c / total, summed in index order.
  const double inverse_total = 1.0 / static_cast<double>(total);
  double h = 0;
  for (uint64_t c : counts) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) * inverse_total;
    h -= p * DeterministicLog(p);
  }
  return h;
}

void TokenizeFiles(std::span<const std::filesystem::path> inputs, const std::filesystem::path& out,
                   uint64_t max_shard_tokens, const Tokenizer* tokenizer) {
  if (inputs.empty()) Fail("data tokenize: no input files");
  const auto encode = [&](const std::vector<uint8_t>& bytes, const std::filesystem::path& input) {
    ValidateUtf8(bytes, input.string());
    if (tokenizer == nullptr) return TokenizeBytes(bytes);
    const std::vector<uint32_t> ids = tokenizer->Encode(
        std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
        input.string());
    // Here, before the output exists (the shard writer checks again): the text of the
    // end-of-document token in a file encodes to the id no document may hold.
    tokenizer->vocabulary().CheckDocument(ids, input.string());
    return ids;
  };
  // Every input is read, checked and encoded once, before the output directory is created: a
  // bad file leaves nothing. (The documents are held until written, as a Dataset holds them.)
  std::vector<std::vector<uint32_t>> documents;
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const std::filesystem::path& input : inputs) {
    // Sized before it is read: its bytes and as many token ids (4 bytes each) must fit.
    const std::vector<uint8_t> bytes =
        ReadFileBytes(input, MemAvailableBytes() / 5,
                      "a fifth of the memory available now (an input is read whole, then encoded)");
    documents.push_back(encode(bytes, input));
    files.push_back({{"file", input.filename().string()}, {"bytes", bytes.size()}});
  }
  ShardWriter writer(out, max_shard_tokens, tokenizer ? tokenizer->vocabulary() : Vocabulary{});
  for (const std::vector<uint32_t>& document : documents) writer.AddDocument(document);
  writer.Finish({{"tokenized_files", std::move(files)}});
}

}  // namespace lockstep::data
