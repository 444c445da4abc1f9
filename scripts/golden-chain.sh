#!/usr/bin/env bash
# Regenerates the pinned chains tests/fixtures/tiny_chain.jsonl, tiny_int8_chain.jsonl and
# tiny_bf16_chain.jsonl: the state-hash chains of `tiny`, `tiny-int8` (int8 linears) and
# `tiny-bf16` (bf16 activations and compute weights) trained 20 steps on the synthetic
# corpus (seed 7, 200000 tokens). tests/e2e/golden_test.cc compares fresh runs with them, so a
# toolchain, library or code change that moves a single bit of the contract fails CI (the other
# tests compare variants with the reference and cannot see both move together).
# Regenerate only for an intended change of the numerics contract, formats or run descriptor --
# with its version bumped -- and say so in the commit.
set -euo pipefail
cd "$(dirname "$0")/.."
lockstep=${LOCKSTEP:-build/lockstep}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$lockstep" data synth --out "$tmp/data" --seed 7 --tokens 200000 >/dev/null 2>&1
for config in tiny tiny-int8 tiny-bf16; do
  run="$tmp/$config"
  fixture="tests/fixtures/${config//-/_}_chain.jsonl"
  "$lockstep" train --config "$config" --data "$tmp/data" --out "$run" --steps 20 --no-progress >/dev/null 2>&1
  # The chain's checkpointed steps re-derived independently: tools/state_hash.py recomputes each
  # checkpoint's hash from its files (Python's standard library only) and must print the chain's
  # line.
  for step in 0 20; do
    derived=$(python3 tools/state_hash.py "$run/checkpoints/$(printf 'step_%09d' "$step")")
    grep -qx "{\"step\": $step, \"hash\": \"$derived\"}" "$run/state_hashes.jsonl" ||
      { echo "golden-chain.sh: tools/state_hash.py gives $derived for $config's step $step, not the chain's" >&2; exit 1; }
  done
  cp "$run/state_hashes.jsonl" "$fixture"
  echo "wrote $fixture ($(wc -l < "$fixture") lines, $("$lockstep" --version | grep 'numerics contract'))"
done
