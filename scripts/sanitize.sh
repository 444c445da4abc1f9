#!/usr/bin/env bash
# Builds lockstep with AddressSanitizer + UndefinedBehaviorSanitizer into build-asan and runs the
# whole test suite under them (slower than scripts/test.sh; not part of CI's time budget).
# Leak checking is off: Open MPI's MPI_Init keeps allocations for the life of the process.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOCKSTEP_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$(nproc)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
ctest --test-dir build-asan --output-on-failure -j"$(nproc)" --timeout 1800 "$@"
