#!/usr/bin/env bash
# Builds lockstep and runs the whole test suite (ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
