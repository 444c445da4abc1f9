#!/usr/bin/env bash
# Installs what is missing, builds lockstep and runs the whole test suite (ctest), then checks
# the numerics contract across compilers (scripts/compilers.sh: a Clang build must train the
# pinned tiny chain too).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
scripts/compilers.sh
