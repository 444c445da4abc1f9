// The chained state hash. The byte layout is normative and documented, field by field, in
// docs/formats/state-hash.md; tools/state_hash.py recomputes it independently.
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <bit>
#include <map>
#include <set>

#include "lockstep/state.h"
#include "state/internal.h"

namespace lockstep {
namespace {

// Version tag of the layout: any change to what is hashed or how bumps it.
constexpr std::string_view kStateHashTag{"lockstep/state-hash/v2\0", 23};
static_assert(kStateHashFormatVersion == 2, "the tag names the layout's version");

using state_internal::kStateArrays;

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
// A chunk of zeros, which init states and skipped gradients are mostly made of, and its
// digest: hashed once.
std::span<const float> ZeroChunk() {
  static const std::vector<float> zeros(static_cast<size_t>(kHashChunkFloats), 0.0f);
  return zeros;
}
const Digest& ZeroChunkDigest() {
  static const Digest digest = Blake2b().Update(ZeroChunk()).Final();
  return digest;
}

bool AllZeroBits(std::span<const float> values) {
  const auto* words = reinterpret_cast<const uint32_t*>(values.data());
  return std::all_of(words, words + values.size(), [](uint32_t w) { return w == 0; });
}

}  // namespace

std::vector<std::vector<Digest>> ChunkDigestsOfPieces(std::span<const std::span<const float>> pieces) {
  // Every chunk of every piece is a message; messages of one length (the full chunks, and each
  // length of last chunk) are hashed side by side in tasks of up to kGroup, across pieces, so
  // small arrays fill the lanes too. A full chunk of zeros gets its known digest.
  constexpr size_t kGroup = 8;
  struct Message {
    const uint8_t* bytes;
    Digest* out;
  };
  std::vector<std::vector<Digest>> digests(pieces.size());
  std::map<size_t, std::vector<Message>> by_length;  // bytes -> messages
  for (size_t p = 0; p < pieces.size(); ++p) {
    const std::span<const float> piece = pieces[p];
    const auto n = static_cast<int64_t>(piece.size());
    digests[p].resize(static_cast<size_t>(ChunkCount(n)));
    for (int64_t c = 0; c < ChunkCount(n); ++c) {
      const int64_t floats = std::min(kHashChunkFloats, n - c * kHashChunkFloats);
      by_length[static_cast<size_t>(floats) * sizeof(float)].push_back(
          {reinterpret_cast<const uint8_t*>(piece.data() + c * kHashChunkFloats),
           &digests[p][static_cast<size_t>(c)]});
    }
  }
  struct Task {
    size_t bytes;
    std::span<const Message> messages;
  };
  std::vector<Task> tasks;
  for (const auto& [bytes, messages] : by_length) {
    for (size_t i = 0; i < messages.size(); i += kGroup) {
      tasks.push_back({bytes, std::span(messages).subspan(i, std::min(kGroup, messages.size() - i))});
    }
  }
  ZeroChunkDigest();  // made here: ParallelFor bodies must not throw
  Blake2bImplementation();
  constexpr size_t kChunkBytes = sizeof(float) * kHashChunkFloats;
  ParallelFor(static_cast<int64_t>(tasks.size()), [&](int64_t t) {
    const Task& task = tasks[static_cast<size_t>(t)];
    std::array<const uint8_t*, kGroup> hashed;
    std::array<Digest*, kGroup> outs;
    size_t count = 0;
    for (const Message& m : task.messages) {
      const auto* floats = reinterpret_cast<const float*>(m.bytes);
      if (task.bytes == kChunkBytes && AllZeroBits({floats, static_cast<size_t>(kHashChunkFloats)})) {
        *m.out = ZeroChunkDigest();
      } else {
        hashed[count] = m.bytes;
        outs[count++] = m.out;
      }
    }
    std::array<Digest, kGroup> got;
    Blake2b256Many(std::span(hashed).first(count), task.bytes, got.data());
    for (size_t i = 0; i < count; ++i) *outs[i] = got[i];
  });
  return digests;
}

std::vector<Digest> ChunkDigests(std::span<const float> piece) {
  return std::move(ChunkDigestsOfPieces({&piece, 1})[0]);
}

Digest ArrayDigestFromChunks(uint64_t elements, std::span<const Digest> chunks) {
  if (chunks.size() != static_cast<size_t>(ChunkCount(static_cast<int64_t>(elements)))) {
    Fail("array digest: {} chunk digests for {} elements (expected {})", chunks.size(), elements,
         ChunkCount(static_cast<int64_t>(elements)));
  }
  Blake2b h;
  h.UpdateU64(elements);
  for (const Digest& chunk : chunks) h.Update(chunk);
  return h.Final();
}

Digest ArrayDigest(std::span<const float> values) {
  return ArrayDigestFromChunks(values.size(), ChunkDigests(values));
}

ArrayHasher& ArrayHasher::Update(std::span<const float> piece) {
  elements_ += piece.size();
  while (!piece.empty()) {
    if (partial_floats_ == 0 && piece.size() >= static_cast<size_t>(kHashChunkFloats)) {
      // Whole chunks straight from the piece, in parallel.
      const size_t whole = piece.size() - piece.size() % static_cast<size_t>(kHashChunkFloats);
      const std::vector<Digest> digests = ChunkDigests(piece.first(whole));
      chunks_.insert(chunks_.end(), digests.begin(), digests.end());
      piece = piece.subspan(whole);
      continue;
    }
    const size_t take =
        std::min(piece.size(), static_cast<size_t>(kHashChunkFloats - partial_floats_));
    partial_.Update(piece.first(take));
    partial_floats_ += static_cast<int64_t>(take);
    piece = piece.subspan(take);
    if (partial_floats_ == kHashChunkFloats) {
      chunks_.push_back(partial_.Final());
      partial_ = Blake2b();
      partial_floats_ = 0;
    }
  }
  return *this;
}

Digest ZeroArrayDigest(uint64_t elements) {
  const uint64_t whole = elements / kHashChunkFloats, rest = elements % kHashChunkFloats;
  std::vector<Digest> chunks(whole, ZeroChunkDigest());
  if (rest > 0) chunks.push_back(Blake2b().Update(ZeroChunk().first(rest)).Final());
  return ArrayDigestFromChunks(elements, chunks);
}

Digest ArrayHasher::Final() {
  if (partial_floats_ > 0) chunks_.push_back(partial_.Final());
  partial_floats_ = 0;
  return ArrayDigestFromChunks(elements_, chunks_);
}

void state_internal::CheckTensorState(const TensorState& t) {
  if (t.name.empty()) Fail("state hash: a tensor has an empty name");
  const std::string what = fmt::format("state hash: tensor '{}'", t.name);
  const uint64_t count = ElementCount(t.shape, what);
  for (int a = 0; a < kStateArrayCount; ++a) {
    const std::span<const float> values = t.*kStateArrays[a];
    const bool by_digest = a == static_cast<int>(StateArray::kGrad) && values.empty() &&
                           t.grad_digest.has_value();
    if (values.size() != count && !by_digest) {
      Fail("{}: {} has {} elements but shape [{}] has {}", what, kStateArrayNames[a],
           values.size(), fmt::join(t.shape, ", "), count);
    }
  }
}

bool state_internal::HasGradElements(const TensorState& t) {
  return t.grad.size() == ElementCount(t.shape, t.name);
}

Digest state_internal::CheckedGradDigest(const TensorState& t, const Digest& of_elements) {
  if (t.grad_digest && *t.grad_digest != of_elements) {
    Fail("state hash: tensor '{}': the gradient's elements hash to {}, but its recorded digest is "
         "{}",
         t.name, ToHex(of_elements), ToHex(*t.grad_digest));
  }
  return of_elements;
}

TensorDigest DigestTensor(const TensorState& tensor) {
  state_internal::CheckTensorState(tensor);
  TensorDigest d{.name = tensor.name, .shape = tensor.shape};
  for (int a = 0; a < kStateArrayCount; ++a) {
    if (a == static_cast<int>(StateArray::kGrad)) continue;
    d.*kDigestArrays[a] = ArrayDigest(tensor.*kStateArrays[a]);
  }
  d.grad = state_internal::HasGradElements(tensor)
               ? state_internal::CheckedGradDigest(tensor, ArrayDigest(tensor.grad))
               : *tensor.grad_digest;
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
  // Every array hashed here, and where its digest goes: all their chunks are hashed together,
  // so that the lanes fill across arrays (a small model's arrays are of one to three chunks
  // each: hashed one array at a time, they would leave the lanes mostly empty).
  std::vector<std::span<const float>> pieces;
  std::vector<Digest*> outs;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorState& t = tensors[i];
    state_internal::CheckTensorState(t);
    digests[i].name = t.name;
    digests[i].shape = t.shape;
    for (int a = 0; a < kStateArrayCount; ++a) {
      if (a == static_cast<int>(StateArray::kGrad) && !state_internal::HasGradElements(t)) {
        digests[i].grad = *t.grad_digest;
        continue;
      }
      pieces.push_back(t.*kStateArrays[a]);
      outs.push_back(&(digests[i].*kDigestArrays[a]));
    }
  }
  const std::vector<std::vector<Digest>> chunks = ChunkDigestsOfPieces(pieces);
  for (size_t k = 0; k < pieces.size(); ++k) {
    *outs[k] = ArrayDigestFromChunks(pieces[k].size(), chunks[k]);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (state_internal::HasGradElements(tensors[i])) {
      state_internal::CheckedGradDigest(tensors[i], digests[i].grad);
    }
  }
  return StateHashFromDigests(state, digests);
}

const Digest& ComponentDigest(const StateHash& hash, std::string_view component) {
  for (const auto& [name, digest] : hash.components) {
    if (name == component) return digest;
  }
  Fail("state hash: no component '{}'", component);
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
