#pragma OPENCL FP_CONTRACT OFF
// Element-wise ops (docs/numerics.md): one work-item per element, so nothing depends on the
// work-group size. Stored NaNs of AdamW are the canonical NaN 0x7fc00000.

#define CANONICAL(x) ((x) != (x) ? as_float(0x7fc00000u) : (x))

__kernel void add_into(__global const float* x, __global float* y, long n) {
  const long i = get_global_id(0);
  if (i < n) y[i] = y[i] + x[i];
}

__kernel void scale(__global float* x, float factor, long n) {
  const long i = get_global_id(0);
  if (i < n) x[i] = x[i] * factor;
}

__kernel void copy(__global const float* x, __global float* y, long n) {
  const long i = get_global_id(0);
  if (i < n) y[i] = x[i];
}

__kernel void canonicalize_nans(__global float* x, long n) {
  const long i = get_global_id(0);
  if (i < n) x[i] = CANONICAL(x[i]);
}

// docs/numerics.md, "bf16": round to nearest even on the bits, subnormals kept, NaN canonical.
// On the bits as integers, so that no device's float loads or stores can flush a subnormal. x
// and y may be one buffer (in place).
__kernel void round_to_bf16(__global const uint* x, __global uint* y, long n) {
  const long i = get_global_id(0);
  if (i >= n) return;
  const uint u = x[i];
  const uint rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  y[i] = (u & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : rounded;
}

// A tensor stored as bf16 (its bits: ushort) and read back exactly.
__kernel void to_bf16(__global const uint* x, __global ushort* y, long n) {
  const long i = get_global_id(0);
  if (i >= n) return;
  const uint u = x[i];
  y[i] = (u & 0x7fffffffu) > 0x7f800000u ? (ushort)0x7fc0u
                                         : (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__kernel void from_bf16(__global const ushort* x, __global uint* y, long n) {
  const long i = get_global_id(0);
  if (i < n) y[i] = (uint)x[i] << 16;
}

// The per-step scalars are the host's (rk::AdamWScalars, computed once per call as the contract
// says); per element:
//   m' = fma(beta1, m, omb1 * g); v' = fma(beta2, v, (omb2 * g) * g)
//   denom = sqrt(v') / sqrt_bc2 + eps; p' = fma(-step_size, m' / denom, p * decay)
__kernel void adamw(__global float* param, __global const float* grad, __global float* m,
                    __global float* v, float decay, float beta1, float one_minus_beta1,
                    float beta2, float one_minus_beta2, float sqrt_bc2, float eps,
                    float step_size, long n) {
  const long i = get_global_id(0);
  if (i >= n) return;
  const float g = grad[i];
  const float mi = fma(beta1, m[i], one_minus_beta1 * g);
  const float vi = fma(beta2, v[i], (one_minus_beta2 * g) * g);
  const float denom = sqrt(vi) / sqrt_bc2 + eps;
  const float p = fma(-step_size, mi / denom, param[i] * decay);
  param[i] = CANONICAL(p);
  m[i] = CANONICAL(mi);
  v[i] = CANONICAL(vi);
}

// SwiGLU (docs/numerics.md, "SwiGLU"), one work-item per (row, j): gate g = h[r, j], up
// u = h[r, f + j]; s = 1 / (1 + exp(-g)).
__kernel void swiglu_fwd(__global const float* h, __global float* out, long rows, long f) {
  const long e = get_global_id(0);
  if (e >= rows * f) return;
  const long r = e / f, j = e % f;
  const float g = h[r * 2 * f + j], u = h[r * 2 * f + f + j];
  const float s = 1.0f / (1.0f + dm_exp(-g));
  out[e] = (g * s) * u;
}

// dg = (dy * u) * (s * fma(g, 1 - s, 1)); du = dy * (g * s).
__kernel void swiglu_bwd(__global const float* h, __global const float* dout, __global float* dh,
                         long rows, long f) {
  const long e = get_global_id(0);
  if (e >= rows * f) return;
  const long r = e / f, j = e % f;
  const float g = h[r * 2 * f + j], u = h[r * 2 * f + f + j], dy = dout[e];
  const float s = 1.0f / (1.0f + dm_exp(-g));
  dh[r * 2 * f + j] = (dy * u) * (s * fma(g, 1.0f - s, 1.0f));
  dh[r * 2 * f + f + j] = dy * (g * s);
}
