#!/usr/bin/env bash
# The quality of the int8 linears: trains `smoke`, `smoke-int8` (the same model with int8 linears
# and the int8 backward, docs/model.md "Linears") and smoke-int8 with `int8_backward: false` (the
# straight-through backward's fp32 GEMMs) for STEPS steps on one synthetic corpus, at THREADS
# threads, and prints JSON: each run's mean loss over its last 50 steps, each int8 run's relative
# to fp32's, and each run's mean tokens/s. A benchmark, not a test (minutes on 2 cores).
# With SEED, every run has train.seed = SEED and train.data_seed = SEED + 1, on a corpus
# synthesized with seed SEED + 7 (else the configs' own seeds, on the corpus of seed 11).
#   scripts/int8-quality.sh [STEPS (default 300)] [THREADS (default 2)] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
threads=${2:-2}
seed=${3:-}
lockstep=${LOCKSTEP:-build/lockstep}
[[ $steps =~ ^[0-9]+$ && $steps -ge 50 ]] || { echo "int8-quality.sh: STEPS must be an integer >= 50, not '$steps'" >&2; exit 2; }
[[ $threads =~ ^[0-9]+$ && $threads -ge 1 ]] || { echo "int8-quality.sh: THREADS must be a positive integer, not '$threads'" >&2; exit 2; }
[[ -z $seed || ($seed =~ ^[0-9]+$ && ${#seed} -le 15) ]] || { echo "int8-quality.sh: SEED must be a non-negative integer below 10^15, not '$seed'" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$lockstep" data synth --out "$tmp/data" --seed "$((${seed:-4} + 7))" --tokens 2000000 > /dev/null
# The three configs as files named for their runs: smoke-int8 with int8_backward: false has a
# name of its own, so that its descriptor says so; with SEED, each has its seeds.
seeds=()
[[ -n $seed ]] && seeds=(-e "s/^  seed: .*/  seed: $seed/" -e "s/^  data_seed: .*/  data_seed: $((seed + 1))/")
cp configs/smoke.yaml configs/smoke-int8.yaml "$tmp/"
sed -e 's/^name: smoke-int8$/name: smoke-int8-straight-through/' \
  -e 's/^  int8_backward: true\b.*$/  int8_backward: false/' configs/smoke-int8.yaml > "$tmp/smoke-int8-straight-through.yaml"
grep -q '^  int8_backward: false$' "$tmp/smoke-int8-straight-through.yaml" ||
  { echo "int8-quality.sh: configs/smoke-int8.yaml has no '  int8_backward: true' line to turn off" >&2; exit 1; }
if [[ -n $seed ]]; then
  for name in smoke smoke-int8 smoke-int8-straight-through; do
    sed -i "${seeds[@]}" "$tmp/$name.yaml"
    grep -q "^  seed: $seed\$" "$tmp/$name.yaml" && grep -q "^  data_seed: $((seed + 1))\$" "$tmp/$name.yaml" ||
      { echo "int8-quality.sh: configs/$name.yaml has no '  seed:' or '  data_seed:' line to set" >&2; exit 1; }
  done
fi
for name in smoke smoke-int8 smoke-int8-straight-through; do
  config=$tmp/$name.yaml
  echo "int8-quality.sh: training $name for $steps steps at $threads threads" >&2
  "$lockstep" train --config "$config" --data "$tmp/data" --out "$tmp/$name" --steps "$steps" \
    --threads "$threads" --no-progress > /dev/null
done
python3 - "$tmp" "$steps" "$threads" "$("$lockstep" --version | grep '^active variant' | cut -d' ' -f3)" "${seed:-}" <<'PY'
import json, sys
tmp, steps, threads, variant, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
runs = {}
for config in ("smoke", "smoke-int8", "smoke-int8-straight-through"):
    lines = [json.loads(l) for l in open(f"{tmp}/{config}/metrics.jsonl")]
    last = [l["loss"] for l in lines[-50:]]
    runs[config] = {"mean_loss_last_50": sum(last) / len(last),
                    "final_loss": lines[-1]["loss"],
                    "mean_tokens_per_second": sum(l["tokens_per_second"] for l in lines) / len(lines)}
out = {"steps": steps, "threads": threads, "simd_variant": variant,
       "seed": int(seed) if seed else "the configs'", "runs": runs}
for config in ("smoke-int8", "smoke-int8-straight-through"):
    ratio = runs[config]["mean_loss_last_50"] / runs["smoke"]["mean_loss_last_50"]
    out[config] = {"over_fp32_mean_loss_last_50": ratio, "within_3_percent": abs(ratio - 1) <= 0.03}
print(json.dumps(out, indent=2))
PY
