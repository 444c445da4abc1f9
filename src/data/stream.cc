// The canonical token stream of docs/formats/stream.md: per-epoch Fisher-Yates shuffle of the
// documents driven by Philox, packing with the end-of-document token, fixed windows over the
// endless packing.
#include <algorithm>

#include "lockstep/data.h"

namespace lockstep::data {
namespace {
// Philox counter word 3 of every shuffle draw: separates these draws from any other Philox
// stream keyed by the same seed. ASCII "shuf", little-endian.
constexpr uint32_t kShuffleTag = 0x66756873;
}  // namespace

struct TokenStream::Epoch {
  uint64_t number;
  std::vector<uint32_t> order;   // order[k] = global index of the k-th document of the epoch
  std::vector<uint64_t> starts;  // starts[k] = packed position of order[k]; starts[n] = epoch size
};

TokenStream::TokenStream(const Dataset& dataset, uint64_t seed, uint32_t seq_len)
    : dataset_(dataset),
      seed_(seed),
      seq_len_(seq_len),
      epoch_tokens_(dataset.total_tokens() + dataset.num_documents()) {
  if (seq_len == 0) Fail("TokenStream over {}: seq_len must be at least 1", dataset.dir().string());
}

TokenStream::~TokenStream() = default;

std::shared_ptr<const TokenStream::Epoch> TokenStream::GetEpoch(uint64_t epoch) const {
  std::lock_guard lock(cache_mutex_);
  const auto hit =
      std::find_if(cache_.begin(), cache_.end(), [&](const auto& e) { return e->number == epoch; });
  if (hit != cache_.end()) {
    std::rotate(cache_.begin(), hit, hit + 1);
    return cache_.front();
  }
  auto e = std::make_shared<Epoch>();
  e->number = epoch;
  const uint64_t n = dataset_.num_documents();  // below 2^32: OpenDataset checks
  e->order.resize(n);
  for (uint64_t k = 0; k < n; ++k) e->order[k] = static_cast<uint32_t>(k);
  // Fisher-Yates, j from n-1 down to 1, swapping order[j] with order[r], r uniform in [0, j].
  // r = floor(x * (j + 1) / 2^64) for the 64-bit draw x: the multiply-shift map of Lemire
  // (2019) without rejection. Each r has probability within (j + 1) / 2^64 < 2^-32 of exact,
  // far below anything a training run could detect, and every draw costs exactly one Philox
  // call, which keeps the definition simple to reimplement.
  const PhiloxKey key = PhiloxKeyFromSeed(seed_);
  for (uint64_t j = n - 1; j >= 1; --j) {
    const PhiloxCounter w = Philox4x32({static_cast<uint32_t>(j), static_cast<uint32_t>(epoch),
                                        static_cast<uint32_t>(epoch >> 32), kShuffleTag},
                                       key);
    const uint64_t x = uint64_t{w[0]} | uint64_t{w[1]} << 32;
    const auto r = static_cast<uint64_t>((static_cast<unsigned __int128>(x) * (j + 1)) >> 64);
    std::swap(e->order[j], e->order[r]);
  }
  e->starts.resize(n + 1);
  e->starts[0] = 0;
  for (uint64_t k = 0; k < n; ++k) {
    e->starts[k + 1] = e->starts[k] + dataset_.Document(e->order[k]).size() + 1;  // + eod
  }
  cache_.insert(cache_.begin(), std::move(e));
  if (cache_.size() > kCachedEpochs) cache_.pop_back();
  return cache_.front();
}

std::vector<uint32_t> TokenStream::EpochOrder(uint64_t epoch) const {
  return GetEpoch(epoch)->order;
}

void TokenStream::Window(uint64_t i, std::span<uint32_t> out) const {
  if (out.size() != uint64_t{seq_len_} + 1) {
    Fail("TokenStream::Window({}): output has {} tokens, expected seq_len + 1 = {}", i, out.size(),
         uint64_t{seq_len_} + 1);
  }
  if (i > (UINT64_MAX - seq_len_) / seq_len_) {
    Fail("TokenStream::Window({}): the window lies beyond position 2^64 (seq_len {})", i, seq_len_);
  }
  const uint64_t start = i * seq_len_;
  size_t filled = 0;
  while (filled < out.size()) {  // one pass per epoch the window touches
    const uint64_t position = start + filled;
    const std::shared_ptr<const Epoch> epoch = GetEpoch(position / epoch_tokens_);
    const uint64_t offset = position % epoch_tokens_;
    size_t k = std::upper_bound(epoch->starts.begin(), epoch->starts.end(), offset) -
               epoch->starts.begin() - 1;
    uint64_t within = offset - epoch->starts[k];  // into document k's tokens + its eod
    for (; k < epoch->order.size() && filled < out.size(); ++k, within = 0) {
      const std::span<const uint32_t> doc = dataset_.Document(epoch->order[k]);
      if (within < doc.size()) {
        const size_t n = std::min<uint64_t>(doc.size() - within, out.size() - filled);
        std::copy_n(doc.begin() + within, n, out.begin() + filled);
        filled += n;
      }
      if (filled < out.size()) out[filled++] = dataset_.vocabulary().eod;
    }
  }
}

}  // namespace lockstep::data
