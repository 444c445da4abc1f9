// The x86 int8 GEMM: a register-blocked kernel over packed operands, in one of two forms. Included
// by int8.cc, inside a namespace of its own per form, once or twice per x86 target, with
//   LOCKSTEP_I8_DOT  1: the dot form, groups of G = 4 products per lane: vpdpbusd (AVX-512 VNNI
//                       on AVX3_DL, the VEX AVX-VNNI on AVX2) on u8 = w + 128 and s8 = x, which
//                       adds Σ (w + 128)·x = Σ w·x + 128·Σ x; the row's 128·Σ_r x[i, r] is
//                       subtracted at the end. The adds wrap modulo 2^32 (vpdpbusd, never the
//                       saturating vpdpbusds), and the exact result fits in int32
//                       (k <= kInt8MaxK), so the wrapped sum minus the correction is that result.
//                    0: the widened form, G = 2: vpmaddwd on int8 values widened to int16, a pair
//                       per lane (AVX2, AVX3).
//   LOCKSTEP_INT8_TILE  the function attribute that enables the form's instructions.
// Lane j of an int32 accumulator is output column j of its block; each step adds one group of G
// consecutive products along k to it. The sums are exact, so neither the form, the blocking nor
// the threads change a bit; the epilogue is the reference's float(acc) · (sx[i] · sw[j]).
// Defines PackedWBytes, PackW, GemmPackedW, GemmTiled (the three in one call) and Form (the
// entry points); undefines both macros.
#if LOCKSTEP_I8_DOT
constexpr int64_t kGroup = 4;
using PackedW = uint8_t;  // w + 128
using PackedX = int8_t;
#else
constexpr int64_t kGroup = 2;
using PackedW = int16_t;
using PackedX = int16_t;
#endif
static_assert(kGroup * sizeof(PackedW) == 4 && kGroup * sizeof(PackedX) == 4);
// Six rows by two vectors of sums: 12 registers, which AVX2 has beside the operands (more sums,
// on AVX-512, made GCC 12 keep them in memory).
constexpr int64_t kMr = 6, kNr = 2;
constexpr int64_t kRowsPerTask = 8 * kMr;
constexpr int64_t kKcGroups = 64;  // k in blocks of 64 groups: 8 KiB of an AVX-512 panel

using D32 = hn::ScalableTag<int32_t>;
using V32 = hn::Vec<D32>;

// acc + the products of one group: lane j of w holds column j's group, every lane of x the row's.
LOCKSTEP_INT8_TILE HWY_INLINE V32 GroupStep(V32 acc, V32 w, V32 x) {
#if LOCKSTEP_I8_DOT && HWY_TARGET == HWY_AVX3_DL
  return V32{_mm512_dpbusd_epi32(acc.raw, w.raw, x.raw)};
#elif LOCKSTEP_I8_DOT
  return V32{_mm256_dpbusd_avx_epi32(acc.raw, w.raw, x.raw)};
#elif HWY_TARGET == HWY_AVX3
  return hn::Add(acc, V32{_mm512_madd_epi16(w.raw, x.raw)});
#else
  return hn::Add(acc, V32{_mm256_madd_epi16(w.raw, x.raw)});
#endif
}

// One group of row x starting at element r: its 4 bytes as one int32.
HWY_INLINE int32_t GroupOf(const PackedX* x) {
  int32_t v;
  std::memcpy(&v, x, sizeof(v));
  return v;
}

// sums[kMr rows][kNr vectors] (row stride kNr vectors) += rows x[0..kMr) against `groups`
// groups of a packed panel. The accumulators are named variables: an array of vectors would be
// kept in memory through the loop.
LOCKSTEP_INT8_TILE HWY_INLINE void Accumulate(const PackedX* const* x, const PackedW* w,
                                              int64_t groups, int32_t* sums) {
  static_assert(kMr == 6 && kNr == 2, "Accumulate is written for six rows of two vectors");
  const D32 d;
  const auto lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t stride = kNr * lanes;
#define LOCKSTEP_ACC_ROW(i)                     \
  V32 a##i##0 = hn::Load(d, sums + i * stride); \
  V32 a##i##1 = hn::Load(d, sums + i * stride + lanes);
  LOCKSTEP_ACC_ROW(0)
  LOCKSTEP_ACC_ROW(1)
  LOCKSTEP_ACC_ROW(2)
  LOCKSTEP_ACC_ROW(3)
  LOCKSTEP_ACC_ROW(4)
  LOCKSTEP_ACC_ROW(5)
#undef LOCKSTEP_ACC_ROW
  const PackedX *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3], *x4 = x[4], *x5 = x[5];
  const hn::ScalableTag<PackedW> dw;
#pragma GCC unroll 4
  for (int64_t g = 0; g < groups; ++g, w += stride * kGroup) {
    const V32 w0 = hn::BitCast(d, hn::Load(dw, w));
    const V32 w1 = hn::BitCast(d, hn::Load(dw, w + lanes * kGroup));
#define LOCKSTEP_ACC_STEP(i)                               \
  {                                                        \
    const V32 xv = hn::Set(d, GroupOf(x##i + g * kGroup)); \
    a##i##0 = GroupStep(a##i##0, w0, xv);                  \
    a##i##1 = GroupStep(a##i##1, w1, xv);                  \
  }
    LOCKSTEP_ACC_STEP(0)
    LOCKSTEP_ACC_STEP(1)
    LOCKSTEP_ACC_STEP(2)
    LOCKSTEP_ACC_STEP(3)
    LOCKSTEP_ACC_STEP(4)
    LOCKSTEP_ACC_STEP(5)
#undef LOCKSTEP_ACC_STEP
  }
#define LOCKSTEP_ACC_STORE(i)               \
  hn::Store(a##i##0, d, sums + i * stride); \
  hn::Store(a##i##1, d, sums + i * stride + lanes);
  LOCKSTEP_ACC_STORE(0)
  LOCKSTEP_ACC_STORE(1)
  LOCKSTEP_ACC_STORE(2)
  LOCKSTEP_ACC_STORE(3)
  LOCKSTEP_ACC_STORE(4)
  LOCKSTEP_ACC_STORE(5)
#undef LOCKSTEP_ACC_STORE
}

// Rows [i_begin, i_end) (at most kRowsPerTask) against panel p of packed W, into y. k runs in
// blocks of kKcGroups groups so that the panel's block and the rows' stay in L1 while every
// row block uses them.
LOCKSTEP_INT8_TILE void Task(const PackedX* xp, int64_t kp, const int32_t* row_fix, const float* sx,
                             const PackedW* panel, const float* sw, float* y, int64_t i_begin,
                             int64_t i_end, int64_t j0, int64_t n) {
  const D32 d;
  const hn::RebindToFloat<D32> df;
  const auto lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t stride = kNr * lanes, groups = kp / kGroup;
  HWY_ALIGN int32_t sums[(kRowsPerTask + kMr) * kNr * hn::MaxLanes(d)];
  std::fill(std::begin(sums), std::end(sums), 0);
  for (int64_t g0 = 0; g0 < groups; g0 += kKcGroups) {
    const int64_t count = std::min(kKcGroups, groups - g0);
    for (int64_t i0 = i_begin; i0 < i_end; i0 += kMr) {
      const PackedX* x[kMr];
      for (int64_t ii = 0; ii < kMr; ++ii) {
        x[ii] = xp + std::min(i0 + ii, i_end - 1) * kp + g0 * kGroup;  // past the end: repeated
      }
      Accumulate(x, panel + g0 * stride * kGroup, count, sums + (i0 - i_begin) * stride);
    }
  }
  // y = float(acc - fix) · (sx[i] · sw[j]): the scale product rounded once, then one multiply.
  HWY_ALIGN float part[hn::MaxLanes(df)];
  for (int64_t jj = 0; jj < kNr && j0 + jj * lanes < n; ++jj) {
    const int64_t j = j0 + jj * lanes, count = std::min(lanes, n - j);
    std::fill(part, part + lanes, 0.0f);
    std::copy(sw + j, sw + j + count, part);
    const auto swv = hn::Load(df, part);
    for (int64_t i = i_begin; i < i_end; ++i) {
      const V32 acc = hn::Load(d, sums + (i - i_begin) * stride + jj * lanes);
      const auto v = hn::Mul(hn::ConvertTo(df, hn::Sub(acc, hn::Set(d, row_fix[i]))),
                             hn::Mul(hn::Set(df, sx[i]), swv));
      if (count == lanes) {
        hn::StoreU(v, df, y + i * n + j);
      } else {
        hn::Store(v, df, part);
        std::copy(part, part + count, y + i * n + j);
      }
    }
  }
}

// The bytes of W [n, k] packed (PackW): panels of kNr vectors of columns, k's groups each.
int64_t PackedWBytes(int64_t n, int64_t k) {
  const auto lanes = static_cast<int64_t>(hn::Lanes(D32()));
  const int64_t groups = (k + kGroup - 1) / kGroup, panel_cols = kNr * lanes;
  return (n + panel_cols - 1) / panel_cols * groups * panel_cols * kGroup *
         int64_t{sizeof(PackedW)};
}

// W, column by column into its panel's [group][vector jj][lane][kGroup] layout; columns past n
// and k's padding are 0 (in the dot form stored as 0 + 128).
void PackW(const int8_t* qw, int64_t n, int64_t k, PackedW* wp) {
  const auto lanes = static_cast<int64_t>(hn::Lanes(D32()));
  const int64_t groups = (k + kGroup - 1) / kGroup, panel_cols = kNr * lanes;
  const int64_t panels = (n + panel_cols - 1) / panel_cols,
                panel_elems = groups * panel_cols * kGroup;
  ParallelFor(panels * panel_cols, [&](int64_t j) {
    PackedW* out = wp + j / panel_cols * panel_elems + j % panel_cols * kGroup;
    const int8_t* row = qw + std::min(j, n - 1) * k;  // (a column past n reads nothing)
    int64_t g = 0;
    for (; j < n && (g + 1) * kGroup <= k; ++g, out += panel_cols * kGroup) {  // whole groups
#if LOCKSTEP_I8_DOT
      uint32_t v;  // four int8 values; w + 128 as u8 is w with its top bit flipped
      std::memcpy(&v, row + g * kGroup, sizeof(v));
      v ^= 0x80808080u;
#else
      const uint32_t v = static_cast<uint16_t>(int16_t{row[g * kGroup]}) |
                         static_cast<uint32_t>(static_cast<uint16_t>(int16_t{row[g * kGroup + 1]}))
                             << 16;
#endif
      std::memcpy(out, &v, sizeof(v));
    }
    for (; g < groups; ++g, out += panel_cols * kGroup) {  // k's last group, columns past n
      for (int64_t t = 0; t < kGroup; ++t) {
        const int64_t r = g * kGroup + t;
        const int32_t v = j < n && r < k ? int32_t{row[r]} : 0;
        out[t] = static_cast<PackedW>(LOCKSTEP_I8_DOT ? v + 128 : v);
      }
    }
  });
}

// y = x · Wᵀ from W packed by PackW.
void GemmPackedW(const int8_t* qx, const float* sx, const PackedW* wp, const float* sw, float* y,
                 int64_t m, int64_t n, int64_t k) {
  const D32 d;
  const auto lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t kp = (k + kGroup - 1) / kGroup * kGroup, groups = kp / kGroup;
  const int64_t panel_cols = kNr * lanes, panels = (n + panel_cols - 1) / panel_cols;
  const int64_t panel_elems = groups * panel_cols * kGroup;
  // Scratch on the calling thread: packed X and the rows' corrections.
  const int64_t x_bytes = m * kp * int64_t{sizeof(PackedX)};
  float* a = ScratchFloats(Scratch::kGemmA, static_cast<size_t>((x_bytes + 3) / 4 + m));
  auto* xp = reinterpret_cast<PackedX*>(a);
  auto* row_fix = reinterpret_cast<int32_t*>(a + (x_bytes + 3) / 4);
  // X, row by row, padded with zeros to kp (in the dot form with k a multiple of 4, qx as it is);
  // in the dot form, each row's 128·Σ x (wrapping like the sums).
  const PackedX* x_rows = xp;
#if LOCKSTEP_I8_DOT
  if (kp == k) x_rows = qx;
#endif
  ParallelFor(m, [&](int64_t i) {
    const int8_t* row = qx + i * k;
    uint32_t sum = 0;
    for (int64_t r = 0; r < k; ++r) sum += static_cast<uint32_t>(int32_t{row[r]});
    row_fix[i] = LOCKSTEP_I8_DOT ? static_cast<int32_t>(sum * 128u) : 0;
    if (x_rows == xp) {
      PackedX* out = xp + i * kp;
      for (int64_t r = 0; r < k; ++r) out[r] = static_cast<PackedX>(row[r]);
      std::fill(out + k, out + kp, PackedX{0});
    }
  });
  const int64_t row_tasks = (m + kRowsPerTask - 1) / kRowsPerTask;
  ParallelFor(row_tasks * panels, [&](int64_t task) {
    const int64_t p = task % panels, i_begin = task / panels * kRowsPerTask;
    const int64_t i_end = std::min(m, i_begin + kRowsPerTask);
    Task(x_rows, kp, row_fix, sx, wp + p * panel_elems, sw, y, i_begin, i_end, p * panel_cols, n);
  });
}

void GemmTiled(const int8_t* qx, const float* sx, const int8_t* qw, const float* sw, float* y,
               int64_t m, int64_t n, int64_t k) {
  // W packed into scratch of the calling thread's, for this call.
  auto* wp = reinterpret_cast<PackedW*>(
      ScratchFloats(Scratch::kGemmB, static_cast<size_t>((PackedWBytes(n, k) + 3) / 4)));
  PackW(qw, n, k, wp);
  GemmPackedW(qx, sx, wp, sw, y, m, n, k);
}

// This form's entry points, for the variant's dispatch (int8.cc, WithForm), W packed as bytes;
// kId names the form and its vectors (1: dot on AVX-512, 2: widened on AVX-512, 3: dot on AVX2,
// 4: widened on AVX2), which a packing must match to be read.
struct Form {
  static constexpr int64_t kId = (HWY_TARGET == HWY_AVX2 ? 2 : 0) + (LOCKSTEP_I8_DOT ? 1 : 2);
  static void Gemm(const int8_t* qx, const float* sx, const int8_t* qw, const float* sw, float* y,
                   int64_t m, int64_t n, int64_t k) {
    GemmTiled(qx, sx, qw, sw, y, m, n, k);
  }
  static int64_t PackedBytes(int64_t n, int64_t k) { return PackedWBytes(n, k); }
  static void Pack(const int8_t* qw, int64_t n, int64_t k, uint8_t* out) {
    PackW(qw, n, k, reinterpret_cast<PackedW*>(out));
  }
  static void GemmPacked(const int8_t* qx, const float* sx, const uint8_t* packed, const float* sw,
                         float* y, int64_t m, int64_t n, int64_t k) {
    GemmPackedW(qx, sx, reinterpret_cast<const PackedW*>(packed), sw, y, m, n, k);
  }
};
#undef LOCKSTEP_I8_DOT
#undef LOCKSTEP_INT8_TILE
