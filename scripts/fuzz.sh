#!/usr/bin/env bash
# Fuzzes every reader of an on-disk or on-the-wire format with libFuzzer (Clang, with
# AddressSanitizer + UndefinedBehaviorSanitizer), SECONDS each (default 60), starting from the
# seed corpora in tests/fuzz/corpus/<target>/; new inputs go to build-fuzz/corpus/<target>/ and
# crashes to build-fuzz/crashes/. Prints the CPU seconds spent and what was found.
#   usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (targets: every tests/fuzz/*_fuzz.cc)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(); for f in tests/fuzz/*_fuzz.cc; do t=$(basename "$f" _fuzz.cc); targets+=("$t"); done
fi
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DLOCKSTEP_SANITIZE=ON -DLOCKSTEP_FUZZ=ON -DLOCKSTEP_WITH_MPI=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target $(printf '%s_fuzz ' "${targets[@]}")
export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1
found=0
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t" build-fuzz/crashes
  echo "== $t: ${seconds} s"
  if ! "build-fuzz/tests/${t}_fuzz" "build-fuzz/corpus/$t" "tests/fuzz/corpus/$t" \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
      -artifact_prefix="build-fuzz/crashes/${t}-" 2>&1 | tail -3; then
    found=1
  fi
done
echo "fuzzed ${#targets[@]} targets x ${seconds} s = $(( ${#targets[@]} * seconds )) CPU seconds"
ls build-fuzz/crashes/ 2>/dev/null | sed 's/^/finding: /'
exit $found
