// The decoder's forward and backward passes: plain orchestration over the kernels, llm.c style.
// docs/model.md lists the kernel calls in order; shapes are in the comments. B = batch,
// T = seq, N = B*T rows, d = d_model, Q = n_heads*head_dim, K = n_kv_heads*head_dim,
// F = ffn_hidden, V = vocab.
#include <algorithm>
#include <array>
#include <utility>

#include "lockstep/core.h"
#include "lockstep/kernels.h"
#include "lockstep/model.h"
#include "lockstep/op_calls.h"

namespace lockstep {
namespace {

// The widest input of a layer's linears, its most outputs, and its largest weight (n_kv_heads
// divides n_heads, so wk and wv are never larger than wq).
int64_t LinearMaxIn(const ModelConfig& c) {
  return std::max({c.d_model, c.n_heads * c.head_dim, c.ffn_hidden});
}
int64_t LinearMaxOut(const ModelConfig& c) {
  return std::max({c.d_model, c.n_heads * c.head_dim, 2 * c.ffn_hidden});
}
int64_t LinearMaxWeight(const ModelConfig& c) {
  return std::max(c.n_heads * c.head_dim * c.d_model, 2 * c.ffn_hidden * c.d_model);
}

// The first n elements of an int8 scratch buffer.
template <typename T>
std::span<T> Take(std::vector<T>& v, int64_t n) {
  LOCKSTEP_CHECK(static_cast<size_t>(n) <= v.size(), "int8 scratch of {} for {}", v.size(), n);
  return std::span(v).first(static_cast<size_t>(n));
}

// The linears y = x · Wᵀ of one input x[rows, cols] (docs/model.md, "Linears"): the fp32 GEMM,
// or with model.linear = int8 x's rows quantized once and, per weight, its rows quantized with
// its scale tensor and the exact int8 GEMM.
class LinearInput {
 public:
  LinearInput(const OpHooks& hooks, const ModelConfig& config, int64_t layer, int64_t rows,
              std::span<const float> x, int64_t cols, Int8Scratch* int8,
              const LayerPackings* packed, const LayerInt8Weights* quantized)
      : hooks_(hooks),
        config_(config),
        layer_(layer),
        rows_(rows),
        cols_(cols),
        x_(x),
        int8_(int8),
        packed_(rows <= rk::kGemvMaxRows ? packed : nullptr),
        quantized_(quantized) {
    if (config.linear == Linear::kFp32) {
      int8_ = nullptr;
      return;
    }
    LOCKSTEP_CHECK(int8_ != nullptr, "an int8 linear without its scratch");
    ops::QuantizeRows(hooks_, layer_, x_, Take(int8_->qx, rows_ * cols_), Take(int8_->sx, rows_),
                      rows_, cols_);
  }
  // y[rows, out] = x · Wᵀ for the layer's weight `which`, w[which] [out, cols] (and with int8
  // its scales w[ScaleSlot(which)] [out]), stored as the config stores activations.
  void Apply(std::span<const std::span<const float>> w, LayerTensor which, std::span<float> y,
             int64_t out) const {
    if (int8_ == nullptr && packed_ != nullptr) {
      const rk::GemvPacking& p = (*packed_)[LinearIndex(which)];
      LOCKSTEP_CHECK(p.w.data() == w[which].data() && p.n == out && p.k == cols_,
                     "a packed linear that is not the layer's weight");
      ops::GemmXWtPacked(hooks_, layer_, x_, p, y, rows_);
    } else if (int8_ == nullptr) {
      ops::GemmXWt(hooks_, layer_, x_, w[which], y, rows_, out, cols_);
    } else {
      const std::span<const float> sw = w[ScaleSlot(which)];
      const std::span<int8_t> qx = Take(int8_->qx, rows_ * cols_);
      const std::span<float> sx = Take(int8_->sx, rows_);
      if (quantized_ != nullptr) {
        const rk::I8Packing& p = (*quantized_)[LinearIndex(which)].packed;
        LOCKSTEP_CHECK(p.n == out && p.k == cols_, "a quantized linear that is not the layer's");
        ops::GemmI8XWtPacked(hooks_, layer_, qx, sx, p, sw, y, rows_);
      } else {
        const std::span<int8_t> qw = Take(int8_->qw, out * cols_);
        ops::QuantizeRowsByScale(hooks_, layer_, w[which], sw, qw, out, cols_);
        ops::GemmI8XWt(hooks_, layer_, qx, sx, qw, sw, y, rows_, out, cols_);
      }
    }
    StoreActivation(hooks_, config_, layer_, y);
  }

 private:
  const OpHooks& hooks_;
  const ModelConfig& config_;
  int64_t layer_, rows_, cols_;
  std::span<const float> x_;
  Int8Scratch* int8_;
  const LayerPackings* packed_;
  const LayerInt8Weights* quantized_;
};

}  // namespace

namespace {

// The int8 scratch's sizes, in elements, for `rows` rows of `config`'s linears.
struct Int8Sizes {
  int64_t qx, sx, qw;    // the forward's quantized rows and the input's scales
  int64_t x_hat, w_hat;  // the straight-through backward's dequantized operands
  // The int8 backward's rotated, quantized operands a and b of its GEMM and a sum to add.
  int64_t qa, sa, qb, sb, sum;
};

Int8Sizes SizesOf(const ModelConfig& config, int64_t rows, bool backward) {
  const int64_t in = LinearMaxIn(config), out = LinearMaxOut(config);
  const int64_t weight = LinearMaxWeight(config);
  Int8Sizes z{rows * in, rows, weight, 0, 0, 0, 0, 0, 0, 0};
  if (backward && !config.int8_backward) {
    z.x_hat = rows * in;
    z.w_hat = weight;
  } else if (backward) {
    // A: dy [rows, out] or dyᵀ [out, rows]; B: Wᵀ [in, out] or xᵀ [in, rows]; the sum: an input
    // gradient [rows, in] or a weight gradient [out, in].
    z.qa = rows * out;
    z.sa = std::max(rows, out);
    z.qb = std::max(weight, rows * in);
    z.sb = in;
    z.sum = std::max(rows * in, weight);
  }
  return z;
}

}  // namespace

void Int8Scratch::Resize(const ModelConfig& config, int64_t rows, bool backward) {
  const Int8Sizes z = SizesOf(config, rows, backward);
  const auto size = [](int64_t n) { return static_cast<size_t>(n); };
  qx.resize(size(z.qx));
  sx.resize(size(z.sx));
  qw.resize(size(z.qw));
  x_hat.resize(size(z.x_hat));
  w_hat.resize(size(z.w_hat));
  qa.resize(size(z.qa));
  sa.resize(size(z.sa));
  qb.resize(size(z.qb));
  sb.resize(size(z.sb));
  sum.resize(size(z.sum));
}

int64_t Int8Scratch::Bytes(const ModelConfig& config, int64_t rows, bool backward) {
  const Int8Sizes z = SizesOf(config, rows, backward);
  const int64_t int8s = z.qx + z.qw + z.qa + z.qb;
  const int64_t floats = z.sx + z.x_hat + z.w_hat + z.sa + z.sb + z.sum;
  // The GEMMs' operands as the kernel packs them, x[m, k] at most m·k bytes and m sums, w[n, k]
  // rk::PackedI8Bytes(n, k): the forward's (x, W), and the int8 backward's (dy, Wᵀ) for dx and
  // (dyᵀ, xᵀ) for dW, for each linear's weight [out, in].
  const int64_t d = config.d_model, q = config.n_heads * config.head_dim;
  const int64_t kv = config.n_kv_heads * config.head_dim, f = config.ffn_hidden;
  int64_t packed_x = 0, packed_w = 0;
  const auto call = [&](int64_t m, int64_t n, int64_t k) {
    packed_x = std::max(packed_x, m * k + m * int64_t{sizeof(float)});
    packed_w = std::max(packed_w, static_cast<int64_t>(rk::PackedI8Bytes(n, k)));
  };
  for (const auto& [out, in] :
       {std::pair{q, d}, std::pair{kv, d}, std::pair{d, q}, std::pair{2 * f, d}, std::pair{d, f}}) {
    call(rows, out, in);
    if (backward && config.int8_backward) {
      call(rows, in, out);
      call(out, in, rows);
    }
  }
  return int8s + floats * int64_t{sizeof(float)} + packed_x + packed_w;
}

Model::Model(const ModelConfig& config, int64_t vocab_chunk, int64_t batch, int64_t seq,
             Activations activations)
    : Model(config, vocab_chunk, batch, seq, activations, PlanOnly{}) {
  arena_.assign(static_cast<size_t>(arena_floats_), 0.0f);
  bf16_.assign(static_cast<size_t>(bf16_elements_), BFloat16{});
  if (config.linear == Linear::kInt8) int8_.Resize(config, rows_, /*backward=*/true);
  inputs_.resize(static_cast<size_t>(rows_));
  targets_.resize(static_cast<size_t>(rows_));
}

Model::~Model() {
  if (hooks_.executor == nullptr) return;
  hooks_.executor->Forget(arena_);
  if (!bf16_.empty()) hooks_.executor->Forget(bf16_);
}

void Model::set_hooks(const OpHooks& hooks) {
  if (hooks_.executor != hooks.executor) {
    if (hooks_.executor != nullptr) {
      hooks_.executor->ToHost(arena_);
      hooks_.executor->Forget(arena_);
      if (!bf16_.empty()) {
        hooks_.executor->ToHost(bf16_);
        hooks_.executor->Forget(bf16_);
      }
    }
    if (hooks.executor != nullptr) {
      hooks.executor->Keep(arena_);
      if (!bf16_.empty()) hooks.executor->Keep(bf16_);
    }
  }
  hooks_ = hooks;
}

int64_t Model::AllocatedBytes(const ModelConfig& config, int64_t vocab_chunk, int64_t batch,
                              int64_t seq, Activations activations) {
  const Model plan(config, vocab_chunk, batch, seq, activations, PlanOnly{});
  const int64_t rope_floats = static_cast<int64_t>(plan.rope_.cos.size() + plan.rope_.sin.size());
  const int64_t int8 = config.linear == Linear::kInt8
                           ? Int8Scratch::Bytes(config, plan.rows_, /*backward=*/true)
                           : 0;
  return (plan.arena_floats_ + rope_floats) * int64_t{sizeof(float)} +
         plan.bf16_elements_ * int64_t{sizeof(BFloat16)} +
         2 * plan.rows_ * int64_t{sizeof(uint32_t)} + int8;
}

namespace {

// ParamIndex's positions are ParameterSpecs's order, tensor by tensor.
void CheckParamIndex(const ModelConfig& config, const std::vector<ParamSpec>& specs) {
  const ParamIndex P(config);
  const auto at = [&](size_t i, std::string_view name, int64_t layer = -1) {
    LOCKSTEP_CHECK(i < specs.size() && specs[i].name == name && specs[i].layer == layer,
                   "ParamIndex: {} at {}", name, i);
  };
  at(P.tok, "tok_embeddings.weight");
  if (config.embedding_norm) at(P.emb_norm, "emb_norm.weight");
  for (int64_t l = 0; l < config.n_layers; ++l) {
    for (size_t which = 0; which < kTensorsPerLayer; ++which) {
      at(P.Layer(l, which), fmt::format("layers.{}.{}", l, kLayerTensorNames[which]), l);
    }
  }
  at(P.final_norm, "final_norm.weight");
  at(P.output, "output.weight");
  size_t last = P.output;
  if (config.linear == Linear::kInt8) {
    for (int64_t l = 0; l < config.n_layers; ++l) {
      for (size_t j = 0; j < kLayerLinears.size(); ++j) {
        at(last = P.Scale(l, kLayerLinears[j]), fmt::format("layers.{}.{}", l, kLayerScaleNames[j]),
           l);
      }
    }
  }
  LOCKSTEP_CHECK(last + 1 == specs.size(), "ParamIndex: {} tensors", specs.size());
}

}  // namespace

Model::Model(const ModelConfig& config, int64_t vocab_chunk, int64_t batch, int64_t seq,
             Activations activations, PlanOnly)
    : config_(config),
      activations_(activations),
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
  CheckParamIndex(config, specs_);

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
  // Recomputed, every layer keeps its input only, and all share one set of the rest. Kept as
  // bf16, every layer keeps its input and statistics, and all share one binary32 set of the rest.
  const bool bf16 = Bf16Saved();
  const bool shared = activations == Activations::kRecomputed || bf16;
  for (LayerActivations& a : layers_) {
    a.x_in = take(n * d);
    if (shared && &a != &layers_.front()) {
      const Span x_in = a.x_in;
      a = layers_.front();
      a.x_in = x_in;
      if (bf16) {
        a.attn_rstd = take(n);
        a.q_rstd = take(qk_raw * n * config.n_heads);
        a.k_rstd = take(qk_raw * n * config.n_kv_heads);
        a.attn_lse = take(n * config.n_heads);
        a.ffn_rstd = take(n);
      }
      continue;
    }
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
  logits_ = take(KeepsLogits(n, config.vocab) ? n * config.vocab : 0);
  dx_ = take(n * d);
  dh_ = take(n * d);
  dq_ = take(n * q_dim);
  dk_ = take(n * kv_dim);
  dv_ = take(n * kv_dim);
  dattn_ = take(n * q_dim);
  dgu_ = take(n * 2 * f);
  dact_ = take(n * f);
  dgain_ = take(d);
  if (config.compute_weights == Storage::kBf16) {
    const ParamIndex P(config);
    for (size_t which = 0; which < kTensorsPerLayer; ++which) {
      compute_layer_[which] = take(specs_[P.Layer(0, which)].numel());
    }
    if (config.embedding_norm) compute_emb_norm_ = take(d);
    compute_final_norm_ = take(d);
    compute_output_ = take(config.vocab * d);
  }
  arena_floats_ = end;
  if (bf16) PlanBf16();
}

void Model::PlanBf16() {
  for (int64_t l = 0; l + 1 < config_.n_layers; ++l) {
    Bf16Spans& spans = bf16_spans_.emplace_back();
    for (size_t j = 0; j < spans.size(); ++j) {
      const int64_t size = (layers_.front().*kBf16Saved[j]).size;
      spans[j] = {bf16_elements_, size};
      bf16_elements_ += (size + 31) / 32 * 32;  // 64-byte aligned, as the arena's
    }
  }
}

bool Model::Bf16Saved() const {
  return activations_ == Activations::kKept && config_.activations == Storage::kBf16 &&
         config_.n_layers > 1;
}

void Model::SaveBf16(int64_t l) {
  const OpHooks hidden{.observer = nullptr, .executor = hooks_.executor};
  const LayerActivations& a = layers_[static_cast<size_t>(l)];
  const Bf16Spans& spans = bf16_spans_[static_cast<size_t>(l)];
  for (size_t j = 0; j < spans.size(); ++j) {
    if (spans[j].size > 0) ops::ToBf16(hidden, l, A(a.*kBf16Saved[j]), B(spans[j]));
  }
}

void Model::RestoreBf16(int64_t l) {
  const OpHooks hidden{.observer = nullptr, .executor = hooks_.executor};
  const LayerActivations& a = layers_[static_cast<size_t>(l)];
  const Bf16Spans& spans = bf16_spans_[static_cast<size_t>(l)];
  for (size_t j = 0; j < spans.size(); ++j) {
    if (spans[j].size > 0) ops::FromBf16(hidden, l, B(spans[j]), A(a.*kBf16Saved[j]));
  }
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

namespace {
// The indices of layer `layer`'s tensors, in LayerTensors' slot order.
std::vector<size_t> LayerParams(const ModelConfig& config, int64_t layer) {
  const ParamIndex P(config);
  std::vector<size_t> at;
  for (size_t which = 0; which < kTensorsPerLayer; ++which) at.push_back(P.Layer(layer, which));
  if (config.linear == Linear::kInt8) {
    for (const LayerTensor which : kLayerLinears) at.push_back(P.Scale(layer, which));
  }
  return at;
}
}  // namespace

void Model::WillOpenLayer(TensorAccess& access, int64_t layer) const {
  for (const size_t i : LayerParams(config_, layer)) access.WillOpenParam(i);
}

void Model::OpenLayer(TensorAccess& access, int64_t layer, LayerTensors& w) {
  const std::vector<size_t> at = LayerParams(config_, layer);
  w = {};
  for (size_t slot = 0; slot < at.size(); ++slot) w[slot] = Param(access, at[slot]);
}

void Model::CloseLayer(TensorAccess& access, int64_t layer) const {
  for (const size_t i : LayerParams(config_, layer)) access.CloseParam(i);
}

std::span<const float> Model::Param(TensorAccess& access, size_t i) {
  const std::span<const float> p = access.OpenParam(i);
  if (static_cast<int64_t>(p.size()) != specs_[i].numel()) {
    Fail("Model: parameter '{}' has {} elements, the model expects {}", specs_[i].name, p.size(),
         specs_[i].numel());
  }
  const Span copy = ComputeCopy(i);
  if (copy.size == 0) return p;
  ops::RoundToBf16(hooks_, specs_[i].layer, p, A(copy));
  return A(copy);
}

Model::Span Model::ComputeCopy(size_t i) const {
  if (config_.compute_weights != Storage::kBf16) return {};
  const ParamIndex P(config_);
  if (i == P.output) return compute_output_;
  if (i == P.final_norm) return compute_final_norm_;
  if (config_.embedding_norm && i == P.emb_norm) return compute_emb_norm_;
  if (i >= P.first_layer && i < P.final_norm) {
    return compute_layer_[(i - P.first_layer) % kTensorsPerLayer];
  }
  return {};
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
  const int64_t n = rows_, d = c.d_model;
  const float eps = static_cast<float>(c.norm_eps);
  const OpHooks& obs = hooks_;
  // Embedding (+ optional RMSNorm): x[N, d].
  const std::span<float> x0 = A(layers_[0].x_in);
  ops::EmbeddingFwd(obs, -1, Param(access, P.tok), inputs_, c.embedding_norm ? A(emb_) : x0,
                    c.vocab, d);
  access.CloseParam(P.tok);
  StoreEmbedding(obs, c, c.embedding_norm ? A(emb_) : x0);
  if (c.embedding_norm) {
    ops::RmsNormFwd(obs, -1, A(emb_), Param(access, P.emb_norm), eps, x0, A(emb_rstd_), n, d);
    access.CloseParam(P.emb_norm);
    StoreActivation(obs, c, -1, x0);
  }

  WillOpenLayer(access, 0);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerTensors w;
    OpenLayer(access, l, w);
    if (l + 1 < c.n_layers) {
      WillOpenLayer(access, l + 1);
    } else {
      access.WillOpenParam(P.final_norm);
      access.WillOpenParam(P.output);
    }
    ForwardLayer(obs, l, w, /*output=*/true);
    if (Bf16Saved() && l + 1 < c.n_layers) SaveBf16(l);
    CloseLayer(access, l);
  }

  // Final RMSNorm and the fused output head + cross-entropy + z-loss.
  ops::RmsNormFwd(obs, -1, A(x_final_), Param(access, P.final_norm), eps, A(xf_), A(final_rstd_), n,
                  d);
  access.CloseParam(P.final_norm);
  StoreActivation(obs, c, -1, A(xf_));
  ops::CrossEntropyFwd(obs, -1, CrossEntropyShape(), A(xf_), Param(access, P.output), targets_,
                       A(loss_), A(zloss_), A(lse_), A(logits_));
  access.CloseParam(P.output);
  LossSums sums;
  ops::RowSum(obs, -1, A(loss_), {&sums.loss, 1}, 1, n);
  ops::RowSum(obs, -1, A(zloss_), {&sums.zloss, 1}, 1, n);
  have_forward_ = true;
  logits_kept_ = logits_.size > 0;
  return sums;
}

void LayerForward(const OpHooks& obs, const ModelConfig& c, int64_t l, int64_t n,
                  std::span<const std::span<const float>> w, const LayerBuffers& b,
                  AttentionContext& attention, bool output) {
  const int64_t d = c.d_model, f = c.ffn_hidden, hd = c.head_dim;
  const int64_t q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
  const float eps = static_cast<float>(c.norm_eps);
  // Attention block: x_mid = x_in + attn(RMSNorm(x_in)) · Woᵀ.
  const auto input = [&](std::span<const float> x, int64_t cols) {
    return LinearInput(obs, c, l, n, x, cols, b.int8, b.packed, b.quantized);
  };
  // Every activation an op writes is stored as the config says (StoreActivation).
  const auto store = [&](std::span<float> x) { StoreActivation(obs, c, l, x); };
  ops::RmsNormFwd(obs, l, b.x_in, w[kAttnNorm], eps, b.h, b.attn_rstd, n, d);  // h[N, d]
  store(b.h);
  {
    const LinearInput h = input(b.h, d);
    if (c.qk_norm) {
      h.Apply(w, kWq, b.q_raw, q_dim);   // q_raw[N, Q]
      h.Apply(w, kWk, b.k_raw, kv_dim);  // k_raw[N, K]
      ops::RmsNormFwd(obs, l, b.q_raw, {}, eps, b.q, b.q_rstd, n * c.n_heads, hd);
      ops::RmsNormFwd(obs, l, b.k_raw, {}, eps, b.k, b.k_rstd, n * c.n_kv_heads, hd);
      store(b.q);
      store(b.k);
    } else {
      h.Apply(w, kWq, b.q, q_dim);
      h.Apply(w, kWk, b.k, kv_dim);
    }
    h.Apply(w, kWv, b.v, kv_dim);  // v[N, K]
  }
  attention.Attend(obs, l, b.q, b.k, b.v, b.attn);  // attn[N, Q]
  store(b.attn);
  input(b.attn, q_dim).Apply(w, kWo, b.x_mid, d);  // x_mid[N, d]
  ops::AddInto(obs, l, b.x_in, b.x_mid);
  store(b.x_mid);
  // Feed-forward block: x_out = x_mid + SwiGLU(RMSNorm(x_mid) · W_guᵀ) · W_downᵀ.
  ops::RmsNormFwd(obs, l, b.x_mid, w[kFfnNorm], eps, b.h2, b.ffn_rstd, n, d);
  store(b.h2);
  input(b.h2, d).Apply(w, kWGateUp, b.gu, 2 * f);  // gu[N, 2F]: gate | up
  ops::SwigluFwd(obs, l, b.gu, b.act, n, f);       // act[N, F]
  store(b.act);
  // A recomputation stops here: the backward reads no further.
  if (!output) return;
  input(b.act, f).Apply(w, kWDown, b.x_out, d);  // x_out[N, d]
  ops::AddInto(obs, l, b.x_mid, b.x_out);
  store(b.x_out);
}

void StoreActivation(const OpHooks& hooks, const ModelConfig& config, int64_t layer,
                     std::span<float> x) {
  if (config.activations == Storage::kBf16) ops::RoundToBf16(hooks, layer, x);
}

void StoreEmbedding(const OpHooks& hooks, const ModelConfig& config, std::span<float> x) {
  if (config.activations == Storage::kBf16 || config.compute_weights == Storage::kBf16) {
    ops::RoundToBf16(hooks, -1, x);
  }
}

void Model::ForwardLayer(const OpHooks& obs, int64_t l, std::span<const std::span<const float>> w,
                         bool output) {
  const LayerActivations& a = layers_[static_cast<size_t>(l)];
  const Span x_out = l + 1 < config_.n_layers ? layers_[static_cast<size_t>(l + 1)].x_in : x_final_;
  const LayerBuffers b{.x_in = A(a.x_in),
                       .h = A(a.h),
                       .attn_rstd = A(a.attn_rstd),
                       .q_raw = A(a.q_raw),
                       .k_raw = A(a.k_raw),
                       .q_rstd = A(a.q_rstd),
                       .k_rstd = A(a.k_rstd),
                       .q = A(a.q),
                       .k = A(a.k),
                       .v = A(a.v),
                       .attn = A(a.attn),
                       .x_mid = A(a.x_mid),
                       .h2 = A(a.h2),
                       .ffn_rstd = A(a.ffn_rstd),
                       .gu = A(a.gu),
                       .act = A(a.act),
                       .x_out = output ? A(x_out) : std::span<float>(),
                       .int8 = &int8_};
  LayerForward(obs, config_, l, rows_, w, b, *this, output);
}

void Model::Attend(const OpHooks& obs, int64_t l, std::span<float> q, std::span<float> k,
                   std::span<const float> v, std::span<float> attn) {
  const ModelConfig& c = config_;
  const float theta = static_cast<float>(c.rope_theta);
  ops::RopeFwd(obs, l, rope_, theta, q, q, batch_, seq_, c.n_heads, c.head_dim);
  ops::RopeFwd(obs, l, rope_, theta, k, k, batch_, seq_, c.n_kv_heads, c.head_dim);
  StoreActivation(obs, c, l, q);
  StoreActivation(obs, c, l, k);
  ops::AttentionFwd(obs, l, AttentionShape(l), q, k, v, attn,
                    A(layers_[static_cast<size_t>(l)].attn_lse));
}

Digest Model::Backward(TensorAccess& access, float grad_scale, bool accumulate) {
  if (!have_forward_) Fail("Model::Backward: called before Forward");
  const ModelConfig& c = config_;
  const ParamIndex P(c);
  const int64_t n = rows_, d = c.d_model;
  const OpHooks& obs = hooks_;
  // Output head and final norm: dx = d x_final [N, d].
  access.WillOpenParam(P.output);
  access.WillOpenParam(P.final_norm);
  WillOpenLayer(access, c.n_layers - 1);
  {
    const std::span<const float> head = Param(access, P.output);
    const std::span<float> dw = ScatterGrad(access, P.output, accumulate);
    ops::CrossEntropyBwd(obs, -1, CrossEntropyShape(), A(xf_), head, targets_, A(lse_), grad_scale,
                         A(dh_), dw, logits_kept_ ? A(logits_) : std::span<float>());
  }
  // The activations' gradients between ops are stored as the activations are.
  StoreActivation(obs, c, -1, A(dh_));
  logits_kept_ = false;  // the backward overwrote them
  access.CloseGrad(P.output);
  access.CloseParam(P.output);
  ops::RmsNormBwd(obs, -1, A(dh_), A(x_final_), Param(access, P.final_norm), A(final_rstd_), A(dx_),
                  A(dgain_), n, d);
  access.CloseParam(P.final_norm);
  StoreActivation(obs, c, -1, A(dx_));
  GainGrad(access, -1, P.final_norm, accumulate);

  Blake2b backward;  // the gradient at each layer's input, as the layers' backwards end
  for (int64_t l = c.n_layers - 1; l >= 0; --l) {
    LayerTensors w;
    OpenLayer(access, l, w);
    if (l > 0) {
      WillOpenLayer(access, l - 1);
    } else if (c.embedding_norm) {
      access.WillOpenParam(P.emb_norm);
    }
    // Recomputed activations: this layer's forward again from its input, into the one set of
    // activations all layers share (the last layer's are still there from the forward). The
    // same kernels on the same inputs: the same bits. An observer does not see these ops.
    if (activations_ == Activations::kRecomputed && l + 1 < c.n_layers) {
      ForwardLayer({.observer = nullptr, .executor = obs.executor}, l, w, /*output=*/false);
    }
    if (Bf16Saved() && l + 1 < c.n_layers) RestoreBf16(l);
    BackwardLayer(access, l, w, accumulate);
    backward.Update(OnHost(dx_));
    CloseLayer(access, l);
  }

  // Embedding norm and embedding.
  if (c.embedding_norm) {
    ops::RmsNormBwd(obs, -1, A(dx_), A(emb_), Param(access, P.emb_norm), A(emb_rstd_), A(dx_),
                    A(dgain_), n, d);
    access.CloseParam(P.emb_norm);
    StoreActivation(obs, c, -1, A(dx_));
    GainGrad(access, -1, P.emb_norm, accumulate);
  }
  ops::EmbeddingBwd(obs, -1, A(dx_), inputs_, ScatterGrad(access, P.tok, accumulate), c.vocab, d);
  access.CloseGrad(P.tok);
  // The int8 linears' scales are set from their weights, not trained: their gradient is zero.
  if (c.linear == Linear::kInt8) {
    for (size_t i = P.scales; i < specs_.size(); ++i) {
      ScatterGrad(access, i, accumulate);
      access.CloseGrad(i);
    }
  }
  return backward.Final();
}

void Model::BackwardLayer(TensorAccess& access, int64_t l,
                          std::span<const std::span<const float>> w, bool accumulate) {
  const ModelConfig& c = config_;
  const ParamIndex P(c);
  const int64_t n = rows_, d = c.d_model, f = c.ffn_hidden, hd = c.head_dim;
  const int64_t q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
  const float theta = static_cast<float>(c.rope_theta);
  const OpHooks& obs = hooks_;
  const LayerActivations& a = layers_[static_cast<size_t>(l)];
  const auto weight_grad = [&](size_t which, std::span<const float> dy, std::span<const float> x,
                               int64_t out, int64_t in) {
    WeightGrad(access, l, P.Layer(l, which), dy, x, out, in, accumulate);
  };
  const auto input_grad = [&](LayerTensor which, std::span<const float> dy, std::span<float> dx,
                              int64_t out, int64_t in, bool add = false) {
    InputGrad(l, dy, w[which], SteOperands() ? w[ScaleSlot(which)] : std::span<const float>(), dx,
              out, in, add);
  };
  // What a weight gradient multiplies dy by: the input, or with the straight-through int8
  // backward the values its quantized rows stand for.
  const auto input = [&](std::span<const float> x, int64_t in) {
    return SteOperands() ? DequantizedInput(l, x, in) : x;
  };
  // Every gradient between ops is stored as the activations are.
  const auto store = [&](Span x) { StoreActivation(obs, c, l, A(x)); };
  // Feed-forward block; on entry dx = d x_out, on exit dx = d x_mid.
  input_grad(kWDown, A(dx_), A(dact_), d, f);  // dact[N, F]
  store(dact_);
  weight_grad(kWDown, A(dx_), input(A(a.act), f), d, f);     // dW_down[d, F]
  ops::SwigluBwd(obs, l, A(a.gu), A(dact_), A(dgu_), n, f);  // dgu[N, 2F]
  store(dgu_);
  input_grad(kWGateUp, A(dgu_), A(dh_), 2 * f, d);  // dh2[N, d]
  store(dh_);
  weight_grad(kWGateUp, A(dgu_), input(A(a.h2), d), 2 * f, d);  // dW_gu[2F, d]
  ops::RmsNormBwd(obs, l, A(dh_), A(a.x_mid), w[kFfnNorm], A(a.ffn_rstd), A(dh_), A(dgain_), n, d);
  store(dh_);
  GainGrad(access, l, P.Layer(l, kFfnNorm), accumulate);
  ops::AddInto(obs, l, A(dh_), A(dx_));
  store(dx_);
  // Attention block; on exit dx = d x_in.
  input_grad(kWo, A(dx_), A(dattn_), d, q_dim);  // dattn[N, Q]
  store(dattn_);
  weight_grad(kWo, A(dx_), input(A(a.attn), q_dim), d, q_dim);  // dWo[d, Q]
  ops::AttentionBwd(obs, l, AttentionShape(l), A(a.q), A(a.k), A(a.v), A(a.attn), A(a.attn_lse),
                    A(dattn_), A(dq_), A(dk_), A(dv_));  // dq[N, Q], dk/dv[N, K]
  for (const Span g : {dq_, dk_, dv_}) store(g);
  ops::RopeBwd(obs, l, rope_, theta, A(dq_), A(dq_), batch_, seq_, c.n_heads, hd);
  store(dq_);
  ops::RopeBwd(obs, l, rope_, theta, A(dk_), A(dk_), batch_, seq_, c.n_kv_heads, hd);
  store(dk_);
  if (c.qk_norm) {
    ops::RmsNormBwd(obs, l, A(dq_), A(a.q_raw), {}, A(a.q_rstd), A(dq_), {}, n * c.n_heads, hd);
    store(dq_);
    ops::RmsNormBwd(obs, l, A(dk_), A(a.k_raw), {}, A(a.k_rstd), A(dk_), {}, n * c.n_kv_heads, hd);
    store(dk_);
  }
  // dh[N, d] = dq · Wq + dk · Wk + dv · Wv (the latter two GEMMs accumulate into dh).
  input_grad(kWq, A(dq_), A(dh_), q_dim, d);
  store(dh_);
  input_grad(kWk, A(dk_), A(dh_), kv_dim, d, /*add=*/true);
  store(dh_);
  input_grad(kWv, A(dv_), A(dh_), kv_dim, d, /*add=*/true);
  store(dh_);
  const std::span<const float> h = input(A(a.h), d);
  weight_grad(kWq, A(dq_), h, q_dim, d);   // dWq[Q, d]
  weight_grad(kWk, A(dk_), h, kv_dim, d);  // dWk[K, d]
  weight_grad(kWv, A(dv_), h, kv_dim, d);  // dWv[K, d]
  ops::RmsNormBwd(obs, l, A(dh_), A(a.x_in), w[kAttnNorm], A(a.attn_rstd), A(dh_), A(dgain_), n, d);
  store(dh_);
  GainGrad(access, l, P.Layer(l, kAttnNorm), accumulate);
  ops::AddInto(obs, l, A(dh_), A(dx_));
  store(dx_);
}

void Model::InputGrad(int64_t layer, std::span<const float> dy, std::span<const float> w,
                      std::span<const float> w_scale, std::span<float> dx, int64_t out, int64_t in,
                      bool add) {
  if (RotatedInt8Backward()) {
    // dy · W = (dy · H)(Wᵀ · H)ᵀ, H the rotation along out.
    RotatedInt8Gemm(layer, dy, false, w, true, dx, rows_, in, out, add);
    return;
  }
  std::span<const float> weight = w;
  if (SteOperands()) {  // the values the weight's int8 rows stand for, with its scales
    const std::span<int8_t> q = Take(int8_.qw, out * in);
    const std::span<float> w_hat = Take(int8_.w_hat, out * in);
    ops::QuantizeRowsByScale(hooks_, layer, w, w_scale, q, out, in);
    ops::DequantizeRows(hooks_, layer, q, w_scale, w_hat, out, in);
    weight = w_hat;
  }
  ops::GemmDyW(hooks_, layer, dy, weight, dx, rows_, out, in, add);
}

void Model::WeightGrad(TensorAccess& access, int64_t layer, size_t i, std::span<const float> dy,
                       std::span<const float> x, int64_t out, int64_t in, bool accumulate) {
  const std::span<float> grad = Grad(access, i, accumulate);
  if (RotatedInt8Backward()) {
    // dyᵀ · x = (dyᵀ · H)(xᵀ · H)ᵀ, H the rotation along the rows.
    RotatedInt8Gemm(layer, dy, true, x, true, grad, out, in, rows_, accumulate);
  } else {
    ops::GemmDytX(hooks_, layer, dy, x, grad, rows_, out, in, accumulate);
  }
  access.CloseGrad(i);
}

std::span<const float> Model::DequantizedInput(int64_t layer, std::span<const float> x,
                                               int64_t cols) {
  const std::span<int8_t> q = Take(int8_.qx, rows_ * cols);
  const std::span<float> scale = Take(int8_.sx, rows_), y = Take(int8_.x_hat, rows_ * cols);
  ops::QuantizeRows(hooks_, layer, x, q, scale, rows_, cols);
  ops::DequantizeRows(hooks_, layer, q, scale, y, rows_, cols);
  return y;
}

void Model::RotatedInt8Gemm(int64_t layer, std::span<const float> a, bool a_transposed,
                            std::span<const float> b, bool b_transposed, std::span<float> y,
                            int64_t m, int64_t n, int64_t k, bool add) {
  Int8Scratch& s = int8_;
  const std::span<int8_t> qa = Take(s.qa, m * k), qb = Take(s.qb, n * k);
  const std::span<float> sa = Take(s.sa, m), sb = Take(s.sb, n);
  ops::HadamardQuantizeRows(hooks_, layer, a, qa, sa, a_transposed ? k : m, a_transposed ? m : k,
                            a_transposed);
  ops::HadamardQuantizeRows(hooks_, layer, b, qb, sb, b_transposed ? k : n, b_transposed ? n : k,
                            b_transposed);
  const std::span<float> product = add ? Take(s.sum, m * n) : y;
  ops::GemmI8XWt(hooks_, layer, qa, sa, qb, sb, product, m, n, k);
  if (add) ops::AddInto(hooks_, layer, product, y);
}

void Model::GainGrad(TensorAccess& access, int64_t layer, size_t i, bool accumulate) {
  const std::span<float> g = Grad(access, i, accumulate);
  if (accumulate) {
    ops::AddInto(hooks_, layer, A(dgain_), g);
  } else {
    ops::Copy(hooks_, layer, A(dgain_), g);
  }
  access.CloseGrad(i);
}

std::span<float> Model::ScatterGrad(TensorAccess& access, size_t i, bool accumulate) {
  const std::span<float> g = Grad(access, i, accumulate);
  if (!accumulate) {
    if (hooks_.executor != nullptr) hooks_.executor->HostWrites(g);
    std::ranges::fill(g, 0.0f);
  }
  return g;
}

LossSums Model::ForwardBackward(TensorAccess& access, std::span<const uint32_t> tokens,
                                float grad_scale, bool accumulate) {
  LossSums sums = Forward(access, tokens);
  sums.backward = Backward(access, grad_scale, accumulate);
  return sums;
}

std::span<const float> Model::RowLoss() const { return OnHost(loss_); }
std::span<const float> Model::RowZLoss() const { return OnHost(zloss_); }

std::span<const float> Model::OnHost(Span s) const {
  if (hooks_.executor != nullptr) hooks_.executor->ToHost(A(s));
  return A(s);
}

void Model::Logits(const ParamStore& params, std::span<float> logits) const {
  if (!have_forward_) Fail("Model::Logits: called before Forward");
  CheckParams(params, "params");
  OnHost(xf_);
  // With bf16 compute weights, the head's compute copy, which the forward made from `params`.
  const std::span<const float> head = config_.compute_weights == Storage::kBf16
                                          ? OnHost(compute_output_)
                                          : params.Tensor(ParamIndex(config_).output);
  rk::GemmXWt(A(xf_), head, logits, rows_, config_.vocab, config_.d_model);
}

void CheckOpCall(const rk::OpSpec& op, std::span<const OpArg> args,
                 std::span<const OpTensor> inputs, std::span<const OpOutput> outputs) {
  std::vector<std::string_view> names;
  for (const OpArg& a : args) names.push_back(a.name);
  std::vector<rk::RoleAndDtype> in, out;
  for (const OpTensor& t : inputs) in.emplace_back(t.role, t.view.dtype());
  for (const OpOutput& t : outputs) out.emplace_back(t.role, t.view.dtype());
  if (!rk::CallFits(op, names, in, out)) {
    LOCKSTEP_INTERNAL(
        "a call of op '{}' does not fit its entry in the op table "
        "(src/kernels/op_table.cc)",
        op.name);
  }
}

rk::AttentionShape Model::AttentionShape(int64_t layer) const {
  return {batch_,
          seq_,
          config_.n_heads,
          config_.n_kv_heads,
          config_.head_dim,
          LayerWindow(config_, layer),
          dmath::Rsqrt(static_cast<float>(config_.head_dim))};
}

rk::CrossEntropyShape Model::CrossEntropyShape() const {
  return {rows_, config_.d_model, config_.vocab, vocab_chunk_, static_cast<float>(config_.z_loss)};
}

}  // namespace lockstep
