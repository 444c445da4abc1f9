#pragma OPENCL FP_CONTRACT OFF
// The int8 ops (docs/numerics.md, "Int8"): each output is the reference's expression -- integer
// sums exact in any order, one IEEE division, multiply or addition per float step -- so the work-
// group size and the work-items' order change nothing.

// QuantizeRows: one work-item per row. The maximum of |x| is exact in any order; the scale is
// the canonical NaN for a row with a NaN or an infinity, else amax / 127; an element is
// clamp(rint(x / s), -127, 127) (rint: to nearest, ties to even) where s > 0, else 0.
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
  for (long i = 0; i < cols; ++i) {
    qr[i] = s > 0.0f ? (char)clamp(rint(xr[i] / s), -127.0f, 127.0f) : (char)0;
  }
}

// GemmI8XWt: one work-item per output. k <= kInt8MaxK (checked by the host), so the int32 sum
// cannot overflow; then float(acc), rounded to nearest even, times the scale product.
__kernel void gemm_i8_xwt(__global const char* qx, __global const float* sx,
                          __global const char* qw, __global const float* sw, __global float* y,
                          long m, long n, long k) {
  const long id = get_global_id(0);
  if (id >= m * n) return;
  const long i = id / n, j = id % n;
  __global const char* a = qx + i * k;
  __global const char* b = qw + j * k;
  int acc = 0;
  for (long r = 0; r < k; ++r) acc += (int)a[r] * (int)b[r];
  y[id] = convert_float_rte(acc) * (sx[i] * sw[j]);
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
