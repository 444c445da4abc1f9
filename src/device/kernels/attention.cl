#pragma OPENCL FP_CONTRACT OFF
// Causal attention with grouped-query heads and sliding windows (docs/numerics.md, "Causal
// attention"): q, out, dout, dq [B, T, Hq, D]; k, v, dk, dv [B, T, Hkv, D] (the forward's k and v
// [B, past + T, Hkv, D]); lse, delta [B, Hq, T]; query head h reads kv head h / (Hq / Hkv). Query t sees keys first(t) .. t; key
// tiles of 64 keys at absolute positions. Each work-item owns one output row and accumulates it
// in place in global memory, so every sum is one chain in the contract's order whatever the
// work-group size.

#define KEY_TILE 64

long first_key(long t, long window) { return window > 0 && t - window + 1 > 0 ? t - window + 1 : 0; }
long last_query(long j, long seq, long window) {
  return window > 0 && j + window - 1 < seq - 1 ? j + window - 1 : seq - 1;
}

// Dot(a, b) over d terms: a fused chain from +0.
float attn_dot(__global const float* a, __global const float* b, long d) {
  float acc = 0.0f;
  for (long x = 0; x < d; ++x) acc = fma(a[x], b[x], acc);
  return acc;
}

// One work-item per (b, h, i), as index (b * Hq + h) * T + i: query i is position t = past + i
// of sequences whose k and v hold S = past + T positions (a KV cache; past is 0 in training).
__kernel void attention_fwd(__global const float* q, __global const float* k,
                            __global const float* v, __global float* out, __global float* lse,
                            long batch, long seq, long q_heads, long kv_heads, long d,
                            long window, float scale, long past) {
  const long row = get_global_id(0);
  if (row >= batch * q_heads * seq) return;
  const long i = row % seq, h = (row / seq) % q_heads, b = row / (seq * q_heads);
  const long g = h / (q_heads / kv_heads), t = past + i, keys = past + seq;
  __global const float* qr = q + ((b * seq + i) * q_heads + h) * d;
  __global float* acc = out + ((b * seq + i) * q_heads + h) * d;
  for (long x = 0; x < d; ++x) acc[x] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const long first = first_key(t, window);
  float s[KEY_TILE];
  for (long n = first / KEY_TILE; n <= t / KEY_TILE; ++n) {
    const long j0 = max(n * KEY_TILE, first), j1 = min(n * KEY_TILE + KEY_TILE - 1, t);
    float mt = -INFINITY;
    for (long j = j0; j <= j1; ++j) {
      const float sj = attn_dot(qr, k + ((b * keys + j) * kv_heads + g) * d, d) * scale;
      s[j - j0] = sj;
      mt = sj > mt ? sj : mt;
    }
    const float m_new = mt > m ? mt : m;
    const float alpha = dm_exp(m - m_new);
    l = l * alpha;
    for (long x = 0; x < d; ++x) acc[x] = acc[x] * alpha;
    for (long j = j0; j <= j1; ++j) {
      const float p = dm_exp(s[j - j0] - m_new);
      l = l + p;
      __global const float* vj = v + ((b * keys + j) * kv_heads + g) * d;
      for (long x = 0; x < d; ++x) acc[x] = fma(p, vj[x], acc[x]);
    }
    m = m_new;
  }
  for (long x = 0; x < d; ++x) acc[x] = acc[x] / l;
  lse[row] = m + dm_log(l);
}

// delta[b, h, t] = Dot(dout[b, t, h, :], out[b, t, h, :]), one work-item per (b, h, t).
__kernel void attention_delta(__global const float* dout, __global const float* out,
                              __global float* delta, long batch, long seq, long q_heads, long d) {
  const long row = get_global_id(0);
  if (row >= batch * q_heads * seq) return;
  const long t = row % seq, h = (row / seq) % q_heads, b = row / (seq * q_heads);
  const long at = ((b * seq + t) * q_heads + h) * d;
  delta[row] = attn_dot(dout + at, out + at, d);
}

// ds of the visible pair (query row (b, h, t), key j): p * (dp - delta); p through *p_out.
float attn_ds(__global const float* q, __global const float* k, __global const float* v,
              __global const float* dout, __global const float* lse,
              __global const float* delta, long b, long h, long t, long j, long g, long seq,
              long q_heads, long kv_heads, long d, float scale, float* p_out) {
  const long qt = ((b * seq + t) * q_heads + h) * d, kj = ((b * seq + j) * kv_heads + g) * d;
  const long row = (b * q_heads + h) * seq + t;
  const float s = attn_dot(q + qt, k + kj, d) * scale;
  const float p = dm_exp(s - lse[row]);
  const float dp = attn_dot(dout + qt, v + kj, d);
  *p_out = p;
  return p * (dp - delta[row]);
}

// dq[b, t, h, :] = scale * sum over j = first(t) .. t of fma(ds, k[b, j, g, :], .), one
// work-item per (b, h, t).
__kernel void attention_dq(__global const float* q, __global const float* k,
                           __global const float* v, __global const float* dout,
                           __global const float* lse, __global const float* delta,
                           __global float* dq, long batch, long seq, long q_heads, long kv_heads,
                           long d, long window, float scale) {
  const long row = get_global_id(0);
  if (row >= batch * q_heads * seq) return;
  const long t = row % seq, h = (row / seq) % q_heads, b = row / (seq * q_heads);
  const long g = h / (q_heads / kv_heads);
  __global float* acc = dq + ((b * seq + t) * q_heads + h) * d;
  for (long x = 0; x < d; ++x) acc[x] = 0.0f;
  for (long j = first_key(t, window); j <= t; ++j) {
    float p;
    const float ds = attn_ds(q, k, v, dout, lse, delta, b, h, t, j, g, seq, q_heads, kv_heads, d,
                             scale, &p);
    __global const float* kj = k + ((b * seq + j) * kv_heads + g) * d;
    for (long x = 0; x < d; ++x) acc[x] = fma(ds, kj[x], acc[x]);
  }
  for (long x = 0; x < d; ++x) acc[x] = scale * acc[x];
}

// dk[b, j, g, :] = scale * sum over h of the group, then t = j .. last(j), of
// fma(ds, q[b, t, h, :], .); dv the same order of fma(p, dout[b, t, h, :], .). One work-item
// per (b, j, g), as index (b * T + j) * Hkv + g.
__kernel void attention_dkv(__global const float* q, __global const float* k,
                            __global const float* v, __global const float* dout,
                            __global const float* lse, __global const float* delta,
                            __global float* dk, __global float* dv, long batch, long seq,
                            long q_heads, long kv_heads, long d, long window, float scale) {
  const long item = get_global_id(0);
  if (item >= batch * seq * kv_heads) return;
  const long g = item % kv_heads, j = (item / kv_heads) % seq, b = item / (kv_heads * seq);
  const long group = q_heads / kv_heads;
  __global float* dk_acc = dk + item * d;
  __global float* dv_acc = dv + item * d;
  for (long x = 0; x < d; ++x) dk_acc[x] = dv_acc[x] = 0.0f;
  for (long h = g * group; h < (g + 1) * group; ++h) {
    for (long t = j; t <= last_query(j, seq, window); ++t) {
      float p;
      const float ds = attn_ds(q, k, v, dout, lse, delta, b, h, t, j, g, seq, q_heads, kv_heads,
                               d, scale, &p);
      const long qt = ((b * seq + t) * q_heads + h) * d;
      for (long x = 0; x < d; ++x) {
        dk_acc[x] = fma(ds, q[qt + x], dk_acc[x]);
        dv_acc[x] = fma(p, dout[qt + x], dv_acc[x]);
      }
    }
  }
  for (long x = 0; x < d; ++x) dk_acc[x] = scale * dk_acc[x];
}
