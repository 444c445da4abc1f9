// The typed op calls: each gives its op's values in op-table order, and Call names them from the
// op's entry (rk::Spec) into the record ObservedOp reports and runs.
#include "lockstep/op_calls.h"

#include <algorithm>
#include <array>
#include <initializer_list>

#include "lockstep/core.h"

namespace lockstep::ops {
namespace {

using Arg = std::optional<double>;

// A tensor a call reads or writes, in its role's place (empty: an optional role left out).
using In = TensorView;
using Out = MutableTensorView;

// Up to N values, without allocating.
template <typename T, size_t N>
class Few {
 public:
  void Push(const T& t) {
    LOCKSTEP_CHECK(size_ < N, "more than {} values in an op's record", N);
    items_[size_++] = t;
  }
  std::span<const T> View() const { return {items_.data(), size_}; }

 private:
  std::array<T, N> items_{};
  size_t size_ = 0;
};

// A call's record: its values named by the op's entry, in the entry's order.
class Record {
 public:
  Record(const rk::OpSpec& spec, std::initializer_list<Arg> args, std::initializer_list<In> inputs,
         std::initializer_list<Out> outputs) {
    LOCKSTEP_CHECK(args.size() == spec.args.size() + spec.optional_args.size() &&
                       inputs.size() == spec.inputs.size() && outputs.size() == spec.outputs.size(),
                   "a call of op '{}' gives {} arguments, {} inputs and {} outputs", spec.name,
                   args.size(), inputs.size(), outputs.size());
    const Arg* value = args.begin();
    for (const std::string_view name : spec.args) {
      LOCKSTEP_CHECK(value->has_value(), "op '{}': argument '{}' not given", spec.name, name);
      args_.Push({name, **value++});
    }
    for (const std::string_view name : spec.optional_args) {
      if (value->has_value()) args_.Push({name, **value});
      ++value;
    }
    const In* in = inputs.begin();
    for (const rk::OpRole& role : spec.inputs) {
      if (!role.optional || !in->empty()) inputs_.Push({role.name, *in});
      ++in;
    }
    const Out* out = outputs.begin();
    for (const rk::OpRole& role : spec.outputs) {
      if (!role.optional || !out->empty()) outputs_.Push({role.name, *out});
      ++out;
    }
  }
  std::span<const OpArg> args() const { return args_.View(); }
  std::span<const OpTensor> inputs() const { return inputs_.View(); }
  std::span<const OpOutput> outputs() const { return outputs_.View(); }

 private:
  Few<OpArg, 8> args_;
  Few<OpTensor, 6> inputs_;
  Few<OpOutput, 3> outputs_;
};

// Runs `kernel`, the CPU form of op `op`, through ObservedOp with the record of the given values;
// with no hook installed, the kernel alone.
template <typename Kernel>
void Call(const OpHooks& hooks, rk::Op op, int64_t layer, std::initializer_list<Arg> args,
          std::initializer_list<In> inputs, std::initializer_list<Out> outputs, Kernel&& kernel) {
  if (hooks.observer == nullptr && hooks.executor == nullptr) {
    kernel();
    return;
  }
  const Record record(rk::Spec(op), args, inputs, outputs);
  ObservedOp(hooks, op, layer, record.args(), record.inputs(), record.outputs(), kernel);
}

double D(int64_t x) { return static_cast<double>(x); }

}  // namespace

void EmbeddingFwd(const OpHooks& hooks, int64_t layer, std::span<const float> table,
                  std::span<const uint32_t> ids, std::span<float> out, int64_t vocab, int64_t d) {
  Call(hooks, rk::Op::kEmbeddingFwd, layer, {D(vocab), D(d)}, {table, ids}, {out},
       [&] { rk::EmbeddingForward(table, ids, out, vocab, d); });
}

void RmsNormFwd(const OpHooks& hooks, int64_t layer, std::span<const float> x,
                std::span<const float> gain, float eps, std::span<float> y, std::span<float> rstd,
                int64_t rows, int64_t cols) {
  Call(hooks, rk::Op::kRmsNormFwd, layer, {D(rows), D(cols), eps}, {x, gain}, {y, rstd},
       [&] { rk::RmsNormForward(x, gain, eps, y, rstd, rows, cols); });
}

// The GEMMs record the output among the inputs when they accumulate into it.
void GemmXWt(const OpHooks& hooks, int64_t layer, std::span<const float> x,
             std::span<const float> w, std::span<float> y, int64_t m, int64_t n, int64_t k,
             bool accumulate) {
  Call(hooks, rk::Op::kGemmXWt, layer, {D(m), D(n), D(k), double(accumulate)},
       {x, w, accumulate ? y : std::span<float>()}, {y},
       [&] { rk::GemmXWt(x, w, y, m, n, k, accumulate); });
}

void GemmXWtPacked(const OpHooks& hooks, int64_t layer, std::span<const float> x,
                   const rk::GemvPacking& w, std::span<float> y, int64_t m) {
  Call(hooks, rk::Op::kGemmXWt, layer, {D(m), D(w.n), D(w.k), 0.0}, {x, w.w, std::span<float>()},
       {y}, [&] { rk::GemmXWtPacked(x, w, y, m); });
}

void GemmDyW(const OpHooks& hooks, int64_t layer, std::span<const float> dy,
             std::span<const float> w, std::span<float> dx, int64_t m, int64_t n, int64_t k,
             bool accumulate) {
  Call(hooks, rk::Op::kGemmDyW, layer, {D(m), D(n), D(k), double(accumulate)},
       {dy, w, accumulate ? dx : std::span<float>()}, {dx},
       [&] { rk::GemmDyW(dy, w, dx, m, n, k, accumulate); });
}

void GemmDytX(const OpHooks& hooks, int64_t layer, std::span<const float> dy,
              std::span<const float> x, std::span<float> dw, int64_t m, int64_t n, int64_t k,
              bool accumulate) {
  Call(hooks, rk::Op::kGemmDytX, layer, {D(m), D(n), D(k), double(accumulate)},
       {dy, x, accumulate ? dw : std::span<float>()}, {dw},
       [&] { rk::GemmDytX(dy, x, dw, m, n, k, accumulate); });
}

void QuantizeRows(const OpHooks& hooks, int64_t layer, std::span<const float> x,
                  std::span<int8_t> q, std::span<float> scale, int64_t rows, int64_t cols) {
  Call(hooks, rk::Op::kQuantizeRows, layer, {D(rows), D(cols)}, {x}, {q, scale},
       [&] { rk::QuantizeRows(x, q, scale, rows, cols); });
}

void QuantizeRowsByScale(const OpHooks& hooks, int64_t layer, std::span<const float> x,
                         std::span<const float> scale, std::span<int8_t> q, int64_t rows,
                         int64_t cols) {
  Call(hooks, rk::Op::kQuantizeRowsByScale, layer, {D(rows), D(cols)}, {x, scale}, {q},
       [&] { rk::QuantizeRowsByScale(x, scale, q, rows, cols); });
}

void GemmI8XWt(const OpHooks& hooks, int64_t layer, std::span<const int8_t> qx,
               std::span<const float> sx, std::span<const int8_t> qw, std::span<const float> sw,
               std::span<float> y, int64_t m, int64_t n, int64_t k) {
  Call(hooks, rk::Op::kGemmI8XWt, layer, {D(m), D(n), D(k)}, {qx, sx, qw, sw}, {y},
       [&] { rk::GemmI8XWt(qx, sx, qw, sw, y, m, n, k); });
}

void GemmI8XWtPacked(const OpHooks& hooks, int64_t layer, std::span<const int8_t> qx,
                     std::span<const float> sx, const rk::I8Packing& w, std::span<const float> sw,
                     std::span<float> y, int64_t m) {
  Call(hooks, rk::Op::kGemmI8XWt, layer, {D(m), D(w.n), D(w.k)}, {qx, sx, w.w, sw}, {y},
       [&] { rk::GemmI8XWtPacked(qx, sx, w, sw, y, m); });
}

void DequantizeRows(const OpHooks& hooks, int64_t layer, std::span<const int8_t> q,
                    std::span<const float> scale, std::span<float> y, int64_t rows, int64_t cols) {
  Call(hooks, rk::Op::kDequantizeRows, layer, {D(rows), D(cols)}, {q, scale}, {y},
       [&] { rk::DequantizeRows(q, scale, y, rows, cols); });
}

void HadamardQuantizeRows(const OpHooks& hooks, int64_t layer, std::span<const float> x,
                          std::span<int8_t> q, std::span<float> scale, int64_t rows, int64_t cols,
                          bool transpose) {
  Call(hooks, rk::Op::kHadamardQuantizeRows, layer, {D(rows), D(cols), double(transpose)}, {x},
       {q, scale}, [&] { rk::HadamardQuantizeRows(x, q, scale, rows, cols, transpose); });
}

void RopeFwd(const OpHooks& hooks, int64_t layer, const rk::RopeTable& table, float theta,
             std::span<const float> x, std::span<float> y, int64_t batch, int64_t seq,
             int64_t heads, int64_t head_dim, std::optional<int64_t> position) {
  const Arg recorded_position = position ? Arg(D(*position)) : std::nullopt;
  Call(hooks, rk::Op::kRopeFwd, layer,
       {D(batch), D(seq), D(heads), D(head_dim), D(table.seq), theta, recorded_position}, {x}, {y},
       [&] { rk::RopeForward(x, y, table, batch, seq, heads, head_dim, position.value_or(0)); });
}

void RopeBwd(const OpHooks& hooks, int64_t layer, const rk::RopeTable& table, float theta,
             std::span<const float> dy, std::span<float> dx, int64_t batch, int64_t seq,
             int64_t heads, int64_t head_dim) {
  Call(hooks, rk::Op::kRopeBwd, layer,
       {D(batch), D(seq), D(heads), D(head_dim), D(table.seq), theta}, {dy}, {dx},
       [&] { rk::RopeBackward(dy, dx, table, batch, seq, heads, head_dim); });
}

void AttentionFwd(const OpHooks& hooks, int64_t layer, const rk::AttentionShape& s,
                  std::span<const float> q, std::span<const float> k, std::span<const float> v,
                  std::span<float> out, std::span<float> lse) {
  const Arg past = s.past != 0 ? Arg(D(s.past)) : std::nullopt;
  Call(hooks, rk::Op::kAttentionFwd, layer,
       {D(s.batch), D(s.seq), D(s.q_heads), D(s.kv_heads), D(s.head_dim), D(s.window), s.scale,
        past},
       {q, k, v}, {out, lse}, [&] { rk::AttentionForward(s, q, k, v, out, lse); });
}

void AttentionBwd(const OpHooks& hooks, int64_t layer, const rk::AttentionShape& s,
                  std::span<const float> q, std::span<const float> k, std::span<const float> v,
                  std::span<const float> out, std::span<const float> lse,
                  std::span<const float> dout, std::span<float> dq, std::span<float> dk,
                  std::span<float> dv) {
  Call(hooks, rk::Op::kAttentionBwd, layer,
       {D(s.batch), D(s.seq), D(s.q_heads), D(s.kv_heads), D(s.head_dim), D(s.window), s.scale},
       {q, k, v, out, lse, dout}, {dq, dk, dv},
       [&] { rk::AttentionBackward(s, q, k, v, out, lse, dout, dq, dk, dv); });
}

void SwigluFwd(const OpHooks& hooks, int64_t layer, std::span<const float> gu, std::span<float> act,
               int64_t rows, int64_t f) {
  Call(hooks, rk::Op::kSwigluFwd, layer, {D(rows), D(f)}, {gu}, {act},
       [&] { rk::SwigluForward(gu, act, rows, f); });
}

void SwigluBwd(const OpHooks& hooks, int64_t layer, std::span<const float> gu,
               std::span<const float> dact, std::span<float> dgu, int64_t rows, int64_t f) {
  Call(hooks, rk::Op::kSwigluBwd, layer, {D(rows), D(f)}, {gu, dact}, {dgu},
       [&] { rk::SwigluBackward(gu, dact, dgu, rows, f); });
}

void AddInto(const OpHooks& hooks, int64_t layer, std::span<const float> x, std::span<float> y,
             std::optional<int64_t> tensor) {
  const Arg recorded_tensor = tensor ? Arg(D(*tensor)) : std::nullopt;
  Call(hooks, rk::Op::kAddInto, layer, {D(std::ssize(x)), recorded_tensor}, {x, y}, {y},
       [&] { rk::AddInto(x, y); });
}

void Copy(const OpHooks& hooks, int64_t layer, std::span<const float> x, std::span<float> y) {
  LOCKSTEP_CHECK(x.size() == y.size(), "copy of {} floats into {}", x.size(), y.size());
  Call(hooks, rk::Op::kCopy, layer, {D(std::ssize(x))}, {x}, {y},
       [&] { std::ranges::copy(x, y.begin()); });
}

void RoundToBf16(const OpHooks& hooks, int64_t layer, std::span<const float> x,
                 std::span<float> y) {
  Call(hooks, rk::Op::kRoundToBf16, layer, {D(std::ssize(x))}, {x}, {y},
       [&] { rk::RoundToBf16(x, y); });
}

void ToBf16(const OpHooks& hooks, int64_t layer, std::span<const float> x, std::span<BFloat16> y) {
  Call(hooks, rk::Op::kToBf16, layer, {D(std::ssize(x))}, {x}, {y}, [&] { rk::ToBf16(x, y); });
}

void FromBf16(const OpHooks& hooks, int64_t layer, std::span<const BFloat16> x,
              std::span<float> y) {
  Call(hooks, rk::Op::kFromBf16, layer, {D(std::ssize(x))}, {x}, {y}, [&] { rk::FromBf16(x, y); });
}

void CrossEntropyFwd(const OpHooks& hooks, int64_t layer, const rk::CrossEntropyShape& s,
                     std::span<const float> h, std::span<const float> w,
                     std::span<const uint32_t> targets, std::span<float> loss,
                     std::span<float> zloss, std::span<float> lse, std::span<float> logits) {
  Call(hooks, rk::Op::kCrossEntropyFwd, layer,
       {D(s.rows), D(s.d), D(s.vocab), D(s.vocab_chunk), s.z_loss, 0.0}, {h, w, targets},
       {loss, zloss, lse},
       [&] { rk::CrossEntropyForward(s, h, w, targets, loss, zloss, lse, logits); });
}

void CrossEntropyBwd(const OpHooks& hooks, int64_t layer, const rk::CrossEntropyShape& s,
                     std::span<const float> h, std::span<const float> w,
                     std::span<const uint32_t> targets, std::span<const float> lse,
                     float grad_scale, std::span<float> dh, std::span<float> dw,
                     std::span<float> logits) {
  Call(hooks, rk::Op::kCrossEntropyBwd, layer,
       {D(s.rows), D(s.d), D(s.vocab), D(s.vocab_chunk), s.z_loss, grad_scale},
       {h, w, targets, lse, dw}, {dh, dw},
       [&] { rk::CrossEntropyBackward(s, h, w, targets, lse, grad_scale, dh, dw, logits); });
}

void RowSum(const OpHooks& hooks, int64_t layer, std::span<const float> x, std::span<float> sum,
            int64_t rows, int64_t cols) {
  Call(hooks, rk::Op::kRowSum, layer, {D(rows), D(cols)}, {x}, {sum},
       [&] { rk::RowSum(x, sum, rows, cols); });
}

void RmsNormBwd(const OpHooks& hooks, int64_t layer, std::span<const float> dy,
                std::span<const float> x, std::span<const float> gain, std::span<const float> rstd,
                std::span<float> dx, std::span<float> dgain, int64_t rows, int64_t cols) {
  Call(hooks, rk::Op::kRmsNormBwd, layer, {D(rows), D(cols)}, {dy, x, gain, rstd}, {dx, dgain},
       [&] { rk::RmsNormBackward(dy, x, gain, rstd, dx, dgain, rows, cols); });
}

void EmbeddingBwd(const OpHooks& hooks, int64_t layer, std::span<const float> dout,
                  std::span<const uint32_t> ids, std::span<float> dtable, int64_t vocab,
                  int64_t d) {
  Call(hooks, rk::Op::kEmbeddingBwd, layer, {D(vocab), D(d)}, {dout, ids, dtable}, {dtable},
       [&] { rk::EmbeddingBackward(dout, ids, dtable, vocab, d); });
}

std::vector<double> BlockSquares(const OpHooks& hooks, int64_t layer, int64_t tensor, int64_t begin,
                                 std::span<const float> x) {
  std::vector<double> sums(
      static_cast<size_t>((std::ssize(x) + rk::kNormBlock - 1) / rk::kNormBlock));
  Call(hooks, rk::Op::kBlockSquares, layer, {D(tensor), D(begin)}, {x}, {std::span(sums)},
       [&] { std::ranges::copy(rk::BlockSquares(x), sums.begin()); });
  return sums;
}

void CanonicalizeNaNs(const OpHooks& hooks, int64_t layer, int64_t tensor, std::span<float> x) {
  Call(hooks, rk::Op::kCanonicalizeNaNs, layer, {D(tensor)}, {x}, {x},
       [&] { rk::CanonicalizeNaNs(x); });
}

float GlobalNorm(const OpHooks& hooks, int64_t layer, std::span<const double> block_sums,
                 std::span<const int64_t> blocks) {
  const std::vector<double> block_counts(blocks.begin(), blocks.end());
  float norm = 0;
  Call(hooks, rk::Op::kGlobalNorm, layer, {D(std::ssize(blocks))},
       {block_sums, std::span<const double>(block_counts)}, {std::span(&norm, 1)},
       [&] { norm = rk::NormOfBlockSums(block_sums, blocks); });
  return norm;
}

void Scale(const OpHooks& hooks, int64_t layer, int64_t tensor, float factor, std::span<float> x) {
  Call(hooks, rk::Op::kScale, layer, {D(tensor), factor}, {x}, {x}, [&] { rk::Scale(x, factor); });
}

void AdamW(const OpHooks& hooks, int64_t layer, int64_t tensor, const rk::AdamWParams& p,
           std::span<float> param, std::span<const float> grad, std::span<float> m,
           std::span<float> v) {
  Call(hooks, rk::Op::kAdamW, layer,
       {D(tensor), p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, D(p.step)}, {param, grad, m, v},
       {param, m, v}, [&] { rk::AdamWUpdate(p, param, grad, m, v); });
}

}  // namespace lockstep::ops
