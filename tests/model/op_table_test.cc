// The op table (rk::OpTable) is the one description of a step's ops: docs/disputes.md's
// catalogue must say what it says, every entry's sample call fits its own entry and runs, and a
// call that does not fit its entry is refused as an internal error.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/kernels.h"
#include "lockstep/model.h"

namespace lockstep {
namespace {

// The catalogue's rendering of a role list: "x, w[, y]", a non-f32 dtype after the role.
std::string Roles(const std::vector<rk::OpRole>& roles) {
  std::string s;
  for (const rk::OpRole& r : roles) {
    const std::string name =
        std::string(r.name) +
        (r.dtype == rk::Dtype::kF32 ? "" : " (" + std::string(rk::DtypeName(r.dtype)) + ")");
    if (r.optional) {
      s += "[" + std::string(s.empty() ? "" : ", ") + name + "]";
    } else {
      s += (s.empty() ? "" : ", ") + name;
    }
  }
  return s;
}

std::string Args(const rk::OpSpec& spec) {
  std::string s;
  for (std::string_view a : spec.args) s += (s.empty() ? "" : ", ") + std::string(a);
  for (std::string_view a : spec.optional_args) s += "[, " + std::string(a) + "]";
  return s;
}

// The catalogue's rows: "| `op` | args | inputs → outputs | `Kernel` ... |", split on " | ".
std::vector<std::vector<std::string>> CatalogueRows() {
  std::ifstream in(std::filesystem::path(LOCKSTEP_SOURCE_DIR) / "docs/disputes.md");
  std::vector<std::vector<std::string>> rows;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("## ")) inside = line == "## The op catalogue";
    if (!inside || !line.starts_with("| `")) continue;
    std::vector<std::string> cells;
    for (size_t at = 2; at < line.size();) {
      const size_t end = line.find(" | ", at);
      cells.push_back(line.substr(at, end == std::string::npos ? std::string::npos : end - at));
      if (end == std::string::npos) break;
      at = end + 3;
    }
    rows.push_back(std::move(cells));
  }
  return rows;
}

TEST(OpTable, TheDocsCatalogueIsTheTable) {
  const std::vector<std::vector<std::string>> rows = CatalogueRows();
  const std::span<const rk::OpSpec> table = rk::OpTable();
  ASSERT_EQ(rows.size(), table.size()) << "docs/disputes.md lists another number of ops";
  for (size_t i = 0; i < table.size(); ++i) {
    const rk::OpSpec& spec = table[i];
    ASSERT_GE(rows[i].size(), 4u) << "catalogue row " << i;
    EXPECT_EQ(rows[i][0], "`" + std::string(spec.name) + "`") << "row " << i;
    EXPECT_EQ(rows[i][1], Args(spec)) << spec.name;
    EXPECT_EQ(rows[i][2], Roles(spec.inputs) + " → " + Roles(spec.outputs)) << spec.name;
    EXPECT_TRUE(rows[i][3].starts_with("`" + std::string(spec.kernel) + "`"))
        << spec.name << ": " << rows[i][3];
  }
}

TEST(OpTable, EverySampleFitsItsEntryAndRunsToEveryOutput) {
  for (const rk::OpSpec& spec : rk::OpTable()) {
    EXPECT_EQ(rk::FindOp(spec.name), &spec);
    EXPECT_EQ(&rk::Spec(spec.op), &spec);
    const rk::OpValues in = spec.sample();
    std::vector<std::string_view> args;
    for (const auto& [name, value] : in.args) args.push_back(name);
    std::vector<rk::RoleAndDtype> inputs, outputs;
    for (const rk::OpRole& role : spec.inputs) {
      const auto it = in.tensors.find(role.name);
      if (it != in.tensors.end()) inputs.emplace_back(role.name, it->second.dtype());
    }
    rk::OpValues out;
    spec.run(in, out);
    for (const rk::OpRole& role : spec.outputs) {
      const auto it = out.tensors.find(role.name);
      if (it != out.tensors.end()) outputs.emplace_back(role.name, it->second.dtype());
    }
    EXPECT_TRUE(rk::CallFits(spec, args, inputs, outputs)) << spec.name;
    EXPECT_EQ(in.tensors.size(), inputs.size())
        << spec.name << ": the sample has a tensor its entry does not list";
  }
  EXPECT_EQ(rk::FindOp("no_such_op"), nullptr);
}

// The referee runs ops on arguments read from a file: shapes whose products pass 2^63 (which
// wrapped to a small count, or to 0, and passed the size checks) and outputs larger than the
// record's are refused by name before anything of their size is allocated or touched.
TEST(OpTable, ArgumentsForgedToOverflowOrToAllocateAreRefused) {
  const auto refused = [](rk::Op op, std::map<std::string, double, std::less<>> args, int64_t limit,
                          const std::string& words) {
    rk::OpValues in = rk::Spec(op).sample();
    for (const auto& [name, value] : args) in.args[name] = value;
    in.allocation_limit = limit;
    rk::OpValues out;
    try {
      rk::Spec(op).run(in, out);
      ADD_FAILURE() << rk::Spec(op).name << ": ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  const double big = 4294967296.0;  // 2^32: any two of them make 2^64, which wraps to 0
  refused(rk::Op::kRopeFwd, {{"batch", 1125899906842624.0}, {"heads", 1048576.0}}, INT64_MAX,
          "batch*seq*heads*head_dim is past 2^63 elements");
  refused(rk::Op::kGemmXWt, {{"m", big}, {"n", big}, {"k", big}}, INT64_MAX, "past 2^63");
  refused(rk::Op::kRowSum, {{"rows", 2048.0}, {"cols", 9007199254740992.0}}, INT64_MAX,
          "rows * cols is past 2^63");  // 2^11 * 2^53 wrapped to 0
  // Arguments that contradict the inputs are refused as such before any output is allocated:
  // 2^40 elements asked of a quantizer given 3341.
  refused(rk::Op::kQuantizeRows, {{"rows", 1048576.0}, {"cols", 1048576.0}}, INT64_MAX,
          "input 'x' has 3341 elements, the arguments give rows * cols = 1099511627776");
  refused(rk::Op::kRowSum, {{"rows", 268435456.0}, {"cols", 0}}, 7,
          "input 'x' has 9009 elements, the arguments give rows * cols = 0");
  refused(rk::Op::kRoundToBf16, {{"n", -7}}, INT64_MAX, "op table: n has a negative factor (-7)");
  refused(rk::Op::kFromBf16, {{"n", 1000000}}, INT64_MAX,
          "input 'x' has 4099 elements, the arguments give n = 1000000");
  refused(rk::Op::kCopy, {{"n", 1}}, INT64_MAX, "input 'x' has 1003 elements");
  // No contradiction, but an output of 200 · 1850 elements for a record that commits to 7.
  refused(rk::Op::kEmbeddingFwd, {{"vocab", 1}, {"d", 1850}}, 7,
          "an output of 370000 elements, more than the 7");
}

// The int8 GEMM's operands are the quantizers' ([-127, 127]) and k at most kInt8MaxK, so that
// its int32 sums are exact: -128, which could carry a sum past int32, and a longer k are refused
// (the referee recomputes it from recorded values).
TEST(OpTable, Int8OperandsOutsideTheQuantizersRangeAreRefused) {
  const auto run = [](rk::OpValues in) {
    rk::OpValues out;
    rk::Spec(rk::Op::kGemmI8XWt).run(in, out);
  };
  for (const char* role : {"x", "w"}) {
    rk::OpValues in = rk::Spec(rk::Op::kGemmI8XWt).sample();
    in.tensors[role].As<int8_t>()[600] = -128;
    try {
      run(in);
      ADD_FAILURE() << role << ": ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("input '{}' element 600 is -128", role)),
                std::string::npos)
          << e.what();
    }
  }
  rk::OpValues in = rk::Spec(rk::Op::kGemmI8XWt).sample();
  in.args["m"] = 1;
  in.args["n"] = 1;
  in.args["k"] = static_cast<double>(rk::kInt8MaxK + 1);
  in.Put("x", std::vector<int8_t>(rk::kInt8MaxK + 1, 127));
  in.Put("w", std::vector<int8_t>(rk::kInt8MaxK + 1, 127));
  in.Put("sx", std::vector<float>{1.0f});
  in.Put("sw", std::vector<float>{1.0f});
  try {
    run(in);
    ADD_FAILURE() << "k past kInt8MaxK ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k = 133145"), std::string::npos) << e.what();
  }
  in.args["k"] = static_cast<double>(rk::kInt8MaxK);  // the bound itself: exact, runs
  in.Put("x", std::vector<int8_t>(rk::kInt8MaxK, 127));
  in.Put("w", std::vector<int8_t>(rk::kInt8MaxK, 127));
  EXPECT_NO_THROW(run(in));
}

// rk::OutputWords compares two runs as the contract does: a NaN's sign and payload do not count
// but in the ops that fix them (AdamW's NaNs are state), in every floating-point dtype; any other
// bit does.
TEST(OpTable, OutputWordsCompareNaNsAsTheContractDoes) {
  const auto bits = [](rk::Op op, const rk::OpValues& v) {
    std::vector<uint32_t> out;
    for (const float w : rk::OutputWords(rk::Spec(op), v))
      out.push_back(std::bit_cast<uint32_t>(w));
    return out;
  };
  const float nan_a = std::bit_cast<float>(0xffc00000u), nan_b = std::bit_cast<float>(0x7fc00001u);
  rk::OpValues a, b, c;
  a.Put("x", std::vector<float>{1.0f, nan_a});
  b.Put("x", std::vector<float>{1.0f, nan_b});
  c.Put("x", std::vector<float>{std::nextafter(1.0f, 2.0f), nan_a});
  EXPECT_EQ(bits(rk::Op::kScale, a), bits(rk::Op::kScale, b));
  EXPECT_NE(bits(rk::Op::kScale, a), bits(rk::Op::kScale, c));
  rk::OpValues pa, pb;
  for (rk::OpValues* v : {&pa, &pb}) {
    v->Put("m", std::vector<float>{0.0f});
    v->Put("v", std::vector<float>{0.0f});
  }
  pa.Put("param", std::vector<float>{nan_a});
  pb.Put("param", std::vector<float>{nan_b});
  EXPECT_NE(bits(rk::Op::kAdamW, pa), bits(rk::Op::kAdamW, pb));
  rk::OpValues da, db;
  da.Put("sums", std::vector<double>{2.0, std::bit_cast<double>(0xfff8000000000000u)});
  db.Put("sums", std::vector<double>{2.0, std::bit_cast<double>(0x7ff0000000000001u)});
  EXPECT_EQ(bits(rk::Op::kBlockSquares, da), bits(rk::Op::kBlockSquares, db));
  EXPECT_EQ(bits(rk::Op::kBlockSquares, da).size(), 4u);  // two f64 values, four words
  // A role the run did not write is left out.
  EXPECT_TRUE(bits(rk::Op::kScale, rk::OpValues()).empty());
}

TEST(OpTable, ACallThatDoesNotFitItsEntryIsAnInternalError) {
  const rk::OpSpec& add = rk::Spec(rk::Op::kAddInto);
  std::vector<float> x(4), y(4);
  const OpArg n{"n", 4};
  const OpTensor inputs[] = {{"x", x}, {"y", y}};
  const OpOutput outputs[] = {{"y", y}};
  EXPECT_NO_THROW(CheckOpCall(add, {&n, 1}, inputs, outputs));
  const OpArg unknown{"count", 4};
  EXPECT_THROW(CheckOpCall(add, {&unknown, 1}, inputs, outputs), Error);  // another argument
  EXPECT_THROW(CheckOpCall(add, {}, inputs, outputs), Error);             // a missing one
  const OpTensor swapped[] = {{"y", y}, {"x", x}};
  EXPECT_THROW(CheckOpCall(add, {&n, 1}, swapped, outputs), Error);  // roles out of order
  const std::vector<uint32_t> ids(4);
  const OpTensor ids_as_x[] = {{"x", ids}, {"y", y}};
  EXPECT_THROW(CheckOpCall(add, {&n, 1}, ids_as_x, outputs), Error);  // another dtype
  // An optional role may be left out, or given.
  const rk::OpSpec& gemm = rk::Spec(rk::Op::kGemmXWt);
  const OpArg gemm_args[] = {{"m", 2}, {"n", 2}, {"k", 2}, {"accumulate", 0}};
  const OpTensor plain[] = {{"x", x}, {"w", x}};
  const OpTensor onto[] = {{"x", x}, {"w", x}, {"y", y}};
  EXPECT_NO_THROW(CheckOpCall(gemm, gemm_args, plain, outputs));
  EXPECT_NO_THROW(CheckOpCall(gemm, gemm_args, onto, outputs));
}

}  // namespace
}  // namespace lockstep
