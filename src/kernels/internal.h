// Private to src/kernels: argument validation and the reference / SIMD split of every op.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <span>

#include "lockstep/core.h"
#include "lockstep/kernels.h"

namespace lockstep::rk::detail {

// True when the active variant is the scalar reference.
bool UsingReference();
// Whether the active variant is one with its target's int8 dot product (Isa::int8_dot).
bool Int8DotActive();

// The elements of a shape: the product of `factors`. Fails, naming the op and the shape, on a
// negative factor or a product past int64: an op's arguments may come from a file (a trace
// record the referee recomputes), and a product that wrapped would pass a size check.
inline int64_t Elements(const char* op, const char* shape, std::initializer_list<int64_t> factors) {
  int64_t n = 1;
  for (const int64_t f : factors) {
    if (f < 0) Fail("{}: {} has a negative factor ({})", op, shape, f);
    if (__builtin_mul_overflow(n, f, &n)) Fail("{}: {} is past 2^63 elements", op, shape);
  }
  return n;
}

template <typename T>
void CheckSize(const char* op, const char* arg, std::span<T> s, int64_t expected,
               const char* shape) {
  if (static_cast<int64_t>(s.size()) != expected) {
    Fail("{}: {} has {} elements, expected {} = {}", op, arg, s.size(), shape, expected);
  }
  if (expected > 0 && s.data() == nullptr) Fail("{}: {} is a null buffer", op, arg);
}
// The same against the product of `factors` (Elements).
template <typename T>
void CheckSize(const char* op, const char* arg, std::span<T> s,
               std::initializer_list<int64_t> factors, const char* shape) {
  CheckSize(op, arg, s, Elements(op, shape, factors), shape);
}

inline void CheckPositive(const char* op, const char* arg, int64_t value) {
  if (value <= 0) Fail("{}: {} = {} (must be > 0)", op, arg, value);
}
inline void CheckNonNegative(const char* op, const char* arg, int64_t value) {
  if (value < 0) Fail("{}: {} = {} (must be >= 0)", op, arg, value);
}
inline void CheckFinite(const char* op, const char* arg, float value) {
  if (!std::isfinite(value)) Fail("{}: {} = {} (must be finite)", op, arg, value);
}

// Fails when the byte ranges of a and b intersect. With allow_identical, a == b exactly (the
// same pointer and size: in-place use) is accepted.
template <typename A, typename B>
void CheckDisjoint(const char* op, const char* a_name, std::span<A> a, const char* b_name,
                   std::span<B> b, bool allow_identical = false) {
  if (a.empty() || b.empty()) return;
  const auto a0 = reinterpret_cast<uintptr_t>(a.data()), a1 = a0 + a.size_bytes();
  const auto b0 = reinterpret_cast<uintptr_t>(b.data()), b1 = b0 + b.size_bytes();
  if (allow_identical && a0 == b0 && a1 == b1) return;
  if (a0 < b1 && b0 < a1) {
    Fail("{}: {} [{} elements at {:#x}] overlaps {} [{} elements at {:#x}]{}", op, a_name,
         a.size(), a0, b_name, b.size(), b0, allow_identical ? " (only exact in-place use is allowed)" : "");
  }
}

}  // namespace lockstep::rk::detail
