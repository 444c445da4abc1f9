// The device layer against the scalar reference, bit for bit, on the OpenCL devices installed
// (PoCL in CI): every op it implements at several work-group sizes, the GEMM at several tilings
// on ragged shapes, the rules of the sources and build options, and the mutations those rules
// guard against.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include "common/expect_error.h"
#include "lockstep/core.h"
#include "lockstep/device.h"
#include "lockstep/kernels.h"

namespace lockstep {
namespace {

// The reference's outputs of `spec` on `in`: the scalar reference at one thread.
rk::OpValues Reference(const rk::OpSpec& spec, const rk::OpValues& in) {
  const rk::Isa isa = rk::ActiveIsa();
  const int threads = Threads();
  rk::SetIsa(rk::ReferenceIsa());
  SetThreads(1);
  rk::OpValues out;
  spec.run(in, out);
  rk::SetIsa(isa);
  SetThreads(threads);
  return out;
}

// Whether two runs of an op gave the same outputs, as the contract compares them
// (rk::OutputWords: NaNs compared as NaN where the contract leaves their bits open). Names the
// first differing word.
::testing::AssertionResult SameBits(const rk::OpSpec& spec, const rk::OpValues& want,
                                    const rk::OpValues& got) {
  for (const rk::OpRole& role : spec.outputs) {
    if (want.Has(role.name) != got.Has(role.name)) {
      return ::testing::AssertionFailure() << "output " << role.name << " is in one run only";
    }
  }
  const std::vector<float> w = rk::OutputWords(spec, want), g = rk::OutputWords(spec, got);
  if (w.size() != g.size()) {
    return ::testing::AssertionFailure() << g.size() << " words of outputs, not " << w.size();
  }
  for (size_t i = 0; i < w.size(); ++i) {
    if (std::bit_cast<uint32_t>(w[i]) != std::bit_cast<uint32_t>(g[i])) {
      return ::testing::AssertionFailure()
             << "word " << i << " of the outputs: reference " << w[i] << ", device " << g[i];
    }
  }
  return ::testing::AssertionSuccess();
}

class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device::OpenClBuiltIn()) GTEST_SKIP() << "built without OpenCL";
    ASSERT_FALSE(device::ListDevices().empty())
        << "no OpenCL device: install pocl-opencl-icd (scripts/install-deps.sh)";
    dev_ = device::Open({});
  }
  std::unique_ptr<device::Device> dev_;
};

TEST_F(DeviceTest, EveryOpItRunsGivesTheReferenceBitsAtEveryWorkGroupSize) {
  int ran = 0;
  for (const rk::OpSpec& spec : rk::OpTable()) {
    if (!dev_->Implements(spec.op)) continue;
    ++ran;
    const rk::OpValues in = spec.sample();
    const rk::OpValues want = Reference(spec, in);
    for (const size_t work_group : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{256}}) {
      if (work_group > dev_->info().max_work_group) continue;
      dev_->set_work_group(work_group);
      rk::OpValues got;
      dev_->Run(spec.op, in, got);
      EXPECT_TRUE(SameBits(spec, want, got)) << spec.name << ", work-group " << work_group;
    }
  }
  // Every op but global_norm; block_squares where the device has fp64 (PoCL does).
  EXPECT_EQ(ran, dev_->info().fp64 ? 30 : 29) << "ops the device runs";
  EXPECT_EQ(dev_->Implements(rk::Op::kBlockSquares), dev_->info().fp64);
}

TEST_F(DeviceTest, TheGemmGivesTheReferenceBitsAtEveryTilingOnRaggedShapes) {
  // One and two slice buffers; k-slices of 1 (no float4 reads along k) to 64; and every GPU
  // candidate.
  std::vector<device::GemmTiling> tilings = {
      {8, 8, 1, 1, 8, 0},    {32, 32, 2, 2, 16, 0}, {64, 32, 4, 2, 32, 0},
      {16, 64, 2, 8, 64, 0}, {4, 128, 1, 4, 1, 0},  {8, 8, 1, 1, 8, 1},
      {32, 32, 2, 2, 16, 1}, {16, 64, 2, 8, 64, 1}, {4, 128, 1, 4, 1, 1}};
  for (const device::GemmTiling& t : device::GemmCandidates()) {
    if (dev_->Fits(t)) tilings.push_back(t);
  }
  // (m, n, k): one element, a reduced length of 0, lengths across chunk ends, edges of every
  // tile; the last two with every stride a multiple of 4 (float4 reads), one ending mid-slice.
  const int64_t shapes[][3] = {{1, 1, 1},     {3, 5, 0},    {67, 45, 531},
                               {33, 17, 257}, {130, 9, 512}, {68, 36, 516}, {64, 128, 256}};
  for (const rk::Op op : {rk::Op::kGemmXWt, rk::Op::kGemmDyW, rk::Op::kGemmDytX}) {
    const rk::OpSpec& spec = rk::Spec(op);
    for (const auto& [m, n, k] : shapes) {
      for (const int accumulate : {0, 1}) {
        rk::OpValues in = spec.sample();
        in.args = {{"m", double(m)}, {"n", double(n)}, {"k", double(k)},
                   {"accumulate", double(accumulate)}};
        const int64_t sizes[3] = {op == rk::Op::kGemmXWt ? m * k : m * n,
                                  op == rk::Op::kGemmDytX ? m * k : n * k,
                                  op == rk::Op::kGemmXWt   ? m * n
                                  : op == rk::Op::kGemmDyW ? m * k
                                                           : n * k};
        uint32_t seed = 100;
        for (size_t r = 0; r < 3; ++r) {
          in.Put(spec.inputs[r].name, rk::SelftestFloats(sizes[r], seed++));
        }
        if (!accumulate) in.tensors.erase(std::string(spec.inputs[2].name));
        const rk::OpValues want = Reference(spec, in);
        for (const device::GemmTiling& t : tilings) {
          dev_->set_gemm_tiling(t);
          rk::OpValues got;
          dev_->Run(op, in, got);
          EXPECT_TRUE(SameBits(spec, want, got))
              << spec.name << " " << m << "x" << n << "x" << k << " accumulate " << accumulate
              << ", tiling " << t.Name();
        }
      }
    }
  }
}

// Every chunk's sum starts from +0 (docs/numerics.md, "GEMM"): products that are all -0 give
// +0, with or without accumulating onto -0 (-0 + +0 is +0). A kernel whose chunk started from the
// first product, or that added the first chunk to a -0 output, would give -0.
TEST_F(DeviceTest, TheGemmChunkSumsStartFromPositiveZeroAtEveryTiling) {
  const int64_t m = 9, n = 7, k = 300;  // two chunks
  for (const rk::Op op : {rk::Op::kGemmXWt, rk::Op::kGemmDyW, rk::Op::kGemmDytX}) {
    const rk::OpSpec& spec = rk::Spec(op);
    const int64_t sizes[3] = {op == rk::Op::kGemmXWt ? m * k : m * n,
                              op == rk::Op::kGemmDytX ? m * k : n * k,
                              op == rk::Op::kGemmXWt   ? m * n
                              : op == rk::Op::kGemmDyW ? m * k
                                                       : n * k};
    for (const int accumulate : {0, 1}) {
      rk::OpValues in = spec.sample();
      in.args = {
          {"m", double(m)}, {"n", double(n)}, {"k", double(k)}, {"accumulate", double(accumulate)}};
      in.Put(spec.inputs[0].name, std::vector<float>(static_cast<size_t>(sizes[0]), -0.0f));
      in.Put(spec.inputs[1].name, std::vector<float>(static_cast<size_t>(sizes[1]), 1.5f));
      if (accumulate) {
        in.Put(spec.inputs[2].name, std::vector<float>(static_cast<size_t>(sizes[2]), -0.0f));
      } else {
        in.tensors.erase(std::string(spec.inputs[2].name));
      }
      const auto all_positive_zero = [&](rk::OpValues& out, const std::string& who) {
        const std::span<const float> y = out.F(spec.outputs[0].name);
        if (y.size() != static_cast<size_t>(sizes[2])) {
          return ::testing::AssertionFailure() << who << ": " << y.size() << " outputs";
        }
        for (size_t i = 0; i < y.size(); ++i) {
          if (std::bit_cast<uint32_t>(y[i]) != 0u) {
            return ::testing::AssertionFailure() << who << ": output " << i << " is " << y[i];
          }
        }
        return ::testing::AssertionSuccess();
      };
      rk::OpValues want = Reference(spec, in);
      ASSERT_TRUE(all_positive_zero(want, "the reference"))
          << spec.name << " accumulate " << accumulate;
      std::vector<device::GemmTiling> tilings = {{}, {8, 8, 1, 1, 8, 1}};
      for (const device::GemmTiling& t : device::GemmCandidates()) {
        if (dev_->Fits(t)) tilings.push_back(t);
      }
      for (const device::GemmTiling& t : tilings) {
        dev_->set_gemm_tiling(t);
        rk::OpValues got;
        dev_->Run(op, in, got);
        EXPECT_TRUE(all_positive_zero(got, "the device"))
            << spec.name << " accumulate " << accumulate << ", tiling " << t.Name();
      }
    }
  }
}

// Attention across key tiles (130 keys), with sliding windows inside a tile, across tiles and
// wider than the sequence, at group sizes 1, 2 and 4 and an odd head size; the cross-entropy with
// a vocabulary that is no multiple of 16 and without z-loss.
// The start-up measurement on a GPU: every candidate the device fits is timed, the device is left
// at the fastest, and a candidate that does not fit is refused by name when set.
TEST_F(DeviceTest, TheGemmTilingIsChosenByMeasurementAmongTheCandidatesThatFit) {
  const std::vector<device::GemmTiming> timings = device::TuneGemm(*dev_, 64, 1);
  ASSERT_FALSE(timings.empty());
  size_t fitting = 0;
  for (const device::GemmTiling& t : device::GemmCandidates()) fitting += dev_->Fits(t) ? 1 : 0;
  EXPECT_EQ(timings.size(), fitting);
  const auto fastest = std::ranges::min(timings, {}, &device::GemmTiming::seconds);
  EXPECT_EQ(dev_->gemm_tiling().Name(), fastest.tiling.Name());
  for (const device::GemmTiming& t : timings) EXPECT_GT(t.seconds, 0.0) << t.tiling.Name();
  const device::GemmTiling too_wide{4096, 4096, 1, 1, 16, 1};
  EXPECT_FALSE(dev_->Fits(too_wide));
  try {
    dev_->set_gemm_tiling(too_wide);
    ADD_FAILURE() << "a tiling the device cannot run was set";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4096x4096/1x1/16/db"), std::string::npos) << e.what();
  }
  dev_->set_gemm_tiling({});
}

// The row kernels' 16 lanes (rows.cl: whole blocks of 16 terms, then a tail without branches)
// at lengths below, at and around multiples of 16, with and without the gain; the cross-entropy's
// lanes at vocabularies as ragged.
TEST_F(DeviceTest, TheRowOpsGiveTheReferenceBitsAtEveryLengthAroundTheLanes) {
  const int64_t rows = 5;
  for (const int64_t cols : {1, 2, 15, 16, 17, 31, 32, 33, 47, 100}) {
    for (const bool gain : {false, true}) {
      rk::OpValues in;
      in.args = {{"rows", double(rows)}, {"cols", double(cols)}, {"eps", 1e-5f}};
      in.Put("x", rk::SelftestFloats(rows * cols, 70 + static_cast<uint32_t>(cols)));
      if (gain) in.Put("gain", rk::SelftestFloats(cols, 71, false));
      for (const rk::Op op : {rk::Op::kRowSum, rk::Op::kRmsNormFwd, rk::Op::kRmsNormBwd}) {
        const rk::OpSpec& spec = rk::Spec(op);
        rk::OpValues call = in;
        if (op == rk::Op::kRowSum) call.tensors.erase("gain");
        if (op == rk::Op::kRmsNormBwd) {
          call.tensors["rstd"] = Reference(rk::Spec(rk::Op::kRmsNormFwd), in).tensors.at("rstd");
          call.Put("dy", rk::SelftestFloats(rows * cols, 72));
        }
        rk::OpValues got;
        dev_->Run(op, call, got);
        EXPECT_TRUE(SameBits(spec, Reference(spec, call), got))
            << spec.name << " cols " << cols << (gain ? " with" : " without") << " gain";
      }
    }
  }
  for (const int64_t vocab : {1, 15, 16, 17, 33}) {
    rk::OpValues ce = rk::Spec(rk::Op::kCrossEntropyFwd).sample();
    const int64_t ce_rows = 7, d = static_cast<int64_t>(ce.args.at("d"));
    ce.args["rows"] = double(ce_rows);
    ce.args["vocab"] = double(vocab);
    ce.Put("h", rk::SelftestFloats(ce_rows * d, 73));
    ce.Put("w", rk::SelftestFloats(vocab * d, 74));
    ce.Put("targets", rk::SelftestIds(ce_rows, static_cast<uint32_t>(vocab), 75));
    const rk::OpSpec& spec = rk::Spec(rk::Op::kCrossEntropyFwd);
    rk::OpValues got;
    dev_->Run(spec.op, ce, got);
    EXPECT_TRUE(SameBits(spec, Reference(spec, ce), got)) << "vocab " << vocab;
  }
}

// The int8 ops across shapes: rows of every Hadamard block (64, 16, 4, 1) transposed or not;
// GEMMs with k across 0 and long sums of -127s (|acc| past 2^24, so float(acc) rounds); the
// quantizer on rows with the special values and the dequantizer on its output.
TEST_F(DeviceTest, TheInt8OpsGiveTheReferenceBitsAcrossShapes) {
  const auto check = [&](rk::Op op, const rk::OpValues& in, const std::string& what) {
    const rk::OpSpec& spec = rk::Spec(op);
    rk::OpValues got;
    dev_->Run(op, in, got);
    EXPECT_TRUE(SameBits(spec, Reference(spec, in), got)) << spec.name << " " << what;
  };
  for (const int64_t len : {1, 4, 37, 64, 80, 192}) {
    for (const int transpose : {0, 1}) {
      rk::OpValues in;
      in.args = {{"rows", double(transpose ? len : 3)},
                 {"cols", double(transpose ? 3 : len)},
                 {"transpose", double(transpose)}};
      in.Put("x", rk::SelftestFloats(3 * len, 80 + static_cast<uint32_t>(len)));
      check(rk::Op::kHadamardQuantizeRows, in, fmt::format("len {} transpose {}", len, transpose));
    }
  }
  for (const int64_t cols : {1, 5, 64, 300}) {
    rk::OpValues in;
    in.args = {{"rows", 7.0}, {"cols", double(cols)}};
    in.Put("x", rk::SelftestFloats(7 * cols, 90 + static_cast<uint32_t>(cols)));
    check(rk::Op::kQuantizeRows, in, fmt::format("cols {}", cols));
    rk::OpValues q = Reference(rk::Spec(rk::Op::kQuantizeRows), in);
    q.args = in.args;
    check(rk::Op::kDequantizeRows, q, fmt::format("cols {}", cols));
  }
  for (const int64_t k : {0, 1, 3, 257, 2048}) {
    const int64_t m = 5, n = 6;
    rk::OpValues in;
    in.args = {{"m", double(m)}, {"n", double(n)}, {"k", double(k)}};
    std::vector<int8_t> x(static_cast<size_t>(m * k), -127), w(static_cast<size_t>(n * k), -127);
    for (size_t i = 1; i < x.size(); i += 3) x[i] = static_cast<int8_t>(i % 255 - 127);
    for (size_t i = 2; i < w.size(); i += 5) w[i] = static_cast<int8_t>(i % 253 - 126);
    in.Put("x", std::move(x));
    in.Put("w", std::move(w));
    in.Put("sx", rk::SelftestFloats(m, 95, false));
    in.Put("sw", rk::SelftestFloats(n, 96, false));
    check(rk::Op::kGemmI8XWt, in, fmt::format("k {}", k));
  }
}

TEST_F(DeviceTest, AttentionRopeAndTheCrossEntropyGiveTheReferenceBitsAcrossShapes) {
  for (const auto& [q_heads, kv_heads, window] :
       {std::tuple{4, 4, 0}, {4, 2, 5}, {4, 1, 70}, {2, 1, 200}}) {
    const int64_t batch = 2, seq = 130, d = 11;
    const int64_t nq = batch * seq * q_heads * d, nkv = batch * seq * kv_heads * d;
    rk::OpValues fwd;
    fwd.args = {{"batch", double(batch)},       {"seq", double(seq)},
                {"q_heads", double(q_heads)},   {"kv_heads", double(kv_heads)},
                {"head_dim", double(d)},        {"window", double(window)},
                {"scale", 0.30151134f}};
    fwd.Put("q", rk::SelftestFloats(nq, 50, false));
    fwd.Put("k", rk::SelftestFloats(nkv, 51, false));
    fwd.Put("v", rk::SelftestFloats(nkv, 52));
    const rk::OpSpec& f = rk::Spec(rk::Op::kAttentionFwd);
    const rk::OpValues want = Reference(f, fwd);
    rk::OpValues got;
    dev_->Run(f.op, fwd, got);
    EXPECT_TRUE(SameBits(f, want, got)) << q_heads << "/" << kv_heads << " window " << window;
    rk::OpValues bwd = fwd;
    bwd.tensors["out"] = want.tensors.at("out");
    bwd.tensors["lse"] = want.tensors.at("lse");
    bwd.Put("dout", rk::SelftestFloats(nq, 53));
    const rk::OpSpec& b = rk::Spec(rk::Op::kAttentionBwd);
    rk::OpValues grads;
    dev_->Run(b.op, bwd, grads);
    EXPECT_TRUE(SameBits(b, Reference(b, bwd), grads))
        << q_heads << "/" << kv_heads << " window " << window;
    // Queries after cached keys (decoding): the last rows of each sequence against every key.
    for (const int64_t past : {1, 64, 129}) {
      rk::OpValues cached = fwd;
      cached.args["seq"] = double(seq - past);
      cached.args["past"] = double(past);
      cached.Put("q", rk::SelftestFloats(batch * (seq - past) * q_heads * d, 54, false));
      const rk::OpValues want_cached = Reference(f, cached);
      rk::OpValues got_cached;
      dev_->Run(f.op, cached, got_cached);
      EXPECT_TRUE(SameBits(f, want_cached, got_cached))
          << q_heads << "/" << kv_heads << " window " << window << " past " << past;
    }
  }
  for (const int64_t position : {0, 5, 60}) {
    rk::OpValues rope = rk::Spec(rk::Op::kRopeFwd).sample();
    rope.args["position"] = double(position);
    rope.args["table_seq"] = double(rope.Int("seq") + 60);
    const rk::OpSpec& spec = rk::Spec(rk::Op::kRopeFwd);
    rk::OpValues got;
    dev_->Run(spec.op, rope, got);
    EXPECT_TRUE(SameBits(spec, Reference(spec, rope), got)) << "rope from position " << position;
  }
  for (const float z_loss : {0.0f, 1e-4f}) {
    rk::OpValues ce = rk::Spec(rk::Op::kCrossEntropyBwd).sample();
    ce.args["vocab"] = 613;
    ce.args["z_loss"] = z_loss;
    ce.Put("w", rk::SelftestFloats(613 * 40, 60));
    ce.Put("dw", rk::SelftestFloats(613 * 40, 61));
    ce.Put("targets", rk::SelftestIds(23, 613, 62));
    rk::OpValues forward;
    for (const rk::Op op : {rk::Op::kCrossEntropyFwd, rk::Op::kCrossEntropyBwd}) {
      const rk::OpSpec& spec = rk::Spec(op);
      if (op == rk::Op::kCrossEntropyBwd) ce.tensors["lse"] = forward.tensors.at("lse");
      const rk::OpValues want = Reference(spec, ce);
      if (op == rk::Op::kCrossEntropyFwd) forward = want;
      rk::OpValues got;
      dev_->Run(op, ce, got);
      EXPECT_TRUE(SameBits(spec, want, got)) << spec.name << " z_loss " << z_loss;
    }
  }
}

// The device's exp and log against the library's (dmath, SLEEF's deterministic family) on the
// special values, every 65537th bit pattern (a stride through every exponent, both signs, NaN
// payloads and subnormals) and the inputs SwiGLU, attention and the cross-entropy meet most.
// scripts/dmath-exhaustive.sh runs all 2^32 (the disabled test below).
::testing::AssertionResult ExpAndLogMatch(device::Device& dev, const std::vector<float>& x) {
  std::vector<float> exp(x.size()), log(x.size());
  dev.ExpAndLog(x, exp, log);
  for (size_t i = 0; i < x.size(); ++i) {
    const float want_exp = dmath::Exp(x[i]), want_log = dmath::Log(x[i]);
    if (std::bit_cast<uint32_t>(exp[i]) != std::bit_cast<uint32_t>(want_exp) ||
        std::bit_cast<uint32_t>(log[i]) != std::bit_cast<uint32_t>(want_log)) {
      return ::testing::AssertionFailure()
             << "x = " << std::hexfloat << x[i] << " (bits " << std::hex
             << std::bit_cast<uint32_t>(x[i]) << "): exp " << exp[i] << " vs " << want_exp
             << ", log " << log[i] << " vs " << want_log;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST_F(DeviceTest, ExpAndLogGiveTheLibrarysBitsOnASample) {
  std::vector<float> x(rk::kSelftestSpecials.begin(), rk::kSelftestSpecials.end());
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 65537) {
    x.push_back(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  }
  for (const float v : rk::SelftestFloats(1 << 20, 9, false)) {
    x.push_back(v * 100.0f);  // exp's whole range, and log's of positive and negative inputs
    x.push_back(v * v);
  }
  EXPECT_TRUE(ExpAndLogMatch(*dev_, x));
}

TEST_F(DeviceTest, DISABLED_ExpAndLogGiveTheLibrarysBitsOnEveryFloat) {
  constexpr uint64_t kPiece = uint64_t{1} << 24;
  std::vector<float> x(kPiece);
  for (uint64_t first = 0; first < (uint64_t{1} << 32); first += kPiece) {
    for (uint64_t i = 0; i < kPiece; ++i) x[i] = std::bit_cast<float>(static_cast<uint32_t>(first + i));
    ASSERT_TRUE(ExpAndLogMatch(*dev_, x)) << "in bit patterns from " << first;
  }
}

TEST_F(DeviceTest, BadInputIsRefusedBeforeAnythingRuns) {
  const rk::OpSpec& embedding = rk::Spec(rk::Op::kEmbeddingFwd);
  rk::OpValues in = embedding.sample();
  in.tensors["ids"].As<uint32_t>()[3] = 50;  // vocab = 50
  rk::OpValues out;
  try {
    dev_->Run(embedding.op, in, out);
    ADD_FAILURE() << "an id out of range ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ids[3] = 50 is out of range (vocab = 50)"),
              std::string::npos)
        << e.what();
  }
  rk::OpValues gemm = rk::Spec(rk::Op::kGemmXWt).sample();
  gemm.tensors["x"].As<float>().pop_back();
  EXPECT_THROW(dev_->Run(rk::Op::kGemmXWt, gemm, out), Error);
  EXPECT_THROW(dev_->set_gemm_tiling({32, 32, 3, 2, 16}), Error);  // 32 is not a multiple of 3
  EXPECT_THROW(dev_->set_gemm_tiling({32, 32, 2, 2, 24}), Error);  // 24 does not divide 256
  for (const rk::OpSpec& spec : rk::OpTable()) {
    if (!dev_->Implements(spec.op)) {
      EXPECT_THROW(dev_->Run(spec.op, spec.sample(), out), Error);
    }
  }
}

TEST(DeviceRules, EverySourceDisablesContractionAndUsesNoForbiddenBuiltIn) {
  ASSERT_FALSE(device::KernelSources().empty());
  // Built-in transcendentals and their relaxed forms, mad, atomics: never (docs/devices.md).
  const std::regex forbidden(
      R"(\b(exp|exp2|exp10|expm1|log|log2|log10|log1p|pow|pown|powr|rootn|sin|cos|tan|sinh|cosh|)"
      R"(tanh|erf|erfc|tgamma|lgamma|mad|native_\w+|half_\w+|atomic_\w+|atom_\w+)\s*\()");
  // A floating-point literal without its f suffix is a double.
  const std::regex double_literal(R"(\b\d+\.\d*([eE][-+]?\d+)?(?![fF\d]))");
  for (const device::KernelSource& source : device::KernelSources()) {
    const std::string text(source.text);
    EXPECT_TRUE(text.starts_with("#pragma OPENCL FP_CONTRACT OFF\n")) << source.name;
    std::string code;  // the source without its comments
    for (size_t at = 0; at < text.size();) {
      const size_t comment = text.find("//", at);
      code += text.substr(at, comment - at);
      if (comment == std::string::npos) break;
      at = text.find('\n', comment);
    }
    std::smatch match;
    EXPECT_FALSE(std::regex_search(code, match, forbidden)) << source.name << ": " << match.str();
    EXPECT_FALSE(std::regex_search(code, match, double_literal))
        << source.name << ": " << match.str();
  }
}

TEST(DeviceRules, TheBuildOptionsAreTheContractsAndNoForbiddenOne) {
  const std::string options(device::BuildOptions());
  EXPECT_NE(options.find("-cl-fp32-correctly-rounded-divide-sqrt"), std::string::npos);
  for (const std::string_view bad : device::ForbiddenBuildOptions()) {
    EXPECT_EQ(options.find(bad), std::string::npos) << bad;
  }
}

TEST(DeviceRules, OpenClErrorsAreNamedAsClHNamesThem) {
  EXPECT_EQ(device::OpenClErrorName(-4), "CL_MEM_OBJECT_ALLOCATION_FAILURE");
  EXPECT_EQ(device::OpenClErrorName(-5), "CL_OUT_OF_RESOURCES");
  EXPECT_EQ(device::OpenClErrorName(-6), "CL_OUT_OF_HOST_MEMORY");
  EXPECT_EQ(device::OpenClErrorName(-11), "CL_BUILD_PROGRAM_FAILURE");
  EXPECT_EQ(device::OpenClErrorName(-54), "CL_INVALID_WORK_GROUP_SIZE");
  EXPECT_EQ(device::OpenClErrorName(-72), "CL_MAX_SIZE_RESTRICTION_EXCEEDED");
  EXPECT_EQ(device::OpenClErrorName(-1001), "CL_PLATFORM_NOT_FOUND_KHR");
  EXPECT_EQ(device::OpenClErrorName(-20), "-20");  // between the runtime's and the API's codes
  EXPECT_EQ(device::OpenClErrorName(-9999), "-9999");
}

// A tensor larger than the device allocates at once (the logits of a cross-entropy whose inputs
// are small), given to the device directly, past the executor's plan: the error names the device,
// the code and what to change.
TEST_F(DeviceTest, ABufferTheDeviceCannotAllocateIsRefusedNamingTheDevice) {
  const auto side = static_cast<int64_t>(std::sqrt(double(dev_->info().max_allocation) / 4)) + 2;
  rk::OpValues ce = rk::Spec(rk::Op::kCrossEntropyFwd).sample();
  ce.args["rows"] = double(side);
  ce.args["vocab"] = double(side);
  ce.args["d"] = 1;
  ce.Put("h", rk::SelftestFloats(side, 70));
  ce.Put("w", rk::SelftestFloats(side, 71));
  ce.Put("targets", rk::SelftestIds(side, static_cast<uint32_t>(side), 72));
  rk::OpValues out;
  test::ExpectError([&] { dev_->Run(rk::Op::kCrossEntropyFwd, ce, out); },
                    {"--device opencl:0:0 (" + dev_->info().name + ")",
                     "CL_INVALID_BUFFER_SIZE (-61) in clCreateBuffer of " +
                         std::to_string(side * side * 4) + " bytes",
                     "CL_DEVICE_MAX_MEM_ALLOC_SIZE", "--device cpu"});
}

TEST(DeviceRules, ADeviceIsJudgedByItsSinglePrecisionConfig) {
  device::DeviceInfo info;
  EXPECT_EQ(info.Missing(), "CL_FP_DENORM, CL_FP_FMA, CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT");
  info.denorm = info.fma = true;
  EXPECT_EQ(info.Missing(), "CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT");
  info.correctly_rounded_divide_sqrt = true;
  EXPECT_EQ(info.Missing(), "");
  EXPECT_FALSE(device::ParseDeviceFlag("cpu").has_value());
  EXPECT_EQ(device::ParseDeviceFlag("opencl:1:2")->device, 2);
  EXPECT_EQ(device::ParseDeviceFlag("opencl:1:2")->Flag(), "opencl:1:2");
  EXPECT_EQ(device::ParseDeviceFlag("opencl")->Flag(), "opencl:0:0");
  EXPECT_EQ(device::ParseDeviceFlag("cuda")->Flag(), "cuda:0");
  EXPECT_EQ(device::ParseDeviceFlag("cuda:3")->runtime, device::DeviceChoice::Runtime::kCuda);
  EXPECT_EQ(device::ParseDeviceFlag("cuda:3")->device, 3);
  for (const char* bad : {"gpu", "opencl:1", "opencl:-1:0", "opencl:a:b", "opencl:1:2:3",
                          "cuda:", "cuda:-1", "cuda:0:0", "cuda:x", "CUDA", "cuda0", "cuda:01",
                          "opencl:00:0", "opencl:0:+1", "cuda: 1", "cuda:2147483648"}) {
    EXPECT_THROW(device::ParseDeviceFlag(bad), Error) << bad;
  }
}

// Kept regions: an op's outputs there stay on the device (the host's bytes untouched, nothing
// copied back) until ToHost; HostWrites drops the copies so that the host's new bytes are what
// the next op reads; a tensor overlapping a kept copy in part brings the copy back first; and an
// op that writes in place under another role's name (RoPE's x and y) reads its input whatever
// the order in which the call binds them.
TEST_F(DeviceTest, KeptCopiesStayOnTheDeviceUntilTheHostAsks) {
  const size_t n = 1000;
  std::vector<float> region = rk::SelftestFloats(3 * n, 11, /*specials=*/false);
  const std::span<float> x(region.data(), n), y(region.data() + n, n);
  const std::vector<float> x0(x.begin(), x.end()), y0(y.begin(), y.end());
  const auto add_into = [&](std::span<float> into) {
    const OpArg args[] = {{"n", double(into.size())}};
    const OpTensor in[] = {{"x", x}, {"y", into}};
    const OpOutput out[] = {{"y", into}};
    EXPECT_TRUE(dev_->Run(rk::Op::kAddInto, args, in, out));
  };
  const auto scale = [&](std::span<float> v, float factor) {
    const OpArg args[] = {{"factor", factor}};
    const OpTensor in[] = {{"x", v}};
    const OpOutput out[] = {{"x", v}};
    EXPECT_TRUE(dev_->Run(rk::Op::kScale, args, in, out));
  };
  dev_->Keep(region);
  const OpExecutor::Traffic t0 = dev_->traffic();
  add_into(y);
  scale(y, 2.0f);
  EXPECT_EQ(dev_->traffic().to_device - t0.to_device, 2 * n * sizeof(float));  // x and y, once
  EXPECT_EQ(dev_->traffic().to_host, t0.to_host) << "an output in a kept region was copied back";
  EXPECT_TRUE(std::ranges::equal(y, y0)) << "the host's bytes changed before ToHost";
  EXPECT_EQ(dev_->traffic().kept, 2 * n * sizeof(float));

  std::vector<float> want = y0;
  rk::AddInto(x0, want);
  rk::Scale(want, 2.0f);
  dev_->ToHost(region);
  EXPECT_EQ(dev_->traffic().to_host - t0.to_host, n * sizeof(float));  // y only: x is unchanged
  EXPECT_TRUE(std::ranges::equal(y, want));
  dev_->ToHost(y);
  EXPECT_EQ(dev_->traffic().to_host - t0.to_host, n * sizeof(float)) << "a current copy read again";

  // The host writes y; the next op reads the host's bytes.
  dev_->HostWrites(y);
  std::ranges::fill(y, 1.0f);
  scale(y, 3.0f);
  dev_->ToHost(y);
  EXPECT_TRUE(std::ranges::all_of(y, [](float v) { return v == 3.0f; }));

  // Half of y, on the device only, then the other half through a piece that overlaps it.
  scale(y.first(n / 2), 5.0f);
  scale(y, 7.0f);
  dev_->ToHost(region);
  EXPECT_TRUE(std::ranges::all_of(y.first(n / 2), [](float v) { return v == 105.0f; }));
  EXPECT_TRUE(std::ranges::all_of(y.last(n / 2), [](float v) { return v == 21.0f; }));

  // RoPE in place: y is both its input x and its output y.
  const rk::OpSpec& rope = rk::Spec(rk::Op::kRopeFwd);
  const rk::OpValues args = [] {
    rk::OpValues v;
    v.args = {{"batch", 1}, {"seq", 5}, {"heads", 2}, {"head_dim", 100}, {"table_seq", 8},
              {"theta", 10000}};
    return v;
  }();
  rk::OpValues in = args, expected;
  in.Put("x", std::vector<float>(x.begin(), x.end()));
  expected = Reference(rope, in);
  std::vector<OpArg> rope_args;
  for (const auto& [name, value] : args.args) rope_args.push_back({name, value});
  const OpTensor rope_in[] = {{"x", x}};
  const OpOutput rope_out[] = {{"y", x}};
  EXPECT_TRUE(dev_->Run(rope.op, rope_args, rope_in, rope_out));
  dev_->ToHost(x);
  EXPECT_TRUE(std::ranges::equal(x, expected.F("y"), [](float a, float b) {
    return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
  }));

  dev_->Forget(region);
  EXPECT_EQ(dev_->traffic().kept, 0u);
}

// What the pragma guards against, shown: RMSNorm's `ss * inv_d + eps` is a multiply then an add
// in the contract. Without the pragma the compiler may fuse it, as the OpenCL C specification
// allows and PoCL does, and some row's bits move. (PoCL keeps the bits under -cl-mad-enable
// while the pragma is there; a vendor's compiler need not, so that option is never passed.)
TEST_F(DeviceTest, WithoutThePragmaTheBitsMove) {
  const rk::OpSpec& spec = rk::Spec(rk::Op::kRmsNormFwd);
  rk::OpValues in;
  in.args = {{"rows", 4096}, {"cols", 67}, {"eps", 1e-5f}};
  in.Put("x", rk::SelftestFloats(4096 * 67, 3, /*specials=*/false));
  const rk::OpValues want = Reference(spec, in);
  rk::OpValues got;
  dev_->Run(spec.op, in, got);
  EXPECT_TRUE(SameBits(spec, want, got));
  const std::unique_ptr<device::Device> mutant =
      device::OpenMutated({}, {.drop_fp_contract_pragma = true});
  rk::OpValues moved;
  mutant->Run(spec.op, in, moved);
  EXPECT_FALSE(SameBits(spec, want, moved)) << "without the pragma every bit stayed in place";
}

}  // namespace
}  // namespace lockstep
