#!/usr/bin/env bash
# The main job on the built-in default, the whole story: install dependencies, build, prove the
# kernels' determinism on this machine, synthesize the demo corpus, train `smoke` with
# checkpoints and the chained state hash, build the audit kit, verify it, and audit (replay)
# every unit of it, printing the MATCH table, and write the report page of it all. Rerunnable: it
# starts over in out/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
threads=$(nproc)
ls=build/lockstep
$ls --version
echo
$ls selftest
echo
rm -rf out/demo
$ls data synth --out out/demo/data --seed 1
echo
$ls train --config smoke --data out/demo/data --out out/demo/run --threads "$threads"
echo
$ls kit build --run out/demo/run --data out/demo/data --out out/demo/kit
$ls kit verify out/demo/kit
echo
$ls audit out/demo/kit --all --threads "$threads" --json-out out/demo/audit.json
echo
$ls report out/demo/run --audit out/demo/audit.json --out out/demo/report.html
echo
echo "run: out/demo/run  kit: out/demo/kit  audit: out/demo/audit.json"
echo "report (open it in a browser): $(pwd)/out/demo/report.html"
