#!/usr/bin/env bash
# One open-1b step of one 4096-token sequence (the config's own sequence length) replayed with
# the state on disk, with and without --recompute-activations (docs/training.md, "Memory"):
# peak RSS, wall time and the state hash of each, which must be equal. The config is
# bench/configs/open-1b-step.yaml at seq_len 4096. Prints one JSON object.
# Needs ~50 GB free under WORK and, on 2 cores, about half an hour.
#
# WORK_DIR must be new, empty, or one this script made (scripts/lib/work-dir.sh): its contents
# are replaced.
#
# usage: bench/recompute_open1b.sh [WORK_DIR] [THREADS]   (default /tmp/lockstep-recompute, nproc)
set -euo pipefail
work=$(realpath -m -- "${1:-/tmp/lockstep-recompute}")
threads=${2:-$(nproc)}
cd "$(dirname "$0")/.."
bin=build/lockstep
[[ -x $bin ]] || { echo "build first: scripts/build.sh" >&2; exit 2; }
source scripts/lib/work-dir.sh
claim_work_dir "$work" bench/recompute_open1b.sh
sed 's/^  seq_len: .*/  seq_len: 4096/; s/^name: .*/name: open-1b-step-4096/' \
  bench/configs/open-1b-step.yaml > "$work/config.yaml"

echo "== data, and step 0 (the state on disk)" >&2
$bin data synth --out "$work/data" --seed 7 --tokens 200000 > /dev/null 2>&1
$bin train --config "$work/config.yaml" --data "$work/data" --out "$work/run" --steps 0 \
  --threads "$threads" --spill-dir "$work/train-spill" --no-progress >&2

for mode in kept recomputed; do
  echo "== replay 0 -> 1, activations $mode" >&2
  flag=$([[ $mode == recomputed ]] && echo --recompute-activations || true)
  sync
  start=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$work/$mode.maxrss_kib" \
    $bin replay --checkpoint "$work/run/checkpoints/step_000000000" --until-step 1 \
    --data "$work/data" --threads "$threads" --spill-dir "$work/replay-spill" $flag \
    > "$work/$mode.json" 2> "$work/$mode.log"
  echo "$(date +%s.%N) - $start" | bc > "$work/$mode.seconds"
done

python3 - "$work" "$threads" <<'EOF'
import json, sys
work, threads = sys.argv[1], int(sys.argv[2])
out = {"config": "open-1b-step at seq_len 4096: one 4096-token sequence, state on disk",
       "threads": threads}
for mode in ("kept", "recomputed"):
    result = json.load(open(f"{work}/{mode}.json"))
    out[mode] = {"peak_rss_gib": int(open(f"{work}/{mode}.maxrss_kib").read()) / 2**20,
                 "wall_seconds": float(open(f"{work}/{mode}.seconds").read()),
                 "planned_peak_rss_gib": result["planned_peak_rss_bytes"] / 2**30,
                 "state_hash": result["state_hash"]}
out["same_hash"] = out["kept"]["state_hash"] == out["recomputed"]["state_hash"]
out["target_recomputed_peak_rss_gib"] = 4
print(json.dumps(out, indent=2))
EOF
