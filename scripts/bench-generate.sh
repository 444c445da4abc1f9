#!/usr/bin/env bash
# Generation speed, lockstep against llama.cpp on the same weights, with this machine's memory
# read bandwidth and the decode speed it allows, all in one run; prints one JSON object on stdout
# (progress on stderr). docs/performance.md, "Generation".
#
#   scripts/bench-generate.sh [--build DIR] [--work DIR] [--prompt N] [--decode N]
#                             [--threads 1,2] [--batches 1,8] [--reps N] [--configs LIST]
#
# For each config (default: smoke, open-100m): a step-0 checkpoint (`lockstep train --steps 0` on
# a small `lockstep data synth` corpus: the seeded initial parameters; the values do not change
# the speed), exported with `lockstep export --format gguf --data` (F32; llama.cpp needs the
# byte vocabulary the dataset's tokenizer writes). lockstep's KvDecoder runs the
# checkpoint (build/bench/bench_generate --checkpoint, which also measures the read bandwidth and
# profiles decode at batch 1) and llama.cpp runs the GGUF (tests/clients/llama/bench.mjs,
# node-llama-cpp 3.21.1 from scripts/install-llama-client.sh), at the same thread counts, batch
# sizes, prompt and decode lengths. A config the GGUF export refuses (smoke: sliding windows
# with QK-norm) is measured on lockstep alone, the refusal recorded, and the nearest config
# that exports (the same with model.qk_norm: false, `smoke-noqknorm`) is measured on both.
# open-100m is also measured with model.compute_weights: bf16 (`open-100m-bf16`), whose decoder
# reads its weights as bfloat16s, half the bytes; llama.cpp runs its `--format gguf-bf16`
# export, its matrices BF16, half the bytes too (docs/export.md: llama.cpp then rounds its
# activations to bf16 as well, a nearby model; the speed is what is compared).
# A --work DIR must be new, empty, or one this script made (scripts/lib/work-dir.sh): its
# contents are replaced; it is kept. Without one a temporary directory is made and removed.
# Needs about 6 GB free under the work directory (open-100m's checkpoint and GGUF) and, on 2
# cores, about 4 minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build="$here/build"
work=""
prompt=128
decode=64
threads=1,2
batches=1,8
reps=2
configs="smoke,open-100m"
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --decode) decode=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--work DIR] [--prompt N] [--decode N] [--threads 1,2] [--batches 1,8] [--reps N] [--configs smoke,open-100m]" >&2; exit 2 ;;
  esac
done
lockstep="$build/lockstep"
bench="$build/bench/bench_generate"
for b in "$lockstep" "$bench"; do
  [ -x "$b" ] || { echo "bench-generate: $b is missing (build the lockstep and bench_generate targets)" >&2; exit 2; }
done
if [ -z "$work" ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-bench-generate.XXXXXX")
  trap 'rm -rf "$work"' EXIT
else
  source "$here/scripts/lib/work-dir.sh"
  claim_work_dir "$work" scripts/bench-generate.sh
fi
client="${LOCKSTEP_LLAMA_CLIENT:-${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}/node-llama-cpp-3.21.1}"
llama_missing=""
if ! command -v node > /dev/null; then
  llama_missing="node is not installed (scripts/install-deps.sh)"
elif [ ! -f "$client/node_modules/node-llama-cpp/package.json" ]; then
  llama_missing="node-llama-cpp 3.21.1 is not installed in $client (scripts/install-llama-client.sh)"
fi
log() { echo "bench-generate: $*" >&2; }

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date +%s)
"$lockstep" data synth --out "$work/data" --seed 7 --tokens 20000 > /dev/null

# The smoke config with QK-norm off: the same shapes, exportable to GGUF (mimo2).
sed -e 's/^name: smoke/name: smoke-noqknorm/' -e 's/^\(  qk_norm:\) true/\1 false/' \
  "$here/configs/smoke.yaml" > "$work/smoke-noqknorm.yaml"
# open-100m with bf16 compute weights.
sed -e 's/^name: open-100m/name: open-100m-bf16/' -e 's/^model:$/model:\n  compute_weights: bf16/' \
  "$here/configs/open-100m.yaml" > "$work/open-100m-bf16.yaml"

models=()
IFS=, read -ra config_list <<< "$configs"
for cfg in "${config_list[@]}"; do
  models+=("$cfg")
  [ "$cfg" = smoke ] && models+=(smoke-noqknorm)
  [ "$cfg" = open-100m ] && models+=(open-100m-bf16)
done

for m in "${models[@]}"; do
  src="$m"
  case "$m" in smoke-noqknorm | open-100m-bf16) src="$work/$m.yaml" ;; esac
  log "$m: step-0 checkpoint"
  "$lockstep" train --config "$src" --data "$work/data" --out "$work/run-$m" --steps 0 \
    --threads 2 --no-progress > "$work/$m.train.log" 2>&1
  ckpt="$work/run-$m/checkpoints/step_000000000"
  format=gguf
  [ "$m" = open-100m-bf16 ] && format=gguf-bf16
  echo "$format" > "$work/$m.format"
  log "$m: export to GGUF ($format)"
  set +e
  "$lockstep" export --checkpoint "$ckpt" --format "$format" --out "$work/$m.gguf" \
    --data "$work/data" > "$work/$m.export.log" 2>&1
  echo $? > "$work/$m.export.rc"
  set -e
  log "$m: lockstep (bench_generate)"
  "$bench" --checkpoint "$ckpt" --prompt "$prompt" --decode "$decode" --threads "$threads" \
    --batches "$batches" --reps "$reps" --profile > "$work/$m.lockstep.json"
  if [ "$(cat "$work/$m.export.rc")" = 0 ] && [ -z "$llama_missing" ]; then
    log "$m: llama.cpp (bench.mjs)"
    node "$here/tests/clients/llama/bench.mjs" "$client" "$work/$m.gguf" "$prompt" "$decode" \
      "$threads" "$batches" "$reps" > "$work/$m.llama.json"
  fi
  # open-100m's checkpoint (2.8 GB) and GGUF (0.9 GB) are not needed any more.
  rm -rf "$work/run-$m" "$work/$m.gguf"
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$work" "$lockstep" "$llama_missing" "$load_before" "$load_after" \
  "$(($(date +%s) - start))" "${models[@]}" << 'EOF'
import json, os, pathlib, platform, subprocess, sys

work, lockstep, llama_missing, load_before, load_after, seconds = sys.argv[1:7]
models = sys.argv[7:]
work = pathlib.Path(work)
version = subprocess.run([lockstep, "--version"], capture_output=True, text=True).stdout
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
           platform.machine())
out = {
    "machine": {"cpu": cpu, "cores": os.cpu_count(), "load_average_before": load_before,
                "load_average_after": load_after},
    "lockstep_version": version.strip().splitlines(),
    "wall_seconds": int(seconds),
    "bandwidth_limit": "batch B: B * read bandwidth at the run's thread count / (parameter bytes "
                       "read per decode step + B * KV-cache bytes read per token)",
    "models": [],
}
targets = []
for m in models:
    ours = json.loads((work / f"{m}.lockstep.json").read_text())
    rc = int((work / f"{m}.export.rc").read_text())
    export_log = (work / f"{m}.export.log").read_text().strip()
    entry = {"config": m, "gguf_format": (work / f"{m}.format").read_text().strip(),
             "gguf_export": "ok" if rc == 0 else f"refused (exit {rc})",
             "gguf_export_message": export_log.splitlines()[-1] if export_log else ""}
    theirs = None
    if rc != 0:
        entry["llama_cpp"] = None
        entry["llama_cpp_why_not"] = "the GGUF export refuses this config: " + entry["gguf_export_message"]
    elif llama_missing:
        entry["llama_cpp"] = None
        entry["llama_cpp_why_not"] = llama_missing
    else:
        theirs = json.loads((work / f"{m}.llama.json").read_text())
        entry["llama_cpp"] = theirs
    entry["lockstep"] = ours
    bw = {b["threads"]: b["gb_per_second"] for b in ours["read_bandwidth"]}
    rows = []
    for r in ours["runs"]:
        row = {"threads": r["threads"], "batch": r["batch"],
               "read_bandwidth_gb_per_second": bw.get(r["threads"]),
               "decode_bandwidth_limit_tokens_per_second": r["decode_bandwidth_limit_tokens_per_second"],
               "lockstep_prefill_tokens_per_second": r["prefill_tokens_per_second"],
               "lockstep_decode_tokens_per_second": r["decode_tokens_per_second"],
               "lockstep_decode_over_bandwidth_limit": r["decode_over_bandwidth_limit"]}
        t = None
        if theirs is not None:
            t = next((x for x in theirs["runs"]
                      if x["threads"] == r["threads"] and x["batch"] == r["batch"]), None)
        if t is not None:
            limit = r["decode_bandwidth_limit_tokens_per_second"]
            row.update({
                "llama_cpp_prefill_tokens_per_second": round(t["prefill_tokens_per_second"], 1),
                "llama_cpp_decode_tokens_per_second": round(t["decode_tokens_per_second"], 2),
                "llama_cpp_decode_over_bandwidth_limit":
                    round(t["decode_tokens_per_second"] / limit, 3) if limit else None,
                "prefill_lockstep_over_llama_cpp":
                    round(r["prefill_tokens_per_second"] / t["prefill_tokens_per_second"], 3),
                "decode_lockstep_over_llama_cpp":
                    round(r["decode_tokens_per_second"] / t["decode_tokens_per_second"], 3),
            })
        rows.append(row)
        if r["batch"] == 1:
            targets.append({
                "config": m, "threads": r["threads"],
                "decode_over_llama_cpp": row.get("decode_lockstep_over_llama_cpp"),
                "decode_over_llama_cpp_target_1_0_met":
                    None if t is None else row["decode_lockstep_over_llama_cpp"] >= 1.0,
                "decode_over_bandwidth_limit": r["decode_over_bandwidth_limit"],
                "decode_over_bandwidth_limit_target_0_8_met":
                    None if r["decode_over_bandwidth_limit"] is None
                    else r["decode_over_bandwidth_limit"] >= 0.8,
            })
    entry["side_by_side"] = rows
    out["models"].append(entry)
out["targets_decode_batch_1"] = targets
print(json.dumps(out, indent=1))
EOF
