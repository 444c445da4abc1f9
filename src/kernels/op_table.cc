// The op table (include/lockstep/kernels.h): every op a step records, with its kernel run from
// recorded values and a sample call for the selftest.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <ranges>

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

// Input `role`, which must hold the product of `factors` elements (`shape` names them): checked
// before an output sized by the same arguments is allocated, so that arguments contradicting the
// inputs are refused as such, never allocated for (both may come from a file).
template <Element T = float>
std::span<const T> Input(const OpValues& in, std::string_view role,
                         std::initializer_list<int64_t> factors, const char* shape) {
  const std::span<const T> t = in.Get<T>(role);
  const int64_t n = detail::Elements("op table", shape, factors);
  if (static_cast<int64_t>(t.size()) != n) {
    Fail("op table: input '{}' has {} elements, the arguments give {} = {}", role, t.size(), shape,
         n);
  }
  return t;
}

AttentionShape AttentionOf(const OpValues& v) {
  return {v.Int("batch"),    v.Int("seq"),    v.Int("q_heads"), v.Int("kv_heads"),
          v.Int("head_dim"), v.Int("window"), v.Float("scale"), v.IntOr("past", 0)};
}
CrossEntropyShape CrossEntropyOf(const OpValues& v) {
  return {v.Int("rows"), v.Int("d"), v.Int("vocab"), v.Int("vocab_chunk"), v.Float("z_loss")};
}
std::span<const float> Optional(const OpValues& v, std::string_view role) {
  return v.Has(role) ? v.F(role) : std::span<const float>();
}
RopeTable RopeOf(const OpValues& v) {
  Allocation(v, {v.Int("table_seq"), v.Int("head_dim")});
  return MakeRopeTable(v.Int("table_seq"), v.Int("head_dim"), v.Float("theta"));
}

// ---- run: each op from its recorded args and inputs --------------------------------------------

void RunEmbeddingFwd(const OpValues& in, OpValues& out) {
  Input(in, "table", {in.Int("vocab"), in.Int("d")}, "vocab * d");
  const std::span<float> o =
      out.Put("out", Zeros(in, {static_cast<int64_t>(in.U("ids").size()), in.Int("d")}));
  EmbeddingForward(in.F("table"), in.U("ids"), o, in.Int("vocab"), in.Int("d"));
}
void RunEmbeddingBwd(const OpValues& in, OpValues& out) {
  const std::span<float> o = out.Put("dtable", in.F("dtable"));
  EmbeddingBackward(in.F("dout"), in.U("ids"), o, in.Int("vocab"), in.Int("d"));
}
void RunRmsNormFwd(const OpValues& in, OpValues& out) {
  const int64_t rows = in.Int("rows"), cols = in.Int("cols");
  Input(in, "x", {rows, cols}, "rows * cols");
  const std::span<float> y = out.Put("y", Zeros(in, {rows, cols}));
  const std::span<float> rstd = out.Put("rstd", Zeros(in, {rows}));
  RmsNormForward(in.F("x"), Optional(in, "gain"), in.Float("eps"), y, rstd, rows, cols);
}
void RunRmsNormBwd(const OpValues& in, OpValues& out) {
  const int64_t rows = in.Int("rows"), cols = in.Int("cols");
  Input(in, "dy", {rows, cols}, "rows * cols");
  const std::span<float> dx = out.Put("dx", Zeros(in, {rows, cols}));
  std::span<float> dgain;
  if (in.Has("gain")) dgain = out.Put("dgain", Zeros(in, {cols}));
  RmsNormBackward(in.F("dy"), in.F("x"), Optional(in, "gain"), in.F("rstd"), dx, dgain, rows,
                  cols);
}
// The three GEMM forms: out = the accumulated input (accumulate = 1) or zeros of a × b.
std::span<float> GemmOutput(const OpValues& in, OpValues& out, std::string_view role, int64_t a,
                            int64_t b) {
  return in.Int("accumulate") != 0 ? out.Put(role, in.F(role)) : out.Put(role, Zeros(in, {a, b}));
}
void RunGemmXWt(const OpValues& in, OpValues& out) {
  const int64_t m = in.Int("m"), n = in.Int("n"), k = in.Int("k");
  Input(in, "x", {m, k}, "m * k");
  Input(in, "w", {n, k}, "n * k");
  GemmXWt(in.F("x"), in.F("w"), GemmOutput(in, out, "y", m, n), m, n, k, in.Int("accumulate") != 0);
}
void RunGemmDyW(const OpValues& in, OpValues& out) {
  const int64_t m = in.Int("m"), n = in.Int("n"), k = in.Int("k");
  Input(in, "dy", {m, n}, "m * n");
  Input(in, "w", {n, k}, "n * k");
  GemmDyW(in.F("dy"), in.F("w"), GemmOutput(in, out, "dx", m, k), m, n, k,
          in.Int("accumulate") != 0);
}
void RunGemmDytX(const OpValues& in, OpValues& out) {
  const int64_t m = in.Int("m"), n = in.Int("n"), k = in.Int("k");
  Input(in, "dy", {m, n}, "m * n");
  Input(in, "x", {m, k}, "m * k");
  GemmDytX(in.F("dy"), in.F("x"), GemmOutput(in, out, "dw", n, k), m, n, k,
           in.Int("accumulate") != 0);
}
void RunRopeFwd(const OpValues& in, OpValues& out) {
  const std::span<float> y = out.Put("y", Zeros(in, {static_cast<int64_t>(in.F("x").size())}));
  RopeForward(in.F("x"), y, RopeOf(in), in.Int("batch"), in.Int("seq"), in.Int("heads"),
              in.Int("head_dim"), in.IntOr("position", 0));
}
void RunRopeBwd(const OpValues& in, OpValues& out) {
  const std::span<float> dx = out.Put("dx", Zeros(in, {static_cast<int64_t>(in.F("dy").size())}));
  RopeBackward(in.F("dy"), dx, RopeOf(in), in.Int("batch"), in.Int("seq"), in.Int("heads"),
               in.Int("head_dim"));
}
void RunAttentionFwd(const OpValues& in, OpValues& out) {
  const AttentionShape s = AttentionOf(in);
  Input(in, "q", {s.batch, s.seq, s.q_heads, s.head_dim}, "batch * seq * q_heads * head_dim");
  const std::span<float> o = out.Put("out", Zeros(in, {static_cast<int64_t>(in.F("q").size())}));
  const std::span<float> lse = out.Put("lse", Zeros(in, {s.batch, s.q_heads, s.seq}));
  AttentionForward(s, in.F("q"), in.F("k"), in.F("v"), o, lse);
}
void RunAttentionBwd(const OpValues& in, OpValues& out) {
  const std::span<float> dq = out.Put("dq", Zeros(in, {static_cast<int64_t>(in.F("q").size())}));
  const std::span<float> dk = out.Put("dk", Zeros(in, {static_cast<int64_t>(in.F("k").size())}));
  const std::span<float> dv = out.Put("dv", Zeros(in, {static_cast<int64_t>(in.F("v").size())}));
  AttentionBackward(AttentionOf(in), in.F("q"), in.F("k"), in.F("v"), in.F("out"), in.F("lse"),
                    in.F("dout"), dq, dk, dv);
}
void RunAddInto(const OpValues& in, OpValues& out) {
  Input(in, "x", {in.Int("n")}, "n");
  const std::span<float> y = out.Put("y", in.F("y"));
  AddInto(in.F("x"), y);
}
void RunCopy(const OpValues& in, OpValues& out) {
  out.Put("y", Input(in, "x", {in.Int("n")}, "n"));
}
void RunRoundToBf16(const OpValues& in, OpValues& out) {
  const int64_t n = in.Int("n");
  const std::span<const float> x = Input(in, "x", {n}, "n");
  RoundToBf16(x, out.Put("y", Zeros(in, {n})));
}
void RunToBf16(const OpValues& in, OpValues& out) {
  const int64_t n = in.Int("n");
  const std::span<const float> x = Input(in, "x", {n}, "n");
  ToBf16(x, out.Put("y", std::vector<BFloat16>(static_cast<size_t>(Allocation(in, {n})))));
}
void RunFromBf16(const OpValues& in, OpValues& out) {
  const int64_t n = in.Int("n");
  const std::span<const BFloat16> x = Input<BFloat16>(in, "x", {n}, "n");
  FromBf16(x, out.Put("y", Zeros(in, {n})));
}
void RunSwigluFwd(const OpValues& in, OpValues& out) {
  Input(in, "gu", {in.Int("rows"), 2, in.Int("f")}, "rows * 2 * f");
  const std::span<float> act = out.Put("act", Zeros(in, {in.Int("rows"), in.Int("f")}));
  SwigluForward(in.F("gu"), act, in.Int("rows"), in.Int("f"));
}
void RunSwigluBwd(const OpValues& in, OpValues& out) {
  Input(in, "gu", {in.Int("rows"), 2, in.Int("f")}, "rows * 2 * f");
  const std::span<float> dgu = out.Put("dgu", Zeros(in, {in.Int("rows"), 2, in.Int("f")}));
  SwigluBackward(in.F("gu"), in.F("dact"), dgu, in.Int("rows"), in.Int("f"));
}
void RunCrossEntropyFwd(const OpValues& in, OpValues& out) {
  const CrossEntropyShape s = CrossEntropyOf(in);
  Input(in, "h", {s.rows, s.d}, "rows * d");
  const std::span<float> loss = out.Put("loss", Zeros(in, {s.rows}));
  const std::span<float> zloss = out.Put("zloss", Zeros(in, {s.rows}));
  const std::span<float> lse = out.Put("lse", Zeros(in, {s.rows}));
  CrossEntropyForward(s, in.F("h"), in.F("w"), in.U("targets"), loss, zloss, lse);
}
void RunCrossEntropyBwd(const OpValues& in, OpValues& out) {
  const CrossEntropyShape s = CrossEntropyOf(in);
  Input(in, "h", {s.rows, s.d}, "rows * d");
  const std::span<float> dh = out.Put("dh", Zeros(in, {s.rows, s.d}));
  const std::span<float> dw = out.Put("dw", in.F("dw"));
  CrossEntropyBackward(s, in.F("h"), in.F("w"), in.U("targets"), in.F("lse"),
                       in.Float("grad_scale"), dh, dw);
}
void RunRowSum(const OpValues& in, OpValues& out) {
  Input(in, "x", {in.Int("rows"), in.Int("cols")}, "rows * cols");
  const std::span<float> sum = out.Put("sum", Zeros(in, {in.Int("rows")}));
  RowSum(in.F("x"), sum, in.Int("rows"), in.Int("cols"));
}
void RunBlockSquares(const OpValues& in, OpValues& out) {
  out.Put("sums", BlockSquares(in.F("x")));
}
void RunCanonicalizeNaNs(const OpValues& in, OpValues& out) {
  CanonicalizeNaNs(out.Put("x", in.F("x")));
}
void RunGlobalNorm(const OpValues& in, OpValues& out) {
  std::vector<int64_t> blocks;
  for (const double count : in.D("blocks")) {
    if (!(count >= 0 && count <= 9007199254740992.0) || count != std::floor(count)) {
      Fail("global_norm: block count {} is not a non-negative integer", count);
    }
    blocks.push_back(static_cast<int64_t>(count));
  }
  out.Put("norm", Floats{NormOfBlockSums(in.D("sums"), blocks)});
}
void RunScale(const OpValues& in, OpValues& out) {
  Scale(out.Put("x", in.F("x")), in.Float("factor"));
}
void RunAdamW(const OpValues& in, OpValues& out) {
  const std::span<float> param = out.Put("param", in.F("param"));
  const std::span<float> m = out.Put("m", in.F("m"));
  const std::span<float> v = out.Put("v", in.F("v"));
  const AdamWParams p{in.Float("lr"),  in.Float("beta1"),        in.Float("beta2"),
                      in.Float("eps"), in.Float("weight_decay"), in.Int("step")};
  AdamWUpdate(p, param, in.F("grad"), m, v);
}

void RunQuantizeRows(const OpValues& in, OpValues& out) {
  const int64_t rows = in.Int("rows"), cols = in.Int("cols");
  Input(in, "x", {rows, cols}, "rows * cols");
  const std::span<int8_t> q =
      out.Put("q", std::vector<int8_t>(static_cast<size_t>(Allocation(in, {rows, cols}))));
  QuantizeRows(in.F("x"), q, out.Put("scale", Zeros(in, {rows})), rows, cols);
}
void RunQuantizeRowsByScale(const OpValues& in, OpValues& out) {
  const int64_t rows = in.Int("rows"), cols = in.Int("cols");
  Input(in, "x", {rows, cols}, "rows * cols");
  const std::span<int8_t> q =
      out.Put("q", std::vector<int8_t>(static_cast<size_t>(Allocation(in, {rows, cols}))));
  QuantizeRowsByScale(in.F("x"), in.F("scale"), q, rows, cols);
}
// The int8 operands of a recorded call: the quantizers' range, [-127, 127] (-128, which no
// quantizer makes, could carry a sum of kInt8MaxK products past int32), and k at most kInt8MaxK.
std::span<const int8_t> Int8Operand(const OpValues& in, std::string_view role, int64_t rows,
                                    int64_t k, const char* shape) {
  if (k > kInt8MaxK) {
    Fail("op table: k = {}: an int8 GEMM sums at most kInt8MaxK = {} products (exact in int32)", k,
         kInt8MaxK);
  }
  const std::span<const int8_t> q = Input<int8_t>(in, role, {rows, k}, shape);
  if (const auto it = std::ranges::find(q, int8_t{-128}); it != q.end()) {
    Fail("op table: input '{}' element {} is -128, outside the quantizers' range [-127, 127]", role,
         it - q.begin());
  }
  return q;
}
void RunGemmI8XWt(const OpValues& in, OpValues& out) {
  const int64_t m = in.Int("m"), n = in.Int("n"), k = in.Int("k");
  const std::span<const int8_t> x = Int8Operand(in, "x", m, k, "m * k");
  const std::span<const int8_t> w = Int8Operand(in, "w", n, k, "n * k");
  GemmI8XWt(x, Input(in, "sx", {m}, "m"), w, Input(in, "sw", {n}, "n"),
            out.Put("y", Zeros(in, {m, n})), m, n, k);
}
void RunDequantizeRows(const OpValues& in, OpValues& out) {
  const int64_t rows = in.Int("rows"), cols = in.Int("cols");
  Input<int8_t>(in, "q", {rows, cols}, "rows * cols");
  DequantizeRows(in.Get<int8_t>("q"), in.F("scale"), out.Put("y", Zeros(in, {rows, cols})), rows,
                 cols);
}

void RunHadamardQuantizeRows(const OpValues& in, OpValues& out) {
  const int64_t rows = in.Int("rows"), cols = in.Int("cols");
  const bool transpose = in.Int("transpose") != 0;
  Input(in, "x", {rows, cols}, "rows * cols");
  const std::span<int8_t> q =
      out.Put("q", std::vector<int8_t>(static_cast<size_t>(Allocation(in, {rows, cols}))));
  HadamardQuantizeRows(in.F("x"), q, out.Put("scale", Zeros(in, {transpose ? cols : rows})), rows,
                       cols, transpose);
}

// ---- samples: small ragged shapes with the special values ---------------------------------------

OpValues With(std::map<std::string, double, std::less<>> args) {
  OpValues v;
  v.args = std::move(args);
  return v;
}

OpValues SampleEmbeddingFwd() {
  OpValues v = With({{"vocab", 50}, {"d", 37}});
  v.Put("table", SelftestFloats(50 * 37, 18));
  v.Put("ids", SelftestIds(200, 50, 20));
  return v;
}
OpValues SampleEmbeddingBwd() {
  OpValues v = With({{"vocab", 50}, {"d", 37}});
  v.Put("dout", SelftestFloats(200 * 37, 19));
  v.Put("ids", SelftestIds(200, 50, 20));
  v.Put("dtable", SelftestFloats(50 * 37, 21));
  return v;
}
OpValues SampleRmsNormFwd() {
  OpValues v = With({{"rows", 13}, {"cols", 257}, {"eps", 1e-5f}});
  v.Put("x", SelftestFloats(13 * 257, 8));
  v.Put("gain", SelftestFloats(257, 10));
  return v;
}
OpValues SampleRmsNormBwd() {
  // The forward's rstd, so that the backward sees a consistent pair.
  OpValues fwd = SampleRmsNormFwd(), out;
  RunRmsNormFwd(fwd, out);
  OpValues v = With({{"rows", 13}, {"cols", 257}});
  v.Put("dy", SelftestFloats(13 * 257, 9));
  v.tensors["x"] = fwd.tensors["x"];
  v.tensors["gain"] = fwd.tensors["gain"];
  v.tensors["rstd"] = out.tensors["rstd"];
  return v;
}
OpValues SampleGemm(std::string_view a, std::string_view b, std::string_view acc, int64_t a_size,
                    int64_t b_size, int64_t acc_size, uint32_t seed) {
  OpValues v = With({{"m", 67}, {"n", 45}, {"k", 531}, {"accumulate", 1}});
  v.Put(a, SelftestFloats(a_size, seed));
  v.Put(b, SelftestFloats(b_size, seed + 1));
  v.Put(acc, SelftestFloats(acc_size, seed + 2));
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
  v.Put("x", SelftestFloats(2 * 19 * 3 * 34, 11));
  return v;
}
OpValues SampleRopeBwd() {
  OpValues v = RopeArgs();
  v.Put("dy", SelftestFloats(2 * 19 * 3 * 34, 12));
  return v;
}
constexpr int64_t kAttnQ = 2 * 70 * 4 * 19, kAttnKv = 2 * 70 * 2 * 19;
OpValues SampleAttentionFwd() {
  // A sliding window: the full-attention path is the window-0 case of the same kernel.
  OpValues v = With({{"batch", 2}, {"seq", 70}, {"q_heads", 4}, {"kv_heads", 2}, {"head_dim", 19},
                     {"window", 7}, {"scale", 0.25f}});
  v.Put("q", SelftestFloats(kAttnQ, 12));
  v.Put("k", SelftestFloats(kAttnKv, 13));
  v.Put("v", SelftestFloats(kAttnKv, 14));
  return v;
}
OpValues SampleAttentionBwd() {
  OpValues v = SampleAttentionFwd(), out;
  v.args["window"] = 0;
  RunAttentionFwd(v, out);
  v.tensors["out"] = out.tensors["out"];
  v.tensors["lse"] = out.tensors["lse"];
  v.Put("dout", SelftestFloats(kAttnQ, 15));
  return v;
}
OpValues SampleAddInto() {
  OpValues v = With({{"n", 1003}});
  v.Put("x", SelftestFloats(1003, 40));
  v.Put("y", SelftestFloats(1003, 41));
  return v;
}
// Values of every kind the rule treats apart: ties (to even, up and down), a carry into the
// exponent, overflow to infinity, subnormals, signed zeros, infinities and NaN payloads.
OpValues SampleRoundToBf16() {
  OpValues v = With({{"n", 4099}});
  Floats x = SelftestFloats(4099, 43);
  const uint32_t special[] = {0x3F808000u, 0x3F818000u, 0x3F80FFFFu, 0x3FFFFFFFu, 0x7F7FFFFFu,
                              0x7F7F7FFFu, 0xFF7F8000u, 0x00000001u, 0x00008000u, 0x00018000u,
                              0x007FFFFFu, 0x807F8000u, 0x00000000u, 0x80000000u, 0x7F800000u,
                              0xFF800000u, 0x7F800001u, 0xFFC00000u, 0x7FBFFFFFu, 0xFFFFFFFFu};
  for (size_t i = 0; i < std::size(special); ++i) x[i * 37] = std::bit_cast<float>(special[i]);
  v.Put("x", std::move(x));
  return v;
}
OpValues SampleToBf16() { return SampleRoundToBf16(); }  // every kind of value, not only bf16
OpValues SampleFromBf16() {
  OpValues v = With({{"n", 4099}});
  std::vector<BFloat16> x(4099);
  const Floats f = SelftestFloats(4099, 44);
  for (size_t i = 0; i < x.size(); ++i) x[i] = NarrowToBf16(f[i]);
  for (const uint16_t special : {0x0001, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f7f, 0x0080}) {
    x[special % 4099] = {special};
  }
  v.Put("x", std::move(x));
  return v;
}
OpValues SampleCopy() {
  OpValues v = With({{"n", 1003}});
  v.Put("x", SelftestFloats(1003, 42));
  return v;
}
OpValues SampleSwigluFwd() {
  OpValues v = With({{"rows", 11}, {"f", 133}});
  v.Put("gu", SelftestFloats(11 * 266, 16));
  for (float& x : v.tensors["gu"].As<float>()) x *= 8.0f;
  return v;
}
OpValues SampleSwigluBwd() {
  OpValues v = SampleSwigluFwd();
  v.Put("dact", SelftestFloats(11 * 133, 17));
  return v;
}
OpValues SampleCrossEntropyFwd() {
  OpValues v = With({{"rows", 23}, {"d", 40}, {"vocab", 700}, {"vocab_chunk", 256},
                     {"z_loss", 1e-4f}, {"grad_scale", 0}});
  v.Put("h", SelftestFloats(23 * 40, 22));
  v.Put("w", SelftestFloats(700 * 40, 23));
  v.Put("targets", SelftestIds(23, 700, 24));
  return v;
}
OpValues SampleCrossEntropyBwd() {
  OpValues v = SampleCrossEntropyFwd(), out;
  RunCrossEntropyFwd(v, out);
  v.args["grad_scale"] = 1.0f / 23;
  v.tensors["lse"] = out.tensors["lse"];
  v.Put("dw", SelftestFloats(700 * 40, 25));
  return v;
}
OpValues SampleRowSum() {
  OpValues v = With({{"rows", 9}, {"cols", 1001}});
  v.Put("x", SelftestFloats(9 * 1001, 7));
  return v;
}
OpValues SampleBlockSquares() {
  OpValues v = With({{"tensor", 0}, {"begin", 0}});
  v.Put("x", SelftestFloats(2 * kNormBlock + 4099, 26));
  return v;
}
OpValues SampleCanonicalizeNaNs() {
  OpValues v = With({{"tensor", 0}});
  v.Put("x", SelftestFloats(4099, 27));
  return v;
}
OpValues SampleGlobalNorm() {
  OpValues v = With({{"tensors", 3}});
  const Floats a = SelftestFloats(70000, 28, false), b = SelftestFloats(17, 29),
               c = SelftestFloats(131073, 30, false);
  std::vector<double> sums, blocks;
  for (const Floats* t : {&a, &b, &c}) {
    const std::vector<double> s = BlockSquares(*t);
    sums.insert(sums.end(), s.begin(), s.end());
    blocks.push_back(static_cast<double>(s.size()));
  }
  v.Put("sums", std::move(sums));
  v.Put("blocks", std::move(blocks));
  return v;
}
OpValues SampleScale() {
  OpValues v = With({{"tensor", 0}, {"factor", 0.3f}});
  v.Put("x", SelftestFloats(4099, 31));
  return v;
}
OpValues SampleAdamW() {
  OpValues v = With({{"tensor", 0}, {"lr", 1e-3f}, {"beta1", 0.9f}, {"beta2", 0.95f},
                     {"eps", 1e-8f}, {"weight_decay", 0.1f}, {"step", 30}});
  v.Put("param", SelftestFloats(1003, 32));
  v.Put("grad", SelftestFloats(1003, 33));
  v.Put("m", SelftestFloats(1003, 34));
  v.Put("v", SelftestFloats(1003, 35));
  for (float& x : v.tensors["v"].As<float>()) x = x * x;  // a second moment is never negative
  return v;
}

OpValues SampleQuantizeRows() {
  constexpr int64_t kRows = 13, kCols = 257;
  OpValues v = With({{"rows", kRows}, {"cols", kCols}});
  Floats x = SelftestFloats(kRows * kCols, 36);
  const auto row = [&](int64_t r) { return std::span(x).subspan(r * kCols, kCols); };
  std::ranges::fill(row(2), -0.0f);  // an all-zero row: scale 0
  for (int64_t i = 0; i < kCols; ++i) {
    row(4)[i] = static_cast<float>(i % 5) * 0x1.0p-149f;  // so small that amax / 127 is 0
    // Ties: amax 63.5 makes s = 0.5, and x / s = k + 0.5 for every other element.
    row(6)[i] = i == 0 ? 63.5f : static_cast<float>(i % 254 - 127) * 0.5f + 0.25f;
  }
  v.Put("x", std::move(x));
  return v;
}
OpValues SampleQuantizeRowsByScale() {
  // QuantizeRows' sample with scales of every kind: each row's own (ties, a zero row, a row too
  // small), a NaN, a negative, an infinity, a subnormal (x / s past 127 and infinite: clamped),
  // and scales too small for a row's largest elements (clamped); x has the special values.
  OpValues v = SampleQuantizeRows();
  const int64_t rows = static_cast<int64_t>(v.args.at("rows"));
  OpValues own;
  RunQuantizeRows(v, own);
  const std::span<const float> own_scale = own.F("scale");
  Floats scale(own_scale.begin(), own_scale.end());
  const float kinds[] = {NAN, -0.5f, INFINITY, 0x1.0p-149f, 0x1.0p-3f, 0x1.0p-10f};
  for (int64_t r = 7, j = 0; r < rows; ++r, ++j) scale[r] = kinds[j % std::size(kinds)];
  Floats x(v.F("x").begin(), v.F("x").end());
  const Floats specials = SelftestFloats(static_cast<int64_t>(x.size()), 40, true);
  const auto cols = static_cast<size_t>(v.args.at("cols"));
  std::copy(specials.end() - 4 * cols, specials.end(), x.end() - 4 * cols);
  v.Put("x", std::move(x));
  v.Put("scale", std::move(scale));
  return v;
}
OpValues SampleGemmI8XWt() {
  constexpr int64_t kM = 67, kN = 45, kK = 531;
  OpValues v = With({{"m", kM}, {"n", kN}, {"k", kK}});
  // Operands as the quantizer makes them; x's rows with the special values get a NaN scale.
  const auto quantized = [&](std::string_view q, std::string_view scale, int64_t rows,
                             uint32_t seed, bool specials) {
    OpValues in = With({{"rows", static_cast<double>(rows)}, {"cols", kK}}), out;
    in.Put("x", SelftestFloats(rows * kK, seed, specials));
    RunQuantizeRows(in, out);
    v.tensors[std::string(q)] = out.tensors["q"];
    v.tensors[std::string(scale)] = out.tensors["scale"];
  };
  quantized("x", "sx", kM, 37, true);
  quantized("w", "sw", kN, 38, false);
  std::fill_n(v.tensors["x"].As<int8_t>().begin(), kK, int8_t{-127});
  std::fill_n(v.tensors["w"].As<int8_t>().begin(), kK, int8_t{-127});
  return v;
}
OpValues SampleDequantizeRows() {
  // The quantizer's output on its own sample: a NaN scale, a zero row, subnormal scales.
  const OpValues x = SampleQuantizeRows();
  OpValues q;
  RunQuantizeRows(x, q);
  OpValues v = With({{"rows", x.args.at("rows")}, {"cols", x.args.at("cols")}});
  v.tensors["q"] = q.tensors["q"];
  v.tensors["scale"] = q.tensors["scale"];
  return v;
}

OpValues SampleHadamardQuantizeRows() {
  // The rows of xᵀ (three of every four calls in the int8 backward): rotated in blocks of 64,
  // whose butterflies the variants take within and across vectors, in a whole tile of columns
  // and a part, with the special values (a column with a NaN or an infinity: a NaN scale). The
  // rows of x are covered by tests/kernels/int8_test.cc.
  constexpr int64_t kRows = 1088, kCols = 73;
  OpValues v = With({{"rows", kRows}, {"cols", kCols}, {"transpose", 1}});
  v.Put("x", SelftestFloats(kRows * kCols, 39, true));
  return v;
}

constexpr Dtype kU32 = Dtype::kU32, kF64 = Dtype::kF64, kF32 = Dtype::kF32, kI8 = Dtype::kI8,
                kBF16 = Dtype::kBF16;
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
        {Op::kQuantizeRows,
         "quantize_rows",
         "QuantizeRows",
         {"rows", "cols"},
         {},
         {{"x"}},
         {{"q", kI8}, {"scale"}},
         RunQuantizeRows,
         SampleQuantizeRows},
        {Op::kGemmI8XWt,
         "gemm_i8_xwt",
         "GemmI8XWt",
         {"m", "n", "k"},
         {},
         {{"x", kI8}, {"sx"}, {"w", kI8}, {"sw"}},
         {{"y"}},
         RunGemmI8XWt,
         SampleGemmI8XWt},
        {Op::kDequantizeRows,
         "dequantize_rows",
         "DequantizeRows",
         {"rows", "cols"},
         {},
         {{"q", kI8}, {"scale"}},
         {{"y"}},
         RunDequantizeRows,
         SampleDequantizeRows},
        {Op::kHadamardQuantizeRows,
         "hadamard_quantize_rows",
         "HadamardQuantizeRows",
         {"rows", "cols", "transpose"},
         {},
         {{"x"}},
         {{"q", kI8}, {"scale"}},
         RunHadamardQuantizeRows,
         SampleHadamardQuantizeRows},
        {Op::kQuantizeRowsByScale,
         "quantize_rows_by_scale",
         "QuantizeRowsByScale",
         {"rows", "cols"},
         {},
         {{"x"}, {"scale"}},
         {{"q", kI8}},
         RunQuantizeRowsByScale,
         SampleQuantizeRowsByScale},
        {Op::kRoundToBf16,
         "round_to_bf16",
         "RoundToBf16",
         {"n"},
         {},
         {{"x"}},
         {{"y"}},
         RunRoundToBf16,
         SampleRoundToBf16},
        {Op::kToBf16,
         "to_bf16",
         "ToBf16",
         {"n"},
         {},
         {{"x"}},
         {{"y", kBF16}},
         RunToBf16,
         SampleToBf16},
        {Op::kFromBf16,
         "from_bf16",
         "FromBf16",
         {"n"},
         {},
         {{"x", kBF16}},
         {{"y"}},
         RunFromBf16,
         SampleFromBf16},
    };
    for (size_t i = 0; i < t.size(); ++i) {
      if (static_cast<size_t>(t[i].op) != i) LOCKSTEP_INTERNAL("op table entry {} out of order", i);
    }
    if (t.size() != static_cast<size_t>(Op::kCount)) LOCKSTEP_INTERNAL("op table incomplete");
    return t;
  }();
  return table;
}

constexpr float kSpecials[] = {
    -0.0f, 0.0f, INFINITY, -INFINITY, NAN, -NAN,
    0x1.0p-149f, -0x1.0p-149f, 0x1.0p-140f, 0x1.0p-126f, -0x1.0p-126f,
    0x1.fffffep127f, -0x1.fffffep127f,
    88.72283f, 88.72284f, -87.33654f, -103.97208f, -103.97209f,
    1.0f, -1.0f, 0x1.fffffep-1f, -0x1.fffffep-1f, 0x1.0p+100f};

}  // namespace

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
const HostTensor& OpValues::Tensor(std::string_view role, Dtype dtype) const {
  const auto it = tensors.find(role);
  if (it == tensors.end()) Fail("the op has no {} tensor '{}'", DtypeName(dtype), role);
  if (it->second.dtype() != dtype) {
    Fail("the op's tensor '{}' is {}, not {}", role, DtypeName(it->second.dtype()),
         DtypeName(dtype));
  }
  return it->second;
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

namespace {
// Every NaN of `t` made the canonical NaN of its dtype (a no-op for integers).
void CanonicalizeNaNsOf(HostTensor& t) {
  switch (t.dtype()) {
    case Dtype::kF32:
      CanonicalizeNaNs(t.As<float>());
      break;
    case Dtype::kF64:
      for (double& x : t.As<double>()) x = x != x ? std::numeric_limits<double>::quiet_NaN() : x;
      break;
    case Dtype::kBF16:
      for (BFloat16& x : t.As<BFloat16>()) {
        if ((x.bits & 0x7f80) == 0x7f80 && (x.bits & 0x7f) != 0) x.bits = 0x7fc0;
      }
      break;
    case Dtype::kU32:
    case Dtype::kI8:
    case Dtype::kI32:
      break;
  }
}
}  // namespace

std::vector<float> OutputWords(const OpSpec& op, const OpValues& values) {
  const bool canonical = op.op != Op::kGlobalNorm && op.op != Op::kAdamW &&
                         op.op != Op::kRoundToBf16 && op.op != Op::kToBf16;
  std::vector<std::byte> bytes;
  for (const OpRole& role : op.outputs) {
    const auto it = values.tensors.find(role.name);
    if (it == values.tensors.end()) continue;
    HostTensor t = it->second;
    if (canonical) CanonicalizeNaNsOf(t);
    const std::span<const std::byte> b = t.view().bytes();
    bytes.insert(bytes.end(), b.begin(), b.end());
  }
  std::vector<float> words((bytes.size() + sizeof(float) - 1) / sizeof(float));
  if (!bytes.empty()) std::memcpy(words.data(), bytes.data(), bytes.size());
  return words;
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
