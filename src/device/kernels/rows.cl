#pragma OPENCL FP_CONTRACT OFF
// Row-wise ops (docs/numerics.md): one work-item per row (or per column, for the gain gradient),
// each reduction by the canonical lane rule -- 16 lanes, term c to lane c mod 16 in increasing c,
// folded pairwise 8-4-2-1 -- so nothing depends on the work-group size.
//
// The lanes are a private array indexed only by unrolled loops' constants: a row is walked in
// whole blocks of 16 terms (term c0 + j to lane j), then a tail of fewer, so each lane is a
// register rather than a slot in local memory (scripts/ptx-check.sh prints the stack frames).

#define LANES 16
#define UNROLL _Pragma("unroll")

float fold(float l[LANES]) {
  UNROLL for (int w = LANES / 2; w >= 1; w /= 2) {
    UNROLL for (int j = 0; j < w; ++j) l[j] = l[j] + l[j + w];
  }
  return l[0];
}

// The lane rule over n terms: LANE_TERM(c, j) updates lane j with term c (c mod 16 == j). The
// tail is computed without branches -- each of its lanes updated with a term in range, then
// restored where its own term lies past n -- so the lanes stay registers there too.
#define LANE_LOOP(n, LANE_TERM)                                      \
  {                                                                  \
    long c0 = 0;                                                     \
    for (; c0 + LANES <= (n); c0 += LANES) {                         \
      UNROLL for (int j = 0; j < LANES; ++j) LANE_TERM(c0 + j, j);   \
    }                                                                \
    if (c0 < (n)) {                                                  \
      UNROLL for (int j = 0; j < LANES; ++j) {                       \
        const float before = l[j];                                   \
        const long c = c0 + j < (n) ? c0 + j : c0;                   \
        LANE_TERM(c, j);                                             \
        l[j] = c0 + j < (n) ? l[j] : before;                         \
      }                                                              \
    }                                                                \
  }

// Lane rule with update fma(a, b, l): the dot product.
float dot(__global const float* a, __global const float* b, long n) {
  float l[LANES];
  UNROLL for (int j = 0; j < LANES; ++j) l[j] = 0.0f;
#define DOT_TERM(c, j) l[j] = fma(a[c], b[c], l[j])
  LANE_LOOP(n, DOT_TERM)
#undef DOT_TERM
  return fold(l);
}

__kernel void row_sum(__global const float* x, __global float* out, long rows, long cols) {
  const long r = get_global_id(0);
  if (r >= rows) return;
  __global const float* xr = x + r * cols;
  float l[LANES];
  UNROLL for (int j = 0; j < LANES; ++j) l[j] = 0.0f;
#define SUM_TERM(c, j) l[j] = l[j] + xr[c]
  LANE_LOOP(cols, SUM_TERM)
#undef SUM_TERM
  out[r] = fold(l);
}

// rstd = 1 / sqrt(ss * inv_d + eps); y = (x * rstd) * gain (no gain: x * rstd).
__kernel void rmsnorm_fwd(__global const float* x, __global const float* gain, int has_gain,
                          float eps, float inv_d, __global float* y, __global float* rstd,
                          long rows, long d) {
  const long r = get_global_id(0);
  if (r >= rows) return;
  __global const float* xr = x + r * d;
  const float ss = dot(xr, xr, d);
  const float s = 1.0f / sqrt(ss * inv_d + eps);
  rstd[r] = s;
  for (long c = 0; c < d; ++c) y[r * d + c] = has_gain ? (xr[c] * s) * gain[c] : xr[c] * s;
}

// g = dy * gain (no gain: dy); coef = ((dot(g, x) * inv_d) * rstd) * rstd;
// dx = rstd * fma(-x, coef, g). g is formed twice rather than stored: the same rounding.
__kernel void rmsnorm_bwd(__global const float* dy, __global const float* x,
                          __global const float* gain, int has_gain, __global const float* rstd,
                          float inv_d, __global float* dx, long rows, long d) {
  const long r = get_global_id(0);
  if (r >= rows) return;
  __global const float* dyr = dy + r * d;
  __global const float* xr = x + r * d;
  float l[LANES];
  UNROLL for (int j = 0; j < LANES; ++j) l[j] = 0.0f;
#define GRAD_TERM(c, j) l[j] = fma(has_gain ? dyr[c] * gain[c] : dyr[c], xr[c], l[j])
  LANE_LOOP(d, GRAD_TERM)
#undef GRAD_TERM
  const float s = rstd[r];
  const float coef = ((fold(l) * inv_d) * s) * s;
  for (long c = 0; c < d; ++c) {
    const float g = has_gain ? dyr[c] * gain[c] : dyr[c];
    dx[r * d + c] = s * fma(-xr[c], coef, g);
  }
}

// Per column, over rows in increasing order from +0: dgain = fma(dy, x * rstd, dgain).
__kernel void rmsnorm_dgain(__global const float* dy, __global const float* x,
                            __global const float* rstd, __global float* dgain, long rows,
                            long d) {
  const long c = get_global_id(0);
  if (c >= d) return;
  float acc = 0.0f;
  for (long r = 0; r < rows; ++r) acc = fma(dy[r * d + c], x[r * d + c] * rstd[r], acc);
  dgain[c] = acc;
}

// Rotate-half RoPE on (x1, x2) = (x[i], x[i + half_dim]) at position t, one work-item per pair:
// forward y1 = fma(x1, cos, -(x2 * sin)), y2 = fma(x2, cos, x1 * sin); inverse (the backward)
// y1 = fma(x1, cos, x2 * sin), y2 = fma(x2, cos, -(x1 * sin)).
__kernel void rope(__global const float* x, __global float* y, __global const float* cos_table,
                   __global const float* sin_table, long seq, long heads, long half_dim,
                   long pairs, int inverse, long first) {
  const long p = get_global_id(0);
  if (p >= pairs) return;
  const long i = p % half_dim, row = p / half_dim;  // row = (b * seq + r) * heads + h
  const long t = first + (row / heads) % seq;      // row r is position first + r
  const float c = cos_table[t * half_dim + i], s = sin_table[t * half_dim + i];
  const long at = row * 2 * half_dim + i;
  const float x1 = x[at], x2 = x[at + half_dim];
  if (!inverse) {
    y[at] = fma(x1, c, -(x2 * s));
    y[at + half_dim] = fma(x2, c, x1 * s);
  } else {
    y[at] = fma(x1, c, x2 * s);
    y[at + half_dim] = fma(x2, c, -(x1 * s));
  }
}
