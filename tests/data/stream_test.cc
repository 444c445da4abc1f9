// The canonical stream: windows are a pure function of (seed, manifest, seq_len, i), whatever
// order or threads read them, and follow the packing of docs/formats/stream.md exactly.
#include <algorithm>
#include <numeric>
#include <thread>

#include "data/data_test_util.h"

namespace lockstep::data {
namespace {
using testing::TempDir;
using testing::Tokens;
using testing::WriteDataset;

// Documents of lengths 0..12 with distinct contents, spread over several shards.
std::vector<std::vector<uint32_t>> VariedDocuments(size_t count) {
  std::vector<std::vector<uint32_t>> docs(count);
  for (size_t d = 0; d < count; ++d) {
    for (size_t j = 0; j < (d * 5) % 13; ++j)
      docs[d].push_back(static_cast<uint32_t>((d * 31 + j) % 256));
  }
  return docs;
}

// The packed stream written out naively from EpochOrder: epochs 0..epochs-1 back to back.
std::vector<uint32_t> NaivePacking(const Dataset& ds, const TokenStream& stream, uint64_t epochs) {
  std::vector<uint32_t> packed;
  for (uint64_t e = 0; e < epochs; ++e) {
    for (uint32_t d : stream.EpochOrder(e)) {
      const auto doc = ds.Document(d);
      packed.insert(packed.end(), doc.begin(), doc.end());
      packed.push_back(kEodToken);
    }
  }
  return packed;
}

std::vector<std::vector<uint32_t>> ReadWindows(const TokenStream& stream,
                                               const std::vector<uint64_t>& indices,
                                               uint64_t count) {
  std::vector<std::vector<uint32_t>> windows(count, std::vector<uint32_t>(stream.seq_len() + 1));
  for (uint64_t i : indices) stream.Window(i, windows[i]);
  return windows;
}

class StreamTest : public ::testing::Test {
 protected:
  void SetUp() override { WriteDataset(tmp_ / "ds", VariedDocuments(40), 50); }
  TempDir tmp_;
};

TEST_F(StreamTest, WindowsAreSlicesOfThePackedEpochsAcrossEpochBoundaries) {
  const Dataset ds = OpenDataset(tmp_ / "ds");
  ASSERT_GT(ds.shards().size(), 3u);
  for (uint32_t seq_len : {1u, 7u, 64u, 300u}) {
    const TokenStream stream(ds, 1234, seq_len);
    EXPECT_EQ(stream.epoch_tokens(), ds.total_tokens() + ds.num_documents());
    const std::vector<uint32_t> packed = NaivePacking(ds, stream, 5);
    const uint64_t windows = (packed.size() - 1) / seq_len;  // those inside 5 epochs
    std::vector<uint32_t> w(seq_len + 1);
    for (uint64_t i = 0; i < windows; ++i) {
      stream.Window(i, w);
      ASSERT_TRUE(std::equal(w.begin(), w.end(), packed.begin() + i * seq_len))
          << "seq_len " << seq_len << " window " << i;
    }
  }
}

TEST_F(StreamTest, SameWindowsInOrderInReverseAndFromSeveralThreads) {
  const Dataset ds = OpenDataset(tmp_ / "ds");
  constexpr uint64_t kCount = 200;  // about 7 epochs at seq_len 33
  std::vector<uint64_t> forward(kCount);
  std::iota(forward.begin(), forward.end(), 0);
  const std::vector<uint64_t> reverse(forward.rbegin(), forward.rend());

  const auto in_order = ReadWindows(TokenStream(ds, 9, 33), forward, kCount);
  EXPECT_EQ(ReadWindows(TokenStream(ds, 9, 33), reverse, kCount), in_order);

  const TokenStream shared(ds, 9, 33);
  std::vector<std::vector<uint32_t>> threaded(kCount, std::vector<uint32_t>(34));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = t; i < kCount; i += 4)
        shared.Window(kCount - 1 - i, threaded[kCount - 1 - i]);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(threaded, in_order);

  for (uint64_t i = 0; i + 1 < kCount; ++i) {
    EXPECT_EQ(in_order[i].back(), in_order[i + 1].front()) << "windows " << i << ", " << i + 1;
  }
}

TEST_F(StreamTest, EveryDocumentOncePerEpochAndTheSeedChangesTheOrder) {
  const Dataset ds = OpenDataset(tmp_ / "ds");
  const TokenStream stream(ds, 5, 16);
  std::vector<uint32_t> identity(ds.num_documents());
  std::iota(identity.begin(), identity.end(), 0);
  std::vector<std::vector<uint32_t>> orders;
  for (uint64_t e : {0, 1, 2, 1000000007}) {
    std::vector<uint32_t> order = stream.EpochOrder(e);
    orders.push_back(order);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, identity) << "epoch " << e;
  }
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_NE(orders[1], orders[2]);
  EXPECT_NE(TokenStream(ds, 6, 16).EpochOrder(0), orders[0]);
  EXPECT_EQ(TokenStream(ds, 5, 99).EpochOrder(2), orders[2]);  // seq_len does not reorder
}

TEST(Stream, OneShortDocumentRepeatsWithinAWindow) {
  TempDir tmp;
  WriteDataset(tmp / "ds", {Tokens("abc")});
  const Dataset ds = OpenDataset(tmp / "ds");
  const TokenStream stream(ds, 77, 10);
  std::vector<uint32_t> w(11);
  stream.Window(3, w);  // positions 30..40 of "abc<eod>abc<eod>..."
  const std::vector<uint32_t> cycle = {'a', 'b', 'c', kEodToken};
  for (size_t k = 0; k < w.size(); ++k) EXPECT_EQ(w[k], cycle[(30 + k) % 4]) << k;
  EXPECT_EQ(stream.EpochOrder(12345), std::vector<uint32_t>{0});
}

TEST(Stream, RejectsBadArguments) {
  TempDir tmp;
  WriteDataset(tmp / "ds", {Tokens("abc"), Tokens("de")});
  const Dataset ds = OpenDataset(tmp / "ds");
  EXPECT_THROW(TokenStream(ds, 1, 0), Error);
  const TokenStream stream(ds, 1, 8);
  std::vector<uint32_t> wrong(8);
  EXPECT_THROW(stream.Window(0, wrong), Error);
  std::vector<uint32_t> w(9);
  EXPECT_THROW(stream.Window(UINT64_MAX / 4, w), Error);
  EXPECT_NO_THROW(stream.Window(UINT64_MAX / 8 - 1, w));  // far epochs are fine
}

// Pinned values, also printed by the Python reference implementation in
// docs/formats/stream.md: the definition must never drift.
TEST(Stream, PinnedShuffleOfTenDocuments) {
  TempDir tmp;
  std::vector<std::vector<uint32_t>> docs;
  for (char c = 'a'; c < 'a' + 10; ++c) docs.push_back(Tokens(std::string(c - 'a' + 1, c)));
  WriteDataset(tmp / "ds", docs);
  const Dataset ds = OpenDataset(tmp / "ds");
  const TokenStream stream(ds, 2024, 8);
  EXPECT_EQ(stream.EpochOrder(0), (std::vector<uint32_t>{6, 5, 7, 1, 2, 3, 4, 9, 0, 8}));
  EXPECT_EQ(stream.EpochOrder(1), (std::vector<uint32_t>{6, 7, 9, 3, 1, 2, 5, 0, 4, 8}));
  std::vector<uint32_t> w(9);
  stream.Window(8, w);  // positions 64..72: the last token of epoch 0 (65 tokens), then epoch 1
  EXPECT_EQ(DescribeTokens(w), "<eod>ggggggg<eod>");
}

}  // namespace
}  // namespace lockstep::data
