#!/usr/bin/env bash
# The main job on the built-in default: install dependencies, build, prove the kernels'
# determinism on this machine, synthesize the demo corpus and train `smoke` on it with
# checkpoints and the chained state hash, then print the loss curve. Rerunnable: it starts
# over in out/demo/ each time. Extra arguments go to `lockstep train` (e.g. --threads 2).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build/lockstep --version
echo
build/lockstep selftest
echo
rm -rf out/demo
build/lockstep data synth --out out/demo/data --seed 1
echo
build/lockstep train --config smoke --data out/demo/data --out out/demo/run --threads "$(nproc)" "$@"
echo
echo "run directory: out/demo/run (metrics.jsonl, state_hashes.jsonl, checkpoints/)"
tail -n 1 out/demo/run/state_hashes.jsonl
