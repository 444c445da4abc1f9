#!/usr/bin/env bash
# Builds gpu-bundle/, what scripts/gpu-check.sh runs on a lent GPU machine, where nothing can be
# installed and the system libraries are unknown (its glibc may be older than Debian 12's): the
# lockstep binary of build/ (scripts/build.sh), every library it loads and the dynamic loader to
# start it through (so it runs on the carried glibc, not the machine's), Debian's OpenCL ICD
# loader among them, and vendors/vendor.icd naming the vendor's OpenCL library
# (libnvidia-opencl.so.1; `--vendor LIB` names another, e.g. libpocl.so.2 to try the bundle
# here). Fails when the bundle exceeds the 64 MiB the device tool carries. LOCKSTEP_BUNDLE names
# another directory than gpu-bundle/, LOCKSTEP_BINARY another binary than build/lockstep.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=${LOCKSTEP_BUNDLE:-gpu-bundle}
binary=${LOCKSTEP_BINARY:-build/lockstep}
vendor=libnvidia-opencl.so.1
if [[ ${1:-} == --vendor ]]; then vendor=${2:?--vendor needs a library name}; fi
[[ -x $binary ]] || scripts/build.sh
source scripts/lib/work-dir.sh
claim_work_dir "$bundle" scripts/gpu-bundle.sh  # new, empty, or this script's own
mkdir -p "$bundle/lib" "$bundle/vendors"
cp "$binary" "$bundle/lockstep"
# ldd lists "name => /path (addr)" for each library and "/path/ld-linux... (addr)" for the loader.
ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}' |
  while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
[[ -e $bundle/lib/libOpenCL.so.1 ]] || { echo "$binary does not load libOpenCL.so.1" >&2; exit 1; }
echo "$vendor" > "$bundle/vendors/vendor.icd"
bytes=$(du -sb "$bundle" | cut -f1)
limit=$((64 << 20))
echo "$bundle: $(ls "$bundle/lib" | wc -l) libraries, $((bytes >> 20)) MiB of the $((limit >> 20)) MiB carried; vendor library $vendor"
((bytes <= limit)) || { echo "$bundle is over the limit" >&2; exit 1; }
