// The op table (include/lockstep/kernels.h): every op a step records, with its kernel run from
// recorded values and a sample call for the selftest.
#include <algorithm>
#include <cmath>
#include <iterator>

#include "kernels/internal.h"
#include "lockstep/kernels.h"

namespace lockstep::rk {
namespace {

using Floats = std::vector<float>;

// The elements of an output or table of `in`'s run, the product of `factors`, checked: the args
// may come from a file.
int64_t Allocation(const OpValues& in, std::initializer_list<int64_t> factors) {
  const int64_t n = detail::Elements("op table", "an output", factors);
  if (n > in.allocation_limit) {
    Fail(
        "op table: the arguments ask for an output of {} elements, more than the {} of the "
        "largest output the record commits to",
        n, in.allocation_limit);
  }
  return n;
}
Floats Zeros(const OpValues& in, std::initializer_list<int64_t> factors) {
  return Floats(static_cast<size_t>(Allocation(in, factors)), 0.0f);
}

AttentionShape AttentionOf(const OpValues& v) {
  return {v.Int("batch"),    v.Int("seq"),    v.Int("q_heads"), v.Int("kv_heads"),
          v.Int("head_dim"), v.Int("window"), v.Float("scale"), v.IntOr("past", 0)};
}
CrossEntropyShape CrossEntropyOf(const OpValues& v) {
  return {v.Int("rows"), v.Int("d"), v.Int("vocab"), v.Int("vocab_chunk"), v.Float("z_loss")};
}
std::span<const float> Optional(const OpValues& v, std::string_view role) {
  return v.Has(role) ? std::span<const float>(v.F(role)) : std::span<const float>();
}
RopeTable RopeOf(const OpValues& v) {
  Allocation(v, {v.Int("table_seq"), v.Int("head_dim")});
  return MakeRopeTable(v.Int("table_seq"), v.Int("head_dim"), v.Float("theta"));
}

// ---- run: each op from its recorded args and inputs --------------------------------------------

void RunEmbeddingFwd(const OpValues& in, OpValues& out) {
  Floats& o = out.f32["out"] = Zeros(in, {static_cast<int64_t>(in.U("ids").size()), in.Int("d")});
  EmbeddingForward(in.F("table"), in.U("ids"), o, in.Int("vocab"), in.Int("d"));
}
void RunEmbeddingBwd(const OpValues& in, OpValues& out) {
  Floats& o = out.f32["dtable"] = in.F("dtable");
  EmbeddingBackward(in.F("dout"), in.U("ids"), o, in.Int("vocab"), in.Int("d"));
}
void RunRmsNormFwd(const OpValues& in, OpValues& out) {
  const int64_t rows = in.Int("rows"), cols = in.Int("cols");
  Floats& y = out.f32["y"] = Zeros(in, {rows, cols});
  Floats& rstd = out.f32["rstd"] = Zeros(in, {rows});
  RmsNormForward(in.F("x"), Optional(in, "gain"), in.Float("eps"), y, rstd, rows, cols);
}
void RunRmsNormBwd(const OpValues& in, OpValues& out) {
  const int64_t rows = in.Int("rows"), cols = in.Int("cols");
  Floats& dx = out.f32["dx"] = Zeros(in, {rows, cols});
  std::span<float> dgain;
  if (in.Has("gain")) dgain = out.f32["dgain"] = Zeros(in, {cols});
  RmsNormBackward(in.F("dy"), in.F("x"), Optional(in, "gain"), in.F("rstd"), dx, dgain, rows,
                  cols);
}
// The three GEMM forms: out = the accumulated input (accumulate = 1) or zeros of a × b.
Floats& GemmOutput(const OpValues& in, OpValues& out, std::string_view role, int64_t a, int64_t b) {
  Floats& o = out.f32[std::string(role)];
  o = in.Int("accumulate") != 0 ? in.F(role) : Zeros(in, {a, b});
  return o;
}
void RunGemmXWt(const OpValues& in, OpValues& out) {
  const int64_t m = in.Int("m"), n = in.Int("n"), k = in.Int("k");
  GemmXWt(in.F("x"), in.F("w"), GemmOutput(in, out, "y", m, n), m, n, k, in.Int("accumulate") != 0);
}
void RunGemmDyW(const OpValues& in, OpValues& out) {
  const int64_t m = in.Int("m"), n = in.Int("n"), k = in.Int("k");
  GemmDyW(in.F("dy"), in.F("w"), GemmOutput(in, out, "dx", m, k), m, n, k,
          in.Int("accumulate") != 0);
}
void RunGemmDytX(const OpValues& in, OpValues& out) {
  const int64_t m = in.Int("m"), n = in.Int("n"), k = in.Int("k");
  GemmDytX(in.F("dy"), in.F("x"), GemmOutput(in, out, "dw", n, k), m, n, k,
           in.Int("accumulate") != 0);
}
void RunRopeFwd(const OpValues& in, OpValues& out) {
  Floats& y = out.f32["y"] = Zeros(in, {static_cast<int64_t>(in.F("x").size())});
  RopeForward(in.F("x"), y, RopeOf(in), in.Int("batch"), in.Int("seq"), in.Int("heads"),
              in.Int("head_dim"), in.IntOr("position", 0));
}
void RunRopeBwd(const OpValues& in, OpValues& out) {
  Floats& dx = out.f32["dx"] = Zeros(in, {static_cast<int64_t>(in.F("dy").size())});
  RopeBackward(in.F("dy"), dx, RopeOf(in), in.Int("batch"), in.Int("seq"), in.Int("heads"),
               in.Int("head_dim"));
}
void RunAttentionFwd(const OpValues& in, OpValues& out) {
  const AttentionShape s = AttentionOf(in);
  Floats& o = out.f32["out"] = Zeros(in, {static_cast<int64_t>(in.F("q").size())});
  Floats& lse = out.f32["lse"] = Zeros(in, {s.batch, s.q_heads, s.seq});
  AttentionForward(s, in.F("q"), in.F("k"), in.F("v"), o, lse);
}
void RunAttentionBwd(const OpValues& in, OpValues& out) {
  Floats& dq = out.f32["dq"] = Zeros(in, {static_cast<int64_t>(in.F("q").size())});
  Floats& dk = out.f32["dk"] = Zeros(in, {static_cast<int64_t>(in.F("k").size())});
  Floats& dv = out.f32["dv"] = Zeros(in, {static_cast<int64_t>(in.F("v").size())});
  AttentionBackward(AttentionOf(in), in.F("q"), in.F("k"), in.F("v"), in.F("out"), in.F("lse"),
                    in.F("dout"), dq, dk, dv);
}
void RunAddInto(const OpValues& in, OpValues& out) {
  Floats& y = out.f32["y"] = in.F("y");
  AddInto(in.F("x"), y);
}
void RunCopy(const OpValues& in, OpValues& out) { out.f32["y"] = in.F("x"); }
void RunSwigluFwd(const OpValues& in, OpValues& out) {
  Floats& act = out.f32["act"] = Zeros(in, {in.Int("rows"), in.Int("f")});
  SwigluForward(in.F("gu"), act, in.Int("rows"), in.Int("f"));
}
void RunSwigluBwd(const OpValues& in, OpValues& out) {
  Floats& dgu = out.f32["dgu"] = Zeros(in, {in.Int("rows"), 2, in.Int("f")});
  SwigluBackward(in.F("gu"), in.F("dact"), dgu, in.Int("rows"), in.Int("f"));
}
void RunCrossEntropyFwd(const OpValues& in, OpValues& out) {
  const CrossEntropyShape s = CrossEntropyOf(in);
  Floats& loss = out.f32["loss"] = Zeros(in, {s.rows});
  Floats& zloss = out.f32["zloss"] = Zeros(in, {s.rows});
  Floats& lse = out.f32["lse"] = Zeros(in, {s.rows});
  CrossEntropyForward(s, in.F("h"), in.F("w"), in.U("targets"), loss, zloss, lse);
}
void RunCrossEntropyBwd(const OpValues& in, OpValues& out) {
  const CrossEntropyShape s = CrossEntropyOf(in);
  Floats& dh = out.f32["dh"] = Zeros(in, {s.rows, s.d});
  Floats& dw = out.f32["dw"] = in.F("dw");
  CrossEntropyBackward(s, in.F("h"), in.F("w"), in.U("targets"), in.F("lse"),
                       in.Float("grad_scale"), dh, dw);
}
void RunRowSum(const OpValues& in, OpValues& out) {
  Floats& sum = out.f32["sum"] = Zeros(in, {in.Int("rows")});
  RowSum(in.F("x"), sum, in.Int("rows"), in.Int("cols"));
}
void RunBlockSquares(const OpValues& in, OpValues& out) {
  out.f64["sums"] = BlockSquares(in.F("x"));
}
void RunCanonicalizeNaNs(const OpValues& in, OpValues& out) {
  CanonicalizeNaNs(out.f32["x"] = in.F("x"));
}
void RunGlobalNorm(const OpValues& in, OpValues& out) {
  std::vector<int64_t> blocks;
  for (const double count : in.D("blocks")) {
    if (!(count >= 0 && count <= 9007199254740992.0) || count != std::floor(count)) {
      Fail("global_norm: block count {} is not a non-negative integer", count);
    }
    blocks.push_back(static_cast<int64_t>(count));
  }
  out.f32["norm"] = {NormOfBlockSums(in.D("sums"), blocks)};
}
void RunScale(const OpValues& in, OpValues& out) {
  Scale(out.f32["x"] = in.F("x"), in.Float("factor"));
}
void RunAdamW(const OpValues& in, OpValues& out) {
  Floats& param = out.f32["param"] = in.F("param");
  Floats& m = out.f32["m"] = in.F("m");
  Floats& v = out.f32["v"] = in.F("v");
  const AdamWParams p{in.Float("lr"),  in.Float("beta1"),        in.Float("beta2"),
                      in.Float("eps"), in.Float("weight_decay"), in.Int("step")};
  AdamWUpdate(p, param, in.F("grad"), m, v);
}

// ---- samples: small ragged shapes with the special values ---------------------------------------

OpValues With(std::map<std::string, double, std::less<>> args) {
  OpValues v;
  v.args = std::move(args);
  return v;
}

OpValues SampleEmbeddingFwd() {
  OpValues v = With({{"vocab", 50}, {"d", 37}});
  v.f32["table"] = SelftestFloats(50 * 37, 18);
  v.u32["ids"] = SelftestIds(200, 50, 20);
  return v;
}
OpValues SampleEmbeddingBwd() {
  OpValues v = With({{"vocab", 50}, {"d", 37}});
  v.f32["dout"] = SelftestFloats(200 * 37, 19);
  v.u32["ids"] = SelftestIds(200, 50, 20);
  v.f32["dtable"] = SelftestFloats(50 * 37, 21);
  return v;
}
OpValues SampleRmsNormFwd() {
  OpValues v = With({{"rows", 13}, {"cols", 257}, {"eps", 1e-5f}});
  v.f32["x"] = SelftestFloats(13 * 257, 8);
  v.f32["gain"] = SelftestFloats(257, 10);
  return v;
}
OpValues SampleRmsNormBwd() {
  // The forward's rstd, so that the backward sees a consistent pair.
  OpValues fwd = SampleRmsNormFwd(), out;
  RunRmsNormFwd(fwd, out);
  OpValues v = With({{"rows", 13}, {"cols", 257}});
  v.f32["dy"] = SelftestFloats(13 * 257, 9);
  v.f32["x"] = fwd.f32["x"];
  v.f32["gain"] = fwd.f32["gain"];
  v.f32["rstd"] = out.f32["rstd"];
  return v;
}
OpValues SampleGemm(std::string_view a, std::string_view b, std::string_view acc, int64_t a_size,
                    int64_t b_size, int64_t acc_size, uint32_t seed) {
  OpValues v = With({{"m", 67}, {"n", 45}, {"k", 531}, {"accumulate", 1}});
  v.f32[std::string(a)] = SelftestFloats(a_size, seed);
  v.f32[std::string(b)] = SelftestFloats(b_size, seed + 1);
  v.f32[std::string(acc)] = SelftestFloats(acc_size, seed + 2);
  return v;
}
OpValues SampleGemmXWt() { return SampleGemm("x", "w", "y", 67 * 531, 45 * 531, 67 * 45, 1); }
OpValues SampleGemmDyW() { return SampleGemm("dy", "w", "dx", 67 * 45, 45 * 531, 67 * 531, 3); }
OpValues SampleGemmDytX() { return SampleGemm("dy", "x", "dw", 67 * 45, 67 * 531, 45 * 531, 5); }
OpValues RopeArgs() {
  return With({{"batch", 2}, {"seq", 19}, {"heads", 3}, {"head_dim", 34}, {"table_seq", 23},
               {"theta", 500000.0f}});
}
OpValues SampleRopeFwd() {
  OpValues v = RopeArgs();
  v.f32["x"] = SelftestFloats(2 * 19 * 3 * 34, 11);
  return v;
}
OpValues SampleRopeBwd() {
  OpValues v = RopeArgs();
  v.f32["dy"] = SelftestFloats(2 * 19 * 3 * 34, 12);
  return v;
}
constexpr int64_t kAttnQ = 2 * 70 * 4 * 19, kAttnKv = 2 * 70 * 2 * 19;
OpValues SampleAttentionFwd() {
  // A sliding window: the full-attention path is the window-0 case of the same kernel.
  OpValues v = With({{"batch", 2}, {"seq", 70}, {"q_heads", 4}, {"kv_heads", 2}, {"head_dim", 19},
                     {"window", 7}, {"scale", 0.25f}});
  v.f32["q"] = SelftestFloats(kAttnQ, 12);
  v.f32["k"] = SelftestFloats(kAttnKv, 13);
  v.f32["v"] = SelftestFloats(kAttnKv, 14);
  return v;
}
OpValues SampleAttentionBwd() {
  OpValues v = SampleAttentionFwd(), out;
  v.args["window"] = 0;
  RunAttentionFwd(v, out);
  v.f32["out"] = out.f32["out"];
  v.f32["lse"] = out.f32["lse"];
  v.f32["dout"] = SelftestFloats(kAttnQ, 15);
  return v;
}
OpValues SampleAddInto() {
  OpValues v = With({{"n", 1003}});
  v.f32["x"] = SelftestFloats(1003, 40);
  v.f32["y"] = SelftestFloats(1003, 41);
  return v;
}
OpValues SampleCopy() {
  OpValues v = With({{"n", 1003}});
  v.f32["x"] = SelftestFloats(1003, 42);
  return v;
}
OpValues SampleSwigluFwd() {
  OpValues v = With({{"rows", 11}, {"f", 133}});
  v.f32["gu"] = SelftestFloats(11 * 266, 16);
  for (float& x : v.f32["gu"]) x *= 8.0f;
  return v;
}
OpValues SampleSwigluBwd() {
  OpValues v = SampleSwigluFwd();
  v.f32["dact"] = SelftestFloats(11 * 133, 17);
  return v;
}
OpValues SampleCrossEntropyFwd() {
  OpValues v = With({{"rows", 23}, {"d", 40}, {"vocab", 700}, {"vocab_chunk", 256},
                     {"z_loss", 1e-4f}, {"grad_scale", 0}});
  v.f32["h"] = SelftestFloats(23 * 40, 22);
  v.f32["w"] = SelftestFloats(700 * 40, 23);
  v.u32["targets"] = SelftestIds(23, 700, 24);
  return v;
}
OpValues SampleCrossEntropyBwd() {
  OpValues v = SampleCrossEntropyFwd(), out;
  RunCrossEntropyFwd(v, out);
  v.args["grad_scale"] = 1.0f / 23;
  v.f32["lse"] = out.f32["lse"];
  v.f32["dw"] = SelftestFloats(700 * 40, 25);
  return v;
}
OpValues SampleRowSum() {
  OpValues v = With({{"rows", 9}, {"cols", 1001}});
  v.f32["x"] = SelftestFloats(9 * 1001, 7);
  return v;
}
OpValues SampleBlockSquares() {
  OpValues v = With({{"tensor", 0}, {"begin", 0}});
  v.f32["x"] = SelftestFloats(2 * kNormBlock + 4099, 26);
  return v;
}
OpValues SampleCanonicalizeNaNs() {
  OpValues v = With({{"tensor", 0}});
  v.f32["x"] = SelftestFloats(4099, 27);
  return v;
}
OpValues SampleGlobalNorm() {
  OpValues v = With({{"tensors", 3}});
  const Floats a = SelftestFloats(70000, 28, false), b = SelftestFloats(17, 29),
               c = SelftestFloats(131073, 30, false);
  std::vector<double>& sums = v.f64["sums"];
  for (const Floats* t : {&a, &b, &c}) {
    const std::vector<double> s = BlockSquares(*t);
    sums.insert(sums.end(), s.begin(), s.end());
    v.f64["blocks"].push_back(static_cast<double>(s.size()));
  }
  return v;
}
OpValues SampleScale() {
  OpValues v = With({{"tensor", 0}, {"factor", 0.3f}});
  v.f32["x"] = SelftestFloats(4099, 31);
  return v;
}
OpValues SampleAdamW() {
  OpValues v = With({{"tensor", 0}, {"lr", 1e-3f}, {"beta1", 0.9f}, {"beta2", 0.95f},
                     {"eps", 1e-8f}, {"weight_decay", 0.1f}, {"step", 30}});
  v.f32["param"] = SelftestFloats(1003, 32);
  v.f32["grad"] = SelftestFloats(1003, 33);
  v.f32["m"] = SelftestFloats(1003, 34);
  v.f32["v"] = SelftestFloats(1003, 35);
  for (float& x : v.f32["v"]) x = x * x;  // a second moment is never negative
  return v;
}

constexpr Dtype kU32 = Dtype::kU32, kF64 = Dtype::kF64, kF32 = Dtype::kF32;
constexpr bool kOptional = true;

const std::vector<OpSpec>& Table() {
  static const std::vector<OpSpec> table = [] {
    const std::vector<std::string_view> attention = {"batch",    "seq",    "q_heads", "kv_heads",
                                                     "head_dim", "window", "scale"};
    const std::vector<std::string_view> rope = {"batch",    "seq",       "heads",
                                                "head_dim", "table_seq", "theta"};
    const std::vector<std::string_view> cross_entropy = {"rows",        "d",      "vocab",
                                                         "vocab_chunk", "z_loss", "grad_scale"};
    const std::vector<std::string_view> gemm = {"m", "n", "k", "accumulate"};
    std::vector<OpSpec> t = {
        {Op::kEmbeddingFwd,
         "embedding_fwd",
         "EmbeddingForward",
         {"vocab", "d"},
         {},
         {{"table"}, {"ids", kU32}},
         {{"out"}},
         RunEmbeddingFwd,
         SampleEmbeddingFwd},
        {Op::kRmsNormFwd,
         "rmsnorm_fwd",
         "RmsNormForward",
         {"rows", "cols", "eps"},
         {},
         {{"x"}, {"gain", kF32, kOptional}},
         {{"y"}, {"rstd"}},
         RunRmsNormFwd,
         SampleRmsNormFwd},
        {Op::kGemmXWt,
         "gemm_xwt",
         "GemmXWt",
         gemm,
         {},
         {{"x"}, {"w"}, {"y", kF32, kOptional}},
         {{"y"}},
         RunGemmXWt,
         SampleGemmXWt},
        {Op::kRopeFwd,
         "rope_fwd",
         "RopeForward",
         rope,
         {"position"},
         {{"x"}},
         {{"y"}},
         RunRopeFwd,
         SampleRopeFwd},
        {Op::kAttentionFwd,
         "attention_fwd",
         "AttentionForward",
         attention,
         {"past"},
         {{"q"}, {"k"}, {"v"}},
         {{"out"}, {"lse"}},
         RunAttentionFwd,
         SampleAttentionFwd},
        {Op::kAddInto,
         "add_into",
         "AddInto",
         {"n"},
         {"tensor"},
         {{"x"}, {"y"}},
         {{"y"}},
         RunAddInto,
         SampleAddInto},
        {Op::kSwigluFwd,
         "swiglu_fwd",
         "SwigluForward",
         {"rows", "f"},
         {},
         {{"gu"}},
         {{"act"}},
         RunSwigluFwd,
         SampleSwigluFwd},
        {Op::kCrossEntropyFwd,
         "cross_entropy_fwd",
         "CrossEntropyForward",
         cross_entropy,
         {},
         {{"h"}, {"w"}, {"targets", kU32}},
         {{"loss"}, {"zloss"}, {"lse"}},
         RunCrossEntropyFwd,
         SampleCrossEntropyFwd},
        {Op::kRowSum,
         "row_sum",
         "RowSum",
         {"rows", "cols"},
         {},
         {{"x"}},
         {{"sum"}},
         RunRowSum,
         SampleRowSum},
        {Op::kCrossEntropyBwd,
         "cross_entropy_bwd",
         "CrossEntropyBackward",
         cross_entropy,
         {},
         {{"h"}, {"w"}, {"targets", kU32}, {"lse"}, {"dw"}},
         {{"dh"}, {"dw"}},
         RunCrossEntropyBwd,
         SampleCrossEntropyBwd},
        {Op::kRmsNormBwd,
         "rmsnorm_bwd",
         "RmsNormBackward",
         {"rows", "cols"},
         {},
         {{"dy"}, {"x"}, {"gain", kF32, kOptional}, {"rstd"}},
         {{"dx"}, {"dgain", kF32, kOptional}},
         RunRmsNormBwd,
         SampleRmsNormBwd},
        {Op::kCopy, "copy", "copy", {"n"}, {}, {{"x"}}, {{"y"}}, RunCopy, SampleCopy},
        {Op::kGemmDyW,
         "gemm_dyw",
         "GemmDyW",
         gemm,
         {},
         {{"dy"}, {"w"}, {"dx", kF32, kOptional}},
         {{"dx"}},
         RunGemmDyW,
         SampleGemmDyW},
        {Op::kGemmDytX,
         "gemm_dytx",
         "GemmDytX",
         gemm,
         {},
         {{"dy"}, {"x"}, {"dw", kF32, kOptional}},
         {{"dw"}},
         RunGemmDytX,
         SampleGemmDytX},
        {Op::kSwigluBwd,
         "swiglu_bwd",
         "SwigluBackward",
         {"rows", "f"},
         {},
         {{"gu"}, {"dact"}},
         {{"dgu"}},
         RunSwigluBwd,
         SampleSwigluBwd},
        {Op::kAttentionBwd,
         "attention_bwd",
         "AttentionBackward",
         attention,
         {},
         {{"q"}, {"k"}, {"v"}, {"out"}, {"lse"}, {"dout"}},
         {{"dq"}, {"dk"}, {"dv"}},
         RunAttentionBwd,
         SampleAttentionBwd},
        {Op::kRopeBwd,
         "rope_bwd",
         "RopeBackward",
         rope,
         {},
         {{"dy"}},
         {{"dx"}},
         RunRopeBwd,
         SampleRopeBwd},
        {Op::kEmbeddingBwd,
         "embedding_bwd",
         "EmbeddingBackward",
         {"vocab", "d"},
         {},
         {{"dout"}, {"ids", kU32}, {"dtable"}},
         {{"dtable"}},
         RunEmbeddingBwd,
         SampleEmbeddingBwd},
        {Op::kBlockSquares,
         "block_squares",
         "BlockSquares",
         {"tensor", "begin"},
         {},
         {{"x"}},
         {{"sums", kF64}},
         RunBlockSquares,
         SampleBlockSquares},
        {Op::kCanonicalizeNaNs,
         "canonicalize_nans",
         "CanonicalizeNaNs",
         {"tensor"},
         {},
         {{"x"}},
         {{"x"}},
         RunCanonicalizeNaNs,
         SampleCanonicalizeNaNs},
        {Op::kGlobalNorm,
         "global_norm",
         "NormOfBlockSums",
         {"tensors"},
         {},
         {{"sums", kF64}, {"blocks", kF64}},
         {{"norm"}},
         RunGlobalNorm,
         SampleGlobalNorm},
        {Op::kScale,
         "scale",
         "Scale",
         {"tensor", "factor"},
         {},
         {{"x"}},
         {{"x"}},
         RunScale,
         SampleScale},
        {Op::kAdamW,
         "adamw",
         "AdamWUpdate",
         {"tensor", "lr", "beta1", "beta2", "eps", "weight_decay", "step"},
         {},
         {{"param"}, {"grad"}, {"m"}, {"v"}},
         {{"param"}, {"m"}, {"v"}},
         RunAdamW,
         SampleAdamW},
    };
    for (size_t i = 0; i < t.size(); ++i) {
      if (static_cast<size_t>(t[i].op) != i) LOCKSTEP_INTERNAL("op table entry {} out of order", i);
    }
    if (t.size() != static_cast<size_t>(Op::kCount)) LOCKSTEP_INTERNAL("op table incomplete");
    return t;
  }();
  return table;
}

template <typename T>
const std::vector<T>& Role(const std::map<std::string, std::vector<T>, std::less<>>& m,
                           std::string_view role, Dtype dtype) {
  const auto it = m.find(role);
  if (it == m.end()) Fail("the op has no {} tensor '{}'", DtypeName(dtype), role);
  return it->second;
}

constexpr float kSpecials[] = {
    -0.0f, 0.0f, INFINITY, -INFINITY, NAN, -NAN,
    0x1.0p-149f, -0x1.0p-149f, 0x1.0p-140f, 0x1.0p-126f, -0x1.0p-126f,
    0x1.fffffep127f, -0x1.fffffep127f,
    88.72283f, 88.72284f, -87.33654f, -103.97208f, -103.97209f,
    1.0f, -1.0f, 0x1.fffffep-1f, -0x1.fffffep-1f, 0x1.0p+100f};

}  // namespace

std::string_view DtypeName(Dtype dtype) {
  switch (dtype) {
    case Dtype::kU32: return "u32";
    case Dtype::kF64: return "f64";
    case Dtype::kF32: break;
  }
  return "f32";
}

double OpValues::Arg(std::string_view name) const {
  const auto it = args.find(name);
  if (it == args.end()) Fail("the op has no argument '{}'", name);
  return it->second;
}
int64_t OpValues::Int(std::string_view name) const {
  const double x = Arg(name);
  if (!(std::fabs(x) <= 9007199254740992.0) || x != std::floor(x)) {
    Fail("argument '{}' = {} is not an integer", name, x);
  }
  return static_cast<int64_t>(x);
}
const std::vector<float>& OpValues::F(std::string_view role) const {
  return Role(f32, role, Dtype::kF32);
}
const std::vector<uint32_t>& OpValues::U(std::string_view role) const {
  return Role(u32, role, Dtype::kU32);
}
const std::vector<double>& OpValues::D(std::string_view role) const {
  return Role(f64, role, Dtype::kF64);
}

const OpSpec& Spec(Op op) { return Table().at(static_cast<size_t>(op)); }
std::span<const OpSpec> OpTable() { return Table(); }
const OpSpec* FindOp(std::string_view name) {
  for (const OpSpec& spec : Table()) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

namespace {
bool RolesFit(std::span<const OpRole> listed, std::span<const RoleAndDtype> given) {
  size_t g = 0;
  for (const OpRole& role : listed) {
    if (g < given.size() && given[g].first == role.name) {
      if (given[g].second != role.dtype) return false;
      ++g;
    } else if (!role.optional) {
      return false;
    }
  }
  return g == given.size();
}
}  // namespace

bool CallFits(const OpSpec& op, std::span<const std::string_view> args,
              std::span<const RoleAndDtype> inputs, std::span<const RoleAndDtype> outputs) {
  const auto listed = [&](std::string_view name) {
    return std::ranges::find(op.args, name) != op.args.end() ||
           std::ranges::find(op.optional_args, name) != op.optional_args.end();
  };
  const auto given = [&](std::string_view name) {
    return std::ranges::find(args, name) != args.end();
  };
  return std::ranges::all_of(args, listed) && std::ranges::all_of(op.args, given) &&
         RolesFit(op.inputs, inputs) && RolesFit(op.outputs, outputs);
}

const std::span<const float> kSelftestSpecials = kSpecials;

std::vector<float> SelftestFloats(int64_t n, uint32_t seed, bool specials) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + 12345u;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(s >> 8) - (1 << 23)) * 0x1.0p-23f;
  }
  constexpr auto kCount = static_cast<int64_t>(std::size(kSpecials));
  if (specials && n >= 16 * kCount) {
    const int64_t stride = n / kCount, offset = seed % stride;
    for (int64_t k = 0; k < kCount; ++k) v[static_cast<size_t>(k * stride + offset)] = kSpecials[k];
  }
  return v;
}

std::vector<uint32_t> SelftestIds(int64_t n, uint32_t vocab, uint32_t seed) {
  std::vector<uint32_t> ids(static_cast<size_t>(n));
  uint32_t s = seed;
  for (uint32_t& id : ids) {
    s = s * 1664525u + 1013904223u;
    id = (s >> 8) % vocab;
  }
  return ids;
}

}  // namespace lockstep::rk
