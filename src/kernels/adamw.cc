// AdamW: validation, the block split across threads, and the choice of kernel.
#include <algorithm>

#include "kernels/adamw_impl.h"
#include "kernels/internal.h"

namespace lockstep::rk {
namespace {
// Elements per thread task. Any value gives the same bits (elements are independent).
constexpr int64_t kBlock = 16384;
}  // namespace

AdamWScalars AdamWScalarsOf(const AdamWParams& p) {
  constexpr const char* kOp = "AdamWUpdate";
  detail::CheckFinite(kOp, "lr", p.lr);
  detail::CheckFinite(kOp, "beta1", p.beta1);
  detail::CheckFinite(kOp, "beta2", p.beta2);
  detail::CheckFinite(kOp, "eps", p.eps);
  detail::CheckFinite(kOp, "weight_decay", p.weight_decay);
  if (p.lr < 0) Fail("{}: lr = {} (must be >= 0)", kOp, p.lr);
  if (!(p.beta1 >= 0 && p.beta1 < 1)) Fail("{}: beta1 = {} (must be in [0, 1))", kOp, p.beta1);
  if (!(p.beta2 >= 0 && p.beta2 < 1)) Fail("{}: beta2 = {} (must be in [0, 1))", kOp, p.beta2);
  if (!(p.eps > 0)) Fail("{}: eps = {} (must be > 0)", kOp, p.eps);
  if (p.weight_decay < 0) Fail("{}: weight_decay = {} (must be >= 0)", kOp, p.weight_decay);
  detail::CheckPositive(kOp, "step", p.step);
  return ref::AdamWScalarsFor(p);
}

void AdamWUpdate(const AdamWParams& p, std::span<float> param, std::span<const float> grad,
                 std::span<float> m, std::span<float> v) {
  constexpr const char* kOp = "AdamWUpdate";
  const AdamWScalars k = AdamWScalarsOf(p);
  const auto n = static_cast<int64_t>(param.size());
  detail::CheckSize(kOp, "grad", grad, n, "param.size()");
  detail::CheckSize(kOp, "m", m, n, "param.size()");
  detail::CheckSize(kOp, "v", v, n, "param.size()");
  detail::CheckDisjoint(kOp, "param", param, "grad", grad);
  detail::CheckDisjoint(kOp, "param", param, "m", m);
  detail::CheckDisjoint(kOp, "param", param, "v", v);
  detail::CheckDisjoint(kOp, "m", m, "grad", grad);
  detail::CheckDisjoint(kOp, "m", m, "v", v);
  detail::CheckDisjoint(kOp, "v", v, "grad", grad);

  const auto kernel = detail::UsingReference() ? &ref::AdamW : &simd::AdamW;
  ParallelFor((n + kBlock - 1) / kBlock, [&](int64_t block) {
    const int64_t i = block * kBlock;
    kernel(k, param.data() + i, grad.data() + i, m.data() + i, v.data() + i,
           std::min(kBlock, n - i));
  });
}

}  // namespace lockstep::rk
