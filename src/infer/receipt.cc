// Generation receipts: docs/formats/receipt.md.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <charconv>

#include "lockstep/build_info.h"
#include "lockstep/infer.h"
#include "lockstep/json.h"

namespace lockstep::infer {
namespace {

using json = nlohmann::json;

// A float as the shortest decimal that reads back to it (the receipt's real-valued fields).
std::string FloatText(float x) { return fmt::format("{}", x); }
float FloatFromText(const json& object, const char* key, std::string_view what) {
  const std::string text = StringField(object, key, what);
  float x = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
  if (ec != std::errc() || end != text.data() + text.size() || FloatText(x) != text) {
    Fail("{}: {} = \"{}\" is not a float's shortest decimal text", what, key, text);
  }
  return x;
}
uint64_t U64FromText(const json& object, const char* key, std::string_view what) {
  const std::string text = StringField(object, key, what);
  const std::optional<uint64_t> x = ParseDecimalU64(text);
  if (!x) Fail("{}: {} = \"{}\" is not a decimal integer from 0 to 2^64 - 1", what, key, text);
  return *x;
}

json Ids(std::span<const uint32_t> ids) {
  return json(std::vector<uint32_t>(ids.begin(), ids.end()));
}

std::vector<uint32_t> IdsField(const json& object, const char* key, std::string_view what) {
  const json& value = object.at(key);
  if (!value.is_array()) Fail("{}: {} is not an array of token ids", what, key);
  std::vector<uint32_t> ids;
  ids.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const uint64_t id = AsU64(value[i], fmt::format("{}: {}[{}]", what, key, i));
    if (id >= data::kMaxVocab) Fail("{}: {}[{}] = {} is not a token id", what, key, i, id);
    ids.push_back(static_cast<uint32_t>(id));
  }
  return ids;
}

// A receipt's tokenizer as the MATCH and MISMATCH lines name it.
std::string TokenizerText(const data::Vocabulary& v) {
  return v.bytes()
             ? std::string("bytes")
             : fmt::format("file {} (BLAKE2b {})", v.tokenizer_file, ToHex(v.tokenizer_blake2b));
}

}  // namespace

std::string GenerationReceipt(const VerifiedModel& model, const ReceiptTokenizer& tokenizer,
                              const SamplingParams& params, std::span<const Request> requests,
                              std::span<const Generation> generations, const Ed25519Seed* key) {
  if (requests.size() != generations.size()) {
    LOCKSTEP_INTERNAL("{} requests, {} generations", requests.size(), generations.size());
  }
  json r;
  r["format"] = kReceiptFormat;
  r["format_version"] = kReceiptFormatVersion;
  r["kind"] = "generation";
  r["lockstep_version"] = build::kVersion;
  r["contract_version"] = build::kContractVersion;
  const auto& d = model.descriptor;
  r["checkpoint"] = {{"state_hash", ToHex(model.state_hash)},
                     {"descriptor_blake2b", ToHex(Blake2b().Update(d).Final())},
                     {"step", model.step}};
  if (!tokenizer.vocabulary.has_value()) {
    r["tokenizer"] = nullptr;
  } else if (tokenizer.vocabulary->bytes()) {
    r["tokenizer"] = {{"kind", "bytes"}};
  } else {
    r["tokenizer"] = {{"kind", "file"},
                      {"name", tokenizer.vocabulary->tokenizer_file},
                      {"blake2b", ToHex(tokenizer.vocabulary->tokenizer_blake2b)}};
  }
  r["eod"] = tokenizer.eod.has_value() ? json(*tokenizer.eod) : json(nullptr);
  r["sampling"] = {{"max_tokens", params.max_tokens},
                   {"temperature", FloatText(params.temperature)},
                   {"top_k", params.top_k},
                   {"top_p", FloatText(params.top_p)},
                   {"seed", std::to_string(params.seed)}};
  json list = json::array();
  for (size_t i = 0; i < requests.size(); ++i) {
    json chain = json::array();
    for (const Digest& c : generations[i].logits_chain) chain.push_back(ToHex(c));
    list.push_back({{"id", std::to_string(requests[i].id)},
                    {"prompt_tokens", Ids(requests[i].prompt)},
                    {"prompt_blake2b", ToHex(PromptDigest(requests[i].prompt))},
                    {"output_tokens", Ids(generations[i].tokens)},
                    {"stop", StopName(generations[i].stop)},
                    {"logits_chain", std::move(chain)}});
  }
  r["requests"] = std::move(list);
  std::string sealed = SealReceipt(r, key);
  if (sealed.size() > kMaxJsonBytes) {  // what verify-generation would refuse is never written
    Fail(
        "the receipt would be {} bytes, more than a receipt may hold ({} bytes): generate fewer "
        "requests or tokens per receipt",
        sealed.size(), kMaxJsonBytes);
  }
  return sealed;
}

ReceiptVerdict VerifyGenerationReceipt(const std::filesystem::path& path,
                                       const VerifiedModel& model, const Ed25519PublicKey* trusted,
                                       const data::Vocabulary* data, const OpHooks& hooks) {
  const OpenedReceipt parsed =
      OpenReceipt(ReadFileText(path, kMaxJsonBytes, "a receipt"), path.string(), trusted);
  const json& r = parsed.receipt;
  const std::string what = path.string() + ": receipt";
  RequireKeys(r,
              {"format", "format_version", "kind", "lockstep_version", "contract_version",
               "checkpoint", "tokenizer", "eod", "sampling", "requests"},
              what);
  RequireFormat(r, kReceiptFormat, kReceiptFormatVersion, what);
  if (StringField(r, "kind", what) != "generation") {
    Fail("{}: kind = {} (this command verifies \"generation\" receipts)", what,
         ShownJson(r.at("kind")));
  }
  StringField(r, "lockstep_version", what);
  const uint64_t contract = U64Field(r, "contract_version", what);
  const json& ckpt = r.at("checkpoint");
  const std::string ckpt_what = what + ": checkpoint";
  RequireKeys(ckpt, {"state_hash", "descriptor_blake2b", "step"}, ckpt_what);
  const Digest state_hash = DigestField(ckpt, "state_hash", ckpt_what);
  const Digest descriptor = DigestField(ckpt, "descriptor_blake2b", ckpt_what);
  const uint64_t step = U64Field(ckpt, "step", ckpt_what);
  const json& tok = r.at("tokenizer");
  std::optional<data::Vocabulary> claimed_vocabulary;
  if (!tok.is_null()) {
    const std::string tok_what = what + ": tokenizer";
    data::Vocabulary v;
    if (tok.is_object() && tok.size() == 1) {
      RequireKeys(tok, {"kind"}, tok_what);
      if (StringField(tok, "kind", tok_what) != "bytes")
        Fail("{}: kind is not \"bytes\"", tok_what);
    } else {
      RequireKeys(tok, {"kind", "name", "blake2b"}, tok_what);
      if (StringField(tok, "kind", tok_what) != "file") Fail("{}: kind is not \"file\"", tok_what);
      v.tokenizer_file = StringField(tok, "name", tok_what);
      if (v.tokenizer_file.empty()) Fail("{}: name is empty", tok_what);
      v.tokenizer_blake2b = DigestField(tok, "blake2b", tok_what);
    }
    claimed_vocabulary = v;
  }
  std::optional<uint32_t> eod;
  if (!r.at("eod").is_null()) {
    const uint64_t id = AsU64(r.at("eod"), what + ": eod");
    if (id >= static_cast<uint64_t>(model.config.model.vocab)) {
      Fail("{}: eod = {} is outside the vocabulary (model.vocab = {})", what, id,
           model.config.model.vocab);
    }
    eod = static_cast<uint32_t>(id);
  }
  // generate binds both from --data, or neither.
  if (claimed_vocabulary.has_value() != eod.has_value()) {
    Fail("{}: tokenizer is {} but eod is {} (a receipt holds both, from the dataset, or neither)",
         what, ShownJson(tok), ShownJson(r.at("eod")));
  }
  const json& s = r.at("sampling");
  const std::string s_what = what + ": sampling";
  RequireKeys(s, {"max_tokens", "temperature", "top_k", "top_p", "seed"}, s_what);
  SamplingParams params;
  const auto bounded = [&](const char* key, int64_t max) {
    const uint64_t value = U64Field(s, key, s_what);
    if (value > static_cast<uint64_t>(max)) {
      Fail("{}: {} = {} (at most {})", s_what, key, value, max);
    }
    return static_cast<int64_t>(value);
  };
  params.max_tokens = bounded("max_tokens", kMaxTokensLimit);
  params.temperature = FloatFromText(s, "temperature", s_what);
  params.top_k = bounded("top_k", kMaxTopK);
  params.top_p = FloatFromText(s, "top_p", s_what);
  params.seed = U64FromText(s, "seed", s_what);
  CheckSampling(params, s_what);

  const json& list = r.at("requests");
  if (!list.is_array() || list.empty()) Fail("{}: requests is not a non-empty array", what);
  if (list.size() > kMaxRequests) {
    Fail("{}: {} requests, more than one generation may hold ({})", what, list.size(),
         kMaxRequests);
  }
  std::vector<Request> requests;
  struct Claimed {
    Digest prompt_digest;
    std::vector<uint32_t> tokens;
    std::vector<Digest> chain;
    std::string stop;
  };
  std::vector<Claimed> claimed;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& q = list[i];
    const std::string q_what = fmt::format("{}: requests[{}]", what, i);
    RequireKeys(q,
                {"id", "prompt_tokens", "prompt_blake2b", "output_tokens", "stop", "logits_chain"},
                q_what);
    Request request{U64FromText(q, "id", q_what), IdsField(q, "prompt_tokens", q_what)};
    Claimed c{DigestField(q, "prompt_blake2b", q_what),
              IdsField(q, "output_tokens", q_what),
              {},
              StringField(q, "stop", q_what)};
    const json& chain = q.at("logits_chain");
    if (!chain.is_array()) Fail("{}: logits_chain is not an array", q_what);
    for (size_t k = 0; k < chain.size(); ++k) {
      const std::string text = chain[k].is_string() ? chain[k].get<std::string>() : "";
      c.chain.push_back(DigestFromHex(text, fmt::format("{}: logits_chain[{}]", q_what, k)));
    }
    if (c.chain.size() != c.tokens.size()) {
      Fail("{}: {} output tokens but {} logits_chain entries", q_what, c.tokens.size(),
           c.chain.size());
    }
    requests.push_back(std::move(request));
    claimed.push_back(std::move(c));
  }
  if (const auto shared = FirstSharedId(requests)) {
    Fail(
        "{}: requests[{}] and requests[{}] have the same id {} (each request's draws are keyed "
        "by its id; generate refuses such a batch)",
        what, shared->first, shared->second, requests[shared->first].id);
  }

  // Read whole; now the checks against the checkpoint, the dataset and the prompts, in order.
  if (contract != static_cast<uint64_t>(build::kContractVersion)) {
    return {false, fmt::format("the receipt was made under numerics contract {}; this lockstep "
                               "implements contract {} and cannot re-execute it bit for bit",
                               contract, build::kContractVersion)};
  }
  const auto& d = model.descriptor;
  const Digest have_descriptor = Blake2b().Update(d).Final();
  if (state_hash != model.state_hash || descriptor != have_descriptor || step != model.step) {
    return {false, fmt::format("the receipt is of the checkpoint with state hash {} (step {}, "
                               "descriptor {}); {} has state hash {} (step {}, descriptor {})",
                               ToHex(state_hash), step, ToHex(descriptor), model.dir.string(),
                               ToHex(model.state_hash), model.step, ToHex(have_descriptor))};
  }
  if (data != nullptr && eod.has_value() &&
      (data->bytes() != claimed_vocabulary->bytes() ||
       data->tokenizer_file != claimed_vocabulary->tokenizer_file ||
       data->tokenizer_blake2b != claimed_vocabulary->tokenizer_blake2b || data->eod != *eod)) {
    return {false,
            fmt::format("the receipt's tokenizer is {} with eod {}; the checkpoint's "
                        "dataset (--data) has {} with eod {}",
                        TokenizerText(*claimed_vocabulary), *eod, TokenizerText(*data), data->eod)};
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (claimed[i].prompt_digest != PromptDigest(requests[i].prompt)) {
      return {false, fmt::format("request {} (id {}): prompt_blake2b is not the BLAKE2b of its "
                                 "prompt_tokens",
                                 i, requests[i].id)};
    }
  }

  // A request the model cannot run (a prompt empty, too long or outside the vocabulary) is the
  // receipt's fault: refused naming it.
  std::vector<Generation> again;
  try {
    again = Generate(model, requests, params, eod, hooks);
  } catch (const Error& e) {
    Fail("{}: requests: {}", path.string(), e.what());
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const Generation& g = again[i];
    const Claimed& c = claimed[i];
    const int64_t prompt = static_cast<int64_t>(requests[i].prompt.size());
    const std::string who = fmt::format("request {} (id {})", i, requests[i].id);
    for (size_t k = 0; k < std::max(g.tokens.size(), c.tokens.size()); ++k) {
      const int64_t position = prompt + static_cast<int64_t>(k);
      if (k >= c.tokens.size() || k >= g.tokens.size()) {
        return {false,
                fmt::format("{}: the receipt has {} output tokens, re-executed {} (stop "
                            "\"{}\"); they part at position {} (output token {})",
                            who, c.tokens.size(), g.tokens.size(), StopName(g.stop), position, k)};
      }
      if (c.chain[k] != g.logits_chain[k]) {
        return {false, fmt::format("{}: the logits at position {} (output token {}) differ: the "
                                   "receipt's chain is {}, re-executed {}",
                                   who, position, k, ToHex(c.chain[k]), ToHex(g.logits_chain[k]))};
      }
      if (c.tokens[k] != g.tokens[k]) {
        return {false, fmt::format("{}: position {} (output token {}): the receipt has token {}, "
                                   "re-executed {} (the logits agree)",
                                   who, position, k, c.tokens[k], g.tokens[k])};
      }
    }
    if (c.stop != StopName(g.stop)) {
      return {false, fmt::format("{}: the receipt says it stopped at \"{}\", re-executed \"{}\"",
                                 who, c.stop, StopName(g.stop))};
    }
  }
  size_t tokens = 0;
  for (const Generation& g : again) tokens += g.tokens.size();
  std::string bound = "; no tokenizer and no eod (the prompts were given as ids)";
  if (eod.has_value()) {
    bound = data != nullptr
                ? fmt::format("; tokenizer {} and eod {} are the dataset's (--data)",
                              TokenizerText(*claimed_vocabulary), *eod)
                : fmt::format(
                      "; tokenizer {} and eod {} not checked (give --data to check them "
                      "against the checkpoint's dataset)",
                      TokenizerText(*claimed_vocabulary), *eod);
  }
  return {true, fmt::format("{} request(s), {} output token(s) re-executed on checkpoint {} (step "
                            "{}){}{}",
                            requests.size(), tokens, ToHex(model.state_hash), model.step,
                            parsed.signer ? ", signed by " + ToHex(*parsed.signer) : "", bound)};
}

}  // namespace lockstep::infer
