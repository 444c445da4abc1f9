#!/usr/bin/env bash
# Configures and builds lockstep (Release) into build/; arguments go to cmake's configure step
# (e.g. -DLOCKSTEP_WERROR=ON, as scripts/test.sh builds).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
