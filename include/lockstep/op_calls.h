// lockstep op calls: one typed function per op of the op table (rk::OpTable) that the model, the
// decoder and the trainer call. Each runs its op through ObservedOp (lockstep/model.h) and builds
// the op's record -- argument names, role names, their order -- from the op's entry
// (rk::Spec): the values are given in the entry's order, an optional argument left out when it
// is std::nullopt and an optional role when its span is empty (docs/disputes.md, "Records").
// `layer` is the recorded layer: -1 for the embedding, the head and the optimizer.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "lockstep/kernels.h"
#include "lockstep/model.h"

namespace lockstep::ops {

// ---- the model's and the decoder's ----------------------------------------------------------
void EmbeddingFwd(const OpHooks& hooks, int64_t layer, std::span<const float> table,
                  std::span<const uint32_t> ids, std::span<float> out, int64_t vocab, int64_t d);
// A gain-free norm (empty gain) records no "gain" role.
void RmsNormFwd(const OpHooks& hooks, int64_t layer, std::span<const float> x,
                std::span<const float> gain, float eps, std::span<float> y, std::span<float> rstd,
                int64_t rows, int64_t cols);
// The three GEMMs (rk::GemmXWt, GemmDyW, GemmDytX): with accumulate the output is also recorded
// as an input.
void GemmXWt(const OpHooks& hooks, int64_t layer, std::span<const float> x,
             std::span<const float> w, std::span<float> y, int64_t m, int64_t n, int64_t k,
             bool accumulate = false);
// The same op (recorded with w.w) on CPU from w's packing (rk::GemmXWtPacked: the same bits).
void GemmXWtPacked(const OpHooks& hooks, int64_t layer, std::span<const float> x,
                   const rk::GemvPacking& w, std::span<float> y, int64_t m);
void GemmDyW(const OpHooks& hooks, int64_t layer, std::span<const float> dy,
             std::span<const float> w, std::span<float> dx, int64_t m, int64_t n, int64_t k,
             bool accumulate = false);
void GemmDytX(const OpHooks& hooks, int64_t layer, std::span<const float> dy,
              std::span<const float> x, std::span<float> dw, int64_t m, int64_t n, int64_t k,
              bool accumulate = false);
// The int8 ops (rk::QuantizeRows, QuantizeRowsByScale, GemmI8XWt, DequantizeRows,
// HadamardQuantizeRows).
void QuantizeRows(const OpHooks& hooks, int64_t layer, std::span<const float> x,
                  std::span<int8_t> q, std::span<float> scale, int64_t rows, int64_t cols);
void QuantizeRowsByScale(const OpHooks& hooks, int64_t layer, std::span<const float> x,
                         std::span<const float> scale, std::span<int8_t> q, int64_t rows,
                         int64_t cols);
void GemmI8XWt(const OpHooks& hooks, int64_t layer, std::span<const int8_t> qx,
               std::span<const float> sx, std::span<const int8_t> qw, std::span<const float> sw,
               std::span<float> y, int64_t m, int64_t n, int64_t k);
// The same op (recorded with w.w) on CPU from w's packing (rk::GemmI8XWtPacked: the same bits).
void GemmI8XWtPacked(const OpHooks& hooks, int64_t layer, std::span<const int8_t> qx,
                     std::span<const float> sx, const rk::I8Packing& w, std::span<const float> sw,
                     std::span<float> y, int64_t m);
void DequantizeRows(const OpHooks& hooks, int64_t layer, std::span<const int8_t> q,
                    std::span<const float> scale, std::span<float> y, int64_t rows, int64_t cols);
void HadamardQuantizeRows(const OpHooks& hooks, int64_t layer, std::span<const float> x,
                          std::span<int8_t> q, std::span<float> scale, int64_t rows, int64_t cols,
                          bool transpose);
// RoPE with `table` (made with rk::MakeRopeTable(table.seq, head_dim, theta)); `position`, the
// first row's position (recorded when given), continues a sequence.
void RopeFwd(const OpHooks& hooks, int64_t layer, const rk::RopeTable& table, float theta,
             std::span<const float> x, std::span<float> y, int64_t batch, int64_t seq,
             int64_t heads, int64_t head_dim, std::optional<int64_t> position = std::nullopt);
void RopeBwd(const OpHooks& hooks, int64_t layer, const rk::RopeTable& table, float theta,
             std::span<const float> dy, std::span<float> dx, int64_t batch, int64_t seq,
             int64_t heads, int64_t head_dim);
// "past" is recorded where s.past is not 0.
void AttentionFwd(const OpHooks& hooks, int64_t layer, const rk::AttentionShape& s,
                  std::span<const float> q, std::span<const float> k, std::span<const float> v,
                  std::span<float> out, std::span<float> lse);
void AttentionBwd(const OpHooks& hooks, int64_t layer, const rk::AttentionShape& s,
                  std::span<const float> q, std::span<const float> k, std::span<const float> v,
                  std::span<const float> out, std::span<const float> lse,
                  std::span<const float> dout, std::span<float> dq, std::span<float> dk,
                  std::span<float> dv);
void SwigluFwd(const OpHooks& hooks, int64_t layer, std::span<const float> gu, std::span<float> act,
               int64_t rows, int64_t f);
void SwigluBwd(const OpHooks& hooks, int64_t layer, std::span<const float> gu,
               std::span<const float> dact, std::span<float> dgu, int64_t rows, int64_t f);
// y += x; `tensor` (recorded when given) names the parameter tensor y is a piece of.
void AddInto(const OpHooks& hooks, int64_t layer, std::span<const float> x, std::span<float> y,
             std::optional<int64_t> tensor = std::nullopt);
// y = x (the same sizes).
void Copy(const OpHooks& hooks, int64_t layer, std::span<const float> x, std::span<float> y);
// y = x's values rounded to bfloat16 (rk::RoundToBf16); in place with one tensor.
void RoundToBf16(const OpHooks& hooks, int64_t layer, std::span<const float> x, std::span<float> y);
inline void RoundToBf16(const OpHooks& hooks, int64_t layer, std::span<float> x) {
  RoundToBf16(hooks, layer, x, x);
}
// y = x stored as bf16 (rk::ToBf16), and x = y read back (rk::FromBf16); the same sizes.
void ToBf16(const OpHooks& hooks, int64_t layer, std::span<const float> x, std::span<BFloat16> y);
void FromBf16(const OpHooks& hooks, int64_t layer, std::span<const BFloat16> x, std::span<float> y);
// The forward records grad_scale 0. `logits` is the kernels' optional logits buffer (not
// recorded).
void CrossEntropyFwd(const OpHooks& hooks, int64_t layer, const rk::CrossEntropyShape& s,
                     std::span<const float> h, std::span<const float> w,
                     std::span<const uint32_t> targets, std::span<float> loss,
                     std::span<float> zloss, std::span<float> lse, std::span<float> logits = {});
// dw accumulates, so it is recorded as an input too.
void CrossEntropyBwd(const OpHooks& hooks, int64_t layer, const rk::CrossEntropyShape& s,
                     std::span<const float> h, std::span<const float> w,
                     std::span<const uint32_t> targets, std::span<const float> lse,
                     float grad_scale, std::span<float> dh, std::span<float> dw,
                     std::span<float> logits = {});
void RowSum(const OpHooks& hooks, int64_t layer, std::span<const float> x, std::span<float> sum,
            int64_t rows, int64_t cols);
// Without a gain (empty gain and dgain) neither "gain" nor "dgain" is recorded.
void RmsNormBwd(const OpHooks& hooks, int64_t layer, std::span<const float> dy,
                std::span<const float> x, std::span<const float> gain, std::span<const float> rstd,
                std::span<float> dx, std::span<float> dgain, int64_t rows, int64_t cols);
// dtable accumulates, so it is recorded as an input too.
void EmbeddingBwd(const OpHooks& hooks, int64_t layer, std::span<const float> dout,
                  std::span<const uint32_t> ids, std::span<float> dtable, int64_t vocab, int64_t d);

// ---- the optimizer's: `tensor` is the parameter tensor's index -------------------------------
// The kNormBlock block sums of x, a piece of the tensor starting at element `begin` (a block
// boundary).
std::vector<double> BlockSquares(const OpHooks& hooks, int64_t layer, int64_t tensor, int64_t begin,
                                 std::span<const float> x);
void CanonicalizeNaNs(const OpHooks& hooks, int64_t layer, int64_t tensor, std::span<float> x);
// rk::NormOfBlockSums(block_sums, blocks); the block counts are recorded as f64 "blocks".
float GlobalNorm(const OpHooks& hooks, int64_t layer, std::span<const double> block_sums,
                 std::span<const int64_t> blocks);
void Scale(const OpHooks& hooks, int64_t layer, int64_t tensor, float factor, std::span<float> x);
void AdamW(const OpHooks& hooks, int64_t layer, int64_t tensor, const rk::AdamWParams& p,
           std::span<float> param, std::span<const float> grad, std::span<float> m,
           std::span<float> v);

}  // namespace lockstep::ops
