// Scalar reference (normative) of SwiGLU: docs/numerics.md (swiglu).
#include <cmath>

#include "kernels/swiglu_impl.h"
#include "lockstep/kernels.h"

namespace lockstep::rk::ref {
namespace {
// s = 1 / (1 + exp(-g)): three roundings (exp, add, divide). g = -inf gives s = 0 and then
// silu = -inf * 0 = NaN, which the contract keeps (an infinite activation is already a blow-up).
float Sigmoid(float g) { return 1.0f / (1.0f + dmath::Exp(-g)); }
}  // namespace

void SwigluForward(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = (g * Sigmoid(g)) * up[i];
  }
}

// d silu / dg = s * (1 + g * (1 - s)); the bracket is one fused multiply-add.
void SwigluBackward(const float* gate, const float* up, const float* dout, float* dgate,
                    float* dup, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i], u = up[i], dy = dout[i];
    const float s = Sigmoid(g);
    dgate[i] = (dy * u) * (s * std::fma(g, 1.0f - s, 1.0f));
    dup[i] = dy * (g * s);
  }
}

}  // namespace lockstep::rk::ref
