// Choosing a token from logits: docs/numerics.md, "Sampling", written as the order it states.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "lockstep/infer.h"

namespace lockstep::infer {

uint32_t SampleToken(std::span<const float> logits, const SamplingParams& params, uint64_t request,
                     int64_t position) {
  const auto vocab = static_cast<uint32_t>(logits.size());
  if (vocab == 0) Fail("SampleToken: no logits");
  for (uint32_t i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) {
      Fail("request {}, position {}: logit {} is NaN; no token can be chosen", request, position,
           i);
    }
  }
  // Greedy: the largest logit, the lowest id among equals.
  const auto greedy = [&] {
    return static_cast<uint32_t>(std::ranges::max_element(logits) - logits.begin());
  };
  if (params.temperature == 0) return greedy();
  std::vector<float> scaled(vocab);
  for (uint32_t i = 0; i < vocab; ++i) scaled[i] = logits[i] / params.temperature;
  // Candidates by scaled logit, largest first, the lower id first among equals; the first top_k.
  std::vector<uint32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0u);
  const auto before = [&](uint32_t a, uint32_t b) {
    return scaled[a] > scaled[b] || (scaled[a] == scaled[b] && a < b);
  };
  const uint32_t keep =
      params.top_k > 0 ? static_cast<uint32_t>(std::min<int64_t>(params.top_k, vocab)) : vocab;
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), before);
  order.resize(keep);
  // A first candidate that is not finite (the division overflowed, or every logit is -inf) has
  // no weights: the limit of sampling as T goes to 0, the greedy token.
  const float max = scaled[order[0]];
  if (!std::isfinite(max)) return greedy();
  // Weights exp(s - max) and their sum, sequentially in candidate order.
  std::vector<float> weight(keep);
  float total = 0.0f;
  for (uint32_t j = 0; j < keep; ++j) {
    weight[j] = dmath::Exp(scaled[order[j]] - max);
    total += weight[j];
  }
  // Nucleus: the shortest prefix whose running sum reaches top_p * total.
  uint32_t kept = keep;
  float kept_total = total;
  if (params.top_p < 1.0f) {
    const float threshold = params.top_p * total;
    float running = 0.0f;
    for (uint32_t j = 0; j < keep; ++j) {
      running += weight[j];
      if (running >= threshold) {
        kept = j + 1;
        kept_total = running;
        break;
      }
    }
  }
  // One draw: u in [0, 1) from the top 24 bits of the first Philox word.
  const PhiloxCounter counter = {static_cast<uint32_t>(request),
                                 static_cast<uint32_t>(request >> 32),
                                 static_cast<uint32_t>(position),
                                 static_cast<uint32_t>(static_cast<uint64_t>(position) >> 32)};
  const uint32_t word = Philox4x32(counter, PhiloxKeyFromSeed(params.seed))[0];
  const float target = static_cast<float>(word >> 8) * 0x1p-24f * kept_total;
  float running = 0.0f;
  for (uint32_t j = 0; j < kept; ++j) {
    running += weight[j];
    if (target < running) return order[j];
  }
  return order[kept - 1];
}

}  // namespace lockstep::infer
