// Embedding gather and its gradient scatter-add: docs/numerics.md (embedding).
#include <algorithm>

#include "kernels/embedding_impl.h"

namespace lockstep::rk::ref {

void EmbeddingForward(const float* table, const uint32_t* ids, float* out, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; ++i) std::copy_n(table + int64_t{ids[i]} * d, d, out + i * d);
}

void EmbeddingBackwardColumns(const float* dout, const uint32_t* ids, float* dtable, int64_t n,
                              int64_t d, int64_t c0, int64_t c1) {
  for (int64_t i = 0; i < n; ++i) {
    float* row = dtable + int64_t{ids[i]} * d;
    const float* src = dout + i * d;
    for (int64_t c = c0; c < c1; ++c) row[c] = row[c] + src[c];
  }
}

}  // namespace lockstep::rk::ref
