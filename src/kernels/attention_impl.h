// Private to src/kernels: the implementations behind AttentionForward / AttentionBackward, after
// validation (attention.cc). ref:: is the scalar reference (normative, docs/numerics.md (attention));
// simd:: dispatches to the active Highway target. Both give bit-identical results.
//
// Layouts (row-major): q, out, dout, dq [B, T, Hq, D]; k, v, dk, dv [B, T, Hkv, D];
// lse [B, Hq, T].
#pragma once

#include "lockstep/kernels.h"

namespace lockstep::rk {

#define LOCKSTEP_RK_ATTENTION_IMPLS                                                               \
  void AttentionForward(const AttentionShape& s, const float* q, const float* k, const float* v,  \
                        float* out, float* lse);                                                  \
  void AttentionBackward(const AttentionShape& s, const float* q, const float* k, const float* v, \
                         const float* out, const float* lse, const float* dout, float* dq,        \
                         float* dk, float* dv);

namespace ref {
LOCKSTEP_RK_ATTENTION_IMPLS
}
namespace simd {
LOCKSTEP_RK_ATTENTION_IMPLS
}
#undef LOCKSTEP_RK_ATTENTION_IMPLS

}  // namespace lockstep::rk
