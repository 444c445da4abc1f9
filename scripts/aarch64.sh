#!/usr/bin/env bash
# The numerics contract on AArch64: cross-builds the lockstep binary for arm64 (Debian's
# g++-aarch64-linux-gnu and arm64 libraries, without MPI or the tests) into build-aarch64, then
# under qemu-aarch64 runs the selftest and trains `tiny` 20 steps at 1 and 2 threads with the
# NEON variant; each run must give the pinned golden chain (tests/fixtures/tiny_chain.jsonl) that
# x86-64 gives, and `tiny-int8` (int8 linears) 20 steps at 1 thread its own
# (tests/fixtures/tiny_int8_chain.jsonl). Needs root for the packages (it adds arm64 ones beside
# the native ones and removes nothing); slow (qemu: about 4 s per step at one thread).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
  apt-get update -qq
fi
install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
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
# Every kernel, NEON against the scalar reference, at 1, 2, 3, 4 and 7 threads (a few seconds).
run selftest | tail -1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run data synth --out "$tmp/data" --seed 7 --tokens 200000 >/dev/null 2>&1
for threads in 1 2; do
  run train --config tiny --data "$tmp/data" --out "$tmp/run$threads" --steps 20 \
    --threads "$threads" --no-progress >/dev/null 2>&1
  if cmp -s "$tmp/run$threads/state_hashes.jsonl" tests/fixtures/tiny_chain.jsonl; then
    echo "aarch64 (qemu), $threads thread(s): tiny chain = golden chain (x86-64's)"
  else
    echo "aarch64 (qemu), $threads thread(s): tiny chain DIFFERS from the golden chain" >&2
    diff <(head -3 "$tmp/run$threads/state_hashes.jsonl") \
      <(head -3 tests/fixtures/tiny_chain.jsonl) >&2 || true
    exit 1
  fi
done
# The int8 linears on NEON: tiny-int8 20 steps at 1 thread against its pinned chain.
run train --config tiny-int8 --data "$tmp/data" --out "$tmp/int8" --steps 20 --no-progress \
  >/dev/null 2>&1
if cmp -s "$tmp/int8/state_hashes.jsonl" tests/fixtures/tiny_int8_chain.jsonl; then
  echo "aarch64 (qemu): tiny-int8 chain = golden chain (x86-64's)"
else
  echo "aarch64 (qemu): tiny-int8 chain DIFFERS from the golden chain" >&2
  exit 1
fi
