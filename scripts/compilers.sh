#!/usr/bin/env bash
# The numerics contract across compilers: builds the lockstep binary with Clang (build-clang,
# -Wall -Wextra -Werror: every source of the library and the CLI) beside the GCC build (build),
# trains `tiny`, `tiny-int8` and `tiny-bf16` 20 steps with each, and requires every chain to equal
# its pinned golden chain (tests/fixtures/tiny_chain.jsonl, tiny_int8_chain.jsonl,
# tiny_bf16_chain.jsonl) bit for bit, and each to generate, from GCC's step-20
# checkpoint with sampling, the same receipt byte for byte (docs/inference.md). Also runs Clang's selftest (every kernel on every
# usable SIMD variant vs the reference), and compiles every test and benchmark source with Clang
# and the same warnings as errors (-fsyntax-only: Clang's warnings come from its front end, and
# code generation for them would double the time; `cmake --build build-clang` builds them whole).
# Run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang++ >/dev/null || { echo "clang++ not found (apt-get install clang)" >&2; exit 1; }
cmake -S . -B build-clang -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DLOCKSTEP_WERROR=ON -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
cmake --build build-clang -j"$(nproc)" --target lockstep
build-clang/lockstep selftest | tail -1
python3 - "$(nproc)" <<'EOF'
import concurrent.futures, json, shlex, subprocess, sys
commands = [c for c in json.load(open("build-clang/compile_commands.json"))
            if "/tests/" in c["file"] or "/bench/" in c["file"]]
def check(c):
    args = shlex.split(c["command"])
    at = args.index("-o")
    args = [a for a in args[:at] + args[at + 2:] if a != "-c"] + ["-fsyntax-only"]
    return c["file"], subprocess.run(args, cwd=c["directory"], capture_output=True, text=True)
with concurrent.futures.ThreadPoolExecutor(int(sys.argv[1])) as pool:
    failed = [(f, r.stderr) for f, r in pool.map(check, commands) if r.returncode != 0]
for f, err in failed:
    print(err, file=sys.stderr)
print(f"clang -Werror on tests and benchmarks: {len(commands) - len(failed)} of {len(commands)} "
      "sources compile")
sys.exit(1 if failed else 0)
EOF
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
build/lockstep data synth --out "$tmp/data" --seed 7 --tokens 200000 >/dev/null 2>&1
status=0
for compiler in build build-clang; do
  for config in tiny tiny-int8 tiny-bf16; do
    out="$tmp/$compiler"
    [[ $config == tiny ]] || out="$tmp/$compiler-$config"
    "$compiler/lockstep" train --config "$config" --data "$tmp/data" --out "$out" --steps 20 \
      --threads 2 --no-progress >/dev/null 2>&1
    if cmp -s "$out/state_hashes.jsonl" "tests/fixtures/${config//-/_}_chain.jsonl"; then
      echo "$("$compiler/lockstep" --version | sed -n 3p): $config chain = golden chain"
    else
      echo "$("$compiler/lockstep" --version | sed -n 3p): $config chain DIFFERS from the golden chain" >&2
      status=1
    fi
  done
done
# The same generation receipt from both builds (the checkpoint is GCC's; sampling on).
checkpoint="$tmp/build/checkpoints/step_000000020"
for compiler in build build-clang; do
  "$compiler/lockstep" generate --checkpoint "$checkpoint" --data "$tmp/data" --prompt "the " \
    --max-tokens 48 --temperature 0.9 --top-k 64 --top-p 0.95 --seed 5 \
    --receipt "$tmp/$compiler.receipt.json" >/dev/null 2>&1 || { echo "$compiler: generate failed" >&2; status=1; }
done
if cmp -s "$tmp/build.receipt.json" "$tmp/build-clang.receipt.json"; then
  echo "generation receipts from GCC and Clang builds: identical"
else
  echo "generation receipts from GCC and Clang builds DIFFER" >&2
  status=1
fi
exit $status
