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
// Staging: with DOUBLE_BUFFER 1, each work-item reads its share of the next k-slice from global
// memory into registers before it computes the current slice from local memory, and stores them
// into the other of two local buffers after (one barrier per slice, the loads' latency hidden
// behind the FMAs); with 0, it reads and stores a slice, then all compute it (two barriers per
// slice, one buffer: less local memory, which suits CPUs). Reads go along whichever index is contiguous in memory, four floats at a
// time as one aligned float4 where the strides allow (the buffers start aligned: OpenCL's
// CL_DEVICE_MEM_BASE_ADDR_ALIGN), else one by one.

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

// A work-item's groups of the slice k0 .. k0 + kn of matrix M (element (t, r) at
// M[t * t_stride + r * k_stride], rows t0 .. t_end - 1 of it in the tile) into `regs`; elements
// outside the matrix read as 0 (they are never used: the FMA loop stops at kn, and outputs past
// the edge are not written).
inline void read_slice(__global const float* M, long t_stride, long k_stride, long t0, long t_end,
                       long k0, int kn, int tile, int groups, int tid, float4* regs, int count) {
  const int k_contiguous = k_stride == 1;
  // One aligned float4: four elements along the contiguous index, starting at a multiple of 4
  // of it (k0 and t0 are multiples of K_TILE and tile), with the other stride a multiple of 4.
  const int vec = k_contiguous ? (K_TILE % 4 == 0 && t_stride % 4 == 0)
                               : (t_stride == 1 && tile % 4 == 0 && k_stride % 4 == 0);
  for (int g = 0; g < count; ++g) {
    const int group = tid + g * THREADS;
    float4 v = (float4)(0.0f);
    if (group < groups) {
      int kk, t;
      slice_index(4 * group, tile, k_contiguous, &kk, &t);
      const int whole = k_contiguous ? (t0 + t < t_end && kk + 3 < kn)
                                     : (kk < kn && t0 + t + 3 < t_end);
      if (vec && whole) {
        v = *(__global const float4*)(M + (t0 + t) * t_stride + (k0 + kk) * k_stride);
      } else {
        float e4[4];
        for (int u = 0; u < 4; ++u) {
          int uk, ut;
          slice_index(4 * group + u, tile, k_contiguous, &uk, &ut);
          const int inside = 4 * group + u < K_TILE * tile && t0 + ut < t_end && uk < kn;
          e4[u] = inside ? M[(t0 + ut) * t_stride + (k0 + uk) * k_stride] : 0.0f;
        }
        v = (float4)(e4[0], e4[1], e4[2], e4[3]);
      }
    }
    regs[g] = v;
  }
}

// The groups read by read_slice into the local slice buffer `to` ([K_TILE][tile]).
inline void store_slice(__local float* to, int tile, int k_contiguous, int groups, int tid,
                        const float4* regs, int count) {
  for (int g = 0; g < count; ++g) {
    const int group = tid + g * THREADS;
    if (group >= groups) continue;
    const float e4[4] = {regs[g].x, regs[g].y, regs[g].z, regs[g].w};
    for (int u = 0; u < 4; ++u) {
      if (4 * group + u >= K_TILE * tile) break;
      int kk, t;
      slice_index(4 * group + u, tile, k_contiguous, &kk, &t);
      to[kk * tile + t] = e4[u];
    }
  }
}

__kernel __attribute__((reqd_work_group_size(THREADS_N, THREADS_M, 1)))
void gemm(__global const float* A, long a_i, long a_r, __global const float* B, long b_r,
          long b_j, __global float* C, long rows, long cols, long reduced, int accumulate) {
  __local float a_tile[1 + DOUBLE_BUFFER][K_TILE * TILE_M];
  __local float b_tile[1 + DOUBLE_BUFFER][K_TILE * TILE_N];
  const int lx = get_local_id(0), ly = get_local_id(1);
  const int tid = ly * THREADS_N + lx;
  const long i0 = (long)get_group_id(1) * TILE_M, j0 = (long)get_group_id(0) * TILE_N;

  float out[REG_M][REG_N], sum[REG_M][REG_N];
  for (int x = 0; x < REG_M; ++x) {
    for (int y = 0; y < REG_N; ++y) {
      const long i = i0 + ly + x * THREADS_M, j = j0 + lx + y * THREADS_N;
      out[x][y] = (accumulate && i < rows && j < cols) ? C[i * cols + j] : 0.0f;
      sum[x][y] = 0.0f;
    }
  }
  if (reduced == 0) {
    // No terms: the output is its old value with accumulate, else +0.
    for (int x = 0; x < REG_M; ++x) {
      for (int y = 0; y < REG_N; ++y) {
        const long i = i0 + ly + x * THREADS_M, j = j0 + lx + y * THREADS_N;
        if (i < rows && j < cols) C[i * cols + j] = out[x][y];
      }
    }
    return;
  }
  float4 a_regs[REGS_A], b_regs[REGS_B];
  // k-slices never straddle a chunk (K_TILE divides 256), so slice k0 belongs to chunk k0 / 256.
#define READ(k0, kn)                                                                      \
  read_slice(A, a_i, a_r, i0, rows, k0, kn, TILE_M, GROUPS_A, tid, a_regs, REGS_A);       \
  read_slice(B, b_j, b_r, j0, cols, k0, kn, TILE_N, GROUPS_B, tid, b_regs, REGS_B)
#define STORE(buffer)                                                                     \
  store_slice(a_tile[buffer], TILE_M, a_r == 1, GROUPS_A, tid, a_regs, REGS_A);           \
  store_slice(b_tile[buffer], TILE_N, b_r == 1, GROUPS_B, tid, b_regs, REGS_B)
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
    if (next < reduced) READ(next, (int)min((long)K_TILE, reduced - next));
#else
    READ(k0, kn);
    STORE(0);
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
    __local const float* as = a_tile[buffer];
    __local const float* bs = b_tile[buffer];
    for (int kk = 0; kk < kn; ++kk) {
      float a[REG_M], b[REG_N];
      for (int x = 0; x < REG_M; ++x) a[x] = as[kk * TILE_M + ly + x * THREADS_M];
      for (int y = 0; y < REG_N; ++y) b[y] = bs[kk * TILE_N + lx + y * THREADS_N];
      for (int x = 0; x < REG_M; ++x) {
        for (int y = 0; y < REG_N; ++y) sum[x][y] = fma(a[x], b[y], sum[x][y]);
      }
    }
    // The chunk ends with this slice: its sum goes to the output, in chunk order.
    if (k0 + kn == reduced || next % CHUNK == 0) {
      for (int x = 0; x < REG_M; ++x) {
        for (int y = 0; y < REG_N; ++y) {
          out[x][y] = (k0 < CHUNK && !accumulate) ? sum[x][y] : out[x][y] + sum[x][y];
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
  for (int x = 0; x < REG_M; ++x) {
    for (int y = 0; y < REG_N; ++y) {
      const long i = i0 + ly + x * THREADS_M, j = j0 + lx + y * THREADS_N;
      if (i < rows && j < cols) C[i * cols + j] = out[x][y];
    }
  }
}
