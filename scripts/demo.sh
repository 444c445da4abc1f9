#!/usr/bin/env bash
# The main job on the built-in default: install dependencies, build, show the build's facts,
# and prove the kernel library's determinism on this machine (every op, every SIMD variant,
# 1-7 threads, bit for bit against the scalar reference).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build/lockstep --version
echo
build/lockstep selftest
