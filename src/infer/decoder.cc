// The decoder on new tokens with a KV cache: docs/model.md's forward, row by row.
#include <fmt/format.h>

#include <algorithm>

#include "lockstep/infer.h"
#include "lockstep/op_calls.h"

namespace lockstep::infer {

namespace {
// `slots` capacities of seq_len positions.
std::vector<int64_t> FullSlots(const ModelConfig& config, int64_t slots) {
  if (slots < 1) Fail("KvDecoder: {} slots (at least 1)", slots);
  return std::vector<int64_t>(static_cast<size_t>(slots), config.seq_len);
}

// The packed weights' values: bfloat16s where the decoder's weights are (its bf16 compute copy).
Dtype PackedDtype(const ModelConfig& config) {
  return config.compute_weights == Storage::kBf16 ? Dtype::kBF16 : Dtype::kF32;
}

// f(l, i, n, k) for linear i (kLayerLinears order) of every layer l, its weight [n, k].
template <class F>
void ForEachLinear(const ModelConfig& config, F&& f) {
  const std::vector<ParamSpec> specs = ParameterSpecs(config);
  const ParamIndex P(config);
  for (int64_t l = 0; l < config.n_layers; ++l) {
    for (size_t i = 0; i < kLayerLinears.size(); ++i) {
      const std::vector<int64_t>& shape = specs[P.Layer(l, kLayerLinears[i])].shape;
      f(l, i, shape[0], shape[1]);
    }
  }
}
}  // namespace

KvDecoder::KvDecoder(const ModelConfig& config, const ParamStore& params, int64_t slots)
    : KvDecoder(config, params, FullSlots(config, slots)) {}

KvDecoder::KvDecoder(const ModelConfig& config, const ParamStore& params,
                     std::span<const int64_t> capacities)
    : config_(config),
      capacities_(capacities.begin(), capacities.end()),
      rope_(rk::MakeRopeTable(config.seq_len, config.head_dim,
                              static_cast<float>(config.rope_theta))),
      scale_(dmath::Rsqrt(static_cast<float>(config.head_dim))),
      lengths_(capacities.size(), 0) {
  if (capacities.empty()) Fail("KvDecoder: no slots (at least 1)");
  int64_t positions = 0;
  for (const int64_t capacity : capacities) {
    if (capacity < 1 || capacity > config.seq_len) {
      Fail("KvDecoder: a slot of {} positions (1 to the model's seq_len, {})", capacity,
           config.seq_len);
    }
    first_.push_back(positions);
    positions += capacity;
  }
  const std::vector<ParamSpec> specs = ParameterSpecs(config);
  if (params.Specs().size() != specs.size()) {
    Fail("KvDecoder: {} parameter tensors; the model has {}", params.Specs().size(), specs.size());
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (params.Spec(i).name != specs[i].name || params.Spec(i).shape != specs[i].shape) {
      Fail("KvDecoder: parameter {} is '{}'; the model's is '{}'", i, params.Spec(i).name,
           specs[i].name);
    }
  }
  const ParamIndex P(config);
  if (config.compute_weights == Storage::kBf16) {
    compute_ = std::make_unique<ParamStore>(params);
    for (size_t i = 0; i < specs.size(); ++i) {
      if (!specs[i].is_scale) rk::RoundToBf16(compute_->Tensor(i));
    }
  }
  const ParamStore& weights = compute_ != nullptr ? *compute_ : params;
  weights_ = weights.Flat();
  tok_ = weights.Tensor(P.tok);
  if (config.embedding_norm) emb_norm_ = weights.Tensor(P.emb_norm);
  final_norm_ = weights.Tensor(P.final_norm);
  output_ = weights.Tensor(P.output);
  const int64_t kv = config.n_kv_heads * config.head_dim;
  for (int64_t l = 0; l < config.n_layers; ++l) {
    LayerTensors& w = layers_.emplace_back();
    for (size_t which = 0; which < kTensorsPerLayer; ++which) {
      w[which] = weights.Tensor(P.Layer(l, which));
    }
    if (config.linear == Linear::kInt8) {
      for (const LayerTensor which : kLayerLinears) {
        w[ScaleSlot(which)] = weights.Tensor(P.Scale(l, which));
      }
    }
    const auto floats = static_cast<size_t>(positions * kv);
    k_cache_.emplace_back(floats);
    v_cache_.emplace_back(floats);
  }
}

KvDecoder::~KvDecoder() {
  if (hooks_.executor == nullptr) return;
  for (const std::span<const float> r : Resident()) hooks_.executor->Forget(r);
}

std::vector<std::span<const float>> KvDecoder::Resident() const {
  std::vector<std::span<const float>> regions = {weights_};
  for (size_t l = 0; l < k_cache_.size(); ++l) {
    regions.emplace_back(k_cache_[l]);
    regions.emplace_back(v_cache_[l]);
  }
  return regions;
}

void KvDecoder::set_hooks(const OpHooks& hooks) {
  if (hooks_.executor != hooks.executor) {
    if (hooks_.executor != nullptr) {
      for (const std::span<const float> r : Resident()) {
        hooks_.executor->ToHost(r);
        hooks_.executor->Forget(r);
      }
    }
    if (hooks.executor != nullptr) {
      uint64_t bytes = 0, largest = 0;
      for (const std::span<const float> r : Resident()) {
        bytes += r.size_bytes();
        largest = std::max<uint64_t>(largest, r.size_bytes());
      }
      hooks.executor->Plan(bytes, largest, "the model's weights and the KV caches");
      for (const std::span<const float> r : Resident()) hooks.executor->Keep(r);
    }
  }
  hooks_ = hooks;
}

int64_t KvDecoder::Length(int64_t slot) const {
  if (slot < 0 || slot >= slots()) Fail("KvDecoder: slot {} (there are {})", slot, slots());
  return lengths_[static_cast<size_t>(slot)];
}

void KvDecoder::Reset(int64_t slot) {
  Length(slot);
  lengths_[static_cast<size_t>(slot)] = 0;
}

std::span<float> KvDecoder::Cache(std::vector<float>& cache, int64_t slot, int64_t from,
                                  int64_t rows) {
  const int64_t kv = config_.n_kv_heads * config_.head_dim;
  return std::span(cache).subspan(
      static_cast<size_t>((first_[static_cast<size_t>(slot)] + from) * kv),
      static_cast<size_t>(rows * kv));
}

uint64_t KvDecoder::CacheBytes(const ModelConfig& c, std::span<const int64_t> capacities) {
  uint64_t positions = 0;
  for (const int64_t capacity : capacities) positions += static_cast<uint64_t>(capacity);
  return 2 * static_cast<uint64_t>(c.n_layers) * positions *
         static_cast<uint64_t>(c.n_kv_heads * c.head_dim) * sizeof(float);
}

uint64_t KvDecoder::AppendBytes(const ModelConfig& c, int64_t rows, int64_t logit_rows) {
  // Append's scratch per row (x, y, h, rstd, q_raw, q, attn, k_raw, k, v, gu, act), its ids,
  // the logits, and the int8 linears' scratch.
  const int64_t q_dim = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  const int64_t per_row =
      3 * c.d_model + std::max(c.n_heads, int64_t{1}) + 3 * q_dim + 3 * kv + 3 * c.ffn_hidden + 1;
  const uint64_t int8 =
      c.linear == Linear::kInt8 ? static_cast<uint64_t>(Int8Scratch::Bytes(c, rows, false)) : 0;
  return (static_cast<uint64_t>(rows) * static_cast<uint64_t>(per_row) +
          static_cast<uint64_t>(logit_rows) * static_cast<uint64_t>(c.vocab)) *
             sizeof(float) +
         int8;
}

uint64_t KvDecoder::CopyBytes(const ModelConfig& c, bool on_cpu, bool linears) {
  uint64_t bytes = 0;
  if (on_cpu) bytes += rk::PackedGemvBytes(c.vocab, c.d_model, PackedDtype(c));
  if (on_cpu && linears) {
    ForEachLinear(c, [&](int64_t, size_t, int64_t n, int64_t k) {
      bytes += c.linear == Linear::kFp32
                   ? rk::PackedGemvBytes(n, k, PackedDtype(c))
                   : static_cast<uint64_t>(n * k) + rk::PackedI8Bytes(n, k);  // quantized, packed
    });
  }
  if (c.compute_weights == Storage::kBf16) {
    bytes += static_cast<uint64_t>(ParamStore::FlatFloats(ParameterSpecs(c))) * sizeof(float);
  }
  return bytes;
}

void KvDecoder::Norm(int64_t layer, std::span<const float> x, std::span<const float> gain,
                     std::span<float> y, int64_t rows, int64_t cols) {
  const float eps = static_cast<float>(config_.norm_eps);
  const std::span<float> rstd = std::span(rstd_).first(static_cast<size_t>(rows));
  ops::RmsNormFwd(hooks_, layer, x, gain, eps, y, rstd, rows, cols);
}

std::vector<float> KvDecoder::Append(std::span<const Piece> pieces, bool every_position) {
  const ModelConfig& c = config_;
  std::vector<int64_t> first_row;  // piece i's rows are first_row[i] .. first_row[i + 1] - 1
  std::vector<uint32_t> ids;
  std::vector<bool> seen(lengths_.size(), false);
  for (const Piece& p : pieces) {
    const int64_t length = Length(p.slot);
    if (seen[static_cast<size_t>(p.slot)])
      Fail("KvDecoder: slot {} given twice in one call", p.slot);
    seen[static_cast<size_t>(p.slot)] = true;
    const auto n = static_cast<int64_t>(p.tokens.size());
    const auto what = [&] {
      return p.what.empty() ? fmt::format("slot {}", p.slot) : std::string(p.what);
    };
    const int64_t capacity = capacities_[static_cast<size_t>(p.slot)];
    if (n > capacity - length) {
      if (capacity == c.seq_len) {
        Fail("{}: {} positions and {} new tokens exceed the model's seq_len ({})", what(), length,
             n, c.seq_len);
      }
      Fail("{}: {} positions and {} new tokens exceed the slot's {} positions", what(), length, n,
           capacity);
    }
    for (size_t i = 0; i < p.tokens.size(); ++i) {
      if (p.tokens[i] >= static_cast<uint64_t>(c.vocab)) {
        Fail("{}: token {} is {}, outside the vocabulary (model.vocab = {})", what(), i,
             p.tokens[i], c.vocab);
      }
    }
    first_row.push_back(static_cast<int64_t>(ids.size()));
    ids.insert(ids.end(), p.tokens.begin(), p.tokens.end());
  }
  first_row.push_back(static_cast<int64_t>(ids.size()));
  const auto n = static_cast<int64_t>(ids.size());
  if (n == 0) return {};
  const int64_t d = c.d_model, q_dim = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  const auto size = [&](std::vector<float>& v, int64_t floats) {
    v.resize(static_cast<size_t>(floats));
    return std::span<float>(v);
  };
  size(x_, n * d);
  size(y_, n * d);
  size(h_, n * d);
  size(rstd_, n * std::max(c.n_heads, int64_t{1}));
  size(q_raw_, n * q_dim);
  size(k_raw_, n * kv);
  size(q_, n * q_dim);
  size(k_, n * kv);
  size(v_, n * kv);
  size(attn_, n * q_dim);
  size(gu_, n * 2 * c.ffn_hidden);
  size(act_, n * c.ffn_hidden);
  if (c.linear == Linear::kInt8) int8_.Resize(c, n, /*backward=*/false);

  // Embedding (+ optional RMSNorm): x[N, d].
  ops::EmbeddingFwd(hooks_, -1, tok_, ids, c.embedding_norm ? y_ : x_, c.vocab, d);
  StoreEmbedding(hooks_, c, c.embedding_norm ? y_ : x_);
  if (c.embedding_norm) {
    Norm(-1, y_, emb_norm_, x_, n, d);
    StoreActivation(hooks_, c, -1, x_);
  }
  pieces_ = pieces;
  first_row_ = first_row;
  const std::span<float> rstd(rstd_);
  const LayerBuffers b{.x_in = x_,
                       .h = h_,
                       .attn_rstd = rstd.first(static_cast<size_t>(n)),
                       .q_raw = q_raw_,
                       .k_raw = k_raw_,
                       .q_rstd = rstd.first(static_cast<size_t>(n * c.n_heads)),
                       .k_rstd = rstd.first(static_cast<size_t>(n * c.n_kv_heads)),
                       .q = q_,
                       .k = k_,
                       .v = v_,
                       .attn = attn_,
                       .x_mid = y_,
                       .h2 = h_,
                       .ffn_rstd = rstd.first(static_cast<size_t>(n)),
                       .gu = gu_,
                       .act = act_,
                       .x_out = x_,
                       .int8 = &int8_};
  const bool packed = PackedLinears(n), quantized = QuantizedLinears();
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerBuffers layer = b;
    if (packed) layer.packed = &packed_layers_[static_cast<size_t>(l)];
    if (quantized) layer.quantized = &quantized_layers_[static_cast<size_t>(l)];
    LayerForward(hooks_, c, l, n, layers_[static_cast<size_t>(l)], layer, *this);
  }
  pieces_ = {};
  for (size_t i = 0; i < pieces.size(); ++i) {
    lengths_[static_cast<size_t>(pieces[i].slot)] += first_row[i + 1] - first_row[i];
  }

  // The rows whose logits are asked for, then final RMSNorm and the head on them alone.
  int64_t rows = n;
  if (!every_position) {
    rows = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (first_row[i + 1] == first_row[i]) continue;
      const int64_t last = first_row[i + 1] - 1;
      std::copy_n(x_.begin() + last * d, d, x_.begin() + rows * d);
      ++rows;
    }
  }
  const std::span<const float> x = std::span(x_).first(static_cast<size_t>(rows * d));
  const std::span<float> xf = std::span(h_).first(static_cast<size_t>(rows * d));
  Norm(-1, x, final_norm_, xf, rows, d);
  StoreActivation(hooks_, c, -1, xf);
  std::vector<float> logits(static_cast<size_t>(rows * c.vocab));
  if (hooks_.executor == nullptr && rows <= rk::kGemvMaxRows) {
    if (!head_) head_ = rk::PackForGemv(output_, c.vocab, d, PackedDtype(c));
    ops::GemmXWtPacked(hooks_, -1, xf, *head_, logits, rows);
  } else {
    ops::GemmXWt(hooks_, -1, xf, output_, logits, rows, c.vocab, d);
  }
  return logits;
}

bool KvDecoder::PackedLinears(int64_t rows) {
  const ModelConfig& c = config_;
  if (!linear_copies_ || hooks_.executor != nullptr || rows > rk::kGemvMaxRows ||
      c.linear != Linear::kFp32) {
    return false;
  }
  if (packed_layers_.empty()) {
    packed_layers_.resize(layers_.size());
    ForEachLinear(c, [&](int64_t l, size_t i, int64_t n, int64_t k) {
      packed_layers_[static_cast<size_t>(l)][i] =
          rk::PackForGemv(layers_[static_cast<size_t>(l)][kLayerLinears[i]], n, k, PackedDtype(c));
    });
  }
  return true;
}

bool KvDecoder::QuantizedLinears() {
  const ModelConfig& c = config_;
  if (!linear_copies_ || hooks_.executor != nullptr || c.linear != Linear::kInt8) return false;
  if (quantized_layers_.empty()) {
    quantized_layers_.resize(layers_.size());
    ForEachLinear(c, [&](int64_t l, size_t i, int64_t n, int64_t k) {
      const LayerTensors& w = layers_[static_cast<size_t>(l)];
      QuantizedLinear& q = quantized_layers_[static_cast<size_t>(l)][i];
      q.q.resize(static_cast<size_t>(n * k));
      ops::QuantizeRowsByScale(hooks_, l, w[kLayerLinears[i]], w[ScaleSlot(kLayerLinears[i])], q.q,
                               n, k);
      q.packed = rk::PackI8ForGemm(q.q, n, k);
    });
  }
  return true;
}

void KvDecoder::Attend(const OpHooks& hooks, int64_t l, std::span<float> q_rows,
                       std::span<float> k_rows, std::span<const float> v_rows,
                       std::span<float> attn_rows) {
  const ModelConfig& c = config_;
  const int64_t hd = c.head_dim, q_dim = c.n_heads * hd, kv = c.n_kv_heads * hd;
  const float theta = static_cast<float>(c.rope_theta);
  rk::AttentionShape shape{1, 0, c.n_heads, c.n_kv_heads, hd, LayerWindow(c, l), scale_};
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const int64_t rows = first_row_[i + 1] - first_row_[i];
    if (rows == 0) continue;
    const int64_t slot = pieces_[i].slot, past = lengths_[static_cast<size_t>(slot)];
    const auto piece = [&](auto all, int64_t width) {
      return all.subspan(static_cast<size_t>(first_row_[i] * width),
                         static_cast<size_t>(rows * width));
    };
    const std::span<float> q = piece(q_rows, q_dim), k = piece(k_rows, kv);
    std::vector<float>& k_cache = k_cache_[static_cast<size_t>(l)];
    std::vector<float>& v_cache = v_cache_[static_cast<size_t>(l)];
    ops::RopeFwd(hooks, l, rope_, theta, q, q, 1, rows, c.n_heads, hd, past);
    ops::RopeFwd(hooks, l, rope_, theta, k, k, 1, rows, c.n_kv_heads, hd, past);
    StoreActivation(hooks, c, l, q);
    StoreActivation(hooks, c, l, k);
    ops::Copy(hooks, l, k, Cache(k_cache, slot, past, rows));
    ops::Copy(hooks, l, piece(v_rows, kv), Cache(v_cache, slot, past, rows));
    shape.seq = rows;
    shape.past = past;
    const std::span<float> lse = std::span(rstd_).first(static_cast<size_t>(rows * c.n_heads));
    ops::AttentionFwd(hooks, l, shape, q, Cache(k_cache, slot, 0, past + rows),
                      Cache(v_cache, slot, 0, past + rows), piece(attn_rows, q_dim), lse);
  }
}

}  // namespace lockstep::infer
