// The state hash: pinned layout, independence from the thread count, and sensitivity to every
// component with the per-component digest naming what changed.
#include <bit>
#include <functional>

#include "state/state_fixtures.h"

namespace lockstep {
namespace {
using test::ExpectError;
using test::SampleState;

void FlipLowBit(float& x) { x = std::bit_cast<float>(std::bit_cast<uint32_t>(x) ^ 1u); }

TEST(StateHash, PinnedValueOfTheSampleState) {
  // The layout is normative (docs/formats/state-hash.md): this value is what
  // tests/state/sample_state_hash.py prints (tools/state_hash.py on the same state, built in
  // Python), and changes only with a deliberate, versioned layout change.
  const SampleState s;
  EXPECT_EQ(ToHex(ComputeStateHash(s.state, s.Tensors()).hash),
            "b5f7b3d85948c54c140701bb46bd57b2c090024df472a06ce125e96555eaad77");
}

TEST(StateHash, ComponentsInHashOrder) {
  const SampleState s;
  const StateHash h = ComputeStateHash(s.state, s.Tensors());
  std::vector<std::string> names;
  for (const auto& [name, digest] : h.components) names.push_back(name);
  EXPECT_EQ(names,
            (std::vector<std::string>{
                "prev_hash", "scalars", "descriptor", "tokens", "layout", "param:embed.weight",
                "m:embed.weight", "v:embed.weight", "grad:embed.weight", "param:final_norm.gain",
                "m:final_norm.gain", "v:final_norm.gain", "grad:final_norm.gain"}));
  EXPECT_EQ(h.components[0].second, s.state.prev_hash);
  EXPECT_EQ(h.components[3].second, s.state.tokens_digest);
  // An array of one chunk: H(u64(element count) || H(its little-endian bytes)).
  const Digest chunk = Blake2b().Update(s.arrays[0].param).Final();
  EXPECT_EQ(h.components[5].second, Blake2b().UpdateU64(12).Update(chunk).Final());
}

TEST(StateHash, ArrayDigestOfChunksHoweverFedAndOnAnyThreadCount) {
  const int64_t n = 3 * kHashChunkFloats + 5;
  std::vector<float> values(static_cast<size_t>(n), 0.0f);  // chunk 0 all zeros
  for (int64_t i = kHashChunkFloats; i < n; ++i) values[size_t(i)] = float(i % 77) - 38.0f;
  Blake2b by_definition;
  by_definition.UpdateU64(static_cast<uint64_t>(n));
  for (int64_t c = 0; c < n; c += kHashChunkFloats) {
    const auto chunk = std::span<const float>(values).subspan(
        size_t(c), size_t(std::min(kHashChunkFloats, n - c)));
    by_definition.Update(Blake2b().Update(chunk).Final());
  }
  const Digest expected = by_definition.Final();
  for (int threads : {1, 2, 3, 4, 7}) {
    SetThreads(threads);
    EXPECT_EQ(ArrayDigest(values), expected) << threads << " threads";
    for (const int64_t piece : {int64_t{1}, int64_t{1000}, kHashChunkFloats - 1, kHashChunkFloats,
                                2 * kHashChunkFloats + 1}) {
      ArrayHasher hasher;
      for (int64_t at = 0; at < n; at += piece) {
        hasher.Update(std::span<const float>(values).subspan(size_t(at),
                                                             size_t(std::min(piece, n - at))));
      }
      EXPECT_EQ(hasher.Final(), expected) << "pieces of " << piece << ", " << threads << " threads";
    }
  }
  SetThreads(1);
  EXPECT_EQ(ArrayDigest({}), Blake2b().UpdateU64(0).Final());
  // Chunk digests of a piece at a chunk boundary, combined, give the array's digest.
  std::vector<Digest> chunks = ChunkDigests(std::span<const float>(values).first(size_t(kHashChunkFloats)));
  const std::vector<Digest> rest = ChunkDigests(std::span<const float>(values).subspan(size_t(kHashChunkFloats)));
  chunks.insert(chunks.end(), rest.begin(), rest.end());
  EXPECT_EQ(ArrayDigestFromChunks(static_cast<uint64_t>(n), chunks), expected);
}

// Pieces hashed together (chunks of equal length side by side across pieces) give each chunk's
// BLAKE2b-256 as one stream computes it, for every shape of piece: empty, shorter than a chunk,
// whole chunks, a partial last chunk, a chunk of zeros (its known digest), and a piece starting
// 4 bytes into a buffer (its chunks are not 8 bytes apart from the others'), at any thread count.
TEST(StateHash, ChunkDigestsOfPiecesAreEachChunksDigest) {
  const int64_t c = kHashChunkFloats;
  std::vector<float> values(static_cast<size_t>(6 * c + 3));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1009) * 0.25f - 7.0f;
  std::fill(values.begin() + 2 * c, values.begin() + 3 * c, 0.0f);  // chunk 2: all zeros
  const std::span<const float> all(values);
  const std::vector<std::span<const float>> pieces = {
      all.first(0),          all.first(1000),         all.first(size_t(c)),
      all.first(size_t(3 * c)), all.subspan(1, size_t(c + 1000)), all.first(size_t(2 * c + 1000)),
      all.subspan(1, 1000),  all.first(size_t(c - 1))};
  for (const int threads : {1, 2, 3, 7}) {
    SetThreads(threads);
    const std::vector<std::vector<Digest>> got = ChunkDigestsOfPieces(pieces);
    ASSERT_EQ(got.size(), pieces.size());
    for (size_t p = 0; p < pieces.size(); ++p) {
      const auto n = static_cast<int64_t>(pieces[p].size());
      ASSERT_EQ(got[p].size(), static_cast<size_t>(ChunkCount(n))) << "piece " << p;
      for (int64_t k = 0; k < ChunkCount(n); ++k) {
        const auto chunk = pieces[p].subspan(size_t(k * c), size_t(std::min(c, n - k * c)));
        EXPECT_EQ(got[p][size_t(k)], Blake2b().Update(chunk).Final())
            << "piece " << p << ", chunk " << k << ", " << threads << " threads";
      }
      EXPECT_EQ(got[p], ChunkDigests(pieces[p])) << "piece " << p;
    }
  }
  SetThreads(1);
}

TEST(StateHash, SameAtAnyThreadCountAndWhenStreamed) {
  const SampleState s;
  SetThreads(1);
  const StateHash one = ComputeStateHash(s.state, s.Tensors());
  for (int threads : {2, 3, 7}) {
    SetThreads(threads);
    EXPECT_EQ(ComputeStateHash(s.state, s.Tensors()).hash, one.hash) << threads << " threads";
  }
  SetThreads(1);
  std::vector<TensorDigest> streamed;
  for (const TensorState& t : s.Tensors()) streamed.push_back(DigestTensor(t));
  const StateHash from_digests = StateHashFromDigests(s.state, streamed);
  EXPECT_EQ(from_digests.hash, one.hash);
  EXPECT_EQ(from_digests.components, one.components);
}

TEST(StateHash, EveryComponentChangesTheHashAndIsNamed) {
  struct Change {
    const char* what;
    std::function<void(SampleState&)> apply;
    std::vector<std::string> differing;
  };
  const std::vector<Change> changes = {
      {"param bit",
       [](SampleState& s) { FlipLowBit(s.arrays[0].param[4]); },
       {"param:embed.weight"}},
      {"-0.0 -> +0.0", [](SampleState& s) { s.arrays[0].param[5] = 0.0f; }, {"param:embed.weight"}},
      {"m bit", [](SampleState& s) { FlipLowBit(s.arrays[1].m[0]); }, {"m:final_norm.gain"}},
      {"v bit", [](SampleState& s) { FlipLowBit(s.arrays[0].v[11]); }, {"v:embed.weight"}},
      {"grad bit",
       [](SampleState& s) { FlipLowBit(s.arrays[1].grad[2]); },
       {"grad:final_norm.gain"}},
      {"step", [](SampleState& s) { s.state.step++; }, {"scalars"}},
      {"optimizer_step", [](SampleState& s) { s.state.optimizer_step++; }, {"scalars"}},
      {"lr", [](SampleState& s) { FlipLowBit(s.state.lr); }, {"scalars"}},
      {"grad_norm", [](SampleState& s) { FlipLowBit(s.state.grad_norm); }, {"scalars"}},
      {"clip_factor", [](SampleState& s) { s.state.clip_factor = 1.0f; }, {"scalars"}},
      {"skipped", [](SampleState& s) { s.state.skipped = true; }, {"scalars"}},
      {"rng_seed", [](SampleState& s) { s.state.rng_seed ^= 1u << 20; }, {"scalars"}},
      {"rng_counter", [](SampleState& s) { s.state.rng_counter++; }, {"scalars"}},
      {"data_cursor", [](SampleState& s) { s.state.data_cursor++; }, {"scalars"}},
      {"spike total", [](SampleState& s) { s.state.spike.total_skips++; }, {"scalars"}},
      {"spike window", [](SampleState& s) { s.state.spike.recent_skips = {4}; }, {"scalars"}},
      {"spike window size",
       [](SampleState& s) { s.state.spike.recent_skips.push_back(5); },
       {"scalars"}},
      {"tokens", [](SampleState& s) { s.state.tokens_digest[31] ^= 1; }, {"tokens"}},
      {"descriptor", [](SampleState& s) { s.state.descriptor.back() = ' '; }, {"descriptor"}},
      {"prev_hash", [](SampleState& s) { s.state.prev_hash[0] ^= 0x80; }, {"prev_hash"}},
      {"shape", [](SampleState& s) { s.arrays[0].shape.assign({3, 4}); }, {"layout"}},
      // Components are matched by name: reordering tensors shows up in the layout only.
      {"order", [](SampleState& s) { std::swap(s.arrays[0], s.arrays[1]); }, {"layout"}},
  };
  const SampleState base;
  const StateHash base_hash = ComputeStateHash(base.state, base.Tensors());
  for (const Change& change : changes) {
    SampleState changed;
    change.apply(changed);
    const StateHash h = ComputeStateHash(changed.state, changed.Tensors());
    EXPECT_NE(h.hash, base_hash.hash) << change.what;
    EXPECT_EQ(DifferingComponents(base_hash, h), change.differing) << change.what;
  }
}

TEST(StateHash, RejectsInconsistentTensors) {
  SampleState s;
  std::vector<TensorState> tensors = s.Tensors();
  tensors[1].v = tensors[1].v.first(2);
  ExpectError([&] { ComputeStateHash(s.state, tensors); },
              {"'final_norm.gain'", "v has 2 elements", "[3] has 3"});
  tensors = s.Tensors();
  tensors[1].name = tensors[0].name;
  ExpectError([&] { ComputeStateHash(s.state, tensors); }, {"duplicate", "'embed.weight'"});
}

TEST(StateHash, ZeroArrayDigestIsTheDigestOfZeros) {
  for (const int64_t n : {int64_t{0}, int64_t{1}, kHashChunkFloats - 1, kHashChunkFloats,
                          kHashChunkFloats + 5, 3 * kHashChunkFloats}) {
    const std::vector<float> zeros(static_cast<size_t>(n), 0.0f);
    EXPECT_EQ(ZeroArrayDigest(static_cast<uint64_t>(n)), ArrayDigest(zeros)) << n;
  }
}

}  // namespace
}  // namespace lockstep
