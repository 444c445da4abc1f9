#!/usr/bin/env bash
# The numerics contract on AArch64: cross-builds the lockstep binary for arm64 (Debian's
# g++-aarch64-linux-gnu and arm64 libraries, without MPI or the tests) into build-aarch64, then
# under qemu-aarch64 runs the selftest (the variants NEON_DOTPROD and NEON), checks that a CPU
# without the dot-product extension is offered NEON alone, and trains `tiny` 20 steps at 1 and 2
# threads, `tiny-int8` (int8 linears, on sdot) and `tiny-bf16` (bf16 storage) 20 steps at 1
# thread with the best variant; each chain must be the pinned one x86-64 gives
# (tests/fixtures/tiny_chain.jsonl, tiny_int8_chain.jsonl, tiny_bf16_chain.jsonl). Needs root for the packages (it adds arm64 ones beside the native ones
# and removes nothing); slow (qemu: about 4 s per step at one thread).
#   usage: scripts/aarch64.sh [--short]   (--short: the selftest and 3 steps of each chain at one
#   thread, compared with the pinned chains' first 3 steps; about 7 minutes against 12 on 2
#   cores. scripts/test.sh, and so CI, runs it, so that the cross build cannot rot unseen)
set -euo pipefail
cd "$(dirname "$0")/.."
short=
case ${1:-} in
  --short) short=1 ;;
  "") ;;
  *) echo "usage: scripts/aarch64.sh [--short]" >&2; exit 2 ;;
esac
SUDO=""
[[ $(id -u) -eq 0 ]] || SUDO=sudo
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
fi
install() { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
install g++-aarch64-linux-gnu qemu-user libc6-dev:arm64 libhwy-dev:arm64 libsleef-dev:arm64 \
  libsodium-dev:arm64 libpcre2-dev:arm64 libfmt-dev:arm64 libcurl4-openssl-dev:arm64 \
  ocl-icd-opencl-dev:arm64 opencl-headers nlohmann-json3-dev libcli11-dev
# yaml-cpp's and SentencePiece's packages are not co-installable across architectures: installing
# the arm64 ones would remove the native ones. They are unpacked instead into a private sysroot
# (build-aarch64/sysroot), which the toolchain file searches and qemu's loader is pointed at, and
# the machine's packages stay as they are.
sysroot=$PWD/build-aarch64/sysroot
if [[ ! -e $sysroot/.unpacked ]]; then
  rm -rf "$sysroot"
  mkdir -p "$sysroot/debs"
  (cd "$sysroot/debs" && apt-get download -qq -o APT::Sandbox::User=root libyaml-cpp-dev:arm64 libyaml-cpp0.7:arm64 \
    libsentencepiece-dev:arm64 libsentencepiece0:arm64)
  for deb in "$sysroot"/debs/*.deb; do dpkg-deb -x "$deb" "$sysroot"; done
  # pkg-config files name their prefix absolutely (/usr): make it the sysroot's.
  sed -i "s|^prefix=.*|prefix=$sysroot/usr|" "$sysroot"/usr/lib/aarch64-linux-gnu/pkgconfig/*.pc
  touch "$sysroot/.unpacked"
fi
cmake -S . -B build-aarch64 -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DLOCKSTEP_AARCH64_SYSROOT="$sysroot" \
  -DLOCKSTEP_WITH_MPI=OFF -DLOCKSTEP_BUILD_TESTS=OFF -DLOCKSTEP_BUILD_BENCH=OFF >/dev/null
cmake --build build-aarch64 -j"$(nproc)" --target lockstep
# No `-L /usr/aarch64-linux-gnu`: with it, qemu loads the cross toolchain's ld.so (libc6-arm64-cross)
# while ld.so loads libc.so.6 from the system's arm64 libc (libc6:arm64), and Debian ships those two
# at different versions. The pair does not agree on glibc's private interface between ld.so and
# libc, and the first pthread_create spun forever: any dynamically linked program that starts a
# thread hung, which is why this script once trained with one thread only. Without -L both come
# from libc6:arm64 (pulled in by libc6-dev:arm64 above).
run() {
  QEMU_SET_ENV=LD_LIBRARY_PATH=$sysroot/usr/lib/aarch64-linux-gnu qemu-aarch64 build-aarch64/lockstep "$@"
}
run --version
# qemu's default CPU ("max") has the dot-product extension: both NEON variants are usable, and
# the selftest checks every kernel on each (NEON_DOTPROD's int8 GEMM uses sdot) against the
# scalar reference at 1, 2, 3, 4 and 7 threads (a few seconds).
run --version | grep -q '^SIMD variants usable on this CPU: .*NEON_DOTPROD' ||
  { echo "aarch64 (qemu): NEON_DOTPROD is not usable on qemu's default CPU" >&2; exit 1; }
run selftest | tail -1
# A CPU without it (Cortex-A57) offers NEON alone.
if QEMU_CPU=cortex-a57 run --version | grep -q '^SIMD variants usable on this CPU: .*NEON_DOTPROD'; then
  echo "aarch64 (qemu): NEON_DOTPROD is offered on a Cortex-A57, which lacks sdot" >&2
  exit 1
fi
echo "aarch64 (qemu): NEON_DOTPROD offered with the dot-product extension, not without it"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run data synth --out "$tmp/data" --seed 7 --tokens 200000 >/dev/null 2>&1
# CONFIG trained STEPS steps at THREADS threads must give the first STEPS steps of FIXTURE, the
# chain x86-64 gives (a shorter run's chain is a prefix of a longer one's).
check_chain() {
  local config=$1 fixture=$2 steps=$3 threads=$4 out="$tmp/$1-$3-$4"
  run train --config "$config" --data "$tmp/data" --out "$out" --steps "$steps" \
    --threads "$threads" --no-progress >/dev/null 2>&1
  if cmp -s "$out/state_hashes.jsonl" <(head -n $((steps + 1)) "$fixture"); then
    echo "aarch64 (qemu), $threads thread(s): $config's $steps-step chain = golden chain (x86-64's)"
  else
    echo "aarch64 (qemu), $threads thread(s): $config's $steps-step chain DIFFERS from $fixture" >&2
    diff <(head -3 "$out/state_hashes.jsonl") <(head -3 "$fixture") >&2 || true
    exit 1
  fi
}
# tiny-int8's linears run on sdot (NEON_DOTPROD, the best variant here).
if [[ $short ]]; then
  check_chain tiny tests/fixtures/tiny_chain.jsonl 3 1
  check_chain tiny-int8 tests/fixtures/tiny_int8_chain.jsonl 3 1
  check_chain tiny-bf16 tests/fixtures/tiny_bf16_chain.jsonl 3 1
else
  check_chain tiny tests/fixtures/tiny_chain.jsonl 20 1
  check_chain tiny tests/fixtures/tiny_chain.jsonl 20 2
  check_chain tiny-int8 tests/fixtures/tiny_int8_chain.jsonl 20 1
  check_chain tiny-bf16 tests/fixtures/tiny_bf16_chain.jsonl 20 1
fi
