// The KV-cache decoder: a position's logits are the training forward's, bit for bit, whether the
// sequence is run whole, prefilled in pieces or decoded a token at a time, whatever other
// sequences share the call, at every SIMD variant and thread count, and on the OpenCL device.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "lockstep/device.h"
#include "lockstep/infer.h"
#include "lockstep/model.h"

namespace lockstep {
namespace {

using infer::KvDecoder;
using Piece = KvDecoder::Piece;

// tiny (windows of 8 beside full attention, QK-norm, embedding norm), the same without the
// optional features, tiny-int8 (int8 linears) and tiny-bf16 (bf16 activations and compute
// weights).
std::vector<ModelConfig> Configs() {
  ModelConfig tiny = LoadRunConfig("tiny").model;
  ModelConfig plain = tiny;
  plain.window = 0;
  plain.qk_norm = false;
  plain.embedding_norm = false;
  return {tiny, plain, LoadRunConfig("tiny-int8").model, LoadRunConfig("tiny-bf16").model};
}

std::vector<uint32_t> Tokens(int64_t n, uint32_t vocab, uint32_t seed) {
  std::vector<uint32_t> t(static_cast<size_t>(n));
  uint32_t s = seed;
  for (uint32_t& id : t) id = (s = s * 1664525u + 1013904223u) >> 8 & (vocab - 1);
  return t;
}

// The training forward's logits of every position (Model::Forward, then Model::Logits).
std::vector<float> TrainingLogits(const ModelConfig& c, const ParamStore& params,
                                  std::vector<uint32_t> tokens) {
  const auto seq = static_cast<int64_t>(tokens.size());
  tokens.push_back(0);  // a target for the last position: the logits do not depend on it
  Model model(c, 256, 1, seq);
  model.Forward(params, tokens);
  std::vector<float> logits(static_cast<size_t>(seq * c.vocab));
  model.Logits(params, logits);
  return logits;
}

struct Fixture {
  explicit Fixture(const ModelConfig& config) : c(config), params(ParameterSpecs(config)) {
    InitParameters(c, 7, params);
  }
  ModelConfig c;
  ParamStore params;
};

// Every position three ways: whole, in pieces of 5, 1 and the rest, and a token at a time.
std::vector<float> ThreeWays(const Fixture& f, const std::vector<uint32_t>& tokens,
                             const OpHooks& hooks = {}) {
  const auto n = static_cast<int64_t>(tokens.size());
  const std::span<const uint32_t> all(tokens);
  std::vector<float> out;
  {
    KvDecoder d(f.c, f.params, 1);
    d.set_hooks(hooks);
    const Piece whole[] = {{0, all}};
    out = d.Append(whole, true);
  }
  {
    KvDecoder d(f.c, f.params, 1);
    d.set_hooks(hooks);
    for (const auto& [from, to] : {std::pair{0, 5}, {5, 6}, {6, int(n)}}) {
      const Piece p[] = {{0, all.subspan(from, to - from)}};
      const std::vector<float> got = d.Append(p, true);
      out.insert(out.end(), got.begin(), got.end());
    }
  }
  {
    KvDecoder d(f.c, f.params, 1);
    d.set_hooks(hooks);
    for (int64_t t = 0; t < n; ++t) {
      const Piece p[] = {{0, all.subspan(t, 1)}};
      const std::vector<float> got = d.Append(p, false);
      out.insert(out.end(), got.begin(), got.end());
    }
    EXPECT_EQ(d.Length(0), n);
  }
  return out;
}

TEST(KvDecoder, DecodeEqualsPrefillEqualsTheTrainingForward) {
  for (const ModelConfig& c : Configs()) {
    const Fixture f(c);
    const std::vector<uint32_t> tokens = Tokens(40, 512, 3);  // past the window and a 64-key tile
    const std::vector<float> want = TrainingLogits(c, f.params, tokens);
    const std::vector<float> got = ThreeWays(f, tokens);
    ASSERT_EQ(got.size(), 3 * want.size());
    for (int way = 0; way < 3; ++way) {
      EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + way * want.size()))
          << "way " << way << ", window " << c.window << ", qk_norm " << c.qk_norm;
    }
  }
}

// A slot holds the positions it was given, no more, with the bits of a full-length slot; and a
// generation's caches and prefill are sized before anything is allocated.
TEST(KvDecoder, ASlotHoldsItsCapacityAndABatchIsPlannedBeforeItIsAllocated) {
  const Fixture f(Configs()[0]);
  const std::vector<uint32_t> a = Tokens(3, 512, 4), b = Tokens(5, 512, 5);
  const Piece pieces[] = {{0, a}, {1, b}};
  const int64_t capacities[] = {3, 5};
  KvDecoder sized(f.c, f.params, capacities), full(f.c, f.params, 2);
  EXPECT_EQ(sized.Append(pieces, true), full.Append(pieces, true));
  const Piece more[] = {{0, std::span(a).first(1)}};
  test::ExpectError([&] { sized.Append(more, false); },
                    {"slot 0: 3 positions and 1 new tokens exceed the slot's 3 positions"});
  EXPECT_EQ(sized.Length(0), 3);  // unchanged by the refused call
  const int64_t kv = f.c.n_kv_heads * f.c.head_dim;
  EXPECT_EQ(KvDecoder::CacheBytes(f.c, capacities),
            uint64_t(2 * f.c.n_layers * 8 * kv * sizeof(float)));
  test::ExpectError([&] { KvDecoder(f.c, f.params, std::vector<int64_t>{0}); },
                    {"a slot of 0 positions"});

  // Two requests of 4 prompt tokens and 3 new ones: 4 + 2 positions each are cached.
  const std::vector<infer::Request> requests = {{0, Tokens(4, 512, 6)}, {1, Tokens(4, 512, 7)}};
  infer::SamplingParams params;
  params.max_tokens = 3;
  const uint64_t need = KvDecoder::CacheBytes(f.c, std::vector<int64_t>{6, 6}) +
                        KvDecoder::AppendBytes(f.c, 8, 2) + KvDecoder::CopyBytes(f.c, true);
  // The head and every fp32 linear packed as PackForGemv holds them (none on a device): as
  // binary32, or with bf16 compute weights as bfloat16 (half the bytes) beside a ParamStore's copy
  // of every weight.
  uint64_t packed = 0, head_packed = 0, matrices = 0;
  for (size_t i = 0; i < f.params.Specs().size(); ++i) {
    const ParamSpec& spec = f.params.Spec(i);
    if (!spec.is_matrix || spec.name == "tok_embeddings.weight") continue;
    const uint64_t bytes =
        rk::PackForGemv(f.params.Tensor(i), spec.shape[0], spec.shape[1]).packed.size();
    packed += bytes;
    if (spec.name == "output.weight") head_packed = bytes;
    matrices += f.params.Tensor(i).size_bytes();
  }
  EXPECT_GE(packed, matrices);
  EXPECT_GT(head_packed, 0u);
  EXPECT_EQ(KvDecoder::CopyBytes(f.c, true, /*linears=*/false), head_packed);
  ModelConfig bf16 = f.c;
  bf16.compute_weights = Storage::kBf16;
  const uint64_t compute_copy = ParamStore(ParameterSpecs(bf16)).Flat().size() * sizeof(float);
  EXPECT_EQ(KvDecoder::CopyBytes(f.c, true), packed);
  EXPECT_EQ(KvDecoder::CopyBytes(f.c, false), 0u);
  EXPECT_EQ(KvDecoder::CopyBytes(bf16, false), compute_copy);
  EXPECT_EQ(KvDecoder::CopyBytes(bf16, true), compute_copy + packed / 2);
  // With int8 linears: the head packed, and each linear's weight quantized once (a byte each)
  // and packed for the int8 GEMM.
  const ModelConfig int8 = LoadRunConfig("tiny-int8").model;
  const std::vector<float> head(static_cast<size_t>(int8.vocab * int8.d_model));
  uint64_t int8_bytes = rk::PackForGemv(head, int8.vocab, int8.d_model).packed.size();
  for (const ParamSpec& spec : ParameterSpecs(int8)) {
    if (!spec.is_matrix || spec.layer < 0) continue;
    const std::vector<int8_t> q(static_cast<size_t>(spec.numel()));
    int8_bytes += q.size() + rk::PackI8ForGemm(q, spec.shape[0], spec.shape[1]).packed.size();
  }
  EXPECT_EQ(KvDecoder::CopyBytes(int8, true), int8_bytes);
  // Everything fits; or all but the linears' copies, which the decoder then does without; or
  // not even that, which is refused.
  EXPECT_TRUE(infer::CheckGenerationFits(f.c, requests, params, need, true));
  EXPECT_TRUE(infer::CheckGenerationFits(f.c, requests, params, need - packed, false));
  const uint64_t least = need - (packed - head_packed);
  EXPECT_FALSE(infer::CheckGenerationFits(f.c, requests, params, need - 1, true));
  EXPECT_FALSE(infer::CheckGenerationFits(f.c, requests, params, least, true));
  test::ExpectError([&] { infer::CheckGenerationFits(f.c, requests, params, least - 1, true); },
                    {"2 requests need", "12 positions in all", "MemAvailable",
                     "fewer requests or a smaller --max-tokens"});
}

// A decoder without its copies of the linears (the packed fp32 weights, the quantized int8 ones)
// gives the same bits as one with them, prefilling and decoding.
TEST(KvDecoder, TheLinearsCopiesChangeNoBit) {
  for (const ModelConfig& c : Configs()) {
    const Fixture f(c);
    const std::vector<uint32_t> tokens = Tokens(20, 512, 9);
    std::vector<float> with, without;
    for (const bool copies : {true, false}) {
      KvDecoder d(f.c, f.params, 1);
      d.set_linear_copies(copies);
      std::vector<float>& out = copies ? with : without;
      const Piece prompt[] = {{0, std::span(tokens).first(12)}};
      out = d.Append(prompt, true);
      for (size_t t = 12; t < tokens.size(); ++t) {
        const Piece p[] = {{0, std::span(tokens).subspan(t, 1)}};
        const std::vector<float> got = d.Append(p, false);
        out.insert(out.end(), got.begin(), got.end());
      }
    }
    EXPECT_TRUE(with == without) << LinearName(c.linear) << ", compute weights "
                                 << StorageName(c.compute_weights);
  }
}

void ARequestsLogitsDoNotDependOnTheOthers(const ModelConfig& c) {
  const Fixture f(c);
  const std::vector<std::vector<uint32_t>> seqs = {Tokens(30, 512, 1), Tokens(12, 512, 2),
                                                   Tokens(21, 512, 3)};
  std::vector<std::vector<float>> alone;
  for (const auto& s : seqs) alone.push_back(TrainingLogits(f.c, f.params, s));
  // The three together, in two orders and slot assignments, prefilled by unequal pieces and
  // then decoded side by side (a finished sequence drops out of the batch).
  for (const std::vector<int>& order : {std::vector{0, 1, 2}, std::vector{2, 0, 1}}) {
    KvDecoder d(f.c, f.params, 3);
    std::vector<std::vector<float>> got(3);
    const auto take = [&](const std::vector<float>& logits, const std::vector<int>& who) {
      for (size_t i = 0; i < who.size(); ++i) {
        got[who[i]].insert(got[who[i]].end(), logits.begin() + i * f.c.vocab,
                           logits.begin() + (i + 1) * f.c.vocab);
      }
    };
    std::vector<Piece> prefill;
    std::vector<int> who;
    for (size_t slot = 0; slot < order.size(); ++slot) {
      const int s = order[slot];
      prefill.push_back({int64_t(slot), std::span(seqs[s]).first(5 + 2 * s)});
    }
    const std::vector<float> first = d.Append(prefill, true);
    int64_t row = 0;
    for (size_t slot = 0; slot < order.size(); ++slot) {
      const int s = order[slot];
      const int64_t rows = 5 + 2 * s;
      got[s].insert(got[s].end(), first.begin() + row * f.c.vocab,
                    first.begin() + (row + rows) * f.c.vocab);
      row += rows;
    }
    for (;;) {
      std::vector<Piece> step;
      who.clear();
      for (size_t slot = 0; slot < order.size(); ++slot) {
        const int s = order[slot];
        const int64_t at = d.Length(int64_t(slot));
        if (at == int64_t(seqs[s].size())) continue;
        step.push_back({int64_t(slot), std::span(seqs[s]).subspan(at, 1)});
        who.push_back(s);
      }
      if (step.empty()) break;
      take(d.Append(step, false), who);
    }
    for (int s = 0; s < 3; ++s)
      EXPECT_EQ(got[s], alone[s]) << LinearName(c.linear) << ", sequence " << s;
  }
}

TEST(KvDecoder, ARequestsLogitsDoNotDependOnTheOthersInTheBatch) {
  for (const ModelConfig& c : {Configs()[0], Configs()[2]})
    ARequestsLogitsDoNotDependOnTheOthers(c);
}

TEST(KvDecoder, TheBitsAreTheSameAtEveryVariantAndThreadCount) {
  for (const ModelConfig& c : {Configs()[0], Configs()[2]}) {
    const Fixture f(c);
    const std::vector<uint32_t> tokens = Tokens(20, 512, 4);
    for (const rk::SweepResult& r :
         rk::SweepVariants([&] { return ThreeWays(f, tokens); }, rk::kSweepThreadCounts)) {
      EXPECT_TRUE(r.equal) << LinearName(c.linear) << ": " << r.isa.name << " at " << r.threads
                           << " threads: first difference at " << r.first_diff;
    }
  }
}

TEST(KvDecoder, TheOpenClDeviceGivesTheSameBits) {
  if (!device::OpenClBuiltIn()) GTEST_SKIP() << "built without OpenCL";
  ASSERT_FALSE(device::ListDevices().empty()) << "no OpenCL device (scripts/install-deps.sh)";
  const std::unique_ptr<device::Device> dev = device::Open({});
  const Fixture f(Configs()[0]);
  const std::vector<uint32_t> tokens = Tokens(20, 512, 5);
  const std::vector<float> cpu = ThreeWays(f, tokens);  // nothing kept: every op's tensors travel
  EXPECT_EQ(ThreeWays(f, tokens, {nullptr, dev.get()}), cpu);
  EXPECT_GT(dev->traffic().to_device, 0u) << "the device ran none of the ops";
}

// The weights and the KV caches stay on the device: a decoded token sends it a few rows, not
// every weight again (each op sent its weights, and the cache, on every call).
TEST(KvDecoder, TheDeviceKeepsTheWeightsAndTheCaches) {
  if (!device::OpenClBuiltIn()) GTEST_SKIP() << "built without OpenCL";
  ASSERT_FALSE(device::ListDevices().empty()) << "no OpenCL device (scripts/install-deps.sh)";
  const std::unique_ptr<device::Device> dev = device::Open({});
  const Fixture f(Configs()[0]);
  const std::vector<uint32_t> tokens = Tokens(20, 512, 5);
  const std::span<const uint32_t> all(tokens);
  const uint64_t weights = f.params.Flat().size_bytes();
  {
    KvDecoder d(f.c, f.params, 1);
    d.set_hooks({nullptr, dev.get()});
    const Piece prompt[] = {{0, all.first(19)}};
    d.Append(prompt, false);
    EXPECT_GT(dev->traffic().kept, weights);  // the weights and the caches, copied as used
    const uint64_t before = dev->traffic().to_device;
    const Piece next[] = {{0, all.subspan(19, 1)}};
    const std::vector<float> logits = d.Append(next, false);
    EXPECT_LT(dev->traffic().to_device - before, weights / 4)
        << "a decoded token sent the device its weights again";
    EXPECT_EQ(logits.size(), 512u);
  }
  EXPECT_EQ(dev->traffic().kept, 0u) << "the decoder left copies on the device";
}

TEST(KvDecoder, TooLongSequencesAndOutOfVocabularyTokensAreRefusedAndChangeNothing) {
  const Fixture f(Configs()[0]);
  KvDecoder d(f.c, f.params, 2);
  const std::vector<uint32_t> long_one = Tokens(65, 512, 6), bad = {3, 512};
  const Piece too_long[] = {{1, long_one}};
  test::ExpectError([&] { d.Append(too_long, false); }, {"slot 1", "seq_len (64)"});
  const Piece out_of_vocab[] = {{0, bad}};
  test::ExpectError([&] { d.Append(out_of_vocab, false); },
                    {"token 1 is 512", "model.vocab = 512"});
  const Piece twice[] = {{0, std::span(bad).first(1)}, {0, std::span(bad).first(1)}};
  test::ExpectError([&] { d.Append(twice, false); }, {"slot 0 given twice"});
  EXPECT_EQ(d.Length(0), 0);
  EXPECT_EQ(d.Length(1), 0);
}

}  // namespace
}  // namespace lockstep
