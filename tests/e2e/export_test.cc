// lockstep export: the architecture chosen for every built-in config, and the row permutation
// that makes llama.cpp's interleaved RoPE ("llama") equal lockstep's rotate-half RoPE. The
// comparison against llama.cpp itself is tests/e2e/export_llama.py (ctest
// export_gguf_llama_cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "lockstep/infer.h"

namespace lockstep::infer {
namespace {

std::string Refusal(const std::string& config, ExportFormat format) {
  try {
    ExportArchitecture(LoadRunConfig(config).model, format);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Export, ArchitecturePerBuiltInConfig) {
  const std::vector<std::tuple<std::string, std::string, std::string>> expected = {
      {"bench-8x512", "LlamaForCausalLM", "llama"},
      {"open-100m", "Qwen2ForCausalLM", "mimo2"},
      {"open-1b", "Qwen2ForCausalLM", "mimo2"},
      {"smoke", "Qwen3ForCausalLM", ""},
      {"tiny", "Qwen3ForCausalLM", ""},
      {"tiny-dp", "Qwen3ForCausalLM", ""},
  };
  for (const auto& [name, hf, gguf] : expected) {
    const ModelConfig c = LoadRunConfig(name).model;
    EXPECT_EQ(ExportArchitecture(c, ExportFormat::kHf), hf) << name;
    if (gguf.empty()) {
      const std::string why = Refusal(name, ExportFormat::kGguf);
      EXPECT_NE(why.find(fmt::format("model.window = {} with model.qk_norm = true", c.window)),
                std::string::npos)
          << name << ": " << why;
    } else {
      EXPECT_EQ(ExportArchitecture(c, ExportFormat::kGguf), gguf) << name;
    }
  }
  // gguf-bf16 holds a model's matrices as BF16 only where its weights are bfloat16s: for a
  // bf16-compute-weight model, with gguf's architecture.
  for (const auto& [name, hf, gguf] : expected) {
    ModelConfig c = LoadRunConfig(name).model;
    const std::string why = Refusal(name, ExportFormat::kGgufBf16);
    EXPECT_NE(why.find("model.compute_weights = fp32"), std::string::npos) << name << ": " << why;
    if (gguf.empty()) continue;
    c.compute_weights = Storage::kBf16;
    EXPECT_EQ(ExportArchitecture(c, ExportFormat::kGgufBf16), gguf) << name;
  }
  // No format has lockstep's int8 linears: an fp32 export would be another model.
  for (const ExportFormat format :
       {ExportFormat::kHf, ExportFormat::kGguf, ExportFormat::kGgufBf16}) {
    const std::string why = Refusal("tiny-int8", format);
    EXPECT_NE(why.find("model.linear = int8"), std::string::npos) << why;
    // Nor activations rounded to bf16 between ops.
    const std::string bf16 = Refusal("tiny-bf16", format);
    EXPECT_NE(bf16.find("model.activations = bf16"), std::string::npos) << bf16;
  }
}

// RoPE of one head vector at position t, both conventions, in double.
std::vector<double> RotateHalf(const std::vector<double>& x, int t, double theta) {
  const size_t half = x.size() / 2;
  std::vector<double> y(x.size());
  for (size_t i = 0; i < half; ++i) {
    const double a = t * std::pow(theta, -2.0 * i / x.size());
    y[i] = x[i] * std::cos(a) - x[i + half] * std::sin(a);
    y[i + half] = x[i + half] * std::cos(a) + x[i] * std::sin(a);
  }
  return y;
}
std::vector<double> Interleaved(const std::vector<double>& x, int t, double theta) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size() / 2; ++i) {
    const double a = t * std::pow(theta, -2.0 * i / x.size());
    y[2 * i] = x[2 * i] * std::cos(a) - x[2 * i + 1] * std::sin(a);
    y[2 * i + 1] = x[2 * i + 1] * std::cos(a) + x[2 * i] * std::sin(a);
  }
  return y;
}

TEST(Export, PermutationTurnsRotateHalfIntoInterleavedRope) {
  // A [heads * hd, 1] projection is one q vector; row h*hd + 2i + j comes from h*hd + j*hd/2 + i.
  constexpr int kHeads = 2, kHd = 8;
  std::vector<float> w(kHeads * kHd);
  for (size_t r = 0; r < w.size(); ++r) w[r] = static_cast<float>(r);
  const std::vector<float> p = PermuteForInterleavedRope(w, kHeads, kHd, 1);
  EXPECT_EQ(p, (std::vector<float>{0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15}));

  // Rotating the permuted vector the interleaved way gives the permuted rotate-half result, so
  // scores q·k (both permuted alike) are lockstep's; without the permutation they are not.
  for (size_t r = 0; r < w.size(); ++r) w[r] = std::sin(1.7f * r + 0.3f);
  const std::vector<float> wp = PermuteForInterleavedRope(w, kHeads, kHd, 1);
  double worst = 0, unpermuted = 0;
  for (int h = 0; h < kHeads; ++h) {
    const std::vector<double> x(w.begin() + h * kHd, w.begin() + (h + 1) * kHd);
    const std::vector<double> xp(wp.begin() + h * kHd, wp.begin() + (h + 1) * kHd);
    const std::vector<double> want = RotateHalf(x, 5, 10000.0);
    std::vector<float> want_f(want.begin(), want.end());
    const std::vector<float> want_p = PermuteForInterleavedRope(want_f, 1, kHd, 1);
    const std::vector<double> got = Interleaved(xp, 5, 10000.0);
    const std::vector<double> bug = Interleaved(x, 5, 10000.0);
    for (int i = 0; i < kHd; ++i) {
      worst = std::max(worst, std::abs(got[i] - want_p[i]));
      unpermuted = std::max(unpermuted, std::abs(bug[i] - want[i]));
    }
  }
  EXPECT_LT(worst, 1e-6);
  EXPECT_GT(unpermuted, 0.1);  // the classic silent bug is visible
}

}  // namespace
}  // namespace lockstep::infer
