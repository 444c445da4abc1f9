#!/usr/bin/env bash
# The static check of what a GPU compiler makes of the device sources (docs/devices.md): the
# programs the runtime builds from src/device/kernels/*.cl -- gemm.cl at the default tiling with
# one and two slice buffers, norm.cl (fp64), and every other source after dmath.cl -- compiled by Debian's clang-15 with
# libclc-15 for NVIDIA's OpenCL target (nvptx64-nvidia-nvcl) with the contract's build options.
# In the PTX, every f32 and f64 add, sub, mul, fma, div, sqrt and reciprocal must carry .rn (a PTX
# mul or add without it may be fused by the assembler), and nothing may flush subnormals (.ftz)
# or approximate (approx, ex2, lg2, sin, cos). With PTX files as arguments (a driver's
# program binaries, scripts/gpu-check.sh), checks those instead. Exit 0 clean, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
check() {  # $1: a PTX file, $2: the name to report
  local bad
  bad=$(grep -nE '\b(add|sub|mul|fma|mad|div|sqrt|rcp)(\.[a-z0-9]+)*\.f(32|64)\b' "$1" |
    grep -vE '\b(add|sub|mul|fma|div|sqrt|rcp)\.rn\.f(32|64)\b' || true)
  bad+=$'\n'$(grep -nE '\.ftz\b|\.approx\b|\b(ex2|lg2|sin|cos|tanh)\.' "$1" || true)
  local ops
  ops=$(grep -cE '\b(add|sub|mul|fma|div|sqrt|rcp)\.rn\.f(32|64)\b' "$1" || true)
  if [[ -n ${bad//$'\n'/} ]]; then
    echo "$2: FAIL: float instructions that are not correctly rounded, or flush, or approximate:"
    echo "$bad" | grep -v '^$' | head -20
    return 1
  fi
  echo "$2: $ops rounded float operations, none unrounded, flushing or approximate"
}
status=0
if (($# > 0)); then
  for ptx in "$@"; do check "$ptx" "$ptx" || status=1; done
  exit $status
fi
clc=/usr/lib/clc/nvptx64--nvidiacl.bc
command -v clang-15 >/dev/null && [[ -e $clc ]] ||
  { echo "needs clang-15 and libclc-15 (scripts/install-deps.sh)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
kernels=src/device/kernels
cat "$kernels/dmath.cl" $(ls "$kernels"/*.cl |
  grep -v -e '/dmath.cl$' -e '/gemm.cl$' -e '/norm.cl$') > "$tmp/main.cl"
cp "$kernels/gemm.cl" "$tmp/gemm.cl"
cp "$kernels/gemm.cl" "$tmp/gemm-db.cl"
cp "$kernels/norm.cl" "$tmp/norm.cl"
# norm.cl's constants, as the runtime passes them (rk::kNormBlock, rk::kReductionLanes).
block=$(grep -oP 'kNormBlock = \K\d+' include/lockstep/kernels.h)
lanes=$(grep -oP 'kReductionLanes = \K\d+' include/lockstep/kernels.h)
for name in main gemm gemm-db norm; do
  double_buffer=0
  [[ $name == gemm-db ]] && double_buffer=1
  clang-15 -cl-std=CL1.2 -target nvptx64-nvidia-nvcl -Xclang -mlink-bitcode-file -Xclang "$clc" \
    -Wno-linker-warnings -cl-fp32-correctly-rounded-divide-sqrt -O2 -S \
    -DTILE_M=32 -DTILE_N=32 -DREG_M=2 -DREG_N=2 -DK_TILE=16 -DDOUBLE_BUFFER=$double_buffer \
    -DBLOCK="$block" -DLANES="$lanes" -o "$tmp/$name.ptx" "$tmp/$name.cl"
  check "$tmp/$name.ptx" "program $name (PTX, clang-15 + libclc)" || status=1
done
exit $status
