#pragma OPENCL FP_CONTRACT OFF
// The embedding (docs/numerics.md, "Embedding"); the ids are checked on the host first.

// out[i, c] = table[ids[i], c]: a copy, one work-item per element.
__kernel void embedding_fwd(__global const float* table, __global const uint* ids,
                            __global float* out, long n, long d) {
  const long e = get_global_id(0);
  if (e >= n * d) return;
  const long i = e / d, c = e % d;
  out[e] = table[(long)ids[i] * d + c];
}

// Per column c, over tokens in increasing order: dtable[ids[i], c] += dout[i, c]. One work-item
// per column, so every element's sum is one sequence in the contract's order.
__kernel void embedding_bwd(__global const float* dout, __global const uint* ids,
                            __global float* dtable, long n, long d) {
  const long c = get_global_id(0);
  if (c >= d) return;
  for (long i = 0; i < n; ++i) {
    const long at = (long)ids[i] * d + c;
    dtable[at] = dtable[at] + dout[i * d + c];
  }
}
