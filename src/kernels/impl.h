// Private to src/kernels: the implementations behind each public op, after validation.
// ref:: is the scalar reference (normative); simd:: dispatches to the active Highway target.
// Both have the same signatures and must give bit-identical results.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lockstep/kernels.h"

namespace lockstep::rk {

// Scratch memory of an op that runs many times per step, kept per thread from one call to the
// next and grown to the largest size asked: a buffer allocated per call would be mapped, faulted
// in page by page and unmapped every time. 64-byte aligned; the contents are undefined. Each
// kind is one buffer per thread, so an op must not hold a kind across a call that uses it.
enum class Scratch { kGemmA, kGemmB, kLogits, kAttention, kCount };
float* ScratchFloats(Scratch kind, size_t floats);

// C[m,n] (ldc = n) from A(i, r) = a[i*a_rs + r*a_cs], B(r, j) = b[r*b_rs + j*b_cs]; the reduced
// index r runs over 0..k-1. Covers all three linear-layer forms through the strides.
struct GemmArgs {
  const float* a;
  int64_t a_rs, a_cs;
  const float* b;
  int64_t b_rs, b_cs;
  float* c;
  int64_t m, n, k;
  bool accumulate;
};

#define LOCKSTEP_RK_IMPLS                                                                         \
  void Gemm(const GemmArgs& g);                                                                   \
  void RowSum(const float* x, float* out, int64_t rows, int64_t cols);                            \
  void RowSumSquares(const float* x, float* out, int64_t rows, int64_t cols);                     \
  void RowMax(const float* x, float* out, int64_t rows, int64_t cols);                            \
  void AddInto(const float* x, float* y, int64_t n);                                              \
  void RoundToBf16(const float* x, float* y, int64_t n);                                          \
  void RmsNormForward(const float* x, const float* gain, float eps, float* y, float* rstd,        \
                      int64_t rows, int64_t d);                                                   \
  void RmsNormBackward(const float* dy, const float* x, const float* gain, const float* rstd,     \
                       float* dx, float* dgain, int64_t rows, int64_t d);                         \
  void Rope(const float* x, float* y, const float* cos, const float* sin, int64_t batch,          \
            int64_t seq, int64_t heads, int64_t head_dim, bool inverse);                          \
  void QuantizeRows(const float* x, int8_t* q, float* scale, int64_t rows, int64_t cols);         \
  void QuantizeRowsByScale(const float* x, const float* scale, int8_t* q, int64_t rows,           \
                           int64_t cols);                                                         \
  void GemmI8XWt(const int8_t* qx, const float* sx, const int8_t* qw, const float* sw, float* y,  \
                 int64_t m, int64_t n, int64_t k);                                                \
  void DequantizeRows(const int8_t* q, const float* scale, float* y, int64_t rows, int64_t cols); \
  void HadamardRows(const float* x, float* y, int64_t rows, int64_t cols, bool transpose);        \
  void HadamardQuantizeRows(const float* x, int8_t* q, float* scale, int64_t rows, int64_t cols,  \
                            bool transpose);

namespace ref {
LOCKSTEP_RK_IMPLS
}
namespace simd {
LOCKSTEP_RK_IMPLS
// Decode's packed weight (rk::PackForGemv), which only the SIMD variants have: the vectors of
// the active one, W packed for them (as binary32 or as bfloat16), and the product from it.
int64_t GemvLanes();
void PackGemv(const float* w, int64_t n, int64_t k, float* packed);
void GemvPacked(const float* x, const float* packed, float* y, int64_t m, int64_t n, int64_t k);
void PackGemvBf16(const float* w, int64_t n, int64_t k, uint16_t* packed);
// The int8 GEMM's weight packed once (rk::PackI8ForGemm): the active variant's form (0: none, the
// product reads the weight itself), the bytes it packs W into, the packing and the product.
int64_t I8PackingForm();
int64_t PackedI8Bytes(int64_t n, int64_t k);
void PackI8(const int8_t* qw, int64_t n, int64_t k, uint8_t* out);
void GemmI8XWtPacked(const int8_t* qx, const float* sx, const uint8_t* packed, const float* sw,
                     float* y, int64_t m, int64_t n, int64_t k);
void GemvPackedBf16(const float* x, const uint16_t* packed, float* y, int64_t m, int64_t n,
                    int64_t k);
}
#undef LOCKSTEP_RK_IMPLS

}  // namespace lockstep::rk
