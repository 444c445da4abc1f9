#!/usr/bin/env bash
# The main job on the built-in default, the whole story: install dependencies, build, prove the
# kernels' determinism on this machine, synthesize the demo corpus, train `smoke` with
# checkpoints and the chained state hash, build the audit kit, verify it, and audit (replay)
# every unit of it, printing the MATCH table, with a signed audit receipt, its report and the
# coverage page, and write the report page of it all. Rerunnable: it starts over in out/demo/
# (a directory it made; one it did not make is refused, untouched: scripts/lib/work-dir.sh).
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
source scripts/lib/work-dir.sh
claim_work_dir out/demo scripts/demo.sh  # this script's own from an earlier run, or new
$ls data synth --out out/demo/data --seed 1
echo
$ls train --config smoke --data out/demo/data --out out/demo/run --threads "$threads"
echo
$ls kit build --run out/demo/run --data out/demo/data --out out/demo/kit
$ls kit verify out/demo/kit
echo
$ls keygen --out out/demo/auditor.key
$ls audit out/demo/kit --all --threads "$threads" --json-out out/demo/audit.json \
  --receipt out/demo/receipt.json --sign-key out/demo/auditor.key --report out/demo/audit.md
echo
$ls coverage --kit out/demo/kit out/demo/receipt.json --metrics out/demo/run/metrics.jsonl \
  --out out/demo/coverage.html
echo
$ls report out/demo/run --audit out/demo/audit.json --out out/demo/report.html
echo
echo "run: out/demo/run  kit: out/demo/kit  audit: out/demo/audit.json, out/demo/audit.md and"
echo "the signed receipt out/demo/receipt.json  coverage: out/demo/coverage.html"
echo "report (open it in a browser): $(pwd)/out/demo/report.html"
