#!/usr/bin/env bash
# The open-1b audit on this machine, measured end to end (issue: "open-1b one-step interval
# replay"). With bench/configs/open-1b-step.yaml (open-1b's 1.61B parameters, one 256-token
# sequence per step) it:
#   1. trains step 0 and step 1 with the state on disk (--spill-dir): the publisher's side,
#      giving the step-0 checkpoint (init state, zero moments) and the chain's hash of step 1;
#   2. deletes the step-1 checkpoint (only its chain line is needed; it frees 26 GB);
#   3. replays the init unit (streamed, tensor by tensor) against chain line 0;
#   4. replays the one-step interval 0 -> 1 from the step-0 checkpoint against chain line 1;
# and prints one JSON object: each replay's result (match, wall time, peak RSS measured and
# planned) and the disk each part used; then each phase of the interval replay against its
# limits on this machine: bytes read ÷ the disk's read bandwidth, bytes written ÷ its write
# bandwidth (both measured here with dd and O_DIRECT), bytes hashed ÷ the hash rate at THREADS
# (bench_hash), and the step's model FLOPs ÷ the GEMM rate (bench_train_step --flops). A phase's
# limit is the largest of them: what it would take if the rest overlapped it perfectly. (Bytes
# read again soon after they were read or written, such as the gradients, may come from the page
# cache instead of the disk: there the read limit is an upper bound.)
# Needs ~55 GB free under WORK and ~6 minutes on 2 cores.
#
# WORK_DIR must be new, empty, or one this script made (scripts/lib/work-dir.sh): its contents
# are replaced.
#
# usage: bench/replay_open1b.sh [--config FILE] [WORK_DIR] [THREADS]
#        (default bench/configs/open-1b-step.yaml, /tmp/lockstep-open1b, nproc;
#        bench/configs/open-1b-int8-step.yaml is the same step with OPEN's whole recipe)
set -euo pipefail
config=bench/configs/open-1b-step.yaml
if [[ ${1:-} == --config ]]; then
  config=$(realpath -e -- "${2:?--config needs a file}")
  shift 2
fi
work=$(realpath -m -- "${1:-/tmp/lockstep-open1b}")
threads=${2:-$(nproc)}
cd "$(dirname "$0")/.."
bin=build/lockstep
[[ -x $bin ]] || { echo "build first: scripts/build.sh" >&2; exit 2; }
source scripts/lib/work-dir.sh
claim_work_dir "$work" bench/replay_open1b.sh
du_bytes() { du -sb "$1" | cut -f1; }

echo "== data" >&2
$bin data synth --out "$work/data" --seed 7 --tokens 200000 >&2

echo "== train steps 0 and 1 (state on disk)" >&2
start=$SECONDS
/usr/bin/time -f "%M" -o "$work/train.maxrss_kib" \
  $bin train --config "$config" --data "$work/data" --out "$work/run" --steps 1 \
  --threads "$threads" --spill-dir "$work/train-spill" --no-progress >&2
train_seconds=$((SECONDS - start))
step0_bytes=$(du_bytes "$work/run/checkpoints/step_000000000")
rm -rf "$work/run/checkpoints/step_000000001"

# Each replay starts from a cold page cache with nothing left to write back (the training just
# wrote 19 GB), as an auditor's would: sync always, drop the cache where we may (root).
cold() {
  sync
  if [[ -w /proc/sys/vm/drop_caches ]]; then echo 3 >/proc/sys/vm/drop_caches; cold_cache=true; fi
}
cold_cache=false

echo "== this machine's limits" >&2
cold
read_bps=$(dd if="$work/run/checkpoints/step_000000000/model.safetensors" of=/dev/null bs=64M \
  count=64 iflag=direct 2>&1 | awk '/copied/ {print $1 / $(NF-3)}')
write_bps=$(dd if=/dev/zero of="$work/dd-write" bs=64M count=32 oflag=direct 2>&1 |
  awk '/copied/ {print $1 / $(NF-3)}')
rm -f "$work/dd-write"
build/bench/bench_hash 512 "$threads" >"$work/hash.json"
build/bench/bench_train_step --flops --config "$config" --threads "$threads" >"$work/flops.json"

echo "== init unit" >&2
cold
$bin replay --from-init --config "$config" --data "$work/data" --threads "$threads" \
  --expect-hash "$(sed -n 1p "$work/run/state_hashes.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["hash"])')" \
  >"$work/init.json"

echo "== interval unit 0 -> 1" >&2
cold
$bin replay --checkpoint "$work/run/checkpoints/step_000000000" --until-step 1 \
  --data "$work/data" --threads "$threads" --spill-dir "$work/replay-spill" >"$work/interval.json"

python3 - "$work" "$train_seconds" "$step0_bytes" "$threads" "$cold_cache" "$read_bps" \
  "$write_bps" "$config" <<'EOF'
import json, re, sys
work, train_seconds, step0_bytes = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
read_bps, write_bps = float(sys.argv[6]), float(sys.argv[7])
hash_json = json.load(open(f"{work}/hash.json"))
hash_bps = next(v for k, v in hash_json.items()
                if re.fullmatch(r"array_digest_\d+_threads_gib_per_s", k)) * 2**30
flops = json.load(open(f"{work}/flops.json"))
gemm_flops_per_s = flops["gemm_gflops"] * 1e9
def limits(phase):
    parts = {"read": phase["read_bytes"] / read_bps,
             "write": phase["written_bytes"] / write_bps,
             "hash": phase["hashed_bytes"] / hash_bps}
    if phase["name"].endswith("forward and backward"):
        parts["compute"] = flops["step_flops"] / gemm_flops_per_s
    limit = max(parts.values())
    return {"name": phase["name"], "seconds": round(phase["seconds"], 2),
            "read_gb": round(phase["read_bytes"] / 1e9, 2),
            "written_gb": round(phase["written_bytes"] / 1e9, 2),
            "hashed_gb": round(phase["hashed_bytes"] / 1e9, 2),
            "limit_seconds": {k: round(v, 2) for k, v in parts.items()},
            "limit": round(limit, 2),
            "limit_over_seconds": round(limit / phase["seconds"], 3) if limit > 0 else None}
def unit(name):
    r = json.load(open(f"{work}/{name}.json"))
    planned, peak = r["planned_peak_rss_bytes"], r["peak_rss_bytes"]
    return {"match": r["match"], "state_hash": r["state_hash"], "wall_seconds": r["wall_seconds"],
            "peak_rss_bytes": peak, "peak_rss_gib": round(peak / 2**30, 3),
            "planned_peak_rss_bytes": planned,
            "plan_error": round((planned - peak) / peak, 4),
            "spill_disk_bytes": r.get("spill_disk_bytes", 0)}
print(json.dumps({
    "config": sys.argv[8], "threads": int(sys.argv[4]),
    "page_cache_dropped_before_each_replay": sys.argv[5] == "true",
    "train_steps_0_1": {"wall_seconds": round(train_seconds, 1),
                        "peak_rss_bytes": int(open(f"{work}/train.maxrss_kib").read()) * 1024},
    "step0_checkpoint_bytes": step0_bytes,
    "init_unit": unit("init"),
    "interval_unit_0_1": unit("interval"),
    "machine": {"disk_read_gb_per_s": round(read_bps / 1e9, 3),
                "disk_write_gb_per_s": round(write_bps / 1e9, 3),
                "hash_gib_per_s": round(hash_bps / 2**30, 3),
                "gemm_gflops": flops["gemm_gflops"], "step_flops": flops["step_flops"]},
    "interval_phases": [limits(p) for p in json.load(open(f"{work}/interval.json"))["phases"]],
}, indent=2))
EOF
