#pragma OPENCL FP_CONTRACT OFF
// The fused head's cross-entropy and z-loss (docs/numerics.md, "Fused output head"), on logits
// z[rows, vocab] that the GEMM made (the same bits in any chunking). One work-item per row for
// the log-sum-exp, one per logit for the gradient.

// Merges lane state (mb, sb) into (m, s): both stand for s * exp(m).
void ce_merge(float* m, float* s, float mb, float sb) {
  const float e = mb == *m ? 1.0f : dm_exp(-fabs(mb - *m));
  if (mb > *m) {
    *s = fma(*s, e, sb);
    *m = mb;
  } else {
    *s = fma(sb, e, *s);
  }
}

__kernel void cross_entropy_fwd(__global const float* z, __global const uint* targets,
                                __global float* loss, __global float* zloss,
                                __global float* lse, long rows, long vocab, float z_loss) {
  const long r = get_global_id(0);
  if (r >= rows) return;
  __global const float* zr = z + r * vocab;
  // 16 lanes, logit v to lane v mod 16 in increasing v, folded 8-4-2-1; the lanes indexed only
  // by unrolled loops' constants (whole blocks of 16 logits, then the tail), so they stay in
  // registers.
  float m[16], s[16];
  _Pragma("unroll") for (int j = 0; j < 16; ++j) {
    m[j] = -INFINITY;
    s[j] = 0.0f;
  }
  long v0 = 0;
  for (; v0 + 16 <= vocab; v0 += 16) {
    _Pragma("unroll") for (int j = 0; j < 16; ++j) ce_merge(&m[j], &s[j], zr[v0 + j], 1.0f);
  }
  _Pragma("unroll") for (int j = 0; j < 16; ++j) {
    if (v0 + j < vocab) ce_merge(&m[j], &s[j], zr[v0 + j], 1.0f);
  }
  _Pragma("unroll") for (int w = 8; w >= 1; w /= 2) {
    _Pragma("unroll") for (int j = 0; j < w; ++j) ce_merge(&m[j], &s[j], m[j + w], s[j + w]);
  }
  const float l = m[0] + dm_log(s[0]);
  lse[r] = l;
  loss[r] = l - zr[targets[r]];
  zloss[r] = (z_loss * l) * l;
}

// z[r, v] replaced by its gradient: grad_scale * (coef * exp(z - lse)), and for the target
// grad_scale * fma(coef, exp(z - lse), -1); coef = fma(2 * z_loss, lse, 1).
__kernel void cross_entropy_dz(__global float* z, __global const uint* targets,
                               __global const float* lse, long rows, long vocab, float z_loss,
                               float grad_scale) {
  const long e = get_global_id(0);
  if (e >= rows * vocab) return;
  const long r = e / vocab, v = e % vocab;
  const float coef = fma(2.0f * z_loss, lse[r], 1.0f);
  const float p = dm_exp(z[e] - lse[r]);
  z[e] = v == (long)targets[r] ? grad_scale * fma(coef, p, -1.0f) : grad_scale * (coef * p);
}
