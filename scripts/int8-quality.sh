#!/usr/bin/env bash
# The quality of the int8 linears: trains `smoke`, `smoke-int8` (the same model with int8 linears
# and the int8 backward, docs/model.md "Linears") and smoke-int8 with `int8_backward: false` (the
# straight-through backward's fp32 GEMMs) for STEPS steps on one synthetic corpus, at THREADS
# threads, and prints JSON: each run's mean loss over its last 50 steps, each int8 run's relative
# to fp32's, and each run's mean tokens/s. A benchmark, not a test (minutes on 2 cores).
#   scripts/int8-quality.sh [STEPS (default 300)] [THREADS (default 2)]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
threads=${2:-2}
lockstep=${LOCKSTEP:-build/lockstep}
[[ $steps =~ ^[0-9]+$ && $steps -ge 50 ]] || { echo "int8-quality.sh: STEPS must be an integer >= 50, not '$steps'" >&2; exit 2; }
[[ $threads =~ ^[0-9]+$ && $threads -ge 1 ]] || { echo "int8-quality.sh: THREADS must be a positive integer, not '$threads'" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$lockstep" data synth --out "$tmp/data" --seed 11 --tokens 2000000 > /dev/null
# smoke-int8 with int8_backward: false (a config of its own name, so that its descriptor says so).
sed -e 's/^name: smoke-int8$/name: smoke-int8-straight-through/' \
  -e 's/^  int8_backward: true\b.*$/  int8_backward: false/' configs/smoke-int8.yaml > "$tmp/smoke-int8-straight-through.yaml"
grep -q '^  int8_backward: false$' "$tmp/smoke-int8-straight-through.yaml" ||
  { echo "int8-quality.sh: configs/smoke-int8.yaml has no '  int8_backward: true' line to turn off" >&2; exit 1; }
for config in smoke smoke-int8 "$tmp/smoke-int8-straight-through.yaml"; do
  name=$(basename "$config" .yaml)
  echo "int8-quality.sh: training $name for $steps steps at $threads threads" >&2
  "$lockstep" train --config "$config" --data "$tmp/data" --out "$tmp/$name" --steps "$steps" \
    --threads "$threads" --no-progress > /dev/null
done
python3 - "$tmp" "$steps" "$threads" "$("$lockstep" --version | grep '^active variant' | cut -d' ' -f3)" <<'PY'
import json, sys
tmp, steps, threads, variant = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
runs = {}
for config in ("smoke", "smoke-int8", "smoke-int8-straight-through"):
    lines = [json.loads(l) for l in open(f"{tmp}/{config}/metrics.jsonl")]
    last = [l["loss"] for l in lines[-50:]]
    runs[config] = {"mean_loss_last_50": sum(last) / len(last),
                    "final_loss": lines[-1]["loss"],
                    "mean_tokens_per_second": sum(l["tokens_per_second"] for l in lines) / len(lines)}
out = {"steps": steps, "threads": threads, "simd_variant": variant, "runs": runs}
for config in ("smoke-int8", "smoke-int8-straight-through"):
    ratio = runs[config]["mean_loss_last_50"] / runs["smoke"]["mean_loss_last_50"]
    out[config] = {"over_fp32_mean_loss_last_50": ratio, "within_3_percent": abs(ratio - 1) <= 0.03}
print(json.dumps(out, indent=2))
PY
