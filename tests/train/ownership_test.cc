// Who holds what in a distributed run (OwnershipBounds, docs/distributed.md "What each rank holds"):
// whole hash chunks, one contiguous run of the parameters per rank, balanced to within a chunk,
// and large tensors split between ranks so that each rank's moments fall as 1/N.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lockstep/model.h"
#include "lockstep/state.h"
#include "lockstep/train.h"
#include "train/state_store.h"

namespace lockstep {
namespace {

struct Shares {
  std::vector<int64_t> elements;  // per rank
  int split_tensors = 0;          // tensors held by more than one rank
};

// Checks every structural property and returns each rank's share.
Shares Check(const std::vector<ParamSpec>& specs, int ranks, const std::string& what,
             int64_t unit = kHashChunkFloats) {
  SCOPED_TRACE(what + ", " + std::to_string(ranks) + " ranks, units of " + std::to_string(unit));
  const auto bounds = train::OwnershipBounds(specs, ranks, unit);
  EXPECT_EQ(bounds.size(), specs.size());
  Shares shares{std::vector<int64_t>(static_cast<size_t>(ranks), 0)};
  int last_rank = 0;  // the rank holding the last element seen, in parameter order
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::vector<int64_t>& b = bounds[i];
    const int64_t n = specs[i].numel();
    if (b.size() != static_cast<size_t>(ranks) + 1) {
      ADD_FAILURE() << specs[i].name << ": " << b.size() << " bounds";
      return shares;
    }
    EXPECT_EQ(b.front(), 0);
    EXPECT_EQ(b.back(), n);
    int holders = 0;
    for (int r = 0; r < ranks; ++r) {
      const int64_t begin = b[size_t(r)], end = b[size_t(r) + 1];
      EXPECT_LE(begin, end) << specs[i].name << " rank " << r;
      if (begin == end) continue;
      // Whole units: a range starts at a unit boundary.
      EXPECT_EQ(begin % unit, 0) << specs[i].name << " rank " << r;
      // One contiguous run per rank: ranks follow each other in parameter order.
      EXPECT_GE(r, last_rank) << specs[i].name;
      last_rank = r;
      shares.elements[size_t(r)] += end - begin;
      ++holders;
    }
    if (holders > 1) ++shares.split_tensors;
  }
  int64_t total = 0;
  for (const ParamSpec& spec : specs) total += spec.numel();
  for (int r = 0; r < ranks; ++r) {
    // Balanced to within one unit of the equal share (the midpoint rule).
    EXPECT_LE(std::abs(shares.elements[size_t(r)] * ranks - total), unit * ranks)
        << "rank " << r << " holds " << shares.elements[size_t(r)] << " of " << total;
  }
  return shares;
}

TEST(Ownership, OneRankHoldsEverything) {
  const std::vector<ParamSpec> specs = ParameterSpecs(LoadRunConfig("tiny").model);
  const auto bounds = train::OwnershipBounds(specs, 1);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(bounds[i], (std::vector<int64_t>{0, specs[i].numel()})) << specs[i].name;
  }
}

TEST(Ownership, WholeChunksContiguousAndBalancedAtEveryWorldSize) {
  for (const char* config : {"tiny-dp", "bench-8x512", "open-100m"}) {
    const std::vector<ParamSpec> specs = ParameterSpecs(LoadRunConfig(config).model);
    for (int ranks : {1, 2, 3, 4, 7, 8}) Check(specs, ranks, config);
  }
}

// Spilled ranks own whole spill chunks (their store's pieces), with the same rule.
TEST(Ownership, SpilledRanksOwnWholeSpillChunks) {
  const std::vector<ParamSpec> specs = ParameterSpecs(LoadRunConfig("open-100m").model);
  for (int ranks : {2, 3, 4, 7}) Check(specs, ranks, "open-100m", train::kSpillChunkFloats);
  EXPECT_THROW(train::OwnershipBounds(specs, 2, kHashChunkFloats + 1), Error);
}

TEST(Ownership, LargeTensorsAreSplitSoEachRanksShareFallsAsOneOverN) {
  // tiny-dp's embedding and head are three chunks each: the distributed tests' 4-rank runs
  // split them.
  const std::vector<ParamSpec> dp = ParameterSpecs(LoadRunConfig("tiny-dp").model);
  EXPECT_EQ(Check(dp, 4, "tiny-dp").split_tensors, 2);
  // open-100m's embedding and head are 42 % of it each; whole-tensor ownership would leave a
  // rank with one of them at any N. Split, every rank holds a quarter at N = 4.
  const std::vector<ParamSpec> big = ParameterSpecs(LoadRunConfig("open-100m").model);
  const Shares four = Check(big, 4, "open-100m");
  EXPECT_GE(four.split_tensors, 2);
  int64_t total = 0;
  for (const ParamSpec& spec : big) total += spec.numel();
  for (const int64_t share : four.elements) EXPECT_LE(share, total / 4 + kHashChunkFloats);
}

}  // namespace
}  // namespace lockstep
