#pragma OPENCL FP_CONTRACT OFF
// The three GEMM forms (docs/numerics.md, "GEMM"): out(i, j) = sum over r of a(i, r) * b(r, j),
// with a(i, r) = A[i * a_i + r * a_r] and b(r, j) = B[r * b_r + j * b_j]. For each output:
// the reduced index in chunks of 256, each chunk s = fma(a, b, s) from +0 in increasing r, the
// chunk sums added in order to the output (its old value with accumulate, else the first chunk
// sum). A work-group computes a TILE_M x TILE_N block of outputs, each work-item REG_M x REG_N of
// them (rows ly + x * (TILE_M / REG_M), columns lx + y * (TILE_N / REG_N)), through k-slices of
// K_TILE terms staged in local memory. The tiling is set with -D at build time; it changes
// nothing but speed, since every output's chain is the same.
//
// Registers: every loop over a work-item's outputs, its staged groups or a group's four floats
// has a bound known at build time and is unrolled (UNROLL), and no private array is indexed by a
// value known only at run time, so the chunk sums and the staged groups stay in registers rather
// than in local memory (scripts/ptx-check.sh checks that ptxas gives the kernel no stack frame).
// The outputs themselves live in C between chunks: a chunk's end adds its sum to C's element
// (or writes it, for the first chunk without accumulate), which each work-item alone touches;
// that halves the registers a tile needs at the cost of one read and one write per output every
// 256 terms.
//
// Staging: with DOUBLE_BUFFER 1, each work-item reads its share of the next k-slice from global
// memory into registers before it computes the current slice from local memory, and stores them
// into the other of two local buffers after (one barrier per slice, the loads' latency hidden
// behind the FMAs); with 0, it reads and stores a slice, then all compute it (two barriers per
// slice, one buffer: less local memory, which suits CPUs). Reads go along whichever index is
// contiguous in memory, four floats at a time as one aligned float4 where the strides allow (the
// buffers start aligned: OpenCL's CL_DEVICE_MEM_BASE_ADDR_ALIGN), else one by one.

#define THREADS_M (TILE_M / REG_M)
#define THREADS_N (TILE_N / REG_N)
#define THREADS (THREADS_M * THREADS_N)
#define CHUNK 256
// A slice of A is K_TILE x TILE_M floats, of B K_TILE x TILE_N, read in groups of four: the
// groups each work-item holds in registers between the read and the store.
#define GROUPS_A ((K_TILE * TILE_M + 3) / 4)
#define GROUPS_B ((K_TILE * TILE_N + 3) / 4)
#define REGS_A ((GROUPS_A + THREADS - 1) / THREADS)
#define REGS_B ((GROUPS_B + THREADS - 1) / THREADS)
#define UNROLL _Pragma("unroll")

// Element e of a K_TILE x tile slice as (kk, t), numbered along the index contiguous in memory.
inline void slice_index(int e, int tile, int k_contiguous, int* kk, int* t) {
  if (k_contiguous) {
    *kk = e % K_TILE;
    *t = e / K_TILE;
  } else {
    *kk = e / tile;
    *t = e % tile;
  }
}

// Group `group` of the slice k0 .. k0 + kn of matrix M (element (t, r) at
// M[t * t_stride + r * k_stride], rows t0 .. t_end - 1 of it in the tile); elements outside the
// matrix read as 0 (they are never used: the FMA loop stops at kn, and outputs past the edge are
// not written).
inline float4 read_group(__global const float* M, long t_stride, long k_stride, long t0,
                         long t_end, long k0, int kn, int tile, int groups, int group) {
  if (group >= groups) return (float4)(0.0f);
  const int k_contiguous = k_stride == 1;
  // One aligned float4: four elements along the contiguous index, starting at a multiple of 4
  // of it (k0 and t0 are multiples of K_TILE and tile), with the other stride a multiple of 4.
  const int vec = k_contiguous ? (K_TILE % 4 == 0 && t_stride % 4 == 0)
                               : (t_stride == 1 && tile % 4 == 0 && k_stride % 4 == 0);
  int kk, t;
  slice_index(4 * group, tile, k_contiguous, &kk, &t);
  const int whole = k_contiguous ? (t0 + t < t_end && kk + 3 < kn)
                                 : (kk < kn && t0 + t + 3 < t_end);
  if (vec && whole) return *(__global const float4*)(M + (t0 + t) * t_stride + (k0 + kk) * k_stride);
  float e[4];
  UNROLL for (int u = 0; u < 4; ++u) {
    int uk, ut;
    slice_index(4 * group + u, tile, k_contiguous, &uk, &ut);
    const int inside = 4 * group + u < K_TILE * tile && t0 + ut < t_end && uk < kn;
    e[u] = inside ? M[(t0 + ut) * t_stride + (k0 + uk) * k_stride] : 0.0f;
  }
  return (float4)(e[0], e[1], e[2], e[3]);
}

// Group `group`, read by read_group, into the local slice buffer `to` ([K_TILE][tile]).
inline void store_group(__local float* to, int tile, int k_contiguous, int groups, int group,
                        float4 v) {
  if (group >= groups) return;
  const float e[4] = {v.x, v.y, v.z, v.w};
  UNROLL for (int u = 0; u < 4; ++u) {
    if (4 * group + u < K_TILE * tile) {
      int kk, t;
      slice_index(4 * group + u, tile, k_contiguous, &kk, &t);
      to[kk * tile + t] = e[u];
    }
  }
}

__kernel __attribute__((reqd_work_group_size(THREADS_N, THREADS_M, 1)))
void gemm(__global const float* A, long a_i, long a_r, __global const float* B, long b_r,
          long b_j, __global float* C, long rows, long cols, long reduced, int accumulate) {
  __local float a_tile[1 + DOUBLE_BUFFER][K_TILE * TILE_M];
  __local float b_tile[1 + DOUBLE_BUFFER][K_TILE * TILE_N];
  // `cols` as the chunk ends read it: from local memory, written before the first barrier, so
  // that the compiler, which cannot move a local load across a barrier, computes the outputs'
  // addresses at each chunk's end instead of keeping REG_M x REG_N 64-bit addresses live through
  // the k-loop (40 registers of 168 at 128x64/8x4 on sm_90).
  __local long cols_at_chunk_end[1];
  if (get_local_id(0) == 0 && get_local_id(1) == 0) cols_at_chunk_end[0] = cols;
  const int lx = get_local_id(0), ly = get_local_id(1);
  const int tid = ly * THREADS_N + lx;
  const long i0 = (long)get_group_id(1) * TILE_M, j0 = (long)get_group_id(0) * TILE_N;

  if (reduced == 0) {
    // No terms: the output is its old value with accumulate, else +0.
    if (!accumulate) {
      UNROLL for (int x = 0; x < REG_M; ++x) {
        UNROLL for (int y = 0; y < REG_N; ++y) {
          const long i = i0 + ly + x * THREADS_M, j = j0 + lx + y * THREADS_N;
          if (i < rows && j < cols) C[i * cols + j] = 0.0f;
        }
      }
    }
    return;
  }
  float sum[REG_M][REG_N];
  UNROLL for (int x = 0; x < REG_M; ++x) {
    UNROLL for (int y = 0; y < REG_N; ++y) sum[x][y] = 0.0f;
  }
  float4 a_regs[REGS_A], b_regs[REGS_B];
  // k-slices never straddle a chunk (K_TILE divides 256), so slice k0 belongs to chunk k0 / 256.
#define READ(k0, kn)                                                                          \
  UNROLL for (int g = 0; g < REGS_A; ++g)                                                     \
    a_regs[g] = read_group(A, a_i, a_r, i0, rows, k0, kn, TILE_M, GROUPS_A, tid + g * THREADS); \
  UNROLL for (int g = 0; g < REGS_B; ++g)                                                     \
    b_regs[g] = read_group(B, b_j, b_r, j0, cols, k0, kn, TILE_N, GROUPS_B, tid + g * THREADS)
#define STORE(buffer)                                                                         \
  UNROLL for (int g = 0; g < REGS_A; ++g)                                                     \
    store_group(a_tile[buffer], TILE_M, a_r == 1, GROUPS_A, tid + g * THREADS, a_regs[g]);    \
  UNROLL for (int g = 0; g < REGS_B; ++g)                                                     \
    store_group(b_tile[buffer], TILE_N, b_r == 1, GROUPS_B, tid + g * THREADS, b_regs[g])
  int buffer = 0;
#if DOUBLE_BUFFER
  READ(0, (int)min((long)K_TILE, reduced));
  STORE(0);
  barrier(CLK_LOCAL_MEM_FENCE);
#endif
  for (long k0 = 0; k0 < reduced; k0 += K_TILE) {
    const int kn = (int)min((long)K_TILE, reduced - k0);
    const long next = k0 + K_TILE;
#if DOUBLE_BUFFER
    if (next < reduced) {
      READ(next, (int)min((long)K_TILE, reduced - next));
    }
#else
    READ(k0, kn);
    STORE(0);
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
    __local const float* as = a_tile[buffer];
    __local const float* bs = b_tile[buffer];
    for (int kk = 0; kk < kn; ++kk) {
      float a[REG_M], b[REG_N];
      UNROLL for (int x = 0; x < REG_M; ++x) a[x] = as[kk * TILE_M + ly + x * THREADS_M];
      UNROLL for (int y = 0; y < REG_N; ++y) b[y] = bs[kk * TILE_N + lx + y * THREADS_N];
      UNROLL for (int x = 0; x < REG_M; ++x) {
        UNROLL for (int y = 0; y < REG_N; ++y) sum[x][y] = fma(a[x], b[y], sum[x][y]);
      }
    }
    // The chunk ends with this slice: its sum goes to the output, in chunk order.
    if (k0 + kn == reduced || next % CHUNK == 0) {
      const int first = k0 < CHUNK && !accumulate;
      UNROLL for (int x = 0; x < REG_M; ++x) {
        UNROLL for (int y = 0; y < REG_N; ++y) {
          const long i = i0 + ly + x * THREADS_M, j = j0 + lx + y * THREADS_N;
          const long c_cols = cols_at_chunk_end[0];
          if (i < rows && j < c_cols) {
            __global float* c = C + i * c_cols + j;
            *c = first ? sum[x][y] : *c + sum[x][y];
          }
          sum[x][y] = 0.0f;
        }
      }
    }
#if DOUBLE_BUFFER
    if (next < reduced) {
      // The other buffer was last read in the previous slice, which every work-item finished
      // before the barrier that ended it.
      STORE(buffer ^ 1);
      barrier(CLK_LOCAL_MEM_FENCE);
      buffer ^= 1;
    }
#else
    barrier(CLK_LOCAL_MEM_FENCE);  // before the next slice overwrites this one
#endif
  }
}
