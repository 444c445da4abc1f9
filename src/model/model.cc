// The decoder's forward and backward passes: plain orchestration over the kernels, llm.c style.
// docs/model.md lists the kernel calls in order; shapes are in the comments. B = batch,
// T = seq, N = B*T rows, d = d_model, Q = n_heads*head_dim, K = n_kv_heads*head_dim,
// F = ffn_hidden, V = vocab.
#include <algorithm>

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

LossSums Model::Forward(const ParamStore& params, std::span<const uint32_t> tokens) {
  CheckParams(params, "params");
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
  auto W = [&params](size_t i) { return params.Tensor(i); };

  // Embedding (+ optional RMSNorm): x[N, d].
  std::span<float> x0 = A(layers_[0].x_in);
  if (c.embedding_norm) {
    rk::EmbeddingForward(W(P.tok), inputs_, A(emb_), c.vocab, d);
    rk::RmsNormForward(A(emb_), W(P.emb_norm), eps, x0, A(emb_rstd_), n, d);
  } else {
    rk::EmbeddingForward(W(P.tok), inputs_, x0, c.vocab, d);
  }

  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerActivations& a = layers_[static_cast<size_t>(l)];
    auto Wl = [&](size_t which) { return W(P.Layer(l, which)); };
    // Attention block: x_mid = x_in + attn(RMSNorm(x_in)) · Woᵀ.
    rk::RmsNormForward(A(a.x_in), Wl(kAttnNorm), eps, A(a.h), A(a.attn_rstd), n, d);  // h[N,d]
    if (c.qk_norm) {
      rk::GemmXWt(A(a.h), Wl(kWq), A(a.q_raw), n, q_dim, d);   // q_raw[N, Q]
      rk::GemmXWt(A(a.h), Wl(kWk), A(a.k_raw), n, kv_dim, d);  // k_raw[N, K]
      rk::RmsNormForward(A(a.q_raw), {}, eps, A(a.q), A(a.q_rstd), n * c.n_heads, hd);
      rk::RmsNormForward(A(a.k_raw), {}, eps, A(a.k), A(a.k_rstd), n * c.n_kv_heads, hd);
    } else {
      rk::GemmXWt(A(a.h), Wl(kWq), A(a.q), n, q_dim, d);
      rk::GemmXWt(A(a.h), Wl(kWk), A(a.k), n, kv_dim, d);
    }
    rk::GemmXWt(A(a.h), Wl(kWv), A(a.v), n, kv_dim, d);  // v[N, K]
    rk::RopeForward(A(a.q), A(a.q), rope_, batch_, seq_, c.n_heads, hd);
    rk::RopeForward(A(a.k), A(a.k), rope_, batch_, seq_, c.n_kv_heads, hd);
    rk::AttentionForward(AttentionShape(l), A(a.q), A(a.k), A(a.v), A(a.attn),
                         A(a.attn_lse));                                  // attn[N, Q]
    rk::GemmXWt(A(a.attn), Wl(kWo), A(a.x_mid), n, d, q_dim);            // x_mid[N, d]
    rk::AddInto(A(a.x_in), A(a.x_mid));
    // Feed-forward block: x_out = x_mid + SwiGLU(RMSNorm(x_mid) · W_guᵀ) · W_downᵀ.
    rk::RmsNormForward(A(a.x_mid), Wl(kFfnNorm), eps, A(a.h2), A(a.ffn_rstd), n, d);
    rk::GemmXWt(A(a.h2), Wl(kWGateUp), A(a.gu), n, 2 * f, d);  // gu[N, 2F]: gate | up
    rk::SwigluForward(A(a.gu), A(a.act), n, f);                // act[N, F]
    const Span x_out = l + 1 < c.n_layers ? layers_[static_cast<size_t>(l + 1)].x_in : x_final_;
    rk::GemmXWt(A(a.act), Wl(kWDown), A(x_out), n, d, f);  // x_out[N, d]
    rk::AddInto(A(a.x_mid), A(x_out));
  }

  // Final RMSNorm and the fused output head + cross-entropy + z-loss.
  rk::RmsNormForward(A(x_final_), W(P.final_norm), eps, A(xf_), A(final_rstd_), n, d);
  rk::CrossEntropyForward(CrossEntropyShape(), A(xf_), W(P.output), targets_, A(loss_),
                          A(zloss_), A(lse_));
  LossSums sums;
  rk::RowSum(A(loss_), {&sums.loss, 1}, 1, n);
  rk::RowSum(A(zloss_), {&sums.zloss, 1}, 1, n);
  have_forward_ = true;
  return sums;
}

void Model::Backward(const ParamStore& params, float grad_scale, bool accumulate,
                     ParamStore& grads) {
  if (!have_forward_) Fail("Model::Backward: called before Forward");
  CheckParams(params, "params");
  CheckParams(grads, "grads");
  const ModelConfig& c = config_;
  const ParamIndex P(c);
  const int64_t n = rows_, d = c.d_model, f = c.ffn_hidden, hd = c.head_dim;
  const int64_t q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
  auto W = [&params](size_t i) { return params.Tensor(i); };
  auto G = [&grads](size_t i) { return grads.Tensor(i); };
  // Gain gradients come out of RmsNormBackward overwritten (in dgain_); they are then stored or
  // added to the accumulated gradient.
  auto store_gain = [&](size_t i) {
    if (accumulate) {
      rk::AddInto(A(dgain_), G(i));
    } else {
      std::copy(A(dgain_).begin(), A(dgain_).end(), G(i).begin());
    }
  };
  // The embedding and output-head gradients are accumulated by their kernels.
  if (!accumulate) {
    std::ranges::fill(G(P.tok), 0.0f);
    std::ranges::fill(G(P.output), 0.0f);
  }

  // Output head and final norm: dx = d x_final [N, d].
  rk::CrossEntropyBackward(CrossEntropyShape(), A(xf_), W(P.output), targets_, A(lse_),
                           grad_scale, A(dh_), G(P.output));
  rk::RmsNormBackward(A(dh_), A(x_final_), W(P.final_norm), A(final_rstd_), A(dx_), A(dgain_), n,
                      d);
  store_gain(P.final_norm);

  for (int64_t l = c.n_layers - 1; l >= 0; --l) {
    const LayerActivations& a = layers_[static_cast<size_t>(l)];
    auto Wl = [&](size_t which) { return W(P.Layer(l, which)); };
    auto Gl = [&](size_t which) { return G(P.Layer(l, which)); };
    // Feed-forward block; on entry dx = d x_out, on exit dx = d x_mid.
    rk::GemmDyW(A(dx_), Wl(kWDown), A(dact_), n, d, f);                   // dact[N, F]
    rk::GemmDytX(A(dx_), A(a.act), Gl(kWDown), n, d, f, accumulate);      // dW_down[d, F]
    rk::SwigluBackward(A(a.gu), A(dact_), A(dgu_), n, f);                 // dgu[N, 2F]
    rk::GemmDyW(A(dgu_), Wl(kWGateUp), A(dh_), n, 2 * f, d);              // dh2[N, d]
    rk::GemmDytX(A(dgu_), A(a.h2), Gl(kWGateUp), n, 2 * f, d, accumulate);  // dW_gu[2F, d]
    rk::RmsNormBackward(A(dh_), A(a.x_mid), Wl(kFfnNorm), A(a.ffn_rstd), A(dh_), A(dgain_), n, d);
    store_gain(P.Layer(l, kFfnNorm));
    rk::AddInto(A(dh_), A(dx_));
    // Attention block; on exit dx = d x_in.
    rk::GemmDyW(A(dx_), Wl(kWo), A(dattn_), n, d, q_dim);               // dattn[N, Q]
    rk::GemmDytX(A(dx_), A(a.attn), Gl(kWo), n, d, q_dim, accumulate);  // dWo[d, Q]
    rk::AttentionBackward(AttentionShape(l), A(a.q), A(a.k), A(a.v), A(a.attn), A(a.attn_lse),
                          A(dattn_), A(dq_), A(dk_), A(dv_));  // dq[N, Q], dk/dv[N, K]
    rk::RopeBackward(A(dq_), A(dq_), rope_, batch_, seq_, c.n_heads, hd);
    rk::RopeBackward(A(dk_), A(dk_), rope_, batch_, seq_, c.n_kv_heads, hd);
    if (c.qk_norm) {
      rk::RmsNormBackward(A(dq_), A(a.q_raw), {}, A(a.q_rstd), A(dq_), {}, n * c.n_heads, hd);
      rk::RmsNormBackward(A(dk_), A(a.k_raw), {}, A(a.k_rstd), A(dk_), {}, n * c.n_kv_heads, hd);
    }
    // dh[N, d] = dq · Wq + dk · Wk + dv · Wv (the latter two GEMMs accumulate into dh).
    rk::GemmDyW(A(dq_), Wl(kWq), A(dh_), n, q_dim, d);
    rk::GemmDyW(A(dk_), Wl(kWk), A(dh_), n, kv_dim, d, /*accumulate=*/true);
    rk::GemmDyW(A(dv_), Wl(kWv), A(dh_), n, kv_dim, d, /*accumulate=*/true);
    rk::GemmDytX(A(dq_), A(a.h), Gl(kWq), n, q_dim, d, accumulate);   // dWq[Q, d]
    rk::GemmDytX(A(dk_), A(a.h), Gl(kWk), n, kv_dim, d, accumulate);  // dWk[K, d]
    rk::GemmDytX(A(dv_), A(a.h), Gl(kWv), n, kv_dim, d, accumulate);  // dWv[K, d]
    rk::RmsNormBackward(A(dh_), A(a.x_in), Wl(kAttnNorm), A(a.attn_rstd), A(dh_), A(dgain_), n,
                        d);
    store_gain(P.Layer(l, kAttnNorm));
    rk::AddInto(A(dh_), A(dx_));
  }

  // Embedding norm and embedding.
  if (c.embedding_norm) {
    rk::RmsNormBackward(A(dx_), A(emb_), W(P.emb_norm), A(emb_rstd_), A(dx_), A(dgain_), n, d);
    store_gain(P.emb_norm);
  }
  rk::EmbeddingBackward(A(dx_), inputs_, G(P.tok), c.vocab, d);
}

LossSums Model::ForwardBackward(const ParamStore& params, std::span<const uint32_t> tokens,
                                float grad_scale, bool accumulate, ParamStore& grads) {
  const LossSums sums = Forward(params, tokens);
  Backward(params, grad_scale, accumulate, grads);
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
