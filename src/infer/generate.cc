// Generation: prompts prefilled, then decoded side by side, one token per request per step.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include <nlohmann/json.hpp>

#include "lockstep/infer.h"
#include "lockstep/json.h"

namespace lockstep::infer {
namespace {

Digest ChainStep(const Digest& previous, std::span<const float> logits) {
  std::vector<uint8_t> message(previous.size() + logits.size_bytes());
  std::memcpy(message.data(), previous.data(), previous.size());
  for (size_t i = 0; i < logits.size(); ++i) {  // little-endian, whatever the host's order
    const auto bits = std::bit_cast<uint32_t>(logits[i]);
    for (int b = 0; b < 4; ++b) message[previous.size() + 4 * i + b] = uint8_t(bits >> (8 * b));
  }
  return Blake2b256(message);
}

}  // namespace

std::optional<std::pair<size_t, size_t>> FirstSharedId(std::span<const Request> requests) {
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::ranges::stable_sort(order, {}, [&](size_t i) { return requests[i].id; });
  std::optional<std::pair<size_t, size_t>> first;
  for (size_t k = 1; k < order.size(); ++k) {
    if (requests[order[k - 1]].id != requests[order[k]].id) continue;
    const std::pair<size_t, size_t> pair{order[k - 1], order[k]};  // in order: stable sort
    if (!first || pair.second < first->second) first = pair;
  }
  return first;
}

std::string_view StopName(Stop stop) {
  switch (stop) {
    case Stop::kEndOfDocument:
      return "end_of_document";
    case Stop::kMaxTokens:
      return "max_tokens";
    case Stop::kSeqLen:
      return "seq_len";
  }
  LOCKSTEP_INTERNAL("Stop {}", static_cast<int>(stop));
}

Digest PromptDigest(std::span<const uint32_t> ids) {
  std::vector<uint8_t> bytes(ids.size() * 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int b = 0; b < 4; ++b) bytes[4 * i + b] = uint8_t(ids[i] >> (8 * b));
  }
  return Blake2b256(bytes);
}

namespace {
// Each request's KV-cache positions: its prompt, and every token it may generate but the last
// (which is never run), at most seq_len.
std::vector<int64_t> Capacities(const ModelConfig& c, std::span<const Request> requests,
                                const SamplingParams& params) {
  std::vector<int64_t> capacities;
  for (const Request& r : requests) {
    const auto prompt = static_cast<int64_t>(r.prompt.size());
    capacities.push_back(prompt + std::min(params.max_tokens - 1, c.seq_len - prompt));
  }
  return capacities;
}
}  // namespace

bool CheckGenerationFits(const ModelConfig& c, std::span<const Request> requests,
                         const SamplingParams& params, uint64_t available, bool on_cpu) {
  const std::vector<int64_t> capacities = Capacities(c, requests, params);
  int64_t prompts = 0;
  for (const Request& r : requests) prompts += static_cast<int64_t>(r.prompt.size());
  const uint64_t cache = KvDecoder::CacheBytes(c, capacities);
  const uint64_t prefill =
      KvDecoder::AppendBytes(c, prompts, static_cast<int64_t>(requests.size()));
  const uint64_t copy = KvDecoder::CopyBytes(c, on_cpu, /*linears=*/false);
  if (cache + prefill + copy > available) {
    Fail(
        "{} requests need {} for their KV caches ({} layers, {} positions in all: each prompt "
        "and max_tokens, at most seq_len), {} for the prefill of their {} prompt tokens and {} "
        "for the copies of the weights the decoder makes (its packed head; its bf16 compute "
        "copy); this machine has {} available (MemAvailable): give fewer requests or a smaller "
        "--max-tokens",
        requests.size(), MiB(cache), c.n_layers,
        std::accumulate(capacities.begin(), capacities.end(), int64_t{0}), MiB(prefill), prompts,
        MiB(copy), MiB(available));
  }
  return cache + prefill + KvDecoder::CopyBytes(c, on_cpu) <= available;
}

void CheckSampling(const SamplingParams& params, std::string_view what) {
  if (params.max_tokens < 1 || params.max_tokens > kMaxTokensLimit) {
    Fail("{}: max_tokens = {} (an integer from 1 to {})", what, params.max_tokens, kMaxTokensLimit);
  }
  if (!std::isfinite(params.temperature) || std::signbit(params.temperature)) {
    Fail("{}: temperature = {} (a finite number, 0 or above, not -0)", what, params.temperature);
  }
  if (params.top_k < 0 || params.top_k > kMaxTopK) {
    Fail("{}: top_k = {} (an integer from 0 to {}; 0: every id)", what, params.top_k, kMaxTopK);
  }
  if (!(params.top_p > 0 && params.top_p <= 1)) {
    Fail("{}: top_p = {} (a number above 0, at most 1)", what, params.top_p);
  }
}

std::vector<Generation> Generate(const VerifiedModel& model, std::span<const Request> requests,
                                 const SamplingParams& params, std::optional<uint32_t> eod,
                                 const OpHooks& hooks,
                                 const std::function<void(size_t, uint32_t)>& on_token) {
  const ModelConfig& c = model.config.model;
  if (requests.empty()) Fail("no requests to generate for");
  CheckSampling(params, "sampling");
  RequireIeeeFloatingPoint();
  for (size_t r = 0; r < requests.size(); ++r) {
    const auto n = static_cast<int64_t>(requests[r].prompt.size());
    if (n < 1 || n > c.seq_len) {
      Fail("request {} (id {}): its prompt has {} tokens; 1 to the model's seq_len ({})", r,
           requests[r].id, n, c.seq_len);
    }
  }
  const bool linear_copies =
      CheckGenerationFits(c, requests, params, MemAvailableBytes(), hooks.executor == nullptr);
  const std::vector<int64_t> capacities = Capacities(c, requests, params);
  KvDecoder decoder(c, model.params, capacities);
  decoder.set_linear_copies(linear_copies);
  decoder.set_hooks(hooks);
  std::vector<Generation> out(requests.size());
  std::vector<Digest> chain(requests.size());
  std::vector<bool> done(requests.size(), false);
  std::vector<KvDecoder::Piece> pieces;
  std::vector<size_t> who;
  std::vector<std::string> names(requests.size());  // a prompt's bad id is refused naming these
  for (size_t r = 0; r < requests.size(); ++r) {
    names[r] = fmt::format("request {} (id {}): prompt", r, requests[r].id);
    pieces.push_back({static_cast<int64_t>(r), requests[r].prompt, names[r]});
    who.push_back(r);
    chain[r] = PromptDigest(requests[r].prompt);
  }
  std::vector<uint32_t> next(requests.size());
  while (!pieces.empty()) {
    const std::vector<float> logits = decoder.Append(pieces, false);
    for (size_t i = 0; i < who.size(); ++i) {
      const size_t r = who[i];
      const std::span<const float> row =
          std::span(logits).subspan(i * static_cast<size_t>(c.vocab), static_cast<size_t>(c.vocab));
      const int64_t position = decoder.Length(static_cast<int64_t>(r));  // of the chosen token
      const uint32_t token = SampleToken(row, params, requests[r].id, position);
      Generation& g = out[r];
      g.tokens.push_back(token);
      chain[r] = ChainStep(chain[r], row);
      g.logits_chain.push_back(chain[r]);
      if (on_token) on_token(r, token);
      if (eod.has_value() && token == *eod) {
        g.stop = Stop::kEndOfDocument;
      } else if (static_cast<int64_t>(g.tokens.size()) == params.max_tokens) {
        g.stop = Stop::kMaxTokens;
      } else if (position == c.seq_len) {  // the model has no position left to read it at
        g.stop = Stop::kSeqLen;
      } else {
        continue;
      }
      done[r] = true;
    }
    pieces.clear();
    who.clear();
    for (size_t r = 0; r < requests.size(); ++r) {
      if (done[r]) continue;
      next[r] = out[r].tokens.back();
      pieces.push_back({static_cast<int64_t>(r), std::span(next).subspan(r, 1)});
      who.push_back(r);
    }
  }
  return out;
}

std::vector<Request> ParseBatch(std::string_view text, const data::Tokenizer* tokenizer,
                                const std::string& source) {
  std::vector<Request> requests;
  const std::vector<std::string> lines = Lines(text);
  if (lines.size() > kMaxRequests) {
    Fail("{}: {} lines, more requests than one generation may hold ({})", source, lines.size(),
         kMaxRequests);
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string what = fmt::format("{}: line {}", source, i + 1);
    const nlohmann::json line = ParseJsonStrict(lines[i], what);
    if (!line.is_object()) Fail("{}: not a JSON object", what);
    Request r{i, {}};
    if (line.contains("id")) {
      const std::string id = line.at("id").is_string() ? line.at("id").get<std::string>() : "";
      const std::optional<uint64_t> value = ParseDecimalU64(id);
      if (!value) {
        Fail("{}: id = {} (a decimal string from \"0\" to \"18446744073709551615\")", what,
             ShownJson(line.at("id")));
      }
      r.id = *value;
    }
    const bool text = line.contains("prompt"), ids = line.contains("prompt_tokens");
    if (text == ids) Fail("{}: give exactly one of \"prompt\" and \"prompt_tokens\"", what);
    if (line.size() != 1 + size_t(line.contains("id"))) {
      Fail("{}: keys other than \"id\", \"prompt\" and \"prompt_tokens\"", what);
    }
    if (text) {
      if (tokenizer == nullptr) Fail("{}: a text prompt needs --data (the tokenizer)", what);
      if (!line.at("prompt").is_string()) Fail("{}: prompt is not a string", what);
      r.prompt = tokenizer->Encode(line.at("prompt").get<std::string>(), what);
    } else {
      const nlohmann::json& list = line.at("prompt_tokens");
      if (!list.is_array()) Fail("{}: prompt_tokens is not an array", what);
      for (size_t k = 0; k < list.size(); ++k) {
        const uint64_t id = AsU64(list[k], fmt::format("{}: prompt_tokens[{}]", what, k));
        if (id >= data::kMaxVocab)
          Fail("{}: prompt_tokens[{}] = {} is not a token id", what, k, id);
        r.prompt.push_back(static_cast<uint32_t>(id));
      }
    }
    requests.push_back(std::move(r));
  }
  if (requests.empty()) Fail("{}: no requests", source);
  if (const auto shared = FirstSharedId(requests)) {
    Fail("{}: lines {} and {} have the same id {} (each request's draws are keyed by its id)",
         source, shared->first + 1, shared->second + 1, requests[shared->first].id);
  }
  return requests;
}

}  // namespace lockstep::infer
