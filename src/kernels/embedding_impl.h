// Private to src/kernels: the embedding kernels (docs/numerics.md (embedding)). Embedding is pure
// copies and single additions, whose bits no instruction set can change, so there is one
// implementation (ref::) and no SIMD variant; the compiler may vectorise the adds freely.
#pragma once

#include <cstdint>

namespace lockstep::rk::ref {

// out[i, :] = table[ids[i], :] for i in [0, n). ids are already checked against the vocab.
void EmbeddingForward(const float* table, const uint32_t* ids, float* out, int64_t n, int64_t d);

// dtable[ids[i], c] += dout[i, c] for i = 0, 1, ..., n-1 in that order, for the columns
// c in [c0, c1) only: the public entry gives each thread its own column range.
void EmbeddingBackwardColumns(const float* dout, const uint32_t* ids, float* dtable, int64_t n,
                              int64_t d, int64_t c0, int64_t c1);

}  // namespace lockstep::rk::ref
