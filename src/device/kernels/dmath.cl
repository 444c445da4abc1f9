#pragma OPENCL FP_CONTRACT OFF
// The contract's exp and log (docs/numerics.md, "Deterministic math"): the operation sequences
// of SLEEF 3.5.1's deterministic no-FMA family, Sleef_cinz_expf1_u10purec and
// Sleef_cinz_logf1_u10purec (src/libm/sleefsimdsp.c xexpf and xlogf_u1, with the double-float
// helpers of src/libm/df.h), written out: every `a * b + c` below is a multiply and then an add,
// as that family computes it. The constants are SLEEF's, as the binary32 values its C source
// rounds them to. Results are the canonical NaN for every NaN. scripts/dmath-exhaustive.sh
// compares both with the library on all 2^32 inputs; the tests on a sample of them.
// (Written by hand: no OpenCL library has these functions with these bits.)

#define DM_CANONICAL(x) ((x) != (x) ? as_float(0x7fc00000u) : (x))

// 2^q for q in [-126, 127], built from its bits.
float dm_pow2i(int q) { return as_float((uint)(q + 0x7f) << 23); }

float dm_exp(float d) {
  // rint is exact, and equals the family's rounding of d / ln 2 wherever it matters (|q| < 2^22;
  // beyond, the result is replaced below).
  const int q = convert_int_sat(rint(d * 0x1.715476p+0f));
  const float qf = (float)q;
  float s = qf * -0x1.62e4p-1f + d;
  s = qf * -0x1.7f7d1cp-20f + s;
  float u = 0x1.a057b4p-13f;
  u = u * s + 0x1.6d2d92p-10f;
  u = u * s + 0x1.11114cp-7f;
  u = u * s + 0x1.5554f4p-5f;
  u = u * s + 0x1.555556p-3f;
  u = u * s + 0x1p-1f;
  u = 1.0f + ((s * s) * u + s);
  u = (u * dm_pow2i(q >> 1)) * dm_pow2i(q - (q >> 1));
  if (d < -104.0f) u = 0.0f;
  if (100.0f < d) u = INFINITY;
  return DM_CANONICAL(u);
}

// Double-float helpers (SLEEF's df.h, no-FMA forms): a value as the unevaluated sum hi + lo.
float dm_upper(float d) { return as_float(as_uint(d) & 0xfffff000u); }

float2 dm_add2_f_f(float x, float y) {  // dfadd2_vf2_vf_vf
  const float s = x + y;
  const float v = s - x;
  return (float2)(s, (x - (s - v)) + (y - v));
}

float2 dm_add_f2_f2(float2 x, float2 y) {  // dfadd_vf2_vf2_vf2, |x| >= |y|
  const float s = x.x + y.x;
  return (float2)(s, (((x.x - s) + y.x) + x.y) + y.y);
}

float2 dm_add_f2_f(float2 x, float y) {  // dfadd_vf2_vf2_vf
  const float s = x.x + y;
  return (float2)(s, ((x.x - s) + y) + x.y);
}

float2 dm_mul_f2_f(float2 x, float y) {  // dfmul_vf2_vf2_vf
  const float xh = dm_upper(x.x), xl = x.x - xh;
  const float yh = dm_upper(y), yl = y - yh;
  const float s = x.x * y;
  float t = xh * yh + -s;
  t = xl * yh + t;
  t = xh * yl + t;
  t = xl * yl + t;
  t = x.y * y + t;
  return (float2)(s, t);
}

float2 dm_div_f2_f2(float2 n, float2 d) {  // dfdiv_vf2_vf2_vf2
  const float t = 1.0f / d.x;
  const float dh = dm_upper(d.x), dl = d.x - dh;
  const float th = dm_upper(t), tl = t - th;
  const float nhh = dm_upper(n.x), nhl = n.x - nhh;
  const float s = n.x * t;
  float w = -1.0f;
  w = dh * th + w;
  w = dh * tl + w;
  w = dl * th + w;
  w = dl * tl + w;
  w = -w;
  float u = nhh * th + -s;
  u = nhh * tl + u;
  u = nhl * th + u;
  u = nhl * tl + u;
  u = s * w + u;
  return (float2)(s, t * (n.y - s * d.y) + u);
}

float dm_log(float d) {
  const bool tiny = d < 0x1p-126f;
  if (tiny) d = d * 0x1p+64f;
  int e = (int)((as_uint(d * 0x1.555556p+0f) >> 23) & 0xffu) - 0x7f;
  const float m = as_float(as_uint(d) + ((uint)(-e) << 23));
  if (tiny) e -= 64;
  float2 s = dm_mul_f2_f((float2)(0x1.62e43p-1f, -0x1.05c61p-29f), (float)e);
  const float2 x = dm_div_f2_f2(dm_add2_f_f(-1.0f, m), dm_add2_f_f(1.0f, m));
  const float x2 = x.x * x.x;
  float t = 0x1.35feb8p-2f;
  t = t * x2 + 0x1.993394p-2f;
  t = t * x2 + 0x1.5555b4p-1f;
  s = dm_add_f2_f2(s, (float2)(x.x * 2.0f, x.y * 2.0f));
  s = dm_add_f2_f(s, (x2 * x.x) * t);
  float r = s.x + s.y;
  if (d == INFINITY) r = INFINITY;
  if (d < 0.0f || d != d) r = as_float(0x7fc00000u);
  if (d == 0.0f) r = -INFINITY;
  return DM_CANONICAL(r);
}

// For the tests and scripts/dmath-exhaustive.sh: exp and log of every x.
__kernel void dmath_exp_log(__global const float* x, __global float* exp_out,
                            __global float* log_out, long n) {
  const long i = get_global_id(0);
  if (i >= n) return;
  exp_out[i] = dm_exp(x[i]);
  log_out[i] = dm_log(x[i]);
}
