// The model's forward and backward: an independent fp64 reference and finite differences,
// bit-identical results across threads and SIMD variants, and gradient accumulation.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/kernels.h"
#include "lockstep/model.h"

namespace lockstep {
namespace {

using Matrix = std::vector<std::vector<double>>;  // [rows][cols]

std::vector<uint32_t> RandomTokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::vector<uint32_t> ids(static_cast<size_t>(n));
  uint32_t s = seed;
  for (uint32_t& id : ids) {
    s = s * 1664525u + 1013904223u;
    id = (s >> 8) % static_cast<uint32_t>(vocab);
  }
  return ids;
}

// Initialised parameters with every norm gain moved away from 1, so that a gain applied in the
// wrong place (or not at all) shows up in the gradient check.
ParamStore TestParams(const ModelConfig& config) {
  ParamStore params(ParameterSpecs(config));
  InitParameters(config, 99, params);
  uint32_t s = 7;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params.Spec(i).is_matrix || params.Spec(i).is_scale) continue;  // scales: of the matrices
    for (float& g : params.Tensor(i)) {
      s = s * 1664525u + 1013904223u;
      g = 0.75f + 0.5f * static_cast<float>(s >> 8) * 0x1.0p-24f;
    }
  }
  return params;
}

// ---- the fp64 reference: the same architecture written naively, sequence by sequence --------
class Reference {
 public:
  Reference(const ModelConfig& c, const ParamStore& params) : c_(c) {
    for (size_t i = 0; i < params.size(); ++i) {
      p_.emplace_back(params.Tensor(i).begin(), params.Tensor(i).end());
    }
  }
  std::vector<double>& Tensor(size_t i) { return p_[i]; }

  // grad_scale * Σ_t (loss_t + zloss_t) for one sequence (tokens[T + 1]); per-row losses out.
  double Objective(const std::vector<uint32_t>& tokens, double grad_scale,
                   std::vector<double>* row_loss = nullptr) const {
    const int64_t T = static_cast<int64_t>(tokens.size()) - 1, d = c_.d_model, hd = c_.head_dim;
    const int64_t hq = c_.n_heads, hkv = c_.n_kv_heads, f = c_.ffn_hidden;
    size_t next = 0;
    const std::vector<double>& tok = p_[next++];
    Matrix x(T, std::vector<double>(d));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < d; ++i) x[t][i] = tok[tokens[t] * d + i];
    }
    if (c_.embedding_norm) x = Norm(x, &p_[next++]);
    for (int64_t l = 0; l < c_.n_layers; ++l) {
      const auto& [attn_norm, wq, wk, wv, wo, ffn_norm, wgu, wdown] =
          std::tie(p_[next], p_[next + 1], p_[next + 2], p_[next + 3], p_[next + 4],
                   p_[next + 5], p_[next + 6], p_[next + 7]);
      next += 8;
      const Matrix h = Norm(x, &attn_norm);
      Matrix q = Linear(h, wq, hq * hd), k = Linear(h, wk, hkv * hd);
      const Matrix v = Linear(h, wv, hkv * hd);
      HeadsNormRope(q, hq);
      HeadsNormRope(k, hkv);
      const int64_t window = LayerWindow(c_, l);
      Matrix o(T, std::vector<double>(hq * hd, 0.0));
      for (int64_t head = 0; head < hq; ++head) {
        const int64_t g = head / (hq / hkv);
        for (int64_t t = 0; t < T; ++t) {
          const int64_t first = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
          std::vector<double> s;
          double m = -INFINITY;
          for (int64_t j = first; j <= t; ++j) {
            double dot = 0;
            for (int64_t e = 0; e < hd; ++e) dot += q[t][head * hd + e] * k[j][g * hd + e];
            s.push_back(dot / std::sqrt(static_cast<double>(hd)));
            m = std::max(m, s.back());
          }
          double z = 0;
          for (double& si : s) z += (si = std::exp(si - m));
          for (int64_t j = first; j <= t; ++j) {
            for (int64_t e = 0; e < hd; ++e) o[t][head * hd + e] += s[j - first] / z * v[j][g * hd + e];
          }
        }
      }
      Add(x, Linear(o, wo, d));
      const Matrix gu = Linear(Norm(x, &ffn_norm), wgu, 2 * f);
      Matrix a(T, std::vector<double>(f));
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < f; ++j) a[t][j] = gu[t][j] / (1 + std::exp(-gu[t][j])) * gu[t][f + j];
      }
      Add(x, Linear(a, wdown, d));
    }
    const Matrix logits = Linear(Norm(x, &p_[next]), p_[next + 1], c_.vocab);
    double objective = 0;
    if (row_loss) row_loss->clear();
    for (int64_t t = 0; t < T; ++t) {
      const double m = *std::max_element(logits[t].begin(), logits[t].end());
      double sum = 0;
      for (double z : logits[t]) sum += std::exp(z - m);
      const double lse = m + std::log(sum);
      const double loss = lse - logits[t][tokens[t + 1]];
      if (row_loss) row_loss->push_back(loss);
      objective += loss + c_.z_loss * lse * lse;
    }
    return grad_scale * objective;
  }

 private:
  Matrix Linear(const Matrix& x, const std::vector<double>& w, int64_t out) const {
    const int64_t in = static_cast<int64_t>(x[0].size());
    Matrix y(x.size(), std::vector<double>(out));
    for (size_t t = 0; t < x.size(); ++t) {
      for (int64_t o = 0; o < out; ++o) {
        double acc = 0;
        for (int64_t i = 0; i < in; ++i) acc += x[t][i] * w[o * in + i];
        y[t][o] = acc;
      }
    }
    return y;
  }
  // RMSNorm of each row (gain null: gain-free), or of each `width`-wide piece of a row.
  void NormInPlace(double* x, int64_t n, const double* gain) const {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const double r = 1 / std::sqrt(ss / n + c_.norm_eps);
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] * r * (gain ? gain[i] : 1.0);
  }
  Matrix Norm(Matrix x, const std::vector<double>* gain) const {
    for (auto& row : x) NormInPlace(row.data(), static_cast<int64_t>(row.size()), gain->data());
    return x;
  }
  void HeadsNormRope(Matrix& x, int64_t heads) const {
    const int64_t hd = c_.head_dim, half = hd / 2;
    for (size_t t = 0; t < x.size(); ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        double* v = x[t].data() + h * hd;
        if (c_.qk_norm) NormInPlace(v, hd, nullptr);
        for (int64_t i = 0; i < half; ++i) {
          const double angle = t * std::pow(c_.rope_theta, -2.0 * i / hd);
          const double x1 = v[i], x2 = v[i + half];
          v[i] = x1 * std::cos(angle) - x2 * std::sin(angle);
          v[i + half] = x2 * std::cos(angle) + x1 * std::sin(angle);
        }
      }
    }
  }
  static void Add(Matrix& x, const Matrix& y) {
    for (size_t t = 0; t < x.size(); ++t) {
      for (size_t i = 0; i < x[t].size(); ++i) x[t][i] += y[t][i];
    }
  }

  ModelConfig c_;
  std::vector<std::vector<double>> p_;
};

// The gradient check runs `tiny` on one sequence of 16 positions: layer 0's window (8) is
// exercised, and the fp64 reference stays fast.
TEST(ModelGradient, MatchesFp64FiniteDifferencesOnTiny) {
  const RunConfig run = LoadRunConfig("tiny");
  const ModelConfig& config = run.model;
  constexpr int64_t kSeq = 16;
  ASSERT_LT(LayerWindow(config, 0), kSeq);
  const ParamStore params = TestParams(config);
  const std::vector<uint32_t> tokens = RandomTokens(kSeq + 1, config.vocab, 3);
  const float grad_scale = 1.0f / kSeq;

  Model model(config, run.train.vocab_chunk, 1, kSeq);
  ParamStore grads(ParameterSpecs(config));
  const LossSums sums = model.ForwardBackward(params, tokens, grad_scale, false, grads);

  Reference ref(config, params);
  std::vector<double> ref_rows;
  ref.Objective(tokens, grad_scale, &ref_rows);
  double ref_sum = 0, worst_row = 0;
  for (int64_t t = 0; t < kSeq; ++t) {
    ref_sum += ref_rows[t];
    worst_row = std::max(worst_row, std::fabs(model.RowLoss()[t] - ref_rows[t]));
  }
  EXPECT_LT(worst_row, 2e-5);
  EXPECT_NEAR(sums.loss, ref_sum, 1e-4);
  std::printf("fp32 vs fp64 loss: worst row error %.3g, sum %.7g vs %.7g\n", worst_row, sums.loss,
              ref_sum);

  // Central differences of the fp64 objective, step 1e-4 (truncation ~1e-10 relative, rounding
  // ~1e-12): the error measured is the fp32 gradient's. Each tensor's error is relative to its
  // largest fp32 gradient element; the worst seen is ~4e-7, the bound 2e-5.
  constexpr double kStep = 1e-4, kTolerance = 2e-5;
  constexpr int kSamplesPerTensor = 4;
  double worst = 0;
  uint32_t s = 11;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::span<const float> g = grads.Tensor(i);
    double scale = 0;
    for (float v : g) scale = std::max(scale, double{std::fabs(v)});
    ASSERT_GT(scale, 0) << params.Spec(i).name;
    double tensor_worst = 0;
    for (int sample = 0; sample < kSamplesPerTensor; ++sample) {
      s = s * 1664525u + 1013904223u;
      int64_t e = (s >> 4) % g.size();
      if (i == 0) {  // the token table: only the rows of the input tokens have a gradient
        e = tokens[(s >> 4) % kSeq] * config.d_model + (s >> 12) % config.d_model;
      }
      double& p = ref.Tensor(i)[e];
      const double saved = p;
      p = saved + kStep;
      const double plus = ref.Objective(tokens, grad_scale);
      p = saved - kStep;
      const double minus = ref.Objective(tokens, grad_scale);
      p = saved;
      const double fd = (plus - minus) / (2 * kStep);
      tensor_worst = std::max(tensor_worst, std::fabs(g[e] - fd) / scale);
    }
    EXPECT_LT(tensor_worst, kTolerance) << params.Spec(i).name;
    worst = std::max(worst, tensor_worst);
  }
  std::printf("gradient check: worst relative error %.3g over %zu tensors\n", worst, params.size());
}

// Loss, z-loss and every gradient of one microbatch, concatenated.
std::vector<float> StepResult(const RunConfig& run, const ParamStore& params,
                              const std::vector<uint32_t>& tokens, int64_t batch, int64_t seq) {
  Model model(run.model, run.train.vocab_chunk, batch, seq);
  ParamStore grads(ParameterSpecs(run.model));
  const LossSums sums = model.ForwardBackward(params, tokens, 0.01f, false, grads);
  std::vector<float> out = {sums.loss, sums.zloss};
  out.insert(out.end(), grads.Flat().begin(), grads.Flat().end());
  return out;
}

// tiny-int8 with the straight-through backward's fp32 GEMMs (model.int8_backward: false).
RunConfig TinyInt8StraightThrough() {
  RunConfig run = LoadRunConfig("tiny-int8");
  run.model.int8_backward = false;
  return run;
}

// tiny-int8 with bf16 activations and compute weights: OPEN's recipe.
RunConfig TinyInt8Bf16() {
  RunConfig run = LoadRunConfig("tiny-int8");
  run.model.activations = Storage::kBf16;
  run.model.compute_weights = Storage::kBf16;
  return run;
}

TEST(ModelDeterminism, SameBitsOnEveryThreadCountAndIsa) {
  for (const std::string_view name :
       {"tiny", "tiny-int8", "tiny-int8 straight-through", "tiny-bf16", "tiny-int8 bf16"}) {
    const RunConfig run = name.ends_with("straight-through") ? TinyInt8StraightThrough()
                          : name.ends_with(" bf16")          ? TinyInt8Bf16()
                                                             : LoadRunConfig(std::string(name));
    const ParamStore params = TestParams(run.model);
    // Two sequences of 24 positions keep the sweep (every variant x 3 thread counts) fast while
    // crossing layer 0's window (8) and the batch boundary.
    constexpr int64_t kBatch = 2, kSeq = 24;
    const std::vector<uint32_t> tokens = RandomTokens(kBatch * (kSeq + 1), run.model.vocab, 5);
    const int threads[] = {1, 2, 3};
    const auto results =
        rk::SweepVariants([&] { return StepResult(run, params, tokens, kBatch, kSeq); }, threads);
    ASSERT_FALSE(results.empty());
    for (const rk::SweepResult& r : results) {
      EXPECT_TRUE(r.equal) << name << ": " << r.isa.name << " at " << r.threads
                           << " threads: first difference at " << r.first_diff;
    }
  }
}

// The int8 linears compute the fp32 model within the quantization's error (each operand within
// half a step of 1/127 of its row's largest magnitude): every row's loss, and every gradient
// (straight-through, or with the int8 backward's rotated, quantized gradients) relative to its
// tensor's largest (measured: 1.9 % and 2.4 %). A wrong transposition, scale, rotation or operand
// would be off by far more. Also: the int8 model is not the fp32 one.
TEST(ModelInt8, IsTheFp32ModelWithinTheQuantizationError) {
  const RunConfig int8 = LoadRunConfig("tiny-int8");
  RunConfig fp32 = int8;
  fp32.model.linear = Linear::kFp32;
  fp32.model.int8_backward = false;
  const ParamStore params = TestParams(int8.model);
  // The fp32 model's parameters: the same tensors without the scales.
  ParamStore params32(ParameterSpecs(fp32.model));
  for (size_t i = 0; i < params32.size(); ++i) {
    ASSERT_EQ(params32.Spec(i).name, params.Spec(i).name);
    std::ranges::copy(params.Tensor(i), params32.Tensor(i).begin());
  }
  constexpr int64_t kBatch = 2, kSeq = 24;
  const std::vector<uint32_t> tokens = RandomTokens(kBatch * (kSeq + 1), int8.model.vocab, 5);
  const auto run = [&](const RunConfig& r, std::vector<float>& rows, ParamStore& grads) {
    Model model(r.model, r.train.vocab_chunk, kBatch, kSeq);
    model.ForwardBackward(r.model.linear == Linear::kInt8 ? params : params32, tokens,
                          1.0f / (kBatch * kSeq), false, grads);
    rows.assign(model.RowLoss().begin(), model.RowLoss().end());
  };
  std::vector<float> rows32;
  ParamStore grads32(ParameterSpecs(fp32.model));
  std::vector<float> straight_through;
  run(fp32, rows32, grads32);
  for (const bool int8_backward : {false, true}) {
    RunConfig r = int8;
    r.model.int8_backward = int8_backward;
    std::vector<float> rows8;
    ParamStore grads8(ParameterSpecs(r.model));
    run(r, rows8, grads8);
    double worst_row = 0;
    for (size_t t = 0; t < rows8.size(); ++t) {
      worst_row = std::max(worst_row, double{std::fabs(rows8[t] - rows32[t])});
    }
    EXPECT_GT(worst_row, 0) << "the int8 linears computed the fp32 model's bits";
    EXPECT_LT(worst_row, 2e-3);
    double worst = 0;
    for (size_t i = 0; i < params32.size(); ++i) {
      double scale = 0, err = 0;
      for (size_t e = 0; e < grads32.Tensor(i).size(); ++e) {
        scale = std::max(scale, double{std::fabs(grads32.Tensor(i)[e])});
        err = std::max(err, double{std::fabs(grads8.Tensor(i)[e] - grads32.Tensor(i)[e])});
      }
      EXPECT_LT(err / scale, 5e-2) << params.Spec(i).name << " int8_backward " << int8_backward;
      worst = std::max(worst, err / scale);
    }
    if (int8_backward) {
      EXPECT_NE(std::vector<float>(grads8.Flat().begin(), grads8.Flat().end()), straight_through)
          << "the int8 backward changed nothing";
    } else {
      straight_through.assign(grads8.Flat().begin(), grads8.Flat().end());
    }
    std::printf(
        "int8 vs fp32 linears (int8_backward %d): worst row loss difference %.3g, worst relative "
        "gradient difference %.3g\n",
        int8_backward, worst_row, worst);
  }
}

// Recomputed activations (Model::Activations::kRecomputed) change no bit: the losses and every
// gradient equal the kept activations', with and without the optional norms (without them, with
// int8 linears), accumulating or not, and with bf16 activations (kept as bf16 between the forward
// and the backward); and the model holds less.
TEST(ModelRecompute, RecomputedActivationsGiveTheKeptBits) {
  for (const int variant : {0, 1, 2, 3}) {
    const bool norms = variant == 0 || variant == 3;
    RunConfig run = LoadRunConfig(variant == 3 ? "tiny-bf16" : norms ? "tiny" : "tiny-int8");
    // bf16: four layers, so that layers between the first and the last are kept as bf16 too.
    if (variant == 3) run.model.n_layers = 4;
    run.model.qk_norm = norms;
    run.model.embedding_norm = norms;
    run.model.int8_backward = variant == 2;
    const ParamStore params = TestParams(run.model);
    constexpr int64_t kBatch = 2, kSeq = 24;
    const std::vector<uint32_t> tokens = RandomTokens(kBatch * (kSeq + 1), run.model.vocab, 7);
    const auto step = [&](Model::Activations activations) {
      Model model(run.model, run.train.vocab_chunk, kBatch, kSeq, activations);
      ParamStore grads(ParameterSpecs(run.model));
      std::vector<float> out;
      for (const bool accumulate : {false, true}) {
        const LossSums sums = model.ForwardBackward(params, tokens, 0.01f, accumulate, grads);
        out.insert(out.end(), {sums.loss, sums.zloss});
      }
      out.insert(out.end(), grads.Flat().begin(), grads.Flat().end());
      return out;
    };
    const std::vector<float> kept = step(Model::Activations::kKept);
    const std::vector<float> recomputed = step(Model::Activations::kRecomputed);
    ASSERT_EQ(kept.size(), recomputed.size());
    EXPECT_EQ(std::memcmp(kept.data(), recomputed.data(), kept.size() * sizeof(float)), 0)
        << "variant " << variant;
    EXPECT_LT(Model::AllocatedBytes(run.model, run.train.vocab_chunk, kBatch, kSeq,
                                    Model::Activations::kRecomputed),
              Model::AllocatedBytes(run.model, run.train.vocab_chunk, kBatch, kSeq));
  }
}

// Documented rule (docs/model.md): accumulating microbatch 2 onto microbatch 1 gives, for every
// matrix and the embedding table, exactly the gradient of the two as one microbatch when
// microbatch 1 has a multiple of 256 rows; each norm gain's gradient is g1 + g2 (one addition).
TEST(ModelAccumulate, TwoMicrobatchesFollowTheDocumentedRule) {
  const RunConfig run = LoadRunConfig("tiny");
  const ModelConfig& c = run.model;
  const int64_t batch = 256 / c.seq_len;  // 256 rows per microbatch
  const ParamStore params = TestParams(c);
  const std::vector<uint32_t> tokens = RandomTokens(2 * batch * (c.seq_len + 1), c.vocab, 9);
  const std::span<const uint32_t> first(tokens.data(), tokens.size() / 2);
  const std::span<const uint32_t> second(tokens.data() + tokens.size() / 2, tokens.size() / 2);
  const float scale = 1.0f / 512;

  Model half(c, run.train.vocab_chunk, batch, c.seq_len);
  ParamStore accumulated(ParameterSpecs(c)), g1(ParameterSpecs(c)), g2(ParameterSpecs(c));
  accumulated.Flat()[3] = 123.0f;  // garbage that overwriting must clear
  half.ForwardBackward(params, first, scale, false, accumulated);
  half.ForwardBackward(params, second, scale, true, accumulated);
  half.ForwardBackward(params, first, scale, false, g1);
  half.ForwardBackward(params, second, scale, false, g2);

  Model whole(c, run.train.vocab_chunk, 2 * batch, c.seq_len);
  ParamStore joint(ParameterSpecs(c));
  whole.ForwardBackward(params, tokens, scale, false, joint);

  for (size_t i = 0; i < params.size(); ++i) {
    const std::span<const float> got = accumulated.Tensor(i);
    std::vector<float> expected(got.size());
    if (params.Spec(i).is_matrix) {
      std::copy(joint.Tensor(i).begin(), joint.Tensor(i).end(), expected.begin());
    } else {
      for (size_t e = 0; e < expected.size(); ++e) expected[e] = g1.Tensor(i)[e] + g2.Tensor(i)[e];
    }
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
        << params.Spec(i).name;
  }
}

TEST(ModelForward, LogitsAndLossMatchTraining) {
  const RunConfig run = LoadRunConfig("tiny");
  const ModelConfig& c = run.model;
  const ParamStore params = TestParams(c);
  const int64_t T = c.seq_len;
  const std::vector<uint32_t> tokens = RandomTokens(2 * (T + 1), c.vocab, 21);
  Model training(c, run.train.vocab_chunk, 2, T);
  training.Forward(params, tokens);

  // The second sequence alone, as `lockstep forward` runs it: the same loss bits.
  const std::vector<uint32_t> row(tokens.begin() + (T + 1), tokens.end());
  Model single(c, run.train.vocab_chunk, 1, T);
  single.Forward(params, row);
  EXPECT_EQ(std::memcmp(single.RowLoss().data(), training.RowLoss().data() + T, T * sizeof(float)), 0);

  std::vector<float> logits(static_cast<size_t>(T * c.vocab));
  single.Logits(params, logits);
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits.data() + t * c.vocab;
    double sum = 0;
    const double m = *std::max_element(z, z + c.vocab);
    for (int64_t v = 0; v < c.vocab; ++v) sum += std::exp(z[v] - m);
    EXPECT_NEAR(single.RowLoss()[t], m + std::log(sum) - z[row[t + 1]], 1e-5) << t;
  }
}

TEST(ModelForward, RejectsBadShapes) {
  const RunConfig run = LoadRunConfig("tiny");
  EXPECT_THROW(Model(run.model, 256, 1, run.model.seq_len + 1), Error);
  Model model(run.model, 256, 1, 8);
  const ParamStore params = TestParams(run.model);
  EXPECT_THROW(model.Forward(params, std::vector<uint32_t>(8, 0)), Error);
  EXPECT_THROW(model.Forward(params, std::vector<uint32_t>(9, 100000)), Error);
  ParamStore wrong(ParameterSpecs(LoadRunConfig("smoke").model));
  EXPECT_THROW(model.Forward(wrong, std::vector<uint32_t>(9, 0)), Error);
}

// The ops' f32 operands that the model stores as bf16 (docs/model.md, "bf16 storage"): the
// activations, the gradients between ops and the compute weights; by op and role. (Not: the
// embedding's table, the master weights a compute copy is made from, the statistics rstd and lse,
// the weight gradients, the int8 scales.)
const std::map<std::string_view, std::vector<std::string_view>>& Bf16Operands() {
  static const std::map<std::string_view, std::vector<std::string_view>> kOperands = {
      {"rmsnorm_fwd", {"x", "gain"}},
      {"gemm_xwt", {"x", "w"}},
      {"rope_fwd", {"x"}},
      {"attention_fwd", {"q", "k", "v"}},
      {"add_into", {"x", "y"}},
      {"swiglu_fwd", {"gu"}},
      {"cross_entropy_fwd", {"h", "w"}},
      {"cross_entropy_bwd", {"h", "w"}},
      {"rmsnorm_bwd", {"dy", "x", "gain"}},
      {"gemm_dyw", {"dy", "w", "dx"}},
      {"gemm_dytx", {"dy", "x"}},
      {"swiglu_bwd", {"gu", "dact"}},
      {"attention_bwd", {"q", "k", "v", "out", "dout"}},
      {"rope_bwd", {"dy"}},
      {"embedding_bwd", {"dout"}},
      {"quantize_rows", {"x"}},
      {"quantize_rows_by_scale", {"x"}},
      {"hadamard_quantize_rows", {"x"}},
  };
  return kOperands;
}

// Which (op.role) of Bf16Operands were read holding a value that is not a bfloat16's.
class Bf16OperandCheck final : public OpObserver {
 public:
  void Context(uint64_t, int64_t) override {}
  void Begin(std::string_view op, int64_t, std::span<const OpArg>,
             std::span<const OpTensor> inputs) override {
    const auto it = Bf16Operands().find(op);
    if (it == Bf16Operands().end()) return;
    for (const OpTensor& t : inputs) {
      if (std::ranges::find(it->second, t.role) == it->second.end()) continue;
      ++checked;
      const std::span<const float> x = t.view.As<float>();
      const bool bf16 = std::ranges::all_of(
          x, [](float v) { return (std::bit_cast<uint32_t>(v) & 0xffffu) == 0; });
      if (!bf16) wide.insert(fmt::format("{}.{}", op, t.role));
    }
  }
  void End(std::span<const OpOutput>) override {}
  int64_t checked = 0;
  std::set<std::string> wide;
};

// With bf16 activations and compute weights every such operand of a forward and backward is a
// bfloat16 value, in fp32 linears and in int8 ones; in the fp32 model none is (so the check
// sees what it looks for).
TEST(ModelBf16, EveryActivationGradientAndComputeWeightIsBf16) {
  constexpr int64_t kBatch = 2, kSeq = 24;
  for (const std::string_view name : {"tiny-bf16", "tiny-int8 bf16", "tiny"}) {
    const RunConfig run =
        name == "tiny-int8 bf16" ? TinyInt8Bf16() : LoadRunConfig(std::string(name));
    const ParamStore params = TestParams(run.model);
    ParamStore grads(ParameterSpecs(run.model));
    const std::vector<uint32_t> tokens = RandomTokens(kBatch * (kSeq + 1), run.model.vocab, 8);
    Model model(run.model, run.train.vocab_chunk, kBatch, kSeq);
    Bf16OperandCheck check;
    model.set_hooks({.observer = &check});
    model.ForwardBackward(params, tokens, 0.01f, false, grads);
    EXPECT_GT(check.checked, 60) << name;
    if (name == "tiny") {
      EXPECT_GE(check.wide.size(), 15u) << name;
    } else if (name == "tiny-int8 bf16") {
      // Inside one linear's int8 backward GEMM (docs/model.md, "Linears"): its product is added
      // to the gradient (add_into.x), not stored; the rotation reads the stored gradients
      // (hadamard_quantize_rows.x).
      EXPECT_EQ(check.wide, (std::set<std::string>{"add_into.x"}));
    } else {
      EXPECT_TRUE(check.wide.empty())
          << name << ": " << fmt::format("{}", fmt::join(check.wide, ", "));
    }
  }
}

// bf16 storage computes the fp32 model within bfloat16's rounding (2^-9 relative per value):
// every row's loss and every gradient relative to its tensor's largest; and it is not the fp32
// model.
TEST(ModelBf16, IsTheFp32ModelWithinBf16Rounding) {
  const RunConfig bf16 = LoadRunConfig("tiny-bf16");
  const RunConfig fp32 = LoadRunConfig("tiny");
  const ParamStore params = TestParams(fp32.model);
  constexpr int64_t kBatch = 2, kSeq = 24;
  const std::vector<uint32_t> tokens = RandomTokens(kBatch * (kSeq + 1), fp32.model.vocab, 9);
  const auto run = [&](const RunConfig& r, std::vector<float>& rows, ParamStore& grads) {
    Model model(r.model, r.train.vocab_chunk, kBatch, kSeq);
    model.ForwardBackward(params, tokens, 1.0f / (kBatch * kSeq), false, grads);
    rows.assign(model.RowLoss().begin(), model.RowLoss().end());
  };
  std::vector<float> rows32, rows16;
  ParamStore grads32(ParameterSpecs(fp32.model)), grads16(ParameterSpecs(bf16.model));
  run(fp32, rows32, grads32);
  run(bf16, rows16, grads16);
  double loss_worst = 0, grad_worst = 0;
  for (size_t r = 0; r < rows32.size(); ++r) {
    loss_worst = std::max(
        loss_worst, static_cast<double>(std::fabs(rows16[r] - rows32[r]) / std::fabs(rows32[r])));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const std::span<const float> a = grads32.Tensor(i), b = grads16.Tensor(i);
    double largest = 0, diff = 0;
    for (size_t j = 0; j < a.size(); ++j) {
      largest = std::max(largest, static_cast<double>(std::fabs(a[j])));
      diff = std::max(diff, static_cast<double>(std::fabs(a[j] - b[j])));
    }
    grad_worst = std::max(grad_worst, diff / largest);
  }
  std::printf(
      "bf16 vs fp32 storage: worst row loss difference %.3g, worst relative gradient %.3g\n",
      loss_worst, grad_worst);
  EXPECT_LT(loss_worst, 0.01);
  EXPECT_LT(grad_worst, 0.05);
  EXPECT_NE(rows16, rows32);
}

// bf16 activations are kept as bf16 between a layer's forward and its backward (but the last
// layer's, its inputs and its statistics): the activation arena of an 8-layer model holds under
// seven tenths of the fp32 model's, whose every activation is binary32.
TEST(ModelBf16, KeptActivationsTakeFarLessRoom) {
  RunConfig fp32 = LoadRunConfig("tiny");
  fp32.model.n_layers = 8;
  RunConfig bf16 = fp32;
  bf16.model.activations = Storage::kBf16;
  const auto bytes = [](const RunConfig& r) {
    return static_cast<double>(Model::AllocatedBytes(r.model, r.train.vocab_chunk, 4, 64));
  };
  const double ratio = bytes(bf16) / bytes(fp32);
  std::printf("bf16 activations: %.3f of the fp32 model's bytes\n", ratio);
  EXPECT_LT(ratio, 0.7);
  EXPECT_GT(ratio, 0.5);  // the inputs, statistics, the last layer and the scratch stay binary32
}

}  // namespace
}  // namespace lockstep
