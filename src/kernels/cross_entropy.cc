// Fused output head + cross-entropy + z-loss: docs/numerics.md (cross_entropy).
//
// The logits of a vocab chunk are produced by the public GEMM into a rows x chunk scratch
// buffer and consumed at once; the full rows x vocab matrix never exists. Nothing depends on
// the chunk size: each logit is one GEMM output (whose bits do not depend on how many columns
// are computed with it), the log-sum-exp lanes see the logits in vocab order whatever the
// chunking, and the backward GEMMs accumulate over the vocab in kGemmKChunk pieces that the
// chunk boundaries (multiples of kGemmKChunk) never split.
#include <algorithm>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cross_entropy_impl.h"
#include "kernels/impl.h"
#include "kernels/internal.h"

namespace lockstep::rk {
namespace {

void CheckShape(const char* op, const CrossEntropyShape& s, std::span<const float> h,
                std::span<const float> w, std::span<const uint32_t> targets) {
  detail::CheckPositive(op, "rows", s.rows);
  detail::CheckPositive(op, "d", s.d);
  detail::CheckPositive(op, "vocab", s.vocab);
  if (s.vocab_chunk <= 0 || s.vocab_chunk % kGemmKChunk != 0) {
    Fail("{}: vocab_chunk = {} (must be a positive multiple of kGemmKChunk = {})", op,
         s.vocab_chunk, kGemmKChunk);
  }
  detail::CheckFinite(op, "z_loss", s.z_loss);
  if (s.z_loss < 0) Fail("{}: z_loss = {} (must be >= 0)", op, s.z_loss);
  detail::CheckSize(op, "h", h, {s.rows, s.d}, "rows*d");
  detail::CheckSize(op, "w", w, {s.vocab, s.d}, "vocab*d");
  detail::CheckSize(op, "targets", targets, s.rows, "rows");
  for (int64_t r = 0; r < s.rows; ++r) {
    if (targets[r] >= s.vocab) {
      Fail("{}: row {} has target {}, out of range (vocab = {})", op, r, targets[r], s.vocab);
    }
  }
}

// Calls visit(v0, cols, z) for v0 = 0, vocab_chunk, 2*vocab_chunk, ... with z[rows, cols] the
// logits h · w[v0 : v0+cols]ᵀ (rows of w are contiguous, so the chunk is a plain slice). With
// `kept` empty they are computed into per-thread scratch; otherwise chunk v0 is kept at
// kept[rows*v0 ...], computed there when `compute`, else already there from the forward.
template <class Visit>
void ForEachLogitChunk(const CrossEntropyShape& s, std::span<const float> h,
                       std::span<const float> w, std::span<float> kept, bool compute,
                       Visit visit) {
  float* const scratch =
      kept.empty() ? ScratchFloats(Scratch::kLogits,
                                   static_cast<size_t>(s.rows * std::min(s.vocab_chunk, s.vocab)))
                   : nullptr;
  for (int64_t v0 = 0; v0 < s.vocab; v0 += s.vocab_chunk) {
    const int64_t cols = std::min(s.vocab_chunk, s.vocab - v0);
    const std::span<float> z(kept.empty() ? scratch : kept.data() + s.rows * v0,
                             static_cast<size_t>(s.rows * cols));
    if (compute || kept.empty()) GemmXWt(h, w.subspan(v0 * s.d, cols * s.d), z, s.rows, cols, s.d);
    visit(v0, cols, z);
  }
}

// A non-empty `logits` must hold rows*vocab floats apart from every other argument.
void CheckLogits(const char* op, const CrossEntropyShape& s, std::span<const float> logits,
                 std::initializer_list<std::pair<const char*, std::span<const float>>> others) {
  if (logits.empty()) return;
  detail::CheckSize(op, "logits", logits, {s.rows, s.vocab}, "rows*vocab");
  for (const auto& [name, other] : others) detail::CheckDisjoint(op, "logits", logits, name, other);
}

}  // namespace

void CrossEntropyForward(const CrossEntropyShape& s, std::span<const float> h,
                         std::span<const float> w, std::span<const uint32_t> targets,
                         std::span<float> loss, std::span<float> zloss, std::span<float> lse,
                         std::span<float> logits) {
  constexpr const char* kOp = "CrossEntropyForward";
  CheckShape(kOp, s, h, w, targets);
  detail::CheckSize(kOp, "loss", loss, s.rows, "rows");
  detail::CheckSize(kOp, "zloss", zloss, s.rows, "rows");
  detail::CheckSize(kOp, "lse", lse, s.rows, "rows");
  for (auto [name, out] : {std::pair{"loss", loss}, {"zloss", zloss}, {"lse", lse}}) {
    detail::CheckDisjoint(kOp, name, out, "h", h);
    detail::CheckDisjoint(kOp, name, out, "w", w);
    detail::CheckDisjoint(kOp, name, out, "targets", targets);
  }
  detail::CheckDisjoint(kOp, "loss", loss, "zloss", zloss);
  detail::CheckDisjoint(kOp, "loss", loss, "lse", lse);
  detail::CheckDisjoint(kOp, "zloss", zloss, "lse", lse);
  CheckLogits(kOp, s, logits, {{"h", h}, {"w", w}, {"loss", loss}, {"zloss", zloss}, {"lse", lse}});

  // Per row, kReductionLanes running (max, sum) states; an empty lane is (-inf, 0).
  const size_t states = static_cast<size_t>(s.rows * kReductionLanes);
  std::vector<float> lane_max(states, -std::numeric_limits<float>::infinity());
  std::vector<float> lane_sum(states, 0.0f);
  std::vector<float> target_logit(static_cast<size_t>(s.rows));
  const auto accumulate = detail::UsingReference() ? &ref::LseAccumulate : &simd::LseAccumulate;
  ForEachLogitChunk(s, h, w, logits, /*compute=*/true, [&](int64_t v0, int64_t cols,
                                                           std::span<float> z) {
    ParallelFor(s.rows, [&](int64_t r) {
      const float* zr = z.data() + r * cols;
      accumulate(zr, cols, &lane_max[r * kReductionLanes], &lane_sum[r * kReductionLanes]);
      const int64_t t = int64_t{targets[r]} - v0;
      if (t >= 0 && t < cols) target_logit[r] = zr[t];
    });
  });

  ParallelFor(s.rows, [&](int64_t r) {
    float* m = &lane_max[r * kReductionLanes];
    float* sum = &lane_sum[r * kReductionLanes];
    for (int width = kReductionLanes / 2; width >= 1; width /= 2) {
      for (int j = 0; j < width; ++j) ce::Merge(m[j], sum[j], m[j + width], sum[j + width]);
    }
    const float row_lse = m[0] + dmath::Log(sum[0]);
    lse[r] = row_lse;
    loss[r] = row_lse - target_logit[r];
    zloss[r] = (s.z_loss * row_lse) * row_lse;
  });
}

void CrossEntropyBackward(const CrossEntropyShape& s, std::span<const float> h,
                          std::span<const float> w, std::span<const uint32_t> targets,
                          std::span<const float> lse, float grad_scale, std::span<float> dh,
                          std::span<float> dw, std::span<float> logits) {
  constexpr const char* kOp = "CrossEntropyBackward";
  CheckShape(kOp, s, h, w, targets);
  detail::CheckSize(kOp, "lse", lse, s.rows, "rows");
  detail::CheckFinite(kOp, "grad_scale", grad_scale);
  detail::CheckSize(kOp, "dh", dh, {s.rows, s.d}, "rows*d");
  detail::CheckSize(kOp, "dw", dw, {s.vocab, s.d}, "vocab*d");
  for (auto [name, out] : {std::pair{"dh", dh}, {"dw", dw}}) {
    detail::CheckDisjoint(kOp, name, out, "h", h);
    detail::CheckDisjoint(kOp, name, out, "w", w);
    detail::CheckDisjoint(kOp, name, out, "targets", targets);
    detail::CheckDisjoint(kOp, name, out, "lse", lse);
  }
  detail::CheckDisjoint(kOp, "dh", dh, "dw", dw);
  CheckLogits(kOp, s, logits, {{"h", h}, {"w", w}, {"lse", lse}, {"dh", dh}, {"dw", dw}});

  // d(loss + zloss)/dz[v] = (1 + 2*z_loss*lse) * softmax[v] - [v == target]; 2*z_loss is exact.
  std::vector<float> coef(static_cast<size_t>(s.rows));
  for (int64_t r = 0; r < s.rows; ++r) coef[r] = std::fma(2.0f * s.z_loss, lse[r], 1.0f);
  const auto logit_grad = detail::UsingReference() ? &ref::LogitGrad : &simd::LogitGrad;
  ForEachLogitChunk(s, h, w, logits, /*compute=*/false, [&](int64_t v0, int64_t cols,
                                                            std::span<float> z) {
    ParallelFor(s.rows, [&](int64_t r) {
      float* zr = z.data() + r * cols;
      const int64_t t = int64_t{targets[r]} - v0;
      const bool has_target = t >= 0 && t < cols;
      const float target_z = has_target ? zr[t] : 0.0f;
      logit_grad(zr, cols, lse[r], coef[r], grad_scale);
      if (has_target) zr[t] = ce::TargetLogitGrad(target_z, lse[r], coef[r], grad_scale);
    });
    // dh = sum over the whole vocab, continued chunk by chunk (see the file comment).
    GemmDyW(z, w.subspan(v0 * s.d, cols * s.d), dh, s.rows, cols, s.d, /*accumulate=*/v0 > 0);
    GemmDytX(z, h, dw.subspan(v0 * s.d, cols * s.d), s.rows, cols, s.d, /*accumulate=*/true);
  });
}

}  // namespace lockstep::rk
