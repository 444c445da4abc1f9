#!/usr/bin/env bash
# Runs bench_train_step (lockstep) and torch_reference.py (PyTorch) on the same config and prints
# their tokens/s side by side, with the ratio lockstep / PyTorch per thread count and whether
# each one's results kept their bits between 1 and 2 threads.
#
# usage: bench/compare_train_step.sh [--build DIR] [--config NAME|PATH] [--steps N]
#   --build: the CMake build directory holding bench/bench_train_step (default build-bench)
#   PYTHON:  the interpreter with torch (default /usr/bin/python3, where Debian's python3-torch is)
# Timings are noisy on a shared machine: the load average is printed next to them.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-bench
config="bench-8x512"
steps=3
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) sed -n '6,9p' "$0" >&2; exit 2 ;;
  esac
done
python=${PYTHON:-/usr/bin/python3}
bench=$build/bench/bench_train_step
[[ -x $bench ]] || { echo "$bench not built: cmake --build $build --target bench_train_step" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
# bench_train_step exits 1 when its own bits differ across threads: keep its JSON to show that.
"$bench" --json --config "$config" --steps "$steps" >"$tmp/lockstep.json" || [[ $? == 1 ]]
"$python" "$root/bench/torch_reference.py" --json --config "$config" --steps "$steps" >"$tmp/torch.json"
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"

"$python" - "$tmp/lockstep.json" "$tmp/torch.json" <<'PY'
import json, sys
lockstep, torch = (json.load(open(path)) for path in sys.argv[1:3])
by_threads = {row["threads"]: row for row in torch}
print(f"{lockstep[0]['config']}: {lockstep[0]['tokens_per_step']} tokens per step; "
      "best of the timed steps (median in parentheses)")
print(f"{'thr':>3} {'lockstep tok/s':>21} {'pytorch tok/s':>21} {'ratio':>6} "
      f"{'lockstep bits same':>18} {'pytorch bits same':>17}")
rows = []
for ls in lockstep:
    pt = by_threads[ls["threads"]]
    def cell(row):
        return f"{row['tokens_per_second']:.0f} ({row['tokens_per_step'] / row['median_seconds_per_step']:.0f})"
    ratio = ls["tokens_per_second"] / pt["tokens_per_second"]
    print(f"{ls['threads']:>3} {cell(ls):>21} {cell(pt):>21} {ratio:>6.2f} "
          f"{str(ls['bitwise_same_across_threads']):>18} {str(pt['bitwise_same_across_threads']):>17}")
    rows.append({"config": ls["config"], "threads": ls["threads"],
                 "lockstep_tokens_per_second": ls["tokens_per_second"],
                 "pytorch_tokens_per_second": pt["tokens_per_second"],
                 "ratio": round(ratio, 3), "lockstep_mfu_vs_gemm": ls["mfu_vs_gemm"],
                 "lockstep_gemm_gflops": ls["gemm_gflops"],
                 "lockstep_variant": ls["lockstep_variant"],
                 "pytorch_openblas_kernel": pt["openblas_kernel"],
                 "torch_version": pt["torch_version"],
                 "lockstep_bits_same_across_threads": ls["bitwise_same_across_threads"],
                 "pytorch_bits_same_across_threads": pt["bitwise_same_across_threads"]})
print(json.dumps(rows, indent=2))
PY
