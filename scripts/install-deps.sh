#!/usr/bin/env bash
# Installs lockstep's build and test dependencies from Debian 12 packages (needs root).
# (openssh-client: Open MPI's mpirun refuses to start, even on one machine, without an rsh agent;
# chromium: the report test renders `lockstep report`'s page headless, and scripts/demo.sh its
# screenshot; pocl-opencl-icd, ocl-icd-opencl-dev, opencl-headers, clinfo: the OpenCL device
# backend, tested on the CPU through PoCL; clang-15, libclc-15: the PTX of the device programs for
# the CUDA runtime, made at build time (scripts/ptx-build.sh) and checked by scripts/ptx-check.sh; iproute2, procps: the two-host test,
# tests/e2e/two_hosts.sh, makes network namespaces and watches its ranks; clang-format: the check
# that changed lines follow .clang-format, scripts/format-check.sh; universal-ctags: the function
# lengths, scripts/function-lengths.sh; libdnnl-dev: oneDNN, the anchor of bench_gemm --int8, for
# benchmarks only.)
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git python3 clang
  libhwy-dev libsleef-dev libsodium-dev libfmt-dev libcli11-dev nlohmann-json3-dev libyaml-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev libmpfr-dev libgmp-dev libopenblas-dev libdnnl-dev
  libcurl4-openssl-dev libopenmpi-dev openmpi-bin openssh-client libsentencepiece-dev libpcre2-dev chromium
  pocl-opencl-icd ocl-icd-opencl-dev opencl-headers clinfo clang-15 libclc-15
  iproute2 procps clang-format universal-ctags
  python3-nacl  # Ed25519 in tests/e2e/receipt_check.py: a receipt's signature checked outside lockstep
)
# node and npm run the JavaScript clients the tests check against (@huggingface/tokenizers,
# node-llama-cpp: scripts/install-llama-client.sh); Debian's own only where none is installed.
command -v node > /dev/null || packages+=(nodejs)
command -v npm > /dev/null || packages+=(npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
