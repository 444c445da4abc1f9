// The typed op calls (lockstep/op_calls.h): the records they make from the op table, with the
// optional arguments and roles present exactly where a call gives them, and the same results
// observed or not.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/op_calls.h"

namespace lockstep {
namespace {

// What a trace keeps of a record: op, layer, arguments by name, roles in order with dtype and
// size.
class Records final : public OpObserver {
 public:
  void Context(uint64_t, int64_t) override {}
  void Begin(std::string_view op, int64_t layer, std::span<const OpArg> args,
             std::span<const OpTensor> inputs) override {
    std::map<std::string_view, double> by_name;
    for (const OpArg& a : args) by_name[a.name] = a.value;
    std::string r = fmt::format("{} {}", op, layer);
    for (const auto& [name, value] : by_name) r += fmt::format(" {}={}", name, value);
    r += " |";
    for (const OpTensor& t : inputs) {
      r += fmt::format(" {}:{}[{}]", t.role, DtypeName(t.view.dtype()), t.view.elements());
    }
    records.push_back(r + " |");
  }
  void End(std::span<const OpOutput> outputs) override {
    for (const OpOutput& t : outputs) {
      records.back() +=
          fmt::format(" {}:{}[{}]", t.role, DtypeName(t.view.dtype()), t.view.elements());
    }
  }
  std::vector<std::string> records;
};

// ObservedOp with the record written out at the call, as the trainer's calls were spelled.
template <typename Kernel>
void WrittenOp(const OpHooks& hooks, rk::Op op, int64_t layer, std::initializer_list<OpArg> args,
               std::initializer_list<OpTensor> inputs, std::initializer_list<OpOutput> outputs,
               Kernel&& kernel) {
  ObservedOp(hooks, op, layer, std::span<const OpArg>(args.begin(), args.size()),
             std::span<const OpTensor>(inputs.begin(), inputs.size()),
             std::span<const OpOutput>(outputs.begin(), outputs.size()),
             std::forward<Kernel>(kernel));
}

TEST(OpCalls, OptionalArgumentsAndRolesAreRecordedWhereGiven) {
  Records seen;
  const OpHooks hooks{.observer = &seen};
  std::vector<float> x(8, 0.5f), gain(4, 1.0f), y(8), rstd(2), w(16, 0.25f);
  ops::RmsNormFwd(hooks, 3, x, gain, 1e-5f, y, rstd, 2, 4);
  ops::RmsNormFwd(hooks, 3, x, {}, 1e-5f, y, rstd, 2, 4);
  ops::GemmXWt(hooks, 0, x, w, y, 2, 4, 4);
  ops::GemmDyW(hooks, 0, x, w, y, 2, 4, 4, /*accumulate=*/true);
  ops::AddInto(hooks, -1, x, y);
  ops::AddInto(hooks, -1, x, y, /*tensor=*/7);
  const rk::RopeTable table = rk::MakeRopeTable(4, 4, 10000.0f);
  ops::RopeFwd(hooks, 1, table, 10000.0f, x, y, 1, 2, 1, 4);
  ops::RopeFwd(hooks, 1, table, 10000.0f, x, y, 1, 2, 1, 4, /*position=*/0);
  const float eps = 1e-5f;
  const std::vector<std::string> expected = {
      fmt::format("rmsnorm_fwd 3 cols=4 eps={} rows=2 | x:f32[8] gain:f32[4] | y:f32[8] "
                  "rstd:f32[2]",
                  double(eps)),
      fmt::format("rmsnorm_fwd 3 cols=4 eps={} rows=2 | x:f32[8] | y:f32[8] rstd:f32[2]",
                  double(eps)),
      "gemm_xwt 0 accumulate=0 k=4 m=2 n=4 | x:f32[8] w:f32[16] | y:f32[8]",
      "gemm_dyw 0 accumulate=1 k=4 m=2 n=4 | dy:f32[8] w:f32[16] dx:f32[8] | dx:f32[8]",
      "add_into -1 n=8 | x:f32[8] y:f32[8] | y:f32[8]",
      "add_into -1 n=8 tensor=7 | x:f32[8] y:f32[8] | y:f32[8]",
      "rope_fwd 1 batch=1 head_dim=4 heads=1 seq=2 table_seq=4 theta=10000 | x:f32[8] | y:f32[8]",
      "rope_fwd 1 batch=1 head_dim=4 heads=1 position=0 seq=2 table_seq=4 theta=10000 | x:f32[8] "
      "| y:f32[8]",
  };
  EXPECT_EQ(seen.records, expected);
}

// The optimizer's calls make the records written out by hand below (docs/disputes.md,
// "Records"), and compute the same.
TEST(OpCalls, TheOptimizersCallsRecordTheTrainersRecords) {
  Records typed, written;
  std::vector<float> grad = rk::SelftestFloats(70000, 1), param = rk::SelftestFloats(70000, 2);
  std::vector<float> m = rk::SelftestFloats(70000, 3), v(70000, 0.5f);
  grad[3] = std::nanf("");
  std::vector<float> grad2 = grad, param2 = param, m2 = m, v2 = v;
  const rk::AdamWParams adam{.lr = 1e-3f, .weight_decay = 0.1f, .step = 4};

  const std::vector<double> sums = ops::BlockSquares({.observer = &typed}, -1, 5, 0, grad);
  ops::CanonicalizeNaNs({.observer = &typed}, -1, 5, grad);
  const std::vector<int64_t> blocks = {2};
  const float norm = ops::GlobalNorm({.observer = &typed}, -1, sums, blocks);
  ops::Scale({.observer = &typed}, -1, 5, 0.5f, grad);
  ops::AdamW({.observer = &typed}, -1, 5, adam, param, grad, m, v);

  const OpHooks hooks{.observer = &written};
  std::vector<double> sums2(2);
  WrittenOp(hooks, rk::Op::kBlockSquares, -1, {{"tensor", 5}, {"begin", 0}}, {{"x", grad2}},
            {{"sums", sums2}}, [&] { std::ranges::copy(rk::BlockSquares(grad2), sums2.begin()); });
  WrittenOp(hooks, rk::Op::kCanonicalizeNaNs, -1, {{"tensor", 5}}, {{"x", grad2}}, {{"x", grad2}},
            [&] { rk::CanonicalizeNaNs(grad2); });
  const std::vector<double> block_counts = {2};
  float norm2 = 0;
  WrittenOp(hooks, rk::Op::kGlobalNorm, -1, {{"tensors", 1}},
            {{"sums", sums2}, {"blocks", block_counts}}, {{"norm", std::span(&norm2, 1)}},
            [&] { norm2 = rk::NormOfBlockSums(sums2, blocks); });
  WrittenOp(hooks, rk::Op::kScale, -1, {{"tensor", 5}, {"factor", 0.5f}}, {{"x", grad2}},
            {{"x", grad2}}, [&] { rk::Scale(grad2, 0.5f); });
  WrittenOp(hooks, rk::Op::kAdamW, -1,
            {{"tensor", 5},
             {"lr", adam.lr},
             {"beta1", adam.beta1},
             {"beta2", adam.beta2},
             {"eps", adam.eps},
             {"weight_decay", adam.weight_decay},
             {"step", 4}},
            {{"param", param2}, {"grad", grad2}, {"m", m2}, {"v", v2}},
            {{"param", param2}, {"m", m2}, {"v", v2}},
            [&] { rk::AdamWUpdate(adam, param2, grad2, m2, v2); });

  EXPECT_EQ(typed.records, written.records);
  EXPECT_EQ(std::isnan(sums[0]), std::isnan(sums2[0]));
  EXPECT_EQ(sums[1], sums2[1]);
  EXPECT_EQ(std::bit_cast<uint32_t>(norm), std::bit_cast<uint32_t>(norm2));
  EXPECT_EQ(0, std::memcmp(grad.data(), grad2.data(), grad.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(param.data(), param2.data(), param.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(m.data(), m2.data(), m.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(v.data(), v2.data(), v.size() * sizeof(float)));
}

}  // namespace
}  // namespace lockstep
