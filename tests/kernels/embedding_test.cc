// Embedding: bitwise invariance, exact gather and in-order scatter-add, special values and
// argument errors (docs/numerics.md (embedding)).
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "kernels/harness.h"
#include "lockstep/core.h"

namespace lockstep::test {
namespace {

TEST(Embedding, BitwiseInvariant) {
  for (int64_t d : kAwkwardSizes) {
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{257}}) {
      ExpectBitwiseInvariant(fmt::format("embedding d={} n={}", d, n), [&] {
        const int64_t vocab = 17;  // few ids: many repeats, so the sum order matters
        const std::vector<float> table = RandomFloats(vocab * d, d);
        const std::vector<uint32_t> ids = RandomIds(n, vocab, n + d);
        const std::vector<float> dout = RandomFloats(n * d, n, -1e3f, 1e3f);
        std::vector<float> out(n * d);
        std::vector<float> dtable = RandomFloats(vocab * d, d + 1, -1e-3f, 1e-3f);
        rk::EmbeddingForward(table, ids, out, vocab, d);
        rk::EmbeddingBackward(dout, ids, dtable, vocab, d);
        out.insert(out.end(), dtable.begin(), dtable.end());
        return out;
      });
    }
  }
}

// The forward is a copy and the backward is the contract's sequential sum, which the test
// writes out directly: both must match bit for bit, not approximately.
TEST(Embedding, ExactGatherAndInOrderSum) {
  const int64_t vocab = 5, d = 70, n = 300;
  const std::vector<float> table = RandomFloats(vocab * d, 3);
  const std::vector<uint32_t> ids = RandomIds(n, vocab, 4);
  const std::vector<float> dout = RandomFloats(n * d, 5, -1e4f, 1e4f);
  std::vector<float> want = RandomFloats(vocab * d, 6);
  std::vector<float> dtable = want, out(n * d);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < d; ++c) want[ids[i] * d + c] += dout[i * d + c];
  }
  rk::EmbeddingForward(table, ids, out, vocab, d);
  rk::EmbeddingBackward(dout, ids, dtable, vocab, d);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(std::memcmp(&out[i * d], &table[ids[i] * d], d * sizeof(float)), 0) << "row " << i;
  }
  EXPECT_EQ(std::memcmp(dtable.data(), want.data(), want.size() * sizeof(float)), 0);
}

// Integer-valued gradients sum exactly, so the fp64 sum is the answer (the "finite
// difference" of a linear map is its coefficient: each id's row gets its tokens' dout).
TEST(Embedding, BackwardIsTheExactGradient) {
  const int64_t vocab = 11, d = 9, n = 1000;
  const std::vector<uint32_t> ids = RandomIds(n, vocab, 8);
  std::vector<float> dout = RandomFloats(n * d, 9, -100, 100);
  for (float& x : dout) x = std::round(x);
  std::vector<float> dtable(vocab * d, 0.0f);
  rk::EmbeddingBackward(dout, ids, dtable, vocab, d);
  std::vector<double> want(vocab * d, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < d; ++c) want[ids[i] * d + c] += dout[i * d + c];
  }
  ExpectClose("embedding backward", dtable, want, 0, 0);
}

TEST(Embedding, SpecialValues) {
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<uint32_t> ids = {1, 0, 1};
  const std::vector<float> dout = {tiny, -0.0f, kNaN, 1.0f, tiny, -0.0f};  // d = 2
  std::vector<float> dtable = {-0.0f, 5.0f, 0.0f, -0.0f};
  rk::EmbeddingBackward(dout, ids, dtable, 2, 2);
  EXPECT_TRUE(std::isnan(dtable[0]));                  // NaN reaches only its own element
  EXPECT_EQ(dtable[1], 6.0f);
  EXPECT_EQ(dtable[2], 2 * tiny);                      // subnormals add, never flushed
  EXPECT_TRUE(dtable[3] == 0 && std::signbit(dtable[3]));  // -0 + -0 + -0 stays -0
}

TEST(Embedding, RejectsBadArguments) {
  std::vector<float> table(12), out(16), dtable(12);
  const std::vector<uint32_t> ids = {0, 2, 3, 1};  // vocab 3: ids[2] = 3 is out of range
  ExpectError([&] { rk::EmbeddingForward(table, ids, out, 3, 4); },
              {"EmbeddingForward", "ids[2] = 3", "vocab = 3"});
  ExpectError([&] { rk::EmbeddingBackward(std::span(out).first(8), ids, dtable, 3, 4); },
              {"EmbeddingBackward", "dout has 8", "ids.size()*d = 16"});
  ExpectError([&] { rk::EmbeddingBackward(std::vector<float>(16), ids, dtable, 3, 4); },
              {"EmbeddingBackward", "ids[2] = 3"});
  ExpectError([&] { rk::EmbeddingForward(table, std::span(ids).first(2), std::span(table).first(8), 3, 4); },
              {"EmbeddingForward", "out", "overlaps", "table"});
  ExpectError([&] { rk::EmbeddingForward(table, ids, out, 3, 0); }, {"EmbeddingForward", "d = 0"});
}

}  // namespace
}  // namespace lockstep::test
