#pragma OPENCL FP_CONTRACT OFF
// The int8 ops (docs/numerics.md, "Int8"): each output is the reference's expression -- integer
// sums exact in any order, one IEEE division, multiply or addition per float step -- so the work-
// group size and the work-items' order change nothing.

// An element quantized with its row's scale s (int8::Quantize): clamp(rint(x / s), -127, 127)
// (rint: to nearest, ties to even), or 0 where s is not above zero or x / s is NaN.
char quantize(float x, float s) {
  const float y = x / s;
  return s > 0.0f && !isnan(y) ? (char)clamp(rint(y), -127.0f, 127.0f) : (char)0;
}

// QuantizeRows: one work-item per row. The maximum of |x| is exact in any order; the scale is
// the canonical NaN for a row with a NaN or an infinity, else amax / 127.
__kernel void quantize_rows(__global const float* x, __global char* q, __global float* scale,
                            long rows, long cols) {
  const long r = get_global_id(0);
  if (r >= rows) return;
  __global const float* xr = x + r * cols;
  __global char* qr = q + r * cols;
  float amax = 0.0f;
  int finite = 1;
  for (long i = 0; i < cols; ++i) {
    finite = finite && isfinite(xr[i]);
    amax = fmax(amax, fabs(xr[i]));
  }
  const float s = finite ? amax / 127.0f : as_float(0x7fc00000u);
  scale[r] = s;
  for (long i = 0; i < cols; ++i) qr[i] = quantize(xr[i], s);
}

// QuantizeRowsByScale: one work-item per element.
__kernel void quantize_rows_by_scale(__global const float* x, __global const float* scale,
                                     __global char* q, long rows, long cols) {
  const long e = get_global_id(0);
  if (e >= rows * cols) return;
  q[e] = quantize(x[e], scale[e / cols]);
}

// GemmI8XWt: one work-item per block of 4 x 4 outputs, k in groups of 4 bytes packed into ints.
// k <= kInt8MaxK (checked by the host), so no int32 sum overflows and any order gives the same
// sum; then float(acc), rounded to nearest even, times the scale product. On NVIDIA's target the
// four products of a group are one dp4a.s32.s32 (wrapping, never a saturating form:
// scripts/ptx-check.sh requires it and forbids .sat and .satfinite); elsewhere four
// multiply-adds. I8_TILE (4) is defined by the host (MainProgram).

// Bytes r .. r + 3 of a row of k (zeros past k), as the four bytes of an int.
int pack4(__global const char* row, long r, long k, int aligned) {
  if (aligned) return *(__global const int*)(row + r);
  int v = 0;
  for (int b = 0; b < 4; ++b) v |= (r + b < k ? (int)(uchar)row[r + b] : 0) << (8 * b);
  return v;
}

// acc + the sum of the products of a's and b's four signed bytes.
int dot4(int a, int b, int acc) {
#ifdef __NVPTX__
  int d;
  __asm__("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(acc));
  return d;
#else
  const char4 x = as_char4(a), y = as_char4(b);
  return acc + (int)x.s0 * (int)y.s0 + (int)x.s1 * (int)y.s1 + (int)x.s2 * (int)y.s2 +
         (int)x.s3 * (int)y.s3;
#endif
}

__kernel void gemm_i8_xwt(__global const char* qx, __global const float* sx,
                          __global const char* qw, __global const float* sw, __global float* y,
                          long m, long n, long k) {
  const long blocks_n = (n + I8_TILE - 1) / I8_TILE;
  const long id = get_global_id(0);
  if (id >= (m + I8_TILE - 1) / I8_TILE * blocks_n) return;
  const long i0 = id / blocks_n * I8_TILE, j0 = id % blocks_n * I8_TILE;
  // Rows past m or n repeat the last one (their sums are not stored).
  __global const char* a[I8_TILE];
  __global const char* b[I8_TILE];
  #pragma unroll
  for (int t = 0; t < I8_TILE; ++t) {
    a[t] = qx + min(i0 + t, m - 1) * k;
    b[t] = qw + min(j0 + t, n - 1) * k;
  }
  const int aligned = k % 4 == 0;
  int acc[I8_TILE][I8_TILE];
  #pragma unroll
  for (int s = 0; s < I8_TILE; ++s) {
    #pragma unroll
    for (int t = 0; t < I8_TILE; ++t) acc[s][t] = 0;
  }
  for (long r = 0; r < k; r += 4) {
    int av[I8_TILE], bv[I8_TILE];
    #pragma unroll
    for (int t = 0; t < I8_TILE; ++t) {
      av[t] = pack4(a[t], r, k, aligned);
      bv[t] = pack4(b[t], r, k, aligned);
    }
    #pragma unroll
    for (int s = 0; s < I8_TILE; ++s) {
      #pragma unroll
      for (int t = 0; t < I8_TILE; ++t) acc[s][t] = dot4(av[s], bv[t], acc[s][t]);
    }
  }
  // Fixed trip counts, so that the block stays in registers (no stack frame: scripts/ptx-check.sh).
  #pragma unroll
  for (int s = 0; s < I8_TILE; ++s) {
    #pragma unroll
    for (int t = 0; t < I8_TILE; ++t) {
      if (i0 + s < m && j0 + t < n) {
        y[(i0 + s) * n + j0 + t] = convert_float_rte(acc[s][t]) * (sx[i0 + s] * sw[j0 + t]);
      }
    }
  }
}

// DequantizeRows: one work-item per element.
__kernel void dequantize_rows(__global const char* q, __global const float* scale,
                              __global float* y, long rows, long cols) {
  const long id = get_global_id(0);
  if (id >= rows * cols) return;
  y[id] = (float)q[id] * scale[id / cols];
}

// HadamardRows: one work-item per block of a row of x (transpose = 0) or of xᵀ (transpose = 1);
// `block` (HadamardBlock of the row's length) is 64, 16, 4 or 1. The butterflies at strides 1,
// 2, ..., block / 2, then the factor 1/√block.
__kernel void hadamard_rows(__global const float* x, __global float* y, long rows, long cols,
                            int transpose, long block) {
  const long lines = transpose ? cols : rows, len = transpose ? rows : cols;
  const long per_line = len / block;
  const long id = get_global_id(0);
  if (id >= lines * per_line) return;
  const long line = id / per_line, s = id % per_line * block;
  float v[64];
  for (long j = 0; j < block; ++j) {
    v[j] = transpose ? x[(s + j) * cols + line] : x[line * cols + s + j];
  }
  for (long h = 1; h < block; h *= 2) {
    for (long i = 0; i < block; i += 2 * h) {
      for (long j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
    }
  }
  const float factor = block == 64 ? 0.125f : block == 16 ? 0.25f : block == 4 ? 0.5f : 1.0f;
  for (long j = 0; j < block; ++j) y[line * len + s + j] = v[j] * factor;
}
