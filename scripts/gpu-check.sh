#!/usr/bin/env bash
# The check to run on a lent GPU machine (the device tool), from the repository root with
# gpu-bundle/ carried (scripts/gpu-bundle.sh builds it here). Installs nothing; at most a few
# minutes.
#
# For every device runtime the machine has -- CUDA first (NVIDIA's driver, libcuda.so.1), then
# OpenCL (where an OpenCL driver is present: NVIDIA's libnvidia-opencl.so.1 through the carried
# ICD loader, or PoCL here) -- it runs the selftest on the device (every op it runs against the
# scalar reference, at several work-group sizes and every GEMM tiling it fits), dumps the
# programs as the device's compiler built them and checks them (scripts/ptx-check.sh, where they
# are PTX), times the device GEMM at GEMM_N³ (default 4096) at every candidate tiling, trains
# `tiny` 20 steps with its ops on the device, which must give the golden chain
# (tests/fixtures/tiny_chain.jsonl), and times BENCH_STEPS (default 3) steps of BENCH_CONFIG
# (default bench-8x512): seconds, tokens/s and model TFLOP/s of the fastest. Then the anchor,
# with the machine's own python3 and PyTorch (scripts/gpu-anchor.py: cuBLAS SGEMM with TF32 off
# at 4096³ and 8192³, the kernel named; a PyTorch fp32 step of BENCH_CONFIG), and the ratios
# lockstep/cuBLAS (GEMM at 4096³) and lockstep/PyTorch (the step), per runtime.
#
# Writes $OUT/gpu-check.json (and the logs beside it); prints PASS or FAIL. PASS needs at least
# one runtime and every runtime found to pass. LOCKSTEP_DEVICES lists the devices to check
# instead (e.g. "cuda:1 opencl:0:0"), LOCKSTEP_BUNDLE names the bundle, ANCHOR=0 skips the anchor.
# Here, on PoCL: scripts/gpu-bundle.sh --vendor libpocl.so.2 && GEMM_N=512 scripts/gpu-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$(mktemp -d)}
source scripts/lib/work-dir.sh
claim_work_dir "$out" scripts/gpu-check.sh  # new, empty, or this script's own from an earlier run
bundle=$(realpath -m "${LOCKSTEP_BUNDLE:-gpu-bundle}")
[[ -x $bundle/lockstep ]] || { echo "no $bundle: run scripts/gpu-bundle.sh first" >&2; exit 2; }
export OCL_ICD_VENDORS=$bundle/vendors CUDA_CACHE_DISABLE=1
lockstep=("$bundle/lib/ld-linux-x86-64.so.2" --library-path "$bundle/lib" "$bundle/lockstep")
bench_config=${BENCH_CONFIG:-bench-8x512}
gemm_n=${GEMM_N:-4096}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -2
"${lockstep[@]}" --version > "$out/version.txt" 2>&1
sed -n '/^OpenCL devices/,$p' "$out/version.txt"
if [[ -n ${LOCKSTEP_DEVICES:-} ]]; then
  read -ra devices <<< "$LOCKSTEP_DEVICES"
else  # the first device of each runtime --version lists
  devices=()
  cuda=$(grep -oE '^  cuda:[0-9]+' "$out/version.txt" | head -1 | tr -d ' ')
  opencl=$(grep -oE '^  opencl:[0-9]+:[0-9]+' "$out/version.txt" | head -1 | tr -d ' ')
  [[ -n $cuda ]] && devices+=("$cuda")
  [[ -n $opencl ]] && devices+=("$opencl")
fi
"${lockstep[@]}" data synth --out "$out/data" --seed 7 --tokens 200000 > /dev/null 2>&1
# The bench config's model FLOPs per step and tokens per step (lockstep model describe).
read -r flops tokens < <("${lockstep[@]}" model describe --config "$bench_config" |
  sed -n 's/^model FLOPs per step: \([0-9.]*\) GFLOP (\([0-9]*\) sequences of \([0-9]*\).*/\1 \2*\3/p')
tokens=$((tokens))

# One runtime's checks: $1 the device; writes $out/runtime-NAME/ and prints its JSON object.
check_device() {
  local device=$1 dir="$out/runtime-${1//:/-}"
  mkdir -p "$dir"
  timeout 240 "${lockstep[@]}" selftest --device "$device" --dump-programs "$dir/programs" \
    --time-gemm "$gemm_n" > "$dir/selftest.txt" 2>&1
  local selftest=$?
  grep -E "^device:|ops on the device|MISMATCH|error" "$dir/selftest.txt" >&2
  local gemm
  gemm=$(grep -E '^\{"gemm"' "$dir/selftest.txt" || echo null)
  local ptx=none
  if compgen -G "$dir/programs/*.ptx" > /dev/null; then
    if scripts/ptx-check.sh "$dir"/programs/*.ptx > "$dir/ptx-check.txt" 2>&1; then ptx=pass; else ptx=fail; fi
    grep -E "FAIL|resources" "$dir/ptx-check.txt" >&2
  fi
  local start train milliseconds golden=false
  start=$(date +%s%N)
  timeout 240 "${lockstep[@]}" train --config tiny --data "$out/data" --out "$dir/tiny" --steps 20 \
    --device "$device" --no-progress > "$dir/train.txt" 2>&1
  train=$?
  milliseconds=$((($(date +%s%N) - start) / 1000000))
  [[ $train -eq 0 ]] && cmp -s "$dir/tiny/state_hashes.jsonl" tests/fixtures/tiny_chain.jsonl &&
    golden=true
  echo "tiny, 20 steps on $device: exit $train, golden chain: $golden, $milliseconds ms" >&2
  local bench=null bench_exit=0 best
  if ((${BENCH_STEPS:-3} > 0)); then
    timeout 150 "${lockstep[@]}" train --config "$bench_config" --data "$out/data" \
      --out "$dir/bench" --steps "${BENCH_STEPS:-3}" --device "$device" --no-progress \
      > "$dir/bench.txt" 2>&1
    bench_exit=$?
    best=$(grep -o '"step_seconds":[0-9.e+-]*' "$dir/bench/metrics.jsonl" 2>/dev/null |
      cut -d: -f2 | sort -g | head -1)
    if [[ $bench_exit -eq 0 && -n $best && -n $flops ]]; then
      bench=$(awk -v c="$bench_config" -v s="$best" -v f="$flops" -v t="$tokens" 'BEGIN {
        printf "{\"config\": \"%s\", \"step_seconds\": %.4f, ", c, s
        printf "\"tokens_per_second\": %.0f, \"model_tflops\": %.3f}", t / s, f / s / 1000 }')
    fi
    echo "$bench_config on $device: exit $bench_exit, fastest step: $bench" >&2
  fi
  local verdict=PASS
  [[ $selftest -eq 0 && $ptx != fail && $train -eq 0 && $golden == true && $bench_exit -eq 0 ]] ||
    verdict=FAIL
  printf '{"device": "%s", "selftest_exit": %d, "ptx_check": "%s", "gemm": %s, ' \
    "$device" "$selftest" "$ptx" "$gemm"
  printf '"tiny_train_exit": %d, "tiny_golden_chain": %s, "tiny_milliseconds": %d, ' \
    "$train" "$golden" "$milliseconds"
  printf '"bench": %s, "verdict": "%s"}' "$bench" "$verdict"
}

runtimes="" verdict=PASS
((${#devices[@]} > 0)) || { echo "no CUDA or OpenCL device found" >&2; verdict=FAIL; }
for device in "${devices[@]}"; do
  result=$(check_device "$device")
  runtimes+=${runtimes:+, }$result
  [[ $result == *'"verdict": "PASS"}' ]] || verdict=FAIL
done

anchor=null
if [[ ${ANCHOR:-1} != 0 ]]; then
  anchor=$(timeout 150 python3 scripts/gpu-anchor.py --config "$bench_config" 2> "$out/anchor.txt" |
    tail -1)
  [[ $anchor == \{* ]] || anchor="{\"skipped\": \"gpu-anchor.py failed: see anchor.txt\"}"
  echo "anchor: $anchor"
fi
# lockstep / cuBLAS at 4096³ and lockstep / PyTorch for the step, per runtime (null where either
# side is missing).
ratios=$(python3 - "$anchor" "[$runtimes]" <<'EOF'
import json, sys
anchor, runtimes = json.loads(sys.argv[1]) or {}, json.loads(sys.argv[2])
cublas = {m["n"]: m["tflops"] for m in anchor.get("matmul", [])}
torch_step = (anchor.get("step") or {}).get("step_seconds")
out = {}
for r in runtimes:
    gemm, bench = r.get("gemm") or {}, r.get("bench") or {}
    out[r["device"]] = {
        "gemm_vs_cublas": round(gemm["tflops"] / cublas[gemm["n"]], 3)
        if gemm.get("n") in cublas else None,
        "step_vs_pytorch": round(torch_step / bench["step_seconds"], 3)
        if torch_step and bench.get("step_seconds") else None}
print(json.dumps(out))
EOF
)
cat > "$out/gpu-check.json" <<JSON
{"runtimes": [$runtimes],
 "anchor": $anchor,
 "ratios": ${ratios:-null},
 "verdict": "$verdict"}
JSON
cat "$out/gpu-check.json"
echo "$verdict"
[[ $verdict == PASS ]]
