// core's Merkle tree (traces, signed chains) against its definition (docs/disputes.md: RFC 6962's shape with
// BLAKE2b-256), inclusion proofs for every leaf of trees of 1..33 leaves, and the step bisection
// on synthetic chains.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lockstep/dispute.h"

namespace lockstep::dispute {
namespace {

Digest H(std::initializer_list<std::span<const uint8_t>> parts) {
  Blake2b h;
  for (auto p : parts) h.Update(p);
  return h.Final();
}

// The definition, written out independently: MTH({d0}) = H(0x00 || d0); MTH(D[n]) =
// H(0x01 || MTH(D[0:k]) || MTH(D[k:n])) with k the largest power of two < n.
Digest Definition(const std::vector<std::string>& records, size_t lo, size_t hi) {
  const uint8_t leaf = 0, node = 1;
  if (hi - lo == 1) {
    return H({{&leaf, 1}, {reinterpret_cast<const uint8_t*>(records[lo].data()), records[lo].size()}});
  }
  size_t k = 1;
  while (k * 2 < hi - lo) k *= 2;
  const Digest l = Definition(records, lo, lo + k), r = Definition(records, lo + k, hi);
  return H({{&node, 1}, l, r});
}

TEST(Merkle, RootFollowsTheDefinitionAndEveryLeafProvesItsPlace) {
  EXPECT_EQ(MerkleRoot({}), Blake2b().Final());
  for (size_t n = 1; n <= 33; ++n) {
    std::vector<std::string> records;
    std::vector<Digest> leaves;
    for (size_t i = 0; i < n; ++i) {
      records.push_back("{\"index\":" + std::to_string(i) + "}");
      leaves.push_back(LeafHash(records.back()));
    }
    const Digest root = MerkleRoot(leaves);
    EXPECT_EQ(root, Definition(records, 0, n)) << n;
    for (size_t i = 0; i < n; ++i) {
      std::vector<Digest> proof = InclusionProof(leaves, i);
      EXPECT_TRUE(VerifyInclusion(leaves[i], i, n, proof, root)) << n << " " << i;
      if (n > 1) {
        EXPECT_FALSE(VerifyInclusion(leaves[(i + 1) % n], i, n, proof, root)) << n << " " << i;
        proof[0][0] ^= 1;
        EXPECT_FALSE(VerifyInclusion(leaves[i], i, n, proof, root)) << n << " " << i;
      }
    }
  }
}

Digest D(uint8_t v) {
  Digest d{};
  d[0] = v;
  return d;
}

TEST(DisputeSteps, FullSparseAndFirstStepDivergence) {
  std::map<uint64_t, Digest> a, b;
  for (uint64_t s = 0; s <= 16; ++s) {
    a[s] = D(static_cast<uint8_t>(s));
    b[s] = D(static_cast<uint8_t>(s < 11 ? s : 100 + s));
  }
  StepsVerdict v = DisputeSteps(a, b);
  EXPECT_TRUE(v.diverged && v.located);
  EXPECT_EQ(v.first_divergent, 11u);
  EXPECT_EQ(v.last_agreed, 10u);
  EXPECT_EQ(v.queries, 0);
  EXPECT_FALSE(DisputeSteps(a, a).diverged);
  // An empty chain, or two with no step in common, is refused: no verdict would mean anything.
  EXPECT_THROW(DisputeSteps(a, {}), Error);
  EXPECT_THROW(DisputeSteps({}, b), Error);
  EXPECT_THROW(DisputeSteps({{3, D(3)}}, {{4, D(4)}}), Error);

  // B commits every 8th step; asked, it answers from its full history. log2(8) = 3 questions.
  std::map<uint64_t, Digest> sparse;
  for (const auto& [s, h] : b) {
    if (s % 8 == 0) sparse[s] = h;
  }
  v = DisputeSteps(a, sparse, [&](int party, uint64_t step) -> std::optional<Digest> {
    return (party == 0 ? a : b).at(step);
  });
  EXPECT_EQ(v.first_differing, 16u);
  EXPECT_EQ(v.first_divergent, 11u);
  EXPECT_TRUE(v.located);
  EXPECT_EQ(v.queries, 3);
  // Unanswered: only the interval (8, 16] is known.
  v = DisputeSteps(a, sparse);
  EXPECT_FALSE(v.located);
  EXPECT_EQ(v.last_agreed, 8u);
  EXPECT_EQ(v.first_divergent, 16u);

  // Different from the init on.
  std::map<uint64_t, Digest> c = {{0, D(200)}, {1, D(201)}};
  v = DisputeSteps(a, c);
  EXPECT_TRUE(v.diverged && v.located);
  EXPECT_FALSE(v.agreed);
  EXPECT_EQ(v.first_divergent, 0u);
}

}  // namespace
}  // namespace lockstep::dispute
