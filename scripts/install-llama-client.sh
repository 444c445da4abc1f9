#!/usr/bin/env bash
# Installs the client that checks lockstep's GGUF export: llama.cpp through node-llama-cpp 3.21.1
# (its prebuilt CPU binaries for linux-x64; nothing is compiled), outside the repository, in
# ${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}/node-llama-cpp-3.21.1. Idempotent: does nothing when
# that version is already there. Needs node and npm (scripts/install-deps.sh installs them).
# The test export_gguf_llama_cpp (tests/e2e/export_llama.py) uses it, and skips, saying why,
# where it is missing.
set -euo pipefail
version=3.21.1
dir="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}/node-llama-cpp-$version"
installed() {
  node -e "
    const v = (p) => require(p + '/package.json').version;
    process.exit(v('$dir/node_modules/node-llama-cpp') === '$version' &&
                 v('$dir/node_modules/@node-llama-cpp/linux-x64') === '$version' ? 0 : 1)" \
    2>/dev/null
}
if installed; then
  echo "node-llama-cpp $version: already in $dir"
  exit 0
fi
command -v npm > /dev/null || { echo "install-llama-client: npm is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if ((node_major < 20)); then
  echo "install-llama-client: node-llama-cpp $version needs node >= 20; this node is $(node --version 2>/dev/null || echo missing)" >&2
  exit 1
fi
if [ "$(uname -m)" != x86_64 ]; then
  echo "install-llama-client: node-llama-cpp's prebuilt binary used here is linux-x64; this is $(uname -m)" >&2
  exit 1
fi
mkdir -p "$dir"
cp "$(dirname "$0")/../tests/clients/llama/package.json" "$dir/package.json"
# --omit=optional: only the linux-x64 CPU binary, named explicitly, not the CUDA/Vulkan ones.
# NODE_LLAMA_CPP_SKIP_DOWNLOAD: the postinstall never downloads or builds llama.cpp.
(cd "$dir" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --omit=optional --no-audit --no-fund \
  --ignore-scripts "node-llama-cpp@$version" "@node-llama-cpp/linux-x64@$version")
installed || { echo "install-llama-client: node-llama-cpp $version did not install into $dir" >&2; exit 1; }
echo "node-llama-cpp $version: installed in $dir"
