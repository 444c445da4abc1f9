// SwiGLU: validation, the row split across threads, and the choice of kernel.
#include "kernels/internal.h"
#include "kernels/swiglu_impl.h"

namespace lockstep::rk {

void SwigluForward(std::span<const float> h, std::span<float> out, int64_t rows, int64_t f) {
  constexpr const char* kOp = "SwigluForward";
  detail::CheckPositive(kOp, "rows", rows);
  detail::CheckPositive(kOp, "f", f);
  detail::CheckSize(kOp, "h", h, {rows, 2, f}, "rows*2*f");
  detail::CheckSize(kOp, "out", out, {rows, f}, "rows*f");
  detail::CheckDisjoint(kOp, "out", out, "h", h);
  const auto kernel = detail::UsingReference() ? &ref::SwigluForward : &simd::SwigluForward;
  ParallelFor(rows, [&](int64_t r) {
    const float* hr = h.data() + r * 2 * f;
    kernel(hr, hr + f, out.data() + r * f, f);
  });
}

void SwigluBackward(std::span<const float> h, std::span<const float> dout, std::span<float> dh,
                    int64_t rows, int64_t f) {
  constexpr const char* kOp = "SwigluBackward";
  detail::CheckPositive(kOp, "rows", rows);
  detail::CheckPositive(kOp, "f", f);
  detail::CheckSize(kOp, "h", h, {rows, 2, f}, "rows*2*f");
  detail::CheckSize(kOp, "dout", dout, {rows, f}, "rows*f");
  detail::CheckSize(kOp, "dh", dh, {rows, 2, f}, "rows*2*f");
  detail::CheckDisjoint(kOp, "dh", dh, "h", h);
  detail::CheckDisjoint(kOp, "dh", dh, "dout", dout);
  const auto kernel = detail::UsingReference() ? &ref::SwigluBackward : &simd::SwigluBackward;
  ParallelFor(rows, [&](int64_t r) {
    const float* hr = h.data() + r * 2 * f;
    float* dhr = dh.data() + r * 2 * f;
    kernel(hr, hr + f, dout.data() + r * f, dhr, dhr + f, f);
  });
}

}  // namespace lockstep::rk
