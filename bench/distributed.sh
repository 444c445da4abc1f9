#!/usr/bin/env bash
# Data-parallel training measured (docs/distributed.md). Prints one JSON object:
#  - throughput: bench-8x512 (as 2 microbatches of 4 sequences in 2 gradient groups, so that two
#    processes can share a step) trained by one process with 2 threads and by 2 processes with
#    1 thread each, side by side: median tokens/s, rank 0's seconds per step of exchanges, the
#    part of them hidden behind the compute, bytes sent per step, and the ratio (target >= 0.95);
#    the two chains must match;
#  - memory: open-100m with microbatch 1 x seq 256, 1 step, at N = 1, 2, 4 in both layouts
#    (docs/distributed.md): fully sharded (4 microbatches in 4 groups) and replicated (8
#    microbatches in 4 groups): every rank's peak RSS, and the N = 4 rank's ratio to N = 1.
#
# usage: bench/distributed.sh [--build DIR] [--steps N] [--skip-memory]
#   --build: the CMake build directory holding ./lockstep (default build)
# Timings are noisy on a shared machine: the load average is printed next to them (stderr).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
steps=8
memory=1
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --skip-memory) memory=0; shift ;;
    *) sed -n '12,14p' "$0" >&2; exit 2 ;;
  esac
done
lockstep=$build/lockstep
[[ -x $lockstep ]] || { echo "$lockstep not built: scripts/build.sh" >&2; exit 1; }
mpirun=(mpirun --oversubscribe --allow-run-as-root)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$lockstep" data synth --out "$tmp/data" --seed 7 --tokens 2000000 >/dev/null 2>&1

# A config derived from an embedded one: key: value replacements in its YAML.
derive() {  # derive NAME OUT key=value...
  local name=$1 out=$2
  shift 2
  cp "$root/configs/$name.yaml" "$out"
  for kv in "$@"; do
    local key=${kv%%=*} value=${kv#*=}
    if grep -q "^  $key:" "$out"; then
      sed -i "s|^  $key:.*|  $key: $value|" "$out"
    else
      sed -i "s|^  microbatches:\(.*\)|  microbatches:\1\n  $key: $value|" "$out"
    fi
  done
}

derive bench-8x512 "$tmp/bench-dp.yaml" microbatch=4 microbatches=2 grad_groups=2 steps="$steps" ckpt_every=0
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$lockstep" train --config "$tmp/bench-dp.yaml" --data "$tmp/data" --out "$tmp/n1" --threads 2 --no-progress >"$tmp/n1.log" 2>&1
"${mpirun[@]}" -np 2 "$lockstep" train --config "$tmp/bench-dp.yaml" --data "$tmp/data" --out "$tmp/n2" --threads 1 --no-progress >"$tmp/n2.log" 2>&1
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)" >&2
cmp -s "$tmp/n1/state_hashes.jsonl" "$tmp/n2/state_hashes.jsonl" && same=true || same=false

if ((memory)); then
  derive open-100m "$tmp/sharded.yaml" microbatch=1 seq_len=256 microbatches=4 grad_groups=4 steps=1 ckpt_every=0
  derive open-100m "$tmp/replicated.yaml" microbatch=1 seq_len=256 microbatches=8 grad_groups=4 steps=1 ckpt_every=0
  for layout in sharded replicated; do
    "$lockstep" train --config "$tmp/$layout.yaml" --data "$tmp/data" --out "$tmp/$layout-1" --threads 2 --no-progress >"$tmp/$layout-1.log" 2>&1
    for n in 2 4; do
      "${mpirun[@]}" -np $n "$lockstep" train --config "$tmp/$layout.yaml" --data "$tmp/data" --out "$tmp/$layout-$n" --threads 1 --no-progress >"$tmp/$layout-$n.log" 2>&1
    done
  done
fi

python3 - "$tmp" "$same" "$memory" <<'PY'
import json, re, statistics, sys
tmp, same, memory = sys.argv[1], sys.argv[2] == "true", sys.argv[3] == "1"
def steps(run):
    rows = [json.loads(l) for l in open(f"{tmp}/{run}/metrics.jsonl")]
    return rows[1:] if len(rows) > 2 else rows  # the first step warms up
def summary(run, processes, threads):
    rows = steps(run)
    return {"processes": processes, "threads_per_process": threads,
            "tokens_per_second": statistics.median(r["tokens_per_second"] for r in rows),
            "step_seconds": statistics.median(r["step_seconds"] for r in rows),
            "comm_seconds_per_step": statistics.median(r["comm_seconds"] for r in rows),
            "comm_hidden_seconds_per_step":
                statistics.median(r.get("comm_hidden_seconds", 0) for r in rows),
            "comm_bytes_per_step_rank0": statistics.median(r["comm_bytes"] for r in rows)}
one, two = summary("n1", 1, 2), summary("n2", 2, 1)
out = {"config": "bench-8x512 as 2 microbatches x 4 sequences, grad_groups 2",
       "one_process": one, "two_processes": two,
       "ratio_two_processes_over_one": two["tokens_per_second"] / one["tokens_per_second"],
       "target_ratio": 0.95, "chains_equal": same}
if memory:
    for layout in ("sharded", "replicated"):
        rss = {}
        for n in (1, 2, 4):
            text = open(f"{tmp}/{layout}-{n}.log").read()
            line = re.search(r"peak RSS (?:of the process|per rank): (.*)", text).group(1)
            rss[str(n)] = [float(x.split()[0]) for x in line.split(", ")]
        out[f"open-100m_mb1_seq256_{layout}_peak_rss_mib_per_rank"] = rss
        out[f"{layout}_n4_max_over_n1"] = max(rss["4"]) / rss["1"][0]
    out["target_sharded_n4_max_over_n1"] = 0.35
print(json.dumps(out, indent=2))
PY
