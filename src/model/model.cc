// The decoder's forward and backward passes: plain orchestration over the kernels, llm.c style.
// docs/model.md lists the kernel calls in order; shapes are in the comments. B = batch,
// T = seq, N = B*T rows, d = d_model, Q = n_heads*head_dim, K = n_kv_heads*head_dim,
// F = ffn_hidden, V = vocab.
#include <algorithm>
#include <array>

#include "lockstep/core.h"
#include "lockstep/kernels.h"
#include "lockstep/model.h"

namespace lockstep {
namespace {

// Index of each tensor in ParameterSpecs order.
constexpr size_t kAttnNorm = 0, kWq = 1, kWk = 2, kWv = 3, kWo = 4, kFfnNorm = 5, kWGateUp = 6,
                 kWDown = 7, kTensorsPerLayer = 8;

struct ParamIndex {
  size_t tok, emb_norm, first_layer, final_norm, output;
  explicit ParamIndex(const ModelConfig& c)
      : tok(0),
        emb_norm(1),
        first_layer(c.embedding_norm ? 2 : 1),
        final_norm(first_layer + kTensorsPerLayer * static_cast<size_t>(c.n_layers)),
        output(final_norm + 1) {}
  size_t Layer(int64_t l, size_t which) const {
    return first_layer + kTensorsPerLayer * static_cast<size_t>(l) + which;
  }
};

}  // namespace

Model::Model(const ModelConfig& config, int64_t vocab_chunk, int64_t batch, int64_t seq)
    : Model(config, vocab_chunk, batch, seq, PlanOnly{}) {
  arena_.assign(static_cast<size_t>(arena_floats_), 0.0f);
  inputs_.resize(static_cast<size_t>(rows_));
  targets_.resize(static_cast<size_t>(rows_));
}

int64_t Model::AllocatedBytes(const ModelConfig& config, int64_t vocab_chunk, int64_t batch,
                              int64_t seq) {
  const Model plan(config, vocab_chunk, batch, seq, PlanOnly{});
  const int64_t rope_floats = static_cast<int64_t>(plan.rope_.cos.size() + plan.rope_.sin.size());
  return (plan.arena_floats_ + rope_floats) * int64_t{sizeof(float)} +
         2 * plan.rows_ * int64_t{sizeof(uint32_t)};
}

Model::Model(const ModelConfig& config, int64_t vocab_chunk, int64_t batch, int64_t seq, PlanOnly)
    : config_(config),
      vocab_chunk_(vocab_chunk),
      batch_(batch),
      seq_(seq),
      rows_(batch * seq),
      specs_(ParameterSpecs(config)) {
  if (batch < 1 || seq < 1 || seq > config.seq_len) {
    Fail("Model: batch = {} and seq = {} must be >= 1, seq <= model.seq_len = {}", batch, seq,
         config.seq_len);
  }
  rope_ = rk::MakeRopeTable(config.seq_len, config.head_dim, static_cast<float>(config.rope_theta));

  // Plan the arena: every buffer starts on a 64-byte boundary.
  int64_t end = 0;
  auto take = [&end](int64_t n) {
    const Span s{end, n};
    end += (n + 15) / 16 * 16;
    return s;
  };
  const int64_t n = rows_, d = config.d_model, f = config.ffn_hidden;
  const int64_t q_dim = config.n_heads * config.head_dim;
  const int64_t kv_dim = config.n_kv_heads * config.head_dim;
  const int64_t qk_raw = config.qk_norm ? 1 : 0;
  if (config.embedding_norm) {
    emb_ = take(n * d);
    emb_rstd_ = take(n);
  }
  layers_.resize(static_cast<size_t>(config.n_layers));
  for (LayerActivations& a : layers_) {
    a.x_in = take(n * d);
    a.attn_rstd = take(n);
    a.h = take(n * d);
    a.q_raw = take(qk_raw * n * q_dim);
    a.q_rstd = take(qk_raw * n * config.n_heads);
    a.k_raw = take(qk_raw * n * kv_dim);
    a.k_rstd = take(qk_raw * n * config.n_kv_heads);
    a.q = take(n * q_dim);
    a.k = take(n * kv_dim);
    a.v = take(n * kv_dim);
    a.attn = take(n * q_dim);
    a.attn_lse = take(n * config.n_heads);
    a.x_mid = take(n * d);
    a.ffn_rstd = take(n);
    a.h2 = take(n * d);
    a.gu = take(n * 2 * f);
    a.act = take(n * f);
  }
  x_final_ = take(n * d);
  final_rstd_ = take(n);
  xf_ = take(n * d);
  loss_ = take(n);
  zloss_ = take(n);
  lse_ = take(n);
  dx_ = take(n * d);
  dh_ = take(n * d);
  dq_ = take(n * q_dim);
  dk_ = take(n * kv_dim);
  dv_ = take(n * kv_dim);
  dattn_ = take(n * q_dim);
  dgu_ = take(n * 2 * f);
  dact_ = take(n * f);
  dgain_ = take(d);
  arena_floats_ = end;
}

void Model::CheckParams(const ParamStore& params, const char* what) const {
  if (params.size() != specs_.size()) {
    Fail("Model: {} holds {} tensors, the model has {}", what, params.size(), specs_.size());
  }
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (params.Spec(i).name != specs_[i].name || params.Spec(i).shape != specs_[i].shape) {
      Fail("Model: {} tensor {} is '{}', the model expects '{}'", what, i, params.Spec(i).name,
           specs_[i].name);
    }
  }
}

std::span<float> StoreAccess::OpenGrad(size_t i, bool) {
  if (grads_ == nullptr) Fail("StoreAccess: a gradient was asked for, but no gradient store given");
  return grads_->Tensor(i);
}

std::span<const float> Model::Param(TensorAccess& access, size_t i) const {
  const std::span<const float> p = access.OpenParam(i);
  if (static_cast<int64_t>(p.size()) != specs_[i].numel()) {
    Fail("Model: parameter '{}' has {} elements, the model expects {}", specs_[i].name, p.size(),
         specs_[i].numel());
  }
  return p;
}

std::span<float> Model::Grad(TensorAccess& access, size_t i, bool accumulate) const {
  const std::span<float> g = access.OpenGrad(i, accumulate);
  if (static_cast<int64_t>(g.size()) != specs_[i].numel()) {
    Fail("Model: the gradient of '{}' has {} elements, the model expects {}", specs_[i].name,
         g.size(), specs_[i].numel());
  }
  return g;
}

LossSums Model::Forward(const ParamStore& params, std::span<const uint32_t> tokens) {
  CheckParams(params, "params");
  StoreAccess access(params, nullptr);
  return Forward(access, tokens);
}

LossSums Model::ForwardBackward(const ParamStore& params, std::span<const uint32_t> tokens,
                                float grad_scale, bool accumulate, ParamStore& grads) {
  CheckParams(params, "params");
  CheckParams(grads, "grads");
  StoreAccess access(params, &grads);
  return ForwardBackward(access, tokens, grad_scale, accumulate);
}

LossSums Model::Forward(TensorAccess& access, std::span<const uint32_t> tokens) {
  if (tokens.size() != static_cast<size_t>(batch_ * (seq_ + 1))) {
    Fail("Model::Forward: tokens has {} ids, expected batch * (seq + 1) = {} * {}", tokens.size(),
         batch_, seq_ + 1);
  }
  for (int64_t b = 0; b < batch_; ++b) {
    const uint32_t* row = tokens.data() + b * (seq_ + 1);
    std::copy(row, row + seq_, inputs_.begin() + b * seq_);
    std::copy(row + 1, row + 1 + seq_, targets_.begin() + b * seq_);
  }
  const ModelConfig& c = config_;
  const ParamIndex P(c);
  const int64_t n = rows_, d = c.d_model, f = c.ffn_hidden, hd = c.head_dim;
  const int64_t q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
  const float eps = static_cast<float>(c.norm_eps);

  // Embedding (+ optional RMSNorm): x[N, d].
  std::span<float> x0 = A(layers_[0].x_in);
  rk::EmbeddingForward(Param(access, P.tok), inputs_, c.embedding_norm ? A(emb_) : x0, c.vocab, d);
  access.CloseParam(P.tok);
  if (c.embedding_norm) {
    rk::RmsNormForward(A(emb_), Param(access, P.emb_norm), eps, x0, A(emb_rstd_), n, d);
    access.CloseParam(P.emb_norm);
  }

  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerActivations& a = layers_[static_cast<size_t>(l)];
    std::array<std::span<const float>, kTensorsPerLayer> w;
    for (size_t which = 0; which < kTensorsPerLayer; ++which) {
      w[which] = Param(access, P.Layer(l, which));
    }
    // Attention block: x_mid = x_in + attn(RMSNorm(x_in)) · Woᵀ.
    rk::RmsNormForward(A(a.x_in), w[kAttnNorm], eps, A(a.h), A(a.attn_rstd), n, d);  // h[N,d]
    if (c.qk_norm) {
      rk::GemmXWt(A(a.h), w[kWq], A(a.q_raw), n, q_dim, d);   // q_raw[N, Q]
      rk::GemmXWt(A(a.h), w[kWk], A(a.k_raw), n, kv_dim, d);  // k_raw[N, K]
      rk::RmsNormForward(A(a.q_raw), {}, eps, A(a.q), A(a.q_rstd), n * c.n_heads, hd);
      rk::RmsNormForward(A(a.k_raw), {}, eps, A(a.k), A(a.k_rstd), n * c.n_kv_heads, hd);
    } else {
      rk::GemmXWt(A(a.h), w[kWq], A(a.q), n, q_dim, d);
      rk::GemmXWt(A(a.h), w[kWk], A(a.k), n, kv_dim, d);
    }
    rk::GemmXWt(A(a.h), w[kWv], A(a.v), n, kv_dim, d);  // v[N, K]
    rk::RopeForward(A(a.q), A(a.q), rope_, batch_, seq_, c.n_heads, hd);
    rk::RopeForward(A(a.k), A(a.k), rope_, batch_, seq_, c.n_kv_heads, hd);
    rk::AttentionForward(AttentionShape(l), A(a.q), A(a.k), A(a.v), A(a.attn),
                         A(a.attn_lse));                        // attn[N, Q]
    rk::GemmXWt(A(a.attn), w[kWo], A(a.x_mid), n, d, q_dim);  // x_mid[N, d]
    rk::AddInto(A(a.x_in), A(a.x_mid));
    // Feed-forward block: x_out = x_mid + SwiGLU(RMSNorm(x_mid) · W_guᵀ) · W_downᵀ.
    rk::RmsNormForward(A(a.x_mid), w[kFfnNorm], eps, A(a.h2), A(a.ffn_rstd), n, d);
    rk::GemmXWt(A(a.h2), w[kWGateUp], A(a.gu), n, 2 * f, d);  // gu[N, 2F]: gate | up
    rk::SwigluForward(A(a.gu), A(a.act), n, f);               // act[N, F]
    const Span x_out = l + 1 < c.n_layers ? layers_[static_cast<size_t>(l + 1)].x_in : x_final_;
    rk::GemmXWt(A(a.act), w[kWDown], A(x_out), n, d, f);  // x_out[N, d]
    rk::AddInto(A(a.x_mid), A(x_out));
    for (size_t which = 0; which < kTensorsPerLayer; ++which) access.CloseParam(P.Layer(l, which));
  }

  // Final RMSNorm and the fused output head + cross-entropy + z-loss.
  rk::RmsNormForward(A(x_final_), Param(access, P.final_norm), eps, A(xf_), A(final_rstd_), n, d);
  access.CloseParam(P.final_norm);
  rk::CrossEntropyForward(CrossEntropyShape(), A(xf_), Param(access, P.output), targets_, A(loss_),
                          A(zloss_), A(lse_));
  access.CloseParam(P.output);
  LossSums sums;
  rk::RowSum(A(loss_), {&sums.loss, 1}, 1, n);
  rk::RowSum(A(zloss_), {&sums.zloss, 1}, 1, n);
  have_forward_ = true;
  return sums;
}

void Model::Backward(TensorAccess& access, float grad_scale, bool accumulate) {
  if (!have_forward_) Fail("Model::Backward: called before Forward");
  const ModelConfig& c = config_;
  const ParamIndex P(c);
  const int64_t n = rows_, d = c.d_model, f = c.ffn_hidden, hd = c.head_dim;
  const int64_t q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
  // Gain gradients come out of RmsNormBackward overwritten (in dgain_); they are then stored or
  // added to the accumulated gradient.
  auto store_gain = [&](size_t i) {
    const std::span<float> g = Grad(access, i, accumulate);
    if (accumulate) {
      rk::AddInto(A(dgain_), g);
    } else {
      std::copy(A(dgain_).begin(), A(dgain_).end(), g.begin());
    }
    access.CloseGrad(i);
  };
  // dW = dyᵀ · x, stored or added to the accumulated gradient by the GEMM itself.
  auto weight_grad = [&](size_t i, std::span<const float> dy, std::span<const float> x,
                         int64_t rows_out, int64_t cols) {
    rk::GemmDytX(dy, x, Grad(access, i, accumulate), n, rows_out, cols, accumulate);
    access.CloseGrad(i);
  };
  // The embedding and output-head gradients are accumulated into by their kernels.
  auto scatter_grad = [&](size_t i) {
    const std::span<float> g = Grad(access, i, accumulate);
    if (!accumulate) std::ranges::fill(g, 0.0f);
    return g;
  };

  // Output head and final norm: dx = d x_final [N, d].
  rk::CrossEntropyBackward(CrossEntropyShape(), A(xf_), Param(access, P.output), targets_, A(lse_),
                           grad_scale, A(dh_), scatter_grad(P.output));
  access.CloseGrad(P.output);
  access.CloseParam(P.output);
  rk::RmsNormBackward(A(dh_), A(x_final_), Param(access, P.final_norm), A(final_rstd_), A(dx_),
                      A(dgain_), n, d);
  access.CloseParam(P.final_norm);
  store_gain(P.final_norm);

  for (int64_t l = c.n_layers - 1; l >= 0; --l) {
    const LayerActivations& a = layers_[static_cast<size_t>(l)];
    std::array<std::span<const float>, kTensorsPerLayer> w;
    for (size_t which = 0; which < kTensorsPerLayer; ++which) {
      w[which] = Param(access, P.Layer(l, which));
    }
    auto G = [&](size_t which) { return P.Layer(l, which); };
    // Feed-forward block; on entry dx = d x_out, on exit dx = d x_mid.
    rk::GemmDyW(A(dx_), w[kWDown], A(dact_), n, d, f);            // dact[N, F]
    weight_grad(G(kWDown), A(dx_), A(a.act), d, f);               // dW_down[d, F]
    rk::SwigluBackward(A(a.gu), A(dact_), A(dgu_), n, f);         // dgu[N, 2F]
    rk::GemmDyW(A(dgu_), w[kWGateUp], A(dh_), n, 2 * f, d);       // dh2[N, d]
    weight_grad(G(kWGateUp), A(dgu_), A(a.h2), 2 * f, d);         // dW_gu[2F, d]
    rk::RmsNormBackward(A(dh_), A(a.x_mid), w[kFfnNorm], A(a.ffn_rstd), A(dh_), A(dgain_), n, d);
    store_gain(G(kFfnNorm));
    rk::AddInto(A(dh_), A(dx_));
    // Attention block; on exit dx = d x_in.
    rk::GemmDyW(A(dx_), w[kWo], A(dattn_), n, d, q_dim);  // dattn[N, Q]
    weight_grad(G(kWo), A(dx_), A(a.attn), d, q_dim);     // dWo[d, Q]
    rk::AttentionBackward(AttentionShape(l), A(a.q), A(a.k), A(a.v), A(a.attn), A(a.attn_lse),
                          A(dattn_), A(dq_), A(dk_), A(dv_));  // dq[N, Q], dk/dv[N, K]
    rk::RopeBackward(A(dq_), A(dq_), rope_, batch_, seq_, c.n_heads, hd);
    rk::RopeBackward(A(dk_), A(dk_), rope_, batch_, seq_, c.n_kv_heads, hd);
    if (c.qk_norm) {
      rk::RmsNormBackward(A(dq_), A(a.q_raw), {}, A(a.q_rstd), A(dq_), {}, n * c.n_heads, hd);
      rk::RmsNormBackward(A(dk_), A(a.k_raw), {}, A(a.k_rstd), A(dk_), {}, n * c.n_kv_heads, hd);
    }
    // dh[N, d] = dq · Wq + dk · Wk + dv · Wv (the latter two GEMMs accumulate into dh).
    rk::GemmDyW(A(dq_), w[kWq], A(dh_), n, q_dim, d);
    rk::GemmDyW(A(dk_), w[kWk], A(dh_), n, kv_dim, d, /*accumulate=*/true);
    rk::GemmDyW(A(dv_), w[kWv], A(dh_), n, kv_dim, d, /*accumulate=*/true);
    weight_grad(G(kWq), A(dq_), A(a.h), q_dim, d);   // dWq[Q, d]
    weight_grad(G(kWk), A(dk_), A(a.h), kv_dim, d);  // dWk[K, d]
    weight_grad(G(kWv), A(dv_), A(a.h), kv_dim, d);  // dWv[K, d]
    rk::RmsNormBackward(A(dh_), A(a.x_in), w[kAttnNorm], A(a.attn_rstd), A(dh_), A(dgain_), n,
                        d);
    store_gain(G(kAttnNorm));
    rk::AddInto(A(dh_), A(dx_));
    for (size_t which = 0; which < kTensorsPerLayer; ++which) access.CloseParam(G(which));
  }

  // Embedding norm and embedding.
  if (c.embedding_norm) {
    rk::RmsNormBackward(A(dx_), A(emb_), Param(access, P.emb_norm), A(emb_rstd_), A(dx_),
                        A(dgain_), n, d);
    access.CloseParam(P.emb_norm);
    store_gain(P.emb_norm);
  }
  rk::EmbeddingBackward(A(dx_), inputs_, scatter_grad(P.tok), c.vocab, d);
  access.CloseGrad(P.tok);
}

LossSums Model::ForwardBackward(TensorAccess& access, std::span<const uint32_t> tokens,
                                float grad_scale, bool accumulate) {
  const LossSums sums = Forward(access, tokens);
  Backward(access, grad_scale, accumulate);
  return sums;
}

std::span<const float> Model::RowLoss() const { return A(loss_); }
std::span<const float> Model::RowZLoss() const { return A(zloss_); }

void Model::Logits(const ParamStore& params, std::span<float> logits) const {
  if (!have_forward_) Fail("Model::Logits: called before Forward");
  CheckParams(params, "params");
  rk::GemmXWt(A(xf_), params.Tensor(ParamIndex(config_).output), logits, rows_, config_.vocab,
              config_.d_model);
}

rk::AttentionShape Model::AttentionShape(int64_t layer) const {
  return {batch_, seq_, config_.n_heads, config_.n_kv_heads, config_.head_dim,
          LayerWindow(config_, layer), dmath::Rsqrt(static_cast<float>(config_.head_dim))};
}

rk::CrossEntropyShape Model::CrossEntropyShape() const {
  return {rows_, config_.d_model, config_.vocab, vocab_chunk_, static_cast<float>(config_.z_loss)};
}

}  // namespace lockstep
