// The chained state hash. The byte layout is normative and documented, field by field, in
// docs/formats/state-hash.md; tools/state_hash.py recomputes it independently.
#include <fmt/ranges.h>

#include <array>
#include <bit>
#include <set>

#include "lockstep/state.h"
#include "state/internal.h"

namespace lockstep {
namespace {

// Version tag of the layout: any change to what is hashed or how bumps it.
constexpr std::string_view kStateHashTag{"lockstep/state-hash/v1\0", 23};

using state_internal::kDigestArrays, state_internal::kStateArrayNames;
using state_internal::kStateArrays;

Digest DigestOf(std::span<const float> values) { return Blake2b().Update(values).Final(); }
Digest DigestOf(std::string_view text) { return Blake2b().Update(text).Final(); }

Digest ScalarsDigest(const StepState& s) {
  Blake2b h;
  h.UpdateU64(s.step).UpdateU64(s.optimizer_step);
  h.UpdateU32(std::bit_cast<uint32_t>(s.lr))
      .UpdateU32(std::bit_cast<uint32_t>(s.grad_norm))
      .UpdateU32(std::bit_cast<uint32_t>(s.clip_factor))
      .UpdateU32(s.skipped ? 1 : 0);
  h.UpdateU64(s.rng_seed).UpdateU64(s.rng_counter).UpdateU64(s.data_cursor);
  h.UpdateU64(s.spike.total_skips).UpdateU64(s.spike.recent_skips.size());
  for (uint64_t step : s.spike.recent_skips) h.UpdateU64(step);
  return h.Final();
}

// Names and shapes, so that renaming or reshaping a tensor changes the hash even when its
// bytes do not.
Digest LayoutDigest(std::span<const TensorDigest> tensors) {
  Blake2b h;
  h.UpdateU64(tensors.size());
  for (const TensorDigest& t : tensors) {
    h.UpdateU32(static_cast<uint32_t>(t.name.size())).Update(t.name);
    h.UpdateU32(static_cast<uint32_t>(t.shape.size()));
    for (int64_t dim : t.shape) h.UpdateU64(static_cast<uint64_t>(dim));
  }
  return h.Final();
}
}  // namespace

void state_internal::CheckTensorState(const TensorState& t) {
  if (t.name.empty()) Fail("state hash: a tensor has an empty name");
  const std::string what = fmt::format("state hash: tensor '{}'", t.name);
  const uint64_t count = ElementCount(t.shape, what);
  for (int a = 0; a < kStateArrayCount; ++a) {
    const std::span<const float> values = t.*kStateArrays[a];
    if (values.size() != count) {
      Fail("{}: {} has {} elements but shape [{}] has {}", what, kStateArrayNames[a],
           values.size(), fmt::join(t.shape, ", "), count);
    }
  }
}

TensorDigest DigestTensor(const TensorState& tensor) {
  state_internal::CheckTensorState(tensor);
  TensorDigest d{.name = tensor.name, .shape = tensor.shape};
  for (int a = 0; a < kStateArrayCount; ++a) {
    d.*kDigestArrays[a] = DigestOf(tensor.*kStateArrays[a]);
  }
  return d;
}

StateHash StateHashFromDigests(const StepState& state, std::span<const TensorDigest> tensors) {
  std::set<std::string_view> names;
  for (const TensorDigest& t : tensors) {
    if (t.name.empty()) Fail("state hash: a tensor has an empty name");
    if (!names.insert(t.name).second) Fail("state hash: duplicate tensor name '{}'", t.name);
  }
  StateHash result;
  auto& c = result.components;
  c.emplace_back("prev_hash", state.prev_hash);
  c.emplace_back("scalars", ScalarsDigest(state));
  c.emplace_back("descriptor", DigestOf(state.descriptor));
  c.emplace_back("tokens", state.tokens_digest);
  c.emplace_back("layout", LayoutDigest(tensors));
  for (const TensorDigest& t : tensors) {
    for (int a = 0; a < kStateArrayCount; ++a) {
      c.emplace_back(fmt::format("{}:{}", kStateArrayNames[a], t.name), t.*kDigestArrays[a]);
    }
  }
  Blake2b h;
  h.Update(kStateHashTag);
  for (const auto& [name, digest] : c) h.Update(digest);
  result.hash = h.Final();
  return result;
}

StateHash ComputeStateHash(const StepState& state, std::span<const TensorState> tensors) {
  std::vector<TensorDigest> digests(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    state_internal::CheckTensorState(tensors[i]);
    digests[i].name = tensors[i].name;
    digests[i].shape = tensors[i].shape;
  }
  Blake2b();  // initialises libsodium here: ParallelFor bodies must not throw
  // One task per array: the digests land in fixed slots, so the thread count cannot matter.
  ParallelFor(static_cast<int64_t>(kStateArrayCount * tensors.size()), [&](int64_t task) {
    const size_t i = static_cast<size_t>(task) / kStateArrayCount;
    const size_t a = static_cast<size_t>(task) % kStateArrayCount;
    digests[i].*kDigestArrays[a] = DigestOf(tensors[i].*kStateArrays[a]);
  });
  return StateHashFromDigests(state, digests);
}

std::vector<std::string> DifferingComponents(const StateHash& a, const StateHash& b) {
  const std::map<std::string, Digest> in_b(b.components.begin(), b.components.end());
  std::set<std::string> seen;
  std::vector<std::string> differing;
  for (const auto& [name, digest] : a.components) {
    seen.insert(name);
    const auto it = in_b.find(name);
    if (it == in_b.end() || it->second != digest) differing.push_back(name);
  }
  for (const auto& [name, digest] : b.components) {
    if (!seen.contains(name)) differing.push_back(name);
  }
  return differing;
}

}  // namespace lockstep
