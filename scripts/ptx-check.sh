#!/usr/bin/env bash
# The static checks of the PTX the CUDA runtime runs (docs/devices.md, "Static checks"): the PTX
# the build made of every program of the program table (BUILD/ptx/*.ptx, scripts/ptx-build.sh:
# clang-15 + libclc-15 for nvptx64-nvidia-nvcl, sm_80), or the PTX files given as arguments (a
# driver's program binaries: scripts/gpu-check.sh).
#
# 1. Rounding. Every f32 and f64 add, sub, mul, fma, div, sqrt and reciprocal must carry .rn (a
#    PTX mul or add without it may be fused by the assembler), and nothing may flush subnormals
#    (.ftz) or approximate (approx, ex2, lg2, sin, cos).
# 2. Resources, where CUDA's assembler is found ($PTXAS, ptxas on the PATH, or
#    /usr/local/cuda/bin/ptxas; else "skipped: no ptxas", never "passed"): every program
#    assembles for sm_80 and sm_90, and each GEMM kernel has no stack frame and no spills (its
#    register tile in registers), at most 48 KiB of static shared memory, and at least 8 warps
#    resident per multiprocessor. A table of registers, shared memory and occupancy per program
#    and architecture is printed.
# 3. Integer sums: no saturating instruction (.sat, .satfinite) in any program, and the int8
#    GEMM's program multiplies with dp4a.s32.s32; the int8 GEMM is held to the GEMMs' resource
#    rules above (at a work-group of 256).
# Exit 0 clean, 1 otherwise, 2 when there is nothing to check. BUILD: $LOCKSTEP_BUILD or build/.
set -euo pipefail
cd "$(dirname "$0")/.."
rounding() {  # $1: a PTX file, $2: the name to report
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

# Per multiprocessor, by architecture: registers, shared memory (bytes), threads, blocks; and the
# shared memory the runtime reserves per block (the CUDA C Programming Guide's table of compute
# capabilities, 8.0 and 9.0).
declare -A SM_SHARED=([sm_80]=167936 [sm_90]=233472)
SM_REGISTERS=65536 SM_THREADS=2048 SM_BLOCKS=32 RESERVED_SHARED=1024 MIN_WARPS=8
STATIC_SHARED_LIMIT=49152

# ptxas -v of $1 for $2, as lines "kernel registers stack spill_stores spill_loads smem".
resources() {
  "$ptxas" -arch="$2" -v "$1" -o /dev/null 2>&1 | awk '
    /Compiling entry function/ { match($0, /function .[^\047]*/); k = substr($0, RSTART + 10, RLENGTH - 10) }
    /bytes stack frame/ { stack = $1; stores = $5; loads = $9 }
    /Used [0-9]+ registers/ {
      match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15)
      smem = 0
      if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH - 11)
      print k, regs, stack + 0, stores + 0, loads + 0, smem + 0
    }
    /error/ { print "ERROR", $0 }'
}

status=0
files=("$@")
if ((${#files[@]} == 0)); then
  build=${LOCKSTEP_BUILD:-build}
  shopt -s nullglob
  files=("$build"/ptx/*.ptx)
  if ((${#files[@]} == 0)); then
    echo "no PTX in $build/ptx: build lockstep with clang-15 and libclc-15 installed" \
      "(scripts/install-deps.sh, scripts/build.sh)" >&2
    exit 2
  fi
fi
for ptx in "${files[@]}"; do rounding "$ptx" "$(basename "$ptx" .ptx)" || status=1; done
# Integer sums (3. above): a saturated sum depends on the order of its terms.
for ptx in "${files[@]}"; do
  name=$(basename "$ptx" .ptx)
  if grep -qE '\.sat(finite)?\b' "$ptx"; then
    echo "$name: FAIL: a saturating instruction:"
    grep -nE '\.sat(finite)?\b' "$ptx" | head -5
    status=1
  fi
  if grep -q '\.entry gemm_i8_xwt(' "$ptx"; then
    if dp4a=$(grep -c 'dp4a\.s32\.s32' "$ptx") && ((dp4a > 0)); then
      echo "$name: gemm_i8_xwt: $dp4a dp4a.s32.s32, no saturating form"
    else
      echo "$name: FAIL: gemm_i8_xwt has no dp4a.s32.s32"
      status=1
    fi
  fi
done

ptxas=${PTXAS:-$(command -v ptxas || true)}
[[ -z $ptxas && -x /usr/local/cuda/bin/ptxas ]] && ptxas=/usr/local/cuda/bin/ptxas
if [[ -z $ptxas ]]; then
  echo "resources: skipped: no ptxas (CUDA's assembler; set PTXAS)"
  exit $status
fi
echo
echo "resources ($("$ptxas" --version | tail -1)):"
printf '%-24s %-6s %-20s %5s %6s %7s %7s %7s %9s\n' program arch kernel regs stack spills \
  smem blocks warps/SM
for ptx in "${files[@]}"; do
  name=$(basename "$ptx" .ptx)
  for arch in sm_80 sm_90; do
    lines=$(resources "$ptx" "$arch")
    if [[ -z $lines || $lines == *ERROR* ]]; then
      echo "$name: FAIL: does not assemble for $arch:"
      { "$ptxas" -arch="$arch" "$ptx" -o /dev/null 2>&1 || true; } | head -5
      status=1
      continue
    fi
    while read -r kernel regs stack stores loads smem; do
      threads=0
      # A GEMM program is named gemm-TMxTN-RMxRN-K[-db]: its work-group is (TM/RM)(TN/RN).
      if [[ $kernel == gemm && $name =~ ^gemm-([0-9]+)x([0-9]+)-([0-9]+)x([0-9]+)- ]]; then
        threads=$((BASH_REMATCH[1] / BASH_REMATCH[3] * (BASH_REMATCH[2] / BASH_REMATCH[4])))
      fi
      # The int8 GEMM, at a work-group of 256 (the runtime's choice when none is set).
      [[ $kernel == gemm_i8_xwt ]] && threads=256
      blocks=- warps=-
      if ((threads > 0)); then
        local_warps=$(((threads + 31) / 32))
        per_warp=$(((regs * 32 + 255) / 256 * 256))  # registers are allocated per warp in 256s
        by_regs=$((SM_REGISTERS / (local_warps * per_warp)))
        by_shared=$((SM_SHARED[$arch] / (smem + RESERVED_SHARED)))
        by_threads=$((SM_THREADS / threads))
        blocks=$SM_BLOCKS
        for b in $by_regs $by_shared $by_threads; do ((b < blocks)) && blocks=$b; done
        warps=$((blocks * local_warps))
        problem=""
        ((stack > 0 || stores > 0 || loads > 0)) &&
          problem+=" a ${stack}-byte stack frame, $stores/$loads bytes spilled;"
        ((smem > STATIC_SHARED_LIMIT)) && problem+=" $smem bytes of static shared memory (48 KiB at most);"
        ((warps < MIN_WARPS)) && problem+=" $warps warps per multiprocessor (at least $MIN_WARPS);"
        if [[ -n $problem ]]; then
          echo "$name: FAIL for $arch:$problem"
          status=1
        fi
      fi
      printf '%-24s %-6s %-20s %5s %6s %7s %7s %7s %9s\n' "$name" "$arch" "$kernel" "$regs" \
        "$stack" "$((stores + loads))" "$smem" "$blocks" "$warps"
    done <<< "$lines"
  done
done
exit $status
