#!/usr/bin/env bash
# The numerics contract across compilers: builds the lockstep binary with Clang (build-clang,
# -Wall -Wextra -Werror: every source of the library and the CLI) beside the GCC build (build), trains `tiny` 20 steps with each, and requires both chains to equal
# the pinned golden chain (tests/fixtures/tiny_chain.jsonl) bit for bit. Also runs Clang's
# selftest (every kernel on every usable SIMD variant vs the reference). Run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang++ >/dev/null || { echo "clang++ not found (apt-get install clang)" >&2; exit 1; }
cmake -S . -B build-clang -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DLOCKSTEP_WERROR=ON >/dev/null
cmake --build build-clang -j"$(nproc)" --target lockstep
build-clang/lockstep selftest | tail -1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
build/lockstep data synth --out "$tmp/data" --seed 7 --tokens 200000 >/dev/null 2>&1
status=0
for compiler in build build-clang; do
  "$compiler/lockstep" train --config tiny --data "$tmp/data" --out "$tmp/$compiler" --steps 20 \
    --threads 2 --no-progress >/dev/null 2>&1
  if cmp -s "$tmp/$compiler/state_hashes.jsonl" tests/fixtures/tiny_chain.jsonl; then
    echo "$("$compiler/lockstep" --version | sed -n 3p): tiny chain = golden chain"
  else
    echo "$("$compiler/lockstep" --version | sed -n 3p): tiny chain DIFFERS from the golden chain" >&2
    status=1
  fi
done
exit $status
