#pragma OPENCL FP_CONTRACT OFF
// The three GEMM forms (docs/numerics.md, "GEMM"): out(i, j) = sum over r of a(i, r) * b(r, j),
// with a(i, r) = A[i * a_i + r * a_r] and b(r, j) = B[r * b_r + j * b_j]. For each output:
// the reduced index in chunks of 256, each chunk s = fma(a, b, s) from +0 in increasing r, the
// chunk sums added in order to the output (its old value with accumulate, else the first chunk
// sum). A work-group computes a TILE_M x TILE_N block of outputs, each work-item REG_M x REG_N of
// them (rows ly + x * (TILE_M / REG_M), columns lx + y * (TILE_N / REG_N)), through k-slices of
// K_TILE terms staged in local memory. The tiling is set with -D at build time; it changes
// nothing but speed, since every output's chain is the same.

#define THREADS_M (TILE_M / REG_M)
#define THREADS_N (TILE_N / REG_N)
#define CHUNK 256

__kernel __attribute__((reqd_work_group_size(THREADS_N, THREADS_M, 1)))
void gemm(__global const float* A, long a_i, long a_r, __global const float* B, long b_r,
          long b_j, __global float* C, long rows, long cols, long reduced, int accumulate) {
  __local float a_tile[K_TILE][TILE_M];
  __local float b_tile[K_TILE][TILE_N];
  const int lx = get_local_id(0), ly = get_local_id(1);
  const int tid = ly * THREADS_N + lx;
  const long i0 = (long)get_group_id(1) * TILE_M, j0 = (long)get_group_id(0) * TILE_N;

  float out[REG_M][REG_N], sum[REG_M][REG_N];
  for (int x = 0; x < REG_M; ++x) {
    for (int y = 0; y < REG_N; ++y) {
      const long i = i0 + ly + x * THREADS_M, j = j0 + lx + y * THREADS_N;
      out[x][y] = (accumulate && i < rows && j < cols) ? C[i * cols + j] : 0.0f;
    }
  }
  for (long c0 = 0; c0 < reduced; c0 += CHUNK) {
    const long c1 = min(c0 + CHUNK, reduced);
    for (int x = 0; x < REG_M; ++x) {
      for (int y = 0; y < REG_N; ++y) sum[x][y] = 0.0f;
    }
    for (long k0 = c0; k0 < c1; k0 += K_TILE) {
      const int kn = (int)min((long)K_TILE, c1 - k0);
      // Stage the slice; elements outside the matrices are never used (the loop below stops at
      // kn, and rows or columns past the edge are not written).
      for (int e = tid; e < K_TILE * TILE_M; e += THREADS_M * THREADS_N) {
        // Along whichever index is contiguous in memory, for coalesced reads.
        const int kk = a_r == 1 ? e % K_TILE : e / TILE_M;
        const int ii = a_r == 1 ? e / K_TILE : e % TILE_M;
        const long i = i0 + ii, r = k0 + kk;
        a_tile[kk][ii] = (i < rows && kk < kn) ? A[i * a_i + r * a_r] : 0.0f;
      }
      for (int e = tid; e < K_TILE * TILE_N; e += THREADS_M * THREADS_N) {
        const int kk = b_r == 1 ? e % K_TILE : e / TILE_N;
        const int jj = b_r == 1 ? e / K_TILE : e % TILE_N;
        const long j = j0 + jj, r = k0 + kk;
        b_tile[kk][jj] = (j < cols && kk < kn) ? B[r * b_r + j * b_j] : 0.0f;
      }
      barrier(CLK_LOCAL_MEM_FENCE);
      for (int kk = 0; kk < kn; ++kk) {
        float a[REG_M], b[REG_N];
        for (int x = 0; x < REG_M; ++x) a[x] = a_tile[kk][ly + x * THREADS_M];
        for (int y = 0; y < REG_N; ++y) b[y] = b_tile[kk][lx + y * THREADS_N];
        for (int x = 0; x < REG_M; ++x) {
          for (int y = 0; y < REG_N; ++y) sum[x][y] = fma(a[x], b[y], sum[x][y]);
        }
      }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int x = 0; x < REG_M; ++x) {
      for (int y = 0; y < REG_N; ++y) {
        out[x][y] = (c0 == 0 && !accumulate) ? sum[x][y] : out[x][y] + sum[x][y];
      }
    }
  }
  for (int x = 0; x < REG_M; ++x) {
    for (int y = 0; y < REG_N; ++y) {
      const long i = i0 + ly + x * THREADS_M, j = j0 + lx + y * THREADS_N;
      if (i < rows && j < cols) C[i * cols + j] = out[x][y];
    }
  }
}
