#pragma OPENCL FP_CONTRACT OFF
// The global norm's block sums (docs/numerics.md, "GlobalNorm" step 2; op block_squares) in
// binary64, which OpenCL C has only as the cl_khr_fp64 extension: this source is its own program,
// built only on a device whose double-precision config has what the contract needs
// (docs/devices.md), so a device without doubles still runs every other op.
//
// A piece starts at a block boundary; block b is x[b * BLOCK, min((b + 1) * BLOCK, n)). Lane l
// of block b is one work-item: l = fma(X, X, l) in increasing c over the block's elements with
// c = l (mod 16), X the element widened exactly (its square is exact in binary64). Then one
// work-item per block folds its 16 lanes: for w in 8, 4, 2, 1: l[j] = l[j] + l[j + w].
// BLOCK (rk::kNormBlock) and LANES (rk::kReductionLanes) are set with -D by the runtime.
#pragma OPENCL EXTENSION cl_khr_fp64 : enable

__kernel void block_square_lanes(__global const float* x, long n, __global double* lanes,
                                 long blocks) {
  const long item = get_global_id(0);
  if (item >= blocks * LANES) return;
  const long block = item / LANES, begin = block * BLOCK;
  const long end = min(begin + BLOCK, n);
  double lane = 0;
  for (long c = begin + item % LANES; c < end; c += LANES) {
    const double v = (double)x[c];
    lane = fma(v, v, lane);
  }
  lanes[item] = lane;
}

__kernel void block_square_fold(__global const double* lanes, __global double* sums,
                                long blocks) {
  const long block = get_global_id(0);
  if (block >= blocks) return;
  double l[LANES];
  for (int j = 0; j < LANES; ++j) l[j] = lanes[block * LANES + j];
  for (int width = LANES / 2; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) l[j] = l[j] + l[j + width];
  }
  sums[block] = l[0];
}
