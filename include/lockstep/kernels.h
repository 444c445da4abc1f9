// lockstep kernels ("rk"): the reproducible operator library.
//
// Every op has a scalar reference implementation (normative) and SIMD variants compiled per
// Highway target; the active implementation is chosen at run time (SetIsa). All of them produce
// bit-identical results for every thread count: docs/numerics.md gives each op's exact
// operation order and constants. fp32 throughout. Buffers are std::span views whose sizes are
// checked against the shape arguments; any mismatch, a null buffer, a forbidden overlap or a
// non-finite hyper-parameter throws lockstep::Error naming the op, the argument and the values.
//
// Outputs are overwritten unless the op says it accumulates. An op that allows in-place use says
// so; otherwise outputs must not overlap inputs or each other.
#pragma once

#include <bit>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/tensor.h"

namespace lockstep::rk {

// ---- implementation selection --------------------------------------------------------------
// An instruction-set variant: the scalar reference (hwy_target == 0) or a Highway target. A
// target with an optional int8 dot-product extension is two variants, with and without it:
// AVX2_VNNI (AVX2 with AVX-VNNI's vpdpbusd) and NEON_DOTPROD (NEON with sdot), each listed before
// its plain form; only the int8 GEMM differs between the two.
struct Isa {
  int64_t hwy_target = 0;
  std::string name;  // "reference", "AVX2", "AVX2_VNNI", "AVX3", ...
  bool int8_dot = false;
  bool operator==(const Isa&) const = default;
};

Isa ReferenceIsa();
// Every variant compiled into this binary that the numerics contract admits (targets with a
// fused multiply-add), reference first, whether or not this CPU can run it.
std::vector<Isa> CompiledIsas();
// The subset of CompiledIsas() this CPU can run (reference first).
std::vector<Isa> UsableIsas();
// Process-global. Default: the best usable SIMD variant, else the reference.
Isa ActiveIsa();
void SetIsa(const Isa& isa);  // fails if !usable
// Parses "reference", "best" or a target name (case-insensitive).
Isa IsaByName(const std::string& name);

// ---- contract constants ---------------------------------------------------------------------
inline constexpr int kReductionLanes = 16;    // logical lanes of every row reduction
inline constexpr int kGemmKChunk = 256;       // GEMM: K summed in chunks of this many terms
inline constexpr int kAttentionKeyTile = 64;  // attention: keys processed in tiles of this size
inline constexpr int64_t kNormBlock = 65536;  // global norm: tensors summed in blocks this long

// ---- GEMM (the three forms of a linear layer) -----------------------------------------------
// Each output element is sum over the reduced index r of a(r)*b(r): r is cut into chunks of
// kGemmKChunk; each chunk is accumulated from +0 by sequential fused multiply-adds; the chunk
// sums are added in order, the first chunk's sum being the start (so no +0 is added).
// With accumulate = true, the chunk sums are added in order to the existing output instead.
//   y[m,n]  = x[m,k]  · w[n,k]ᵀ      (linear forward)
void GemmXWt(std::span<const float> x, std::span<const float> w, std::span<float> y, int64_t m,
             int64_t n, int64_t k, bool accumulate = false);
// Decode's GemmXWt of at most kGemvMaxRows rows against one weight many times (the KV-cache
// decoder's linears): w packed once in the layout the active SIMD variant's few-row product reads
// as one stream (blocks of one vector of columns, each column's k values interleaved), its values
// as binary32 or, when each is a bfloat16 (a bf16 compute copy), as those bfloat16s: half the
// bytes, widened exactly. The layout is not part of the contract: GemmXWtPacked gives GemmXWt's
// bits, and under a variant whose vectors differ from the packing's (or the reference) it runs
// GemmXWt on w itself.
inline constexpr int64_t kGemvMaxRows = 8;
struct GemvPacking {
  std::span<const float> w;         // the weight [n, k] (kept by the caller)
  int64_t n = 0, k = 0, lanes = 0;  // lanes: of the variant it was packed for (0: not packed)
  Dtype dtype = Dtype::kF32;        // of the packed values: kF32 or kBF16
  std::vector<std::byte> packed;
};
// w packed with its values as `dtype` (kF32, or kBF16: every value of w must be a bfloat16; one
// that is not is refused, naming its index).
GemvPacking PackForGemv(std::span<const float> w, int64_t n, int64_t k, Dtype dtype = Dtype::kF32);
// The bytes PackForGemv holds for a weight [n, k] as `dtype` under the active variant (0: it
// packs none).
uint64_t PackedGemvBytes(int64_t n, int64_t k, Dtype dtype = Dtype::kF32);
// y[m, n] = x[m, k] · wᵀ, m <= kGemvMaxRows: GemmXWt(x, w, y, m, n, k).
void GemmXWtPacked(std::span<const float> x, const GemvPacking& w, std::span<float> y, int64_t m);
//   dx[m,k] = dy[m,n] · w[n,k]       (input gradient; reduction over n)
void GemmDyW(std::span<const float> dy, std::span<const float> w, std::span<float> dx, int64_t m,
             int64_t n, int64_t k, bool accumulate = false);
//   dw[n,k] = dy[m,n]ᵀ · x[m,k]      (weight gradient; reduction over m)
void GemmDytX(std::span<const float> dy, std::span<const float> x, std::span<float> dw, int64_t m,
              int64_t n, int64_t k, bool accumulate = false);

// ---- exact int8 (docs/numerics.md, "Int8: quantized rows and the int8 GEMM") ------------------
// The most terms an int8 GEMM sums: k · 127² < 2^31, so every int32 sum is exact, in any order.
inline constexpr int64_t kInt8MaxK = 133144;
// Each row of x[rows, cols] to symmetric int8: q[rows, cols] and scale[rows]. A row with a NaN or
// an infinity: scale = the canonical NaN, q = 0. Otherwise s = amax / 127 (amax the largest |x| of
// the row, the division rounded once); s = 0 (an all-zero row, or one too small for s to be
// above zero): q = 0; else q[i] = clamp(round-half-even(x[i] / s), -127, 127).
void QuantizeRows(std::span<const float> x, std::span<int8_t> q, std::span<float> scale,
                  int64_t rows, int64_t cols);
// Each row of x[rows, cols] to int8 with a given scale[rows] (an int8 linear's weight and its
// scale tensor): q[r, i] = clamp(round-half-even(x[r, i] / s), -127, 127) for s = scale[r], or 0
// where s is not above zero (0, negative, NaN) or x[r, i] / s is NaN. QuantizeRows' q is this of
// its own scale.
void QuantizeRowsByScale(std::span<const float> x, std::span<const float> scale,
                         std::span<int8_t> q, int64_t rows, int64_t cols);
// The int8 weight scales' refresh from a weight (docs/model.md, "Linears"), in pieces: `maxima`
// holds one value per row of a matrix of `cols` columns, and each element of x, element `begin`
// onwards of the matrix in row-major order, folds its |x| into its row's: the larger, or NaN
// once the row has a NaN or an infinity. A maximum is exact, so neither the pieces nor their
// order change a bit. FoldMaxima folds another set of maxima (another rank's) in.
void FoldRowMaxima(std::span<const float> x, int64_t begin, int64_t cols, std::span<float> maxima);
void FoldMaxima(std::span<const float> from, std::span<float> into);
// scale[r] = the scale QuantizeRows gives a row whose fold is maxima[r]: maxima[r] / 127, or the
// canonical NaN for NaN.
void ScalesOfMaxima(std::span<const float> maxima, std::span<float> scale);
// y[m, n] = float(Σ_r qx[m, r]·qw[n, r]) · (sx[m] · sw[n]): the int32 sum exact (k <= kInt8MaxK),
// its conversion rounded to nearest even, the scale product rounded once, then one multiply.
void GemmI8XWt(std::span<const int8_t> qx, std::span<const float> sx, std::span<const int8_t> qw,
               std::span<const float> sw, std::span<float> y, int64_t m, int64_t n, int64_t k);
// GemmI8XWt against one weight many times (the KV-cache decoder's int8 linears): qw packed once in
// the layout the active variant's product reads (x86: the panels it otherwise packs on every
// call). Not part of the contract: GemmI8XWtPacked gives GemmI8XWt's bits, and under a variant
// whose layout differs from the packing's (or one that packs none, or the reference) it runs
// GemmI8XWt on qw itself.
struct I8Packing {
  std::span<const int8_t> w;       // the weight [n, k] (kept by the caller)
  int64_t n = 0, k = 0, form = 0;  // form: of the variant it was packed for (0: not packed)
  std::vector<std::byte, CacheLineAllocator<std::byte>> packed;  // read by aligned loads
};
I8Packing PackI8ForGemm(std::span<const int8_t> qw, int64_t n, int64_t k);
// The bytes PackI8ForGemm holds for a weight [n, k] under the active variant (0: it packs none).
uint64_t PackedI8Bytes(int64_t n, int64_t k);
void GemmI8XWtPacked(std::span<const int8_t> qx, std::span<const float> sx, const I8Packing& w,
                     std::span<const float> sw, std::span<float> y, int64_t m);
// The values QuantizeRows' q and scale stand for: y[r, i] = float(q[r, i]) · scale[r] (float(q)
// exact, then one multiply rounded to nearest even).
void DequantizeRows(std::span<const int8_t> q, std::span<const float> scale, std::span<float> y,
                    int64_t rows, int64_t cols);
// The block of HadamardRows along a row of `length`: the largest of 64, 16, 4 and 1 dividing it
// (a power of 4, so that the orthonormal factor 1/√block is a power of two).
int64_t HadamardBlock(int64_t length);
// Each row of x[rows, cols] (transpose = false: y[rows, cols], y may be x itself) or of xᵀ
// (transpose = true: y[cols, rows], disjoint from x), rotated block by block by the orthonormal
// Hadamard matrix of HadamardBlock(the row's length): the int8 backward's rotation along the
// length its GEMM sums over (docs/numerics.md, "Int8").
void HadamardRows(std::span<const float> x, std::span<float> y, int64_t rows, int64_t cols,
                  bool transpose);
// QuantizeRows of HadamardRows(x, transpose), in one pass with no rotated matrix in memory: q
// and scale are QuantizeRows' of the rotated rows (q[rows, cols] and scale[rows], or q[cols,
// rows] and scale[cols] when transposed), bit for bit. The int8 backward's operands.
void HadamardQuantizeRows(std::span<const float> x, std::span<int8_t> q, std::span<float> scale,
                          int64_t rows, int64_t cols, bool transpose);

// ---- row reductions (canonical lane rule) ---------------------------------------------------
// out[r] for each row of x[rows, cols]: lane j (of kReductionLanes) accumulates elements
// j, j+16, j+32, ... in order from its start value; lanes are then folded pairwise
// (lane j += lane j+8, then j+4, j+2, j+1) and lane 0 is the result.
void RowSum(std::span<const float> x, std::span<float> out, int64_t rows, int64_t cols);
void RowSumSquares(std::span<const float> x, std::span<float> out, int64_t rows, int64_t cols);
// NaN if any element is NaN, else the maximum (-inf for cols == 0).
void RowMax(std::span<const float> x, std::span<float> out, int64_t rows, int64_t cols);

// ---- element-wise helpers -------------------------------------------------------------------
// y[i] += x[i] (in place on y; used to accumulate gradients across microbatches).
void AddInto(std::span<const float> x, std::span<float> y);
// y[i] = WidenBf16(NarrowToBf16(x[i])) (lockstep/tensor.h): each value rounded to the nearest
// bfloat16 and kept as the binary32 of that value -- how a tensor stored as bf16 is made
// (docs/numerics.md, "bf16"). y is x (in place) or apart from it; the one-argument form is in
// place.
void RoundToBf16(std::span<const float> x, std::span<float> y);
inline void RoundToBf16(std::span<float> x) { RoundToBf16(x, x); }
// y[i] = NarrowToBf16(x[i]): x stored as bf16 (exact where x holds bfloat16 values, as RoundToBf16
// leaves them); and y[i] = WidenBf16(x[i]), always exact.
void ToBf16(std::span<const float> x, std::span<BFloat16> y);
void FromBf16(std::span<const BFloat16> x, std::span<float> y);

// ---- RMSNorm --------------------------------------------------------------------------------
// y[r,:] = x[r,:] * rstd[r] (* gain), rstd[r] = 1 / sqrt(sumsq(x[r,:]) * (1/d) + eps).
// gain may be empty (gain-free norm, e.g. QK-norm). y may alias x.
void RmsNormForward(std::span<const float> x, std::span<const float> gain, float eps,
                    std::span<float> y, std::span<float> rstd, int64_t rows, int64_t d);
// dx from dy; dgain (overwritten, same size as gain, empty iff gain is empty) reduced over rows
// in row order. dx may alias dy.
void RmsNormBackward(std::span<const float> dy, std::span<const float> x,
                     std::span<const float> gain, std::span<const float> rstd,
                     std::span<float> dx, std::span<float> dgain, int64_t rows, int64_t d);

// ---- RoPE (rotate-half convention) ----------------------------------------------------------
// Tables cos/sin[seq, head_dim/2]: angle(t, i) = t * theta^(-2i/head_dim), sin/cos from dmath.
struct RopeTable {
  int64_t seq = 0, half = 0;
  std::vector<float> cos, sin;
};
RopeTable MakeRopeTable(int64_t seq, int64_t head_dim, float theta);
// x[batch, seq, heads, head_dim]: row t of a sequence rotated at position first_position + t (t
// its index in seq; first_position > 0 continues a sequence, as decoding with a KV cache does:
// the table needs first_position + seq rows). y may alias x.
void RopeForward(std::span<const float> x, std::span<float> y, const RopeTable& table,
                 int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                 int64_t first_position = 0);
void RopeBackward(std::span<const float> dy, std::span<float> dx, const RopeTable& table,
                  int64_t batch, int64_t seq, int64_t heads, int64_t head_dim);

// ---- causal attention (grouped-query, optional sliding window, flash-style) -------------------
struct AttentionShape {
  int64_t batch = 1, seq = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  int64_t window = 0;  // 0: full causal; W > 0: query t sees keys t-W+1 .. t
  float scale = 0;     // score = scale * q·k (usually 1/sqrt(head_dim))
  // Keys before the queries (the forward only): the T queries are positions past .. past+T-1 of
  // sequences whose keys and values, k/v[B, past+T, Hkv, D], hold every position from 0 -- a KV
  // cache. A query's result depends only on its position, its vector and the keys it sees, so it
  // is the same whatever `past` and T are (docs/numerics.md, "Causal attention").
  int64_t past = 0;
};
inline constexpr int64_t kAttentionMaxPast = int64_t{1} << 40;
// q[B,T,Hq,D], k/v[B,past+T,Hkv,D] -> out[B,T,Hq,D], lse[B,Hq,T] (log-sum-exp of scaled scores).
void AttentionForward(const AttentionShape& s, std::span<const float> q,
                      std::span<const float> k, std::span<const float> v, std::span<float> out,
                      std::span<float> lse);
// Gradients dq[B,T,Hq,D], dk/dv[B,T,Hkv,D] (overwritten); s.past must be 0.
void AttentionBackward(const AttentionShape& s, std::span<const float> q,
                       std::span<const float> k, std::span<const float> v,
                       std::span<const float> out, std::span<const float> lse,
                       std::span<const float> dout, std::span<float> dq, std::span<float> dk,
                       std::span<float> dv);

// ---- SwiGLU ---------------------------------------------------------------------------------
// h[rows, 2*f] holds gate (columns 0..f-1) then up (f..2f-1) per row (one fused weight).
// out[rows, f] = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
void SwigluForward(std::span<const float> h, std::span<float> out, int64_t rows, int64_t f);
// dh[rows, 2*f] from dout[rows, f].
void SwigluBackward(std::span<const float> h, std::span<const float> dout, std::span<float> dh,
                    int64_t rows, int64_t f);

// ---- embedding ------------------------------------------------------------------------------
// out[n, d] = table[ids[i], :]; every id must be < vocab.
void EmbeddingForward(std::span<const float> table, std::span<const uint32_t> ids,
                      std::span<float> out, int64_t vocab, int64_t d);
// Accumulates: dtable[ids[i], :] += dout[i, :] for i = 0, 1, ..., n-1 in that order.
void EmbeddingBackward(std::span<const float> dout, std::span<const uint32_t> ids,
                       std::span<float> dtable, int64_t vocab, int64_t d);

// ---- fused output head + cross-entropy + z-loss -----------------------------------------------
// logits[r, v] = h[r,:] · w[v,:] are produced vocab_chunk columns at a time. Per row:
// lse = log(sum_v exp(logits)), loss = lse - logits[target], zloss = z * lse². Results do not
// depend on vocab_chunk (which must be a positive multiple of kGemmKChunk). The logits are not
// stored whole unless the caller passes `logits` (rows*vocab floats): the forward then leaves
// them there (chunk v0 as rows x cols floats from rows*v0), and the backward, given the same
// buffer, uses them instead of computing them again (the same GEMM, so the same bits) and
// overwrites it.
struct CrossEntropyShape {
  int64_t rows = 0, d = 0, vocab = 0;
  int64_t vocab_chunk = 4096;
  float z_loss = 0;  // coefficient of lse²
};
// loss[rows], zloss[rows], lse[rows].
void CrossEntropyForward(const CrossEntropyShape& s, std::span<const float> h,
                         std::span<const float> w, std::span<const uint32_t> targets,
                         std::span<float> loss, std::span<float> zloss, std::span<float> lse,
                         std::span<float> logits = {});
// Gradient of grad_scale * sum_r (loss[r] + zloss[r]) given lse from the forward:
// dh[rows, d] overwritten; dw[vocab, d] accumulated (+=) row by row of the vocab.
void CrossEntropyBackward(const CrossEntropyShape& s, std::span<const float> h,
                          std::span<const float> w, std::span<const uint32_t> targets,
                          std::span<const float> lse, float grad_scale, std::span<float> dh,
                          std::span<float> dw, std::span<float> logits = {});

// ---- AdamW ----------------------------------------------------------------------------------
struct AdamWParams {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  int64_t step = 1;  // 1-based: the step this update makes
};
// In place on param, m, v (decoupled weight decay, bias correction via dmath::Pow).
void AdamWUpdate(const AdamWParams& p, std::span<float> param, std::span<const float> grad,
                 std::span<float> m, std::span<float> v);

// The fp32 constants of one AdamW step (docs/numerics.md, "Per-step scalars"), each rounded once.
struct AdamWScalars {
  float decay;  // 1 - lr*wd
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float sqrt_bc2;   // sqrt(1 - beta2^step)
  float eps;
  float step_size;  // lr / (1 - beta1^step)
};
// The scalars of `p`, after checking its arguments as AdamWUpdate does (for a device's kernel).
AdamWScalars AdamWScalarsOf(const AdamWParams& p);

// ---- global gradient norm and clipping ------------------------------------------------------
// sqrt of the sum of squares of every element of every tensor, in list order (docs/numerics.md:
// fp64 lanes per kNormBlock block, blocks and tensors added in order), rounded to fp32.
float GlobalNorm(std::span<const std::span<const float>> tensors);
// GlobalNorm in pieces, for gradients that do not fit in memory at once (the same bits):
// AddTensorSquares continues a tensor's sum S (step 3, starting from 0.0) with its next piece,
// which must start at a kNormBlock boundary of the tensor; NormOfTensorSums adds the tensors'
// sums in order and takes the root (steps 4-5).
double AddTensorSquares(double running, std::span<const float> piece);
float NormOfTensorSums(std::span<const double> tensor_sums);
// The same in blocks, for gradients spread over processes: BlockSquares gives the sum of each
// kNormBlock block of `piece` (which starts at a block boundary of its tensor), the values
// AddTensorSquares adds in order; NormOfBlockSums adds tensor t's blocks[t] sums to 0.0 in order
// (tensors in list order, their blocks concatenated in block_sums), then NormOfTensorSums.
std::vector<double> BlockSquares(std::span<const float> piece);
float NormOfBlockSums(std::span<const double> block_sums, std::span<const int64_t> blocks);
// min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0 (clipping off).
float ClipFactor(float norm, float max_norm);
// x[i] *= factor.
void Scale(std::span<float> x, float factor);
// Words [first, first + out.size()) of the Philox4x32-10 stream under `key`: word g is word
// g % 4 of Philox4x32({low 32 bits of g / 4, high 32 bits, 0, 0}, key) (vector forms where the
// SIMD target has them: the same words). On the calling thread.
void PhiloxWords(PhiloxKey key, uint64_t first, std::span<uint32_t> out);
// x[i] = dmath::Erfinv(x[i]) (vector forms where the SIMD target has them: the same bits). On
// the calling thread: the truncated-normal init calls it per block from its own tasks.
void ErfinvInPlace(std::span<float> x);
// The init's first approximation of erfinv (docs/model.md, "Initialisation"), for
// 0 < |x[i]| <= 0.9545: within 2 ulp of erfinv, odd bit for bit, the same bits on every ISA; not
// part of the contract (the init corrects it exactly by its table). On the calling thread.
void InitErfinvFirstApproximationInPlace(std::span<float> x);

// The truncated-normal init's erfinv (docs/model.md, "Initialisation"). A draw word w gives
// k = w >> 8 and the argument (float)(2k + 1 - 2^24) * 2^-24 * dmath::Erf((float)sqrt 2) (exact
// but for the last multiply's one rounding): InitErfinvArgument(w), never 0, below 1 in magnitude.
float InitErfinvArgument(uint32_t word);
// The init's table: for each k >= 2^23, bits(dmath::Erfinv(x_k)) minus the bits of the init's
// first approximation of x_k = InitErfinvArgument(k << 8), in -2 .. 2 for every k, stored as four
// bits d + 8 (entry a = k - 2^23 in bits 4 (a mod 8) .. of word a / 8). Made from the kernels
// themselves at the first call, on every thread (so never called first from inside a parallel
// task), and kept for the process: kInitErfinvTableBytes.
inline constexpr uint64_t kInitErfinvTableBytes = uint64_t{1} << 22;
std::span<const uint32_t> InitErfinvTable();
// Whether InitErfinvTable() has been made in this process.
bool InitErfinvTableMade();
// out[i] = scale * dmath::Erfinv(InitErfinvArgument(words[i])) (the product rounded once), from
// the first approximation and InitErfinvTable(), which must have been made: x_{2^24-1-k} = -x_k
// and both functions are odd bit for bit, so entry k serves both signs. On the calling thread.
void InitErfinvByTable(std::span<const uint32_t> words, float scale, std::span<float> out);
// Replaces every NaN in x by the canonical quiet NaN (dmath::kCanonicalNaNBits); returns how
// many it replaced. Elementwise, so every ISA and thread count gives the same bits.
int64_t CanonicalizeNaNs(std::span<float> x);

}  // namespace lockstep::rk

// ---- deterministic math ---------------------------------------------------------------------
// Fixed-operation-order functions whose bits are the same on every CPU and compiler: SLEEF's
// deterministic no-FMA family (Sleef_cinz_*_u10) and lockstep's own polynomials. Never libm.
namespace lockstep::dmath {
// The one NaN the contract produces: positive, quiet, payload zero (docs/numerics.md, "NaN").
// Hardware disagrees on NaN bits (x86's default NaN is 0xffc00000, Arm's 0x7fc00000, and which
// operand's payload an FMA propagates depends on the instruction form), so every function below
// returns this NaN for any NaN result.
inline constexpr uint32_t kCanonicalNaNBits = 0x7fc00000u;
inline float Canonical(float x) {
  return x != x ? std::bit_cast<float>(kCanonicalNaNBits) : x;
}
float Exp(float x);
float Log(float x);
float Sqrt(float x);   // IEEE correctly rounded
float Rsqrt(float x);  // 1 / Sqrt(x), both correctly rounded
float Sin(float x);
float Cos(float x);
float Pow(float x, float y);
float Erf(float x);
float Erfinv(float x);  // lockstep's (SLEEF has none): Giles polynomial + one fp64 Newton step
}  // namespace lockstep::dmath

// ---- variant sweep (used by `lockstep selftest` and the tests) ------------------------------
namespace lockstep::rk {
struct SweepResult {
  Isa isa;
  int threads = 1;
  bool equal = false;        // bit-identical to the reference at 1 thread
  int64_t first_diff = -1;   // first differing float index, -1 if none
  int64_t size = 0;          // floats produced (a size mismatch is reported as first_diff 0)
};
// Runs `run` (which returns the op's outputs concatenated) with the reference at one thread,
// then with every usable variant (reference included) at each thread count, and compares the
// bytes. Restores the previously active variant and thread count.
std::vector<SweepResult> SweepVariants(const std::function<std::vector<float>()>& run,
                                       std::span<const int> thread_counts);
inline constexpr int kSweepThreadCounts[] = {1, 2, 3, 4, 7};
}  // namespace lockstep::rk

// ---- the op table ---------------------------------------------------------------------------
// Every op a training step records (docs/disputes.md, "The op catalogue"), described once: its
// name, scalar arguments, input and output roles, the kernel it runs and that kernel run from
// recorded values. The model's and the trainer's calls are checked against it when observed, the
// trace reader refuses records that do not fit it, the referee recomputes through it, the
// selftest runs every entry on every variant, and a test ties docs/disputes.md's catalogue to it.
namespace lockstep::rk {

enum class Op : uint8_t {
  kEmbeddingFwd,
  kRmsNormFwd,
  kGemmXWt,
  kRopeFwd,
  kAttentionFwd,
  kAddInto,
  kSwigluFwd,
  kCrossEntropyFwd,
  kRowSum,
  kCrossEntropyBwd,
  kRmsNormBwd,
  kCopy,
  kGemmDyW,
  kGemmDytX,
  kSwigluBwd,
  kAttentionBwd,
  kRopeBwd,
  kEmbeddingBwd,
  kBlockSquares,
  kCanonicalizeNaNs,
  kGlobalNorm,
  kScale,
  kAdamW,
  kQuantizeRows,
  kGemmI8XWt,
  kDequantizeRows,
  kHadamardQuantizeRows,
  kQuantizeRowsByScale,
  kRoundToBf16,
  kToBf16,
  kFromBf16,
  kCount
};

using lockstep::Dtype;  // the dtypes of lockstep/tensor.h
using lockstep::DtypeName;

// A tensor an op reads or writes. An optional role is absent from some calls (a gain-free
// RMSNorm, a GEMM that does not accumulate).
struct OpRole {
  std::string_view name;
  Dtype dtype = Dtype::kF32;
  bool optional = false;
};

// An op's scalar arguments by name and tensors by role, each in its dtype, as a trace records
// and a dump reveals them. The accessors fail naming what is missing.
struct OpValues {
  std::map<std::string, double, std::less<>> args;
  std::map<std::string, HostTensor, std::less<>> tensors;
  // The most elements the run may allocate for one output or table. The referee sets it to the
  // largest output the disputed records commit to, so that arguments forged to be huge are
  // refused before anything of their size is allocated.
  int64_t allocation_limit = std::numeric_limits<int64_t>::max();

  double Arg(std::string_view name) const;
  int64_t Int(std::string_view name) const;  // fails unless an integer in int64's range
  // An optional argument: `absent` when the call has none.
  int64_t IntOr(std::string_view name, int64_t absent) const {
    return args.contains(name) ? Int(name) : absent;
  }
  float Float(std::string_view name) const { return static_cast<float>(Arg(name)); }
  bool Has(std::string_view role) const { return tensors.contains(role); }
  // Tensor `role`, which must have T's dtype (failing, naming the role and both dtypes).
  template <Element T>
  std::span<const T> Get(std::string_view role) const {
    return Tensor(role, kDtypeOf<T>).template As<T>();
  }
  std::span<const float> F(std::string_view role) const { return Get<float>(role); }
  std::span<const uint32_t> U(std::string_view role) const { return Get<uint32_t>(role); }
  std::span<const double> D(std::string_view role) const { return Get<double>(role); }
  // Sets tensor `role` to `values`; its elements, to be written.
  template <Element T>
  std::span<T> Put(std::string_view role, std::vector<T> values) {
    HostTensor& t = tensors[std::string(role)] = HostTensor(std::move(values));
    return t.As<T>();
  }
  // Sets tensor `role` to a copy of `values`.
  template <Element T>
  std::span<T> Put(std::string_view role, std::span<const T> values) {
    return Put(role, std::vector<T>(values.begin(), values.end()));
  }

 private:
  const HostTensor& Tensor(std::string_view role, Dtype dtype) const;
};

struct OpSpec {
  Op op;
  std::string_view name;    // as recorded, e.g. "gemm_xwt"
  std::string_view kernel;  // the kernel of docs/numerics.md it runs, e.g. "GemmXWt"
  std::vector<std::string_view> args, optional_args;
  std::vector<OpRole> inputs, outputs;  // in record order
  // The op on `in` (its args and inputs) with the active variant and threads: every output.
  void (*run)(const OpValues& in, OpValues& out);
  // A call on small ragged shapes holding the selftest's special values (SelftestFloats).
  OpValues (*sample)();
};

const OpSpec& Spec(Op op);
std::span<const OpSpec> OpTable();  // in Op order, which is the catalogue's
const OpSpec* FindOp(std::string_view name);  // null when no op has that name
// Whether a call's argument names and (role, dtype) lists fit `op`: every listed argument given
// and no other but the optional ones; the roles in the listed order, an optional one possibly
// left out, each with its listed dtype.
using RoleAndDtype = std::pair<std::string_view, Dtype>;
bool CallFits(const OpSpec& op, std::span<const std::string_view> args,
              std::span<const RoleAndDtype> inputs, std::span<const RoleAndDtype> outputs);

// The outputs of a run of `op`, as the contract compares two runs of it (the selftest, a device's
// known answers): each output role's bytes in the op's order (a role the run did not write left
// out), every NaN of a floating-point dtype made canonical but in the ops that fix their NaNs'
// bits (global_norm and adamw: docs/numerics.md, "NaN"), packed into 4-byte words, the last
// zero-padded.
std::vector<float> OutputWords(const OpSpec& op, const OpValues& values);

// Fixed test inputs: a 32-bit LCG mapped exactly to [-1, 1), with the special values every op
// meets (signed zeros, infinities, NaNs, subnormals, the normal range's ends, the edges of exp's
// and erfinv's ranges) spread sparsely over arrays of at least 16 × kSelftestSpecials.size().
extern const std::span<const float> kSelftestSpecials;
std::vector<float> SelftestFloats(int64_t n, uint32_t seed, bool specials = true);
std::vector<uint32_t> SelftestIds(int64_t n, uint32_t vocab, uint32_t seed);

}  // namespace lockstep::rk

namespace lockstep {

// ---- op calls on tensors the caller holds: the executor seam (docs/devices.md) ----------------
// An op's scalar arguments by name (integers and binary32 values are exact in a double).
struct OpArg {
  std::string_view name;
  double value = 0;
};
// A tensor an op reads, by role, tagged with its dtype (lockstep/tensor.h); and one it writes.
struct OpTensor {
  std::string_view role;
  TensorView view;
};
struct OpOutput {
  std::string_view role;
  MutableTensorView view;
};
// Runs ops of the op table somewhere other than the CPU kernels (a device: lockstep/device.h): Run
// returns true when it ran the op -- every output set, with the bits of the op's CPU kernel -- and
// false for an op it does not run, which the CPU kernel then runs.
//
// An executor may keep copies of host memory where it runs the ops (a device's memory), so that
// tensors stay there between ops: Keep names a long-lived host region it may keep copies of
// (the activations, the state in RAM), until Forget (called before the region is freed). An op's
// outputs in a kept region are then written to the copy only. Whoever touches a kept region on
// the host outside an op says so first: ToHost before reading `data` (the executor's newer bytes
// are copied back), HostWrites before writing it (the executor's copies are dropped). ObservedOp
// does both around an op the CPU runs and around an observer.
class OpExecutor {
 public:
  virtual ~OpExecutor() = default;
  virtual bool Run(rk::Op op, std::span<const OpArg> args, std::span<const OpTensor> inputs,
                   std::span<const OpOutput> outputs) = 0;
  virtual void Keep(TensorView /*region*/) {}
  virtual void Forget(TensorView /*region*/) {}
  virtual void ToHost(TensorView /*data*/) {}
  virtual void HostWrites(TensorView /*data*/) {}
  // Fails, naming the sizes, unless `bytes` in all (`detail` says of what), the largest of them
  // one buffer of `largest` bytes, fit where the ops run. Called before anything is kept.
  virtual void Plan(uint64_t /*bytes*/, uint64_t /*largest*/, std::string_view /*detail*/) {}
  // Bytes copied to where the ops run and back so far, and the bytes of the copies kept there
  // now (all zero on the CPU).
  struct Traffic {
    uint64_t to_device = 0, to_host = 0, kept = 0;
  };
  virtual Traffic traffic() const { return {}; }
};

}  // namespace lockstep
