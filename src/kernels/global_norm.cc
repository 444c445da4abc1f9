// Global gradient norm, clip factor and scaling: docs/numerics.md (global_norm).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/global_norm_impl.h"
#include "kernels/internal.h"

namespace lockstep::rk {
namespace {

// Elements per Scale task. Any value gives the same bits (elements are independent).
constexpr int64_t kScaleBlock = 65536;

}  // namespace

// Blocks are the contract's split points, so they may run on any thread in any order; only
// their sums are added in a fixed order afterwards.
std::vector<double> BlockSquares(std::span<const float> piece) {
  const auto n = static_cast<int64_t>(piece.size());
  const int64_t blocks = (n + kNormBlock - 1) / kNormBlock;
  std::vector<double> block_sum(static_cast<size_t>(blocks));
  const auto kernel = detail::UsingReference() ? &ref::AccumulateSquares : &simd::AccumulateSquares;
  ParallelFor(blocks, [&](int64_t b) {
    double lanes[kReductionLanes] = {};
    kernel(piece.data() + b * kNormBlock, std::min(kNormBlock, n - b * kNormBlock), lanes);
    for (int width = kReductionLanes / 2; width >= 1; width /= 2) {
      for (int j = 0; j < width; ++j) lanes[j] = lanes[j] + lanes[j + width];
    }
    block_sum[static_cast<size_t>(b)] = lanes[0];
  });
  return block_sum;
}

double AddTensorSquares(double running, std::span<const float> piece) {
  for (const double sum : BlockSquares(piece)) running = running + sum;
  return running;
}

float NormOfTensorSums(std::span<const double> tensor_sums) {
  double total = 0.0;
  for (const double sum : tensor_sums) total = total + sum;
  // IEEE 754 square root is correctly rounded, so std::sqrt on a double is the same on every
  // conforming machine (unlike exp/log); the one rounding to fp32 follows.
  return dmath::Canonical(static_cast<float>(std::sqrt(total)));
}

float NormOfBlockSums(std::span<const double> block_sums, std::span<const int64_t> blocks) {
  std::vector<double> tensor_sums;
  size_t at = 0;
  for (const int64_t count : blocks) {
    if (count < 0 || static_cast<size_t>(count) > block_sums.size() - at) {
      Fail("NormOfBlockSums: tensor {} has {} blocks, but only {} block sums are left", 
           tensor_sums.size(), count, block_sums.size() - at);
    }
    double sum = 0.0;
    for (int64_t b = 0; b < count; ++b) sum = sum + block_sums[at++];
    tensor_sums.push_back(sum);
  }
  if (at != block_sums.size()) {
    Fail("NormOfBlockSums: {} block sums for {} blocks", block_sums.size(), at);
  }
  return NormOfTensorSums(tensor_sums);
}

float GlobalNorm(std::span<const std::span<const float>> tensors) {
  std::vector<double> tensor_sums;
  for (const std::span<const float>& t : tensors) tensor_sums.push_back(AddTensorSquares(0.0, t));
  return NormOfTensorSums(tensor_sums);
}

float ClipFactor(float norm, float max_norm) {
  if (std::isnan(max_norm)) Fail("ClipFactor: max_norm = {} (must not be NaN)", max_norm);
  if (norm < 0) Fail("ClipFactor: norm = {} (must be >= 0)", norm);
  // A NaN norm stays NaN even with clipping off, so no caller mistakes a NaN gradient for a
  // clean one (Scale refuses a NaN factor).
  if (std::isnan(norm)) return norm;
  if (max_norm <= 0) return 1.0f;
  const float factor = max_norm / (norm + 1e-6f);
  return factor < 1.0f ? factor : 1.0f;
}

// One correctly rounded multiply per element: every instruction set gives these bits, so there
// is no separate SIMD variant (the compiler vectorises the loop for the baseline ISA).
void Scale(std::span<float> x, float factor) {
  detail::CheckFinite("Scale", "factor", factor);
  const auto n = static_cast<int64_t>(x.size());
  float* data = x.data();
  ParallelFor((n + kScaleBlock - 1) / kScaleBlock, [&](int64_t block) {
    const int64_t i0 = block * kScaleBlock, i1 = std::min(n, i0 + kScaleBlock);
    for (int64_t i = i0; i < i1; ++i) data[i] = data[i] * factor;
  });
}

int64_t CanonicalizeNaNs(std::span<float> x) {
  int64_t replaced = 0;
  for (float& f : x) {
    if (f != f) {
      f = dmath::Canonical(f);
      ++replaced;
    }
  }
  return replaced;
}

}  // namespace lockstep::rk
