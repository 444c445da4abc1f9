#!/usr/bin/env bash
# The kernels use no saturating integer instruction (docs/numerics.md, "Int8"): a saturating sum
# depends on the order of its terms once it saturates, so the int8 GEMM's exactness in any order
# would not hold. Disassembles the given object or archive (the kernels' library,
# liblockstep_kernels.a) and lists every saturating x86-64 instruction in it: exits 1 if there
# is one, 0 if none; on another architecture, or without objdump, says "skipped" and exits 0.
# Run by ctest (kernels_use_no_saturating_instructions).
set -euo pipefail
file=${1:?usage: saturation-check.sh OBJECT_OR_ARCHIVE}
if ! command -v objdump >/dev/null; then
  echo "saturation check: skipped (no objdump)"
  exit 0
fi
format=$(objdump -f "$file" | grep -m1 -oE 'file format [^ ]+' || true)
if [[ $format != "file format elf64-x86-64" ]]; then
  echo "saturation check: skipped ($file is ${format:-of an unknown format}, not x86-64)"
  exit 0
fi
# vpdpbusds/vpdpwssds (VNNI), pmaddubsw (int16 sums), padds/psubs (signed), paddus/psubus
# (unsigned), with or without the VEX/EVEX v.
pattern='\bv?(pdpbusds|pdpwssds|pmaddubsw|padds[bw]|psubs[bw]|paddus[bw]|psubus[bw])\b'
hits=$(objdump -d --no-show-raw-insn "$file" | grep -E "$pattern" || true)
if [[ -n $hits ]]; then
  echo "saturating instructions in $file:" >&2
  echo "$hits" | head -20 >&2
  exit 1
fi
echo "saturation check: no saturating instruction in $(basename "$file")"
