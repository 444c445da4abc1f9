// Embedding: validation and the thread split (rows for the gather; column ranges for the
// scatter-add, so that each element's sum over i stays in one thread, in order).
#include <algorithm>

#include "kernels/embedding_impl.h"
#include "kernels/internal.h"

namespace lockstep::rk {
namespace {

// Columns per backward task: wide enough to stream whole cache lines, narrow enough that a
// model dimension of a few hundred still splits across threads.
constexpr int64_t kBackwardColumns = 64;

void CheckIds(const char* op, std::span<const uint32_t> ids, int64_t vocab) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= vocab) Fail("{}: ids[{}] = {} is out of range (vocab = {})", op, i, ids[i], vocab);
  }
}

}  // namespace

void EmbeddingForward(std::span<const float> table, std::span<const uint32_t> ids,
                      std::span<float> out, int64_t vocab, int64_t d) {
  constexpr const char* kOp = "EmbeddingForward";
  const auto n = static_cast<int64_t>(ids.size());
  detail::CheckPositive(kOp, "vocab", vocab);
  detail::CheckPositive(kOp, "d", d);
  detail::CheckSize(kOp, "table", table, {vocab, d}, "vocab*d");
  detail::CheckSize(kOp, "out", out, {n, d}, "ids.size()*d");
  detail::CheckDisjoint(kOp, "out", out, "table", table);
  detail::CheckDisjoint(kOp, "out", out, "ids", ids);
  CheckIds(kOp, ids, vocab);
  ParallelFor(n, [&](int64_t i) {
    ref::EmbeddingForward(table.data(), ids.data() + i, out.data() + i * d, 1, d);
  });
}

void EmbeddingBackward(std::span<const float> dout, std::span<const uint32_t> ids,
                       std::span<float> dtable, int64_t vocab, int64_t d) {
  constexpr const char* kOp = "EmbeddingBackward";
  const auto n = static_cast<int64_t>(ids.size());
  detail::CheckPositive(kOp, "vocab", vocab);
  detail::CheckPositive(kOp, "d", d);
  detail::CheckSize(kOp, "dout", dout, {n, d}, "ids.size()*d");
  detail::CheckSize(kOp, "dtable", dtable, {vocab, d}, "vocab*d");
  detail::CheckDisjoint(kOp, "dtable", dtable, "dout", dout);
  detail::CheckDisjoint(kOp, "dtable", dtable, "ids", ids);
  CheckIds(kOp, ids, vocab);
  ParallelFor((d + kBackwardColumns - 1) / kBackwardColumns, [&](int64_t block) {
    const int64_t c0 = block * kBackwardColumns;
    ref::EmbeddingBackwardColumns(dout.data(), ids.data(), dtable.data(), n, d, c0,
                                  std::min(d, c0 + kBackwardColumns));
  });
}

}  // namespace lockstep::rk
