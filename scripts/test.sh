#!/usr/bin/env bash
# Installs what is missing, builds lockstep with -Wall -Wextra -Werror and runs the whole test
# suite (ctest), then checks the numerics contract across compilers (scripts/compilers.sh: a
# Clang build, warnings as errors too, must train the pinned tiny chain; the tests and benchmarks
# must compile under it) and that the C++ lines
# changed since .clang-format came follow it (scripts/format-check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DLOCKSTEP_WERROR=ON
ctest --test-dir build --output-on-failure -j"$(nproc)"
scripts/compilers.sh
scripts/format-check.sh
