#!/usr/bin/env bash
# The check to run on a lent GPU machine (the device tool), from the repository root with
# gpu-bundle/ carried (scripts/gpu-bundle.sh builds it here). Installs nothing; a few minutes.
# Prints the OpenCL devices and their FP configs, runs the selftest on the device (every op it
# runs against the scalar reference, at several work-group sizes and GEMM tilings), dumps the
# program binaries the driver built and counts unrounded, flushing and approximate float
# instructions in them (scripts/ptx-check.sh, where they are PTX), times the device GEMM at
# 4096³ (GEMM_N) at every candidate tiling, trains `tiny` 20 steps with its ops on the device,
# which must give the golden chain (tests/fixtures/tiny_chain.jsonl), and times BENCH_STEPS
# (default 3) steps of BENCH_CONFIG (default bench-8x512) on the device: seconds, tokens/s and
# model TFLOP/s of its fastest step. Writes $OUT/gpu-check.json (and the logs beside it); prints PASS or FAIL.
# LOCKSTEP_DEVICE picks the device (default: opencl, i.e. opencl:0:0), LOCKSTEP_BUNDLE the bundle.
# Here, on PoCL: scripts/gpu-bundle.sh --vendor libpocl.so.2 && GEMM_N=512 scripts/gpu-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
rm -rf "$out/data" "$out/tiny" "$out/bench" "$out/programs"  # this script's own, from an earlier run
device=${LOCKSTEP_DEVICE:-opencl}
bundle=$(realpath -m "${LOCKSTEP_BUNDLE:-gpu-bundle}")
[[ -x $bundle/lockstep ]] || { echo "no $bundle: run scripts/gpu-bundle.sh first" >&2; exit 2; }
export OCL_ICD_VENDORS=$bundle/vendors CUDA_CACHE_DISABLE=1
lockstep=("$bundle/lib/ld-linux-x86-64.so.2" --library-path "$bundle/lib" "$bundle/lockstep")

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -2
"${lockstep[@]}" --version > "$out/version.txt" 2>&1
sed -n '/^OpenCL devices/,$p' "$out/version.txt"
timeout 240 "${lockstep[@]}" selftest --device "$device" --dump-programs "$out/programs" --time-gemm "${GEMM_N:-4096}" \
  > "$out/selftest.txt" 2>&1
selftest=$?
grep -E "^device:|ops on the device|MISMATCH|error" "$out/selftest.txt"
gemm=$(grep -E '^\{"gemm"' "$out/selftest.txt" || echo null)
ptx=none
if compgen -G "$out/programs/*.ptx" >/dev/null; then
  if scripts/ptx-check.sh "$out"/programs/*.ptx > "$out/ptx-check.txt" 2>&1; then ptx=pass; else ptx=fail; fi
  cat "$out/ptx-check.txt"
fi
"${lockstep[@]}" data synth --out "$out/data" --seed 7 --tokens 200000 > /dev/null 2>&1
start=$(date +%s%N)
timeout 240 "${lockstep[@]}" train --config tiny --data "$out/data" --out "$out/tiny" --steps 20 \
  --device "$device" --no-progress > "$out/train.txt" 2>&1
train=$?
milliseconds=$((($(date +%s%N) - start) / 1000000))
golden=false
[[ $train -eq 0 ]] && cmp -s "$out/tiny/state_hashes.jsonl" tests/fixtures/tiny_chain.jsonl && golden=true
echo "tiny, 20 steps on $device: exit $train, golden chain: $golden, $milliseconds ms"
bench=null bench_exit=0
bench_config=${BENCH_CONFIG:-bench-8x512}
if ((${BENCH_STEPS:-3} > 0)); then
  timeout 150 "${lockstep[@]}" train --config "$bench_config" --data "$out/data" --out "$out/bench" \
    --steps "${BENCH_STEPS:-3}" --device "$device" --no-progress > "$out/bench.txt" 2>&1
  bench_exit=$?
  # The fastest step's seconds and tokens/s from metrics.jsonl; its model FLOPs from the config.
  read -r flops tokens < <("${lockstep[@]}" model describe --config "$bench_config" |
    sed -n 's/^model FLOPs per step: \([0-9.]*\) GFLOP (\([0-9]*\) sequences of \([0-9]*\).*/\1 \2*\3/p')
  tokens=$((tokens))
  best=$(grep -o '"step_seconds":[0-9.e+-]*' "$out/bench/metrics.jsonl" 2>/dev/null |
    cut -d: -f2 | sort -g | head -1)
  if [[ $bench_exit -eq 0 && -n $best && -n $flops ]]; then
    bench=$(awk -v c="$bench_config" -v s="$best" -v f="$flops" -v t="$tokens" 'BEGIN {
      printf "{\"config\": \"%s\", \"step_seconds\": %.4f, ", c, s
      printf "\"tokens_per_second\": %.0f, \"model_tflops\": %.3f}", t / s, f / s / 1000 }')
  fi
  echo "$bench_config on $device: exit $bench_exit, fastest step: $bench"
fi
verdict=PASS
[[ $selftest -eq 0 && $ptx != fail && $train -eq 0 && $golden == true && $bench_exit -eq 0 ]] ||
  verdict=FAIL
cat > "$out/gpu-check.json" <<JSON
{"device": "$device", "selftest_exit": $selftest, "ptx_check": "$ptx", "gemm": $gemm,
 "tiny_train_exit": $train, "tiny_golden_chain": $golden, "tiny_milliseconds": $milliseconds,
 "bench": $bench, "verdict": "$verdict"}
JSON
cat "$out/gpu-check.json"
echo "$verdict"
[[ $verdict == PASS ]]
