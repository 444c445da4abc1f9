// The canonical lane rule of every reduction (docs/numerics.md, "Reductions"): kReductionLanes
// logical lanes, lane j takes terms j, j+16, j+32, ... in order starting from its initial
// value; lanes are folded pairwise (j += j+8, j += j+4, j += j+2, j += j+1) and lane 0 is the
// result. Shared by the scalar reference and (through FoldLanes) by the SIMD variants.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "lockstep/kernels.h"

namespace lockstep::rk::lanes {

inline float FoldSum(float* l) {
  for (int width = kReductionLanes / 2; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) l[j] = l[j] + l[j + width];
  }
  return l[0];
}

// Max without NaN handling: lane j keeps b when b > a (so ties keep the earlier value).
inline float FoldMax(float* l) {
  for (int width = kReductionLanes / 2; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) l[j] = l[j + width] > l[j] ? l[j + width] : l[j];
  }
  return l[0];
}

inline float Sum(const float* x, int64_t n) {
  float l[kReductionLanes] = {};
  for (int64_t c = 0; c < n; ++c) l[c % kReductionLanes] = l[c % kReductionLanes] + x[c];
  return FoldSum(l);
}

// sum of a[c]*b[c], each term fused into its lane: lane = fma(a, b, lane).
inline float Dot(const float* a, const float* b, int64_t n) {
  float l[kReductionLanes] = {};
  for (int64_t c = 0; c < n; ++c) {
    l[c % kReductionLanes] = std::fma(a[c], b[c], l[c % kReductionLanes]);
  }
  return FoldSum(l);
}

// NaN if any element is NaN, else the maximum; -inf when n == 0.
inline float Max(const float* x, int64_t n) {
  float l[kReductionLanes];
  for (float& v : l) v = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int64_t c = 0; c < n; ++c) {
    float& lane = l[c % kReductionLanes];
    nan |= std::isnan(x[c]);
    lane = x[c] > lane ? x[c] : lane;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : FoldMax(l);
}

}  // namespace lockstep::rk::lanes
