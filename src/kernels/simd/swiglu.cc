// SIMD SwiGLU: the reference's operations on whole vectors of independent elements (VExp is
// lane-by-lane dmath::Exp, Div is IEEE, MulAdd is fused), the remainder of a row handed to the
// reference kernel itself.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/swiglu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/simd/dmath-inl.h"
#include "kernels/swiglu_impl.h"

HWY_BEFORE_NAMESPACE();
namespace lockstep::rk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// static: helpers in HWY_NAMESPACE are shared with other kernels' translation units.
template <class D, class V = hn::Vec<D>>
static HWY_INLINE V Sigmoid(D d, V g) {
  const V one = hn::Set(d, 1.0f);
  return hn::Div(one, hn::Add(one, VExp(d, hn::Neg(g))));
}

void SwigluForward(const float* gate, const float* up, float* out, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto g = hn::LoadU(d, gate + i);
    hn::StoreU(hn::Mul(hn::Mul(g, Sigmoid(d, g)), hn::LoadU(d, up + i)), d, out + i);
  }
  ref::SwigluForward(gate + i, up + i, out + i, n - i);
}

void SwigluBackward(const float* gate, const float* up, const float* dout, float* dgate,
                    float* dup, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto g = hn::LoadU(d, gate + i), u = hn::LoadU(d, up + i), dy = hn::LoadU(d, dout + i);
    const auto s = Sigmoid(d, g);
    const auto dsilu = hn::Mul(s, hn::MulAdd(g, hn::Sub(one, s), one));
    hn::StoreU(hn::Mul(hn::Mul(dy, u), dsilu), d, dgate + i);
    hn::StoreU(hn::Mul(dy, hn::Mul(g, s)), d, dup + i);
  }
  ref::SwigluBackward(gate + i, up + i, dout + i, dgate + i, dup + i, n - i);
}

}  // namespace lockstep::rk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lockstep::rk::simd {
HWY_EXPORT(SwigluForward);
HWY_EXPORT(SwigluBackward);

void SwigluForward(const float* gate, const float* up, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SwigluForward)(gate, up, out, n);
}
void SwigluBackward(const float* gate, const float* up, const float* dout, float* dgate,
                    float* dup, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SwigluBackward)(gate, up, dout, dgate, dup, n);
}
}  // namespace lockstep::rk::simd
#endif
