// The x86 int8 GEMM: a register-blocked kernel over packed w and x (packed, or read in place), in
// one of two forms. Included by int8.cc, inside a namespace of its own per form, once or twice
// per x86 target, with
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
// Its entry points are Form's (PackedWBytes, PackW, GemmPackedW, and GemmTiled: the packing and
// the product in one call); it undefines both macros.
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
// The tile of sums kept in registers, kMr rows by kNr vectors of columns. vpdpbusd on AVX-512
// (two per cycle where the core has two 512-bit integer ports, five cycles each) needs at least
// ten sums in flight and, to stay ahead of its loads, many sums per load: 8 × 3 = 24 registers,
// with the 3 of the panel and the row's broadcast 28 of the 32. Elsewhere 6 × 2 = 12, which AVX2
// has beside its operands (16 registers). LOCKSTEP_I8_FOR_ROWS/COLS spell the tile's indices
// for the code that names each register.
#if LOCKSTEP_I8_DOT && HWY_TARGET == HWY_AVX3_DL
constexpr int64_t kMr = 8, kNr = 3;
#define LOCKSTEP_I8_FOR_ROWS(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)
#define LOCKSTEP_I8_FOR_COLS(F, i) F(i, 0) F(i, 1) F(i, 2)
#else
constexpr int64_t kMr = 6, kNr = 2;
#define LOCKSTEP_I8_FOR_ROWS(F) F(0) F(1) F(2) F(3) F(4) F(5)
#define LOCKSTEP_I8_FOR_COLS(F, i) F(i, 0) F(i, 1)
#endif
constexpr int64_t kRowsPerTask = 8 * kMr;
constexpr int64_t kKcGroups = 128;  // k in blocks of 128 groups: 24 KiB of an AVX-512 panel

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

// One group of a row of X: its 4 bytes as one int32.
HWY_INLINE int32_t GroupOf(const PackedX* x) {
  int32_t v;
  std::memcpy(&v, x, sizeof(v));
  return v;
}

// Where the tiles read X [m, k]: packed by PackX (group g of row i of block b at
// data + b·block + (g·kMr + i)·kGroup), or, in the dot form where k is a multiple of kGroup, X
// itself (rows past m read row m - 1, whose sums are never stored).
struct XOperand {
  const PackedX* data;
  bool packed;
  int64_t m, k, block;
  // The tile of rows from i0 (a multiple of kMr): where its row i's group g0 starts, and the
  // step from one group to the next.
  const PackedX* Row(int64_t i0, int64_t i, int64_t g0) const {
    return packed ? data + i0 / kMr * block + (g0 * kMr + i) * kGroup
                  : data + std::min(i0 + i, m - 1) * k + g0 * kGroup;
  }
  int64_t Step() const { return packed ? kMr * kGroup : kGroup; }
};

// Where a tile's sums go once its last block of k is added: y[i0 + i, j0 + j] for the tile's
// rows i < rows and columns j < cols, y's rows n apart, as float(acc - row_fix[i0 + i]) ·
// (sx[i0 + i] · sw[j0 + j]): the scale product rounded once, then one multiply.
struct TileOut {
  const int32_t* row_fix;
  const float* sx;
  const float* sw;
  float* y;
  int64_t i0, rows, j0, cols, n;
};

// The tile's kMr rows by kNr vectors of columns of sums (named variables a##i##c: row i, vector
// c, spelled by the tile's macros: an array of vectors would be kept in memory through the loop)
// plus kMr rows of X (group g of row i at rows[i] + g·step: XOperand) against `groups` groups of a
// packed panel, which is prefetched 64 groups ahead (the first row block of a task reads the panel
// from L3, whose latency 8 groups ahead left exposed: 64 measured 4-6 % faster at one thread on Zen
// 5, the same at two). The sums start at 0 where `first`, else at sums[kMr][kNr vectors]; they go
// to `out`'s rows of y where it is given (the last block of k), else back to `sums`. Only the
// first kVecs vectors of columns are computed, so that a panel's vectors past n cost nothing
// (n = 128 in 48-column panels would compute 144 columns). Not inlined: inlined into Task, GCC 12
// moved and spilled sums in the unrolled loop (measured 15 % slower).
template <int64_t kVecs>
LOCKSTEP_INT8_TILE HWY_NOINLINE void Accumulate(const PackedX* const* rows, int64_t step,
                                                const PackedW* w, int64_t groups, int32_t* sums,
                                                bool first, const TileOut* out) {
  const D32 d;
  const auto lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t stride = kNr * lanes;
  const hn::ScalableTag<PackedW> dw;
#define LOCKSTEP_I8_LOAD(i, c) \
  V32 a##i##c = first || c >= kVecs ? hn::Zero(d) : hn::Load(d, sums + i * stride + c * lanes);
#define LOCKSTEP_I8_LOAD_ROW(i) LOCKSTEP_I8_FOR_COLS(LOCKSTEP_I8_LOAD, i)
  LOCKSTEP_I8_FOR_ROWS(LOCKSTEP_I8_LOAD_ROW)
#define LOCKSTEP_I8_ROW(i) const PackedX* const x##i = rows[i];
  LOCKSTEP_I8_FOR_ROWS(LOCKSTEP_I8_ROW)
  int64_t at = 0;
#pragma GCC unroll 4
  for (int64_t g = 0; g < groups; ++g, w += stride * kGroup, at += step) {
#define LOCKSTEP_I8_PANEL(i, c)                                           \
  if (c < kVecs) __builtin_prefetch(w + (64 * kNr + c) * lanes * kGroup); \
  const V32 w##c = c < kVecs ? hn::BitCast(d, hn::Load(dw, w + c * lanes * kGroup)) : hn::Zero(d);
    LOCKSTEP_I8_FOR_COLS(LOCKSTEP_I8_PANEL, 0)
#define LOCKSTEP_I8_STEP(i, c) \
  if (c < kVecs) a##i##c = GroupStep(a##i##c, w##c, xv);
#define LOCKSTEP_I8_STEP_ROW(i)                    \
  {                                                \
    const V32 xv = hn::Set(d, GroupOf(x##i + at)); \
    LOCKSTEP_I8_FOR_COLS(LOCKSTEP_I8_STEP, i)      \
  }
    LOCKSTEP_I8_FOR_ROWS(LOCKSTEP_I8_STEP_ROW)
  }
  if (out == nullptr) {
#define LOCKSTEP_I8_STORE(i, c) \
  if (c < kVecs) hn::Store(a##i##c, d, sums + i * stride + c * lanes);
#define LOCKSTEP_I8_STORE_ROW(i) LOCKSTEP_I8_FOR_COLS(LOCKSTEP_I8_STORE, i)
    LOCKSTEP_I8_FOR_ROWS(LOCKSTEP_I8_STORE_ROW)
    return;
  }
  // The epilogue: vector c of the columns holds `out->cols - c·lanes` of them (none past n;
  // neither their scales nor y are touched there), rows past out->rows are not stored.
  const hn::RebindToFloat<D32> df;
  const bool whole = out->cols >= stride;
  const float* sw = out->sw + out->j0;
#define LOCKSTEP_I8_SCALE(i, c)                                                                  \
  const auto m##c =                                                                              \
      hn::FirstN(df, static_cast<size_t>(std::clamp(out->cols - c * lanes, int64_t{0}, lanes))); \
  const auto sw##c =                                                                             \
      whole ? hn::LoadU(df, sw + c * lanes)                                                      \
            : (c * lanes < out->cols ? hn::MaskedLoad(m##c, df, sw + c * lanes) : hn::Zero(df));
  LOCKSTEP_I8_FOR_COLS(LOCKSTEP_I8_SCALE, 0)
#define LOCKSTEP_I8_Y(i, c)                                                                \
  {                                                                                        \
    const auto v = hn::Mul(hn::ConvertTo(df, hn::Sub(a##i##c, fix)), hn::Mul(sxv, sw##c)); \
    if (whole) {                                                                           \
      hn::StoreU(v, df, yr + c * lanes);                                                   \
    } else if (c * lanes < out->cols) {                                                    \
      hn::BlendedStore(v, m##c, df, yr + c * lanes);                                       \
    }                                                                                      \
  }
#define LOCKSTEP_I8_Y_ROW(i)                               \
  if (i < out->rows) {                                     \
    const V32 fix = hn::Set(d, out->row_fix[out->i0 + i]); \
    const auto sxv = hn::Set(df, out->sx[out->i0 + i]);    \
    float* yr = out->y + (out->i0 + i) * out->n + out->j0; \
    LOCKSTEP_I8_FOR_COLS(LOCKSTEP_I8_Y, i)                 \
  }
  LOCKSTEP_I8_FOR_ROWS(LOCKSTEP_I8_Y_ROW)
#undef LOCKSTEP_I8_LOAD
#undef LOCKSTEP_I8_LOAD_ROW
#undef LOCKSTEP_I8_ROW
#undef LOCKSTEP_I8_PANEL
#undef LOCKSTEP_I8_STEP
#undef LOCKSTEP_I8_STEP_ROW
#undef LOCKSTEP_I8_STORE
#undef LOCKSTEP_I8_STORE_ROW
#undef LOCKSTEP_I8_SCALE
#undef LOCKSTEP_I8_Y
#undef LOCKSTEP_I8_Y_ROW
}

// Rows [i_begin, i_end) (at most kRowsPerTask, i_begin a multiple of kMr) against panel p of
// packed W, into y. k runs in blocks of kKcGroups groups so that the panel's block and the
// rows' stay in L1 while every row block uses them; the sums of the blocks before the last wait
// in `sums`.
LOCKSTEP_INT8_TILE void Task(const XOperand& x, int64_t groups, const int32_t* row_fix,
                             const float* sx, const PackedW* panel, const float* sw, float* y,
                             int64_t i_begin, int64_t i_end, int64_t j0, int64_t n) {
  const auto lanes = static_cast<int64_t>(hn::Lanes(D32()));
  const int64_t stride = kNr * lanes, cols = std::min(stride, n - j0);
  const int64_t vecs = (cols + lanes - 1) / lanes;  // the panel's vectors of columns
  HWY_ALIGN int32_t sums[kRowsPerTask * kNr * hn::MaxLanes(D32())];
  for (int64_t g0 = 0;; g0 += kKcGroups) {  // (k = 0: one block of no groups, y = 0 · scale)
    const int64_t count = std::min(kKcGroups, groups - g0);
    const bool last = g0 + count >= groups;
    for (int64_t i0 = i_begin; i0 < i_end; i0 += kMr) {
      const TileOut out{row_fix, sx, sw, y, i0, std::min(kMr, i_end - i0), j0, cols, n};
      const PackedX* rows[kMr];
      for (int64_t i = 0; i < kMr; ++i) rows[i] = x.Row(i0, i, g0);
      const PackedW* w = panel + g0 * stride * kGroup;
      int32_t* tile_sums = sums + (i0 - i_begin) * stride;
      const TileOut* to = last ? &out : nullptr;
      if (vecs == kNr) {
        Accumulate<kNr>(rows, x.Step(), w, count, tile_sums, g0 == 0, to);
      } else if (vecs == 2) {
        Accumulate<2>(rows, x.Step(), w, count, tile_sums, g0 == 0, to);
      } else {
        Accumulate<1>(rows, x.Step(), w, count, tile_sums, g0 == 0, to);
      }
    }
    if (last) return;
  }
}

// The bytes of W [n, k] packed (PackW): panels of kNr vectors of columns, k's groups each.
int64_t PackedWBytes(int64_t n, int64_t k) {
  const auto lanes = static_cast<int64_t>(hn::Lanes(D32()));
  const int64_t groups = (k + kGroup - 1) / kGroup, panel_cols = kNr * lanes;
  return (n + panel_cols - 1) / panel_cols * groups * panel_cols * kGroup *
         int64_t{sizeof(PackedW)};
}

#if LOCKSTEP_I8_DOT
// Groups [g_begin, g_end) of a panel whose columns all exist and whose groups are all whole, four
// groups of four columns at a time: a 4×4 transpose (int8.cc's Transpose4x4) of 32-bit groups
// (each w + 128: w with its top bit flipped) from the rows of W at `rows` + j·k. Returns the first
// group it did not pack (g_end less the groups past a multiple of four). The scalar loop of PackW
// took 11 % of a 1024³ product, one gather per 16 groups 15 % of a 512×512×2048 one.
int64_t PackWholePanel(const int8_t* rows, int64_t k, int64_t g_begin, int64_t g_end,
                       PackedW* out) {
  const hn::Full128<int32_t> d;
  const auto flip = hn::Set(d, static_cast<int32_t>(0x80808080u));
  const int64_t panel_cols = kNr * static_cast<int64_t>(hn::Lanes(D32()));
  const auto load = [&](int64_t j, int64_t g) {
    return hn::Xor(hn::LoadU(d, reinterpret_cast<const int32_t*>(rows + j * k + g * kGroup)), flip);
  };
  int64_t g = g_begin;
  for (; g + 4 <= g_end; g += 4) {
    for (int64_t j = 0; j < panel_cols; j += 4) {
      PackedW* o = out + ((g - g_begin) * panel_cols + j) * kGroup;
      Transpose4x4(d, load(j, g), load(j + 1, g), load(j + 2, g), load(j + 3, g),
                   [&](int64_t c, hn::Vec<decltype(d)> v) {
                     hn::StoreU(v, d, reinterpret_cast<int32_t*>(o + c * panel_cols * kGroup));
                   });
    }
  }
  return g;
}
#endif

// W, column by column into its panel's [group][vector jj][lane][kGroup] layout; columns past n
// and k's padding are 0 (in the dot form stored as 0 + 128). A task packs every column of a
// panel over a block of kKcGroups groups, a range of the packing of its own: tasks of single
// columns would have two threads writing the same cache lines (at two threads that cost 10-25 %
// of a product at bench-8x512's shapes). In the dot form a panel of whole columns is transposed
// four by four (PackWholePanel) up to k's last whole group. PackWTasks counts the tasks,
// PackWTask packs one.
int64_t PackWTasks(int64_t n, int64_t k) {
  const int64_t groups = (k + kGroup - 1) / kGroup, panel_cols = kNr * hn::Lanes(D32());
  return (n + panel_cols - 1) / panel_cols * ((groups + kKcGroups - 1) / kKcGroups);
}

void PackWTask(const int8_t* qw, int64_t n, int64_t k, PackedW* wp, int64_t task) {
  const auto lanes = static_cast<int64_t>(hn::Lanes(D32()));
  const int64_t groups = (k + kGroup - 1) / kGroup, panel_cols = kNr * lanes;
  const int64_t panel_elems = groups * panel_cols * kGroup;
  const int64_t blocks = (groups + kKcGroups - 1) / kKcGroups;
  const int64_t j0 = task / blocks * panel_cols, g_begin = task % blocks * kKcGroups,
                g_end = std::min(groups, g_begin + kKcGroups);
  PackedW* panel = wp + task / blocks * panel_elems;
  int64_t g_first = g_begin;  // the first group the loop below packs
#if LOCKSTEP_I8_DOT
  if (j0 + panel_cols <= n) {
    g_first =
        PackWholePanel(qw + j0 * k, k, g_begin, std::max(g_begin, std::min(g_end, k / kGroup)),
                       panel + g_begin * panel_cols * kGroup);
  }
#endif
  for (int64_t jj = 0; jj < panel_cols; ++jj) {
    const int64_t j = j0 + jj;
    PackedW* out = panel + (g_first * panel_cols + jj) * kGroup;
    const int8_t* row = qw + std::min(j, n - 1) * k;  // (a column past n reads nothing)
    int64_t g = g_first;
    for (; j < n && g < g_end && (g + 1) * kGroup <= k; ++g, out += panel_cols * kGroup) {
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
    for (; g < g_end; ++g, out += panel_cols * kGroup) {  // k's last group, columns past n
      for (int64_t t = 0; t < kGroup; ++t) {
        const int64_t r = g * kGroup + t;
        const int32_t v = j < n && r < k ? int32_t{row[r]} : 0;
        out[t] = static_cast<PackedW>(LOCKSTEP_I8_DOT ? v + 128 : v);
      }
    }
  }
}

void PackW(const int8_t* qw, int64_t n, int64_t k, PackedW* wp) {
  ParallelFor(PackWTasks(n, k), [&](int64_t task) { PackWTask(qw, n, k, wp, task); });
}

#if LOCKSTEP_I8_DOT
// A row's correction, 128·Σ_r x[r] modulo 2^32 (wrapping like the sums): the bytes as x + 128 (x
// with its top bit flipped) summed eight at a time in uint64 lanes, less 128 for each.
HWY_INLINE int32_t RowFix(const int8_t* x, int64_t k) {
  const hn::ScalableTag<uint8_t> d8;
  const hn::Repartition<uint64_t, decltype(d8)> d64;
  const auto n = static_cast<int64_t>(hn::Lanes(d8));
  const auto* u = reinterpret_cast<const uint8_t*>(x);
  auto acc = hn::Zero(d64);
  int64_t r = 0;
  for (; r + n <= k; r += n)
    acc = hn::Add(acc, hn::SumsOf8(hn::Xor(hn::LoadU(d8, u + r), hn::Set(d8, 0x80))));
  uint64_t sum = hn::GetLane(hn::SumOfLanes(d64, acc)) - 128u * static_cast<uint64_t>(r);
  for (; r < k; ++r) sum += static_cast<uint64_t>(int64_t{x[r]});
  return static_cast<int32_t>(static_cast<uint32_t>(sum) * 128u);
}
#endif

// Rows [b·kMr, b·kMr + kMr) of X [m, k] into `out` as Accumulate reads them: group g of row i
// at (g·kMr + i)·kGroup, `groups` groups, k's padding and rows past m zeros; and each row's
// correction (the dot form's 128·Σ x, wrapping like the sums; 0 in the widened form).
void PackX(const int8_t* qx, int64_t m, int64_t k, int64_t groups, int64_t b, PackedX* out,
           int32_t* row_fix) {
  const int64_t step = kMr * kGroup;
  for (int64_t ii = 0; ii < kMr; ++ii) {
    const int64_t i = b * kMr + ii;
    PackedX* col = out + ii * kGroup;
    if (i >= m) {
      for (int64_t g = 0; g < groups; ++g) std::fill_n(col + g * step, kGroup, PackedX{0});
      continue;
    }
    const int8_t* row = qx + i * k;
    int64_t g = 0;
#if LOCKSTEP_I8_DOT
    row_fix[i] = RowFix(row, k);
    for (; (g + 1) * kGroup <= k; ++g) std::memcpy(col + g * step, row + g * kGroup, kGroup);
#else
    row_fix[i] = 0;
    for (; (g + 1) * kGroup <= k; ++g) {
      col[g * step] = row[g * kGroup];
      col[g * step + 1] = row[g * kGroup + 1];
    }
#endif
    for (; g < groups; ++g) {  // k's last group, zero-padded
      for (int64_t t = 0; t < kGroup; ++t) {
        const int64_t r = g * kGroup + t;
        col[g * step + t] = r < k ? PackedX{row[r]} : PackedX{0};
      }
    }
  }
}

// X as the tiles read it, and the rows' corrections, made in `tasks` tasks of kMr rows each
// (Run): packed (PackX), or, where the tiles read X itself, its rows' sums alone. In scratch of
// the calling thread's. The dot form reads X in place where it can: its packing was a copy,
// which at a small n (2048×128×512, two threads) took more time than the product's loads it saved.
struct XPrep {
  XOperand x;
  const int8_t* qx;
  PackedX* xp;
  int32_t* row_fix;
  int64_t groups, tasks;

  XPrep(const int8_t* qx_in, int64_t m, int64_t k) : qx(qx_in) {
    groups = (k + kGroup - 1) / kGroup;
    tasks = (m + kMr - 1) / kMr;
    const int64_t block = groups * kMr * kGroup;
    const bool packed = !LOCKSTEP_I8_DOT || k % kGroup != 0;
    const int64_t x_bytes = packed ? tasks * block * int64_t{sizeof(PackedX)} : 0;
    float* a = ScratchFloats(Scratch::kGemmA, static_cast<size_t>((x_bytes + 3) / 4 + m));
    xp = reinterpret_cast<PackedX*>(a);
    row_fix = reinterpret_cast<int32_t*>(a + (x_bytes + 3) / 4);
    x = XOperand{packed ? xp : reinterpret_cast<const PackedX*>(qx), packed, m, k, block};
  }

  void Run(int64_t b) const {
    if (x.packed) {
      PackX(qx, x.m, x.k, groups, b, xp + b * x.block, row_fix);
      return;
    }
#if LOCKSTEP_I8_DOT
    for (int64_t i = b * kMr; i < std::min(x.m, b * kMr + kMr); ++i) {
      row_fix[i] = RowFix(qx + i * x.k, x.k);
    }
#endif
  }
};

// y = x · Wᵀ from X prepared (XPrep, every task run) and W packed by PackW.
void Product(const XPrep& prep, const float* sx, const PackedW* wp, const float* sw, float* y,
             int64_t m, int64_t n) {
  const auto lanes = static_cast<int64_t>(hn::Lanes(D32()));
  const int64_t panel_cols = kNr * lanes, panels = (n + panel_cols - 1) / panel_cols;
  const int64_t panel_elems = prep.groups * panel_cols * kGroup;
  const int64_t row_tasks = (m + kRowsPerTask - 1) / kRowsPerTask;
  ParallelFor(row_tasks * panels, [&](int64_t task) {
    const int64_t p = task % panels, i_begin = task / panels * kRowsPerTask;
    const int64_t i_end = std::min(m, i_begin + kRowsPerTask);
    Task(prep.x, prep.groups, prep.row_fix, sx, wp + p * panel_elems, sw, y, i_begin, i_end,
         p * panel_cols, n);
  });
}

// y = x · Wᵀ from W packed by PackW.
void GemmPackedW(const int8_t* qx, const float* sx, const PackedW* wp, const float* sw, float* y,
                 int64_t m, int64_t n, int64_t k) {
  const XPrep prep(qx, m, k);
  ParallelFor(prep.tasks, [&](int64_t b) { prep.Run(b); });
  Product(prep, sx, wp, sw, y, m, n);
}

// y = x · Wᵀ, W packed into scratch of the calling thread's for this call, in the same parallel
// loop as X's preparation (one wait for the threads fewer).
void GemmTiled(const int8_t* qx, const float* sx, const int8_t* qw, const float* sw, float* y,
               int64_t m, int64_t n, int64_t k) {
  auto* wp = reinterpret_cast<PackedW*>(
      ScratchFloats(Scratch::kGemmB, static_cast<size_t>((PackedWBytes(n, k) + 3) / 4)));
  const XPrep prep(qx, m, k);
  const int64_t w_tasks = PackWTasks(n, k);
  ParallelFor(w_tasks + prep.tasks, [&](int64_t t) {
    if (t < w_tasks) {
      PackWTask(qw, n, k, wp, t);
    } else {
      prep.Run(t - w_tasks);
    }
  });
  Product(prep, sx, wp, sw, y, m, n);
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
#undef LOCKSTEP_I8_FOR_ROWS
#undef LOCKSTEP_I8_FOR_COLS
