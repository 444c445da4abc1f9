// Causal grouped-query attention: argument validation, then the reference or the SIMD variant.
#include "kernels/attention_impl.h"
#include "kernels/internal.h"

namespace lockstep::rk {
namespace {

struct AttentionSizes {
  int64_t q, kv, lse;  // floats in q/out/dout/dq, in k/v/dk/dv, in lse
};

constexpr char kQShape[] = "batch*seq*q_heads*head_dim";
constexpr char kKvShape[] = "batch*(past+seq)*kv_heads*head_dim";
constexpr char kLseShape[] = "batch*q_heads*seq";

AttentionSizes CheckShape(const char* op, const AttentionShape& s) {
  detail::CheckPositive(op, "batch", s.batch);
  detail::CheckPositive(op, "seq", s.seq);
  detail::CheckPositive(op, "q_heads", s.q_heads);
  detail::CheckPositive(op, "kv_heads", s.kv_heads);
  detail::CheckPositive(op, "head_dim", s.head_dim);
  detail::CheckNonNegative(op, "window", s.window);
  detail::CheckNonNegative(op, "past", s.past);
  if (s.past > kAttentionMaxPast) Fail("{}: past = {} (at most 2^40)", op, s.past);
  if (s.q_heads % s.kv_heads != 0) {
    Fail("{}: q_heads = {} is not a multiple of kv_heads = {}", op, s.q_heads, s.kv_heads);
  }
  detail::CheckFinite(op, "scale", s.scale);
  if (!(s.scale > 0)) Fail("{}: scale = {} (must be > 0)", op, s.scale);
  return {detail::Elements(op, kQShape, {s.batch, s.seq, s.q_heads, s.head_dim}),
          detail::Elements(op, kKvShape, {s.batch, s.past + s.seq, s.kv_heads, s.head_dim}),
          detail::Elements(op, kLseShape, {s.batch, s.q_heads, s.seq})};
}

}  // namespace

void AttentionForward(const AttentionShape& s, std::span<const float> q, std::span<const float> k,
                      std::span<const float> v, std::span<float> out, std::span<float> lse) {
  constexpr char op[] = "AttentionForward";
  const AttentionSizes n = CheckShape(op, s);
  detail::CheckSize(op, "q", q, n.q, kQShape);
  detail::CheckSize(op, "k", k, n.kv, kKvShape);
  detail::CheckSize(op, "v", v, n.kv, kKvShape);
  detail::CheckSize(op, "out", out, n.q, kQShape);
  detail::CheckSize(op, "lse", lse, n.lse, kLseShape);
  for (auto [name, output] : {std::pair{"out", out}, std::pair{"lse", lse}}) {
    detail::CheckDisjoint(op, name, output, "q", q);
    detail::CheckDisjoint(op, name, output, "k", k);
    detail::CheckDisjoint(op, name, output, "v", v);
  }
  detail::CheckDisjoint(op, "out", out, "lse", lse);

  if (detail::UsingReference()) {
    ref::AttentionForward(s, q.data(), k.data(), v.data(), out.data(), lse.data());
  } else {
    simd::AttentionForward(s, q.data(), k.data(), v.data(), out.data(), lse.data());
  }
}

void AttentionBackward(const AttentionShape& s, std::span<const float> q, std::span<const float> k,
                       std::span<const float> v, std::span<const float> out,
                       std::span<const float> lse, std::span<const float> dout, std::span<float> dq,
                       std::span<float> dk, std::span<float> dv) {
  constexpr char op[] = "AttentionBackward";
  const AttentionSizes n = CheckShape(op, s);
  if (s.past != 0)
    Fail("{}: past = {} (the backward is of a whole sequence: past must be 0)", op, s.past);
  detail::CheckSize(op, "q", q, n.q, kQShape);
  detail::CheckSize(op, "k", k, n.kv, kKvShape);
  detail::CheckSize(op, "v", v, n.kv, kKvShape);
  detail::CheckSize(op, "out", out, n.q, kQShape);
  detail::CheckSize(op, "lse", lse, n.lse, kLseShape);
  detail::CheckSize(op, "dout", dout, n.q, kQShape);
  detail::CheckSize(op, "dq", dq, n.q, kQShape);
  detail::CheckSize(op, "dk", dk, n.kv, kKvShape);
  detail::CheckSize(op, "dv", dv, n.kv, kKvShape);
  const std::pair<const char*, std::span<const float>> inputs[] = {
      {"q", q}, {"k", k}, {"v", v}, {"out", out}, {"lse", lse}, {"dout", dout}};
  for (auto [name, grad] : {std::pair{"dq", dq}, std::pair{"dk", dk}, std::pair{"dv", dv}}) {
    for (const auto& [input_name, input] : inputs) {
      detail::CheckDisjoint(op, name, grad, input_name, input);
    }
  }
  detail::CheckDisjoint(op, "dq", dq, "dk", dk);
  detail::CheckDisjoint(op, "dq", dq, "dv", dv);
  detail::CheckDisjoint(op, "dk", dk, "dv", dv);

  if (detail::UsingReference()) {
    ref::AttentionBackward(s, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(),
                           dq.data(), dk.data(), dv.data());
  } else {
    simd::AttentionBackward(s, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(),
                            dq.data(), dk.data(), dv.data());
  }
}

}  // namespace lockstep::rk
