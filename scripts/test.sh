#!/usr/bin/env bash
# Installs what is missing, builds lockstep with -Wall -Wextra -Werror and runs the whole test
# suite (ctest), then checks the numerics contract across compilers (scripts/compilers.sh: a
# Clang build, warnings as errors too, must train the pinned tiny chain; the tests and benchmarks
# must compile under it) and that the C++ lines
# changed since .clang-format came follow it (scripts/format-check.sh), and cross-builds for
# arm64 to run the selftest and 3 steps of each pinned chain under qemu (scripts/aarch64.sh
# --short).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# llama.cpp for the GGUF export's test (outside the repository; that test skips, saying why,
# where it cannot be installed, e.g. node older than 20).
scripts/install-llama-client.sh || echo "test.sh: the llama.cpp client is not installed; export_gguf_llama_cpp will skip"
scripts/build.sh -DLOCKSTEP_WERROR=ON
ctest --test-dir build --output-on-failure -j"$(nproc)"
scripts/compilers.sh
scripts/format-check.sh
scripts/aarch64.sh --short
