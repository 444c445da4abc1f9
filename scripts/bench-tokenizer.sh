#!/usr/bin/env bash
# Tokenizer speed: `lockstep data tokenize --tokenizer tokenizer.json` (byte-level BPE,
# src/data/bpe.cc) against @huggingface/tokenizers (node, tests/clients/tokenizers/bench.mjs) on
# the same documents in the same run; prints one JSON object on stdout (progress on stderr).
# docs/performance.md, "Tokenizer".
#
#   scripts/bench-tokenizer.sh [--build DIR] [--work DIR] [--mib 1,8] [--style gpt2|llama3]
#                              [--reps N] [--hf-max-mib N]
#
# The documents are varied text built deterministically (words in several scripts, digits,
# punctuation, lines; no run longer than a few hundred bytes). The tokenizer.json is learned on
# their first 256 KiB by tests/data/make_bpe_tokenizer.py (the tests' learner: up to 2000 merges,
# fewer when no pair is left), GPT-2's layout by default. lockstep's time is the whole command (read, UTF-8 check, encode, shards
# written), the best of --reps; the JavaScript one's is the encode call alone, the best of --reps,
# on documents up to --hf-max-mib (default 8). The module is $LOCKSTEP_TOKENIZERS_JS, or
# installed from npm into the temp directory's cache the tests use.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build="$here/build"
work=""
mibs=1,8
style=gpt2
reps=3
hf_max=8
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --mib) mibs=$2; shift 2 ;;
    --style) style=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --hf-max-mib) hf_max=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--work DIR] [--mib 1,8] [--style gpt2|llama3] [--reps N] [--hf-max-mib N]" >&2; exit 2 ;;
  esac
done
lockstep="$build/lockstep"
[ -x "$lockstep" ] || { echo "bench-tokenizer: $lockstep is missing (build the lockstep target)" >&2; exit 2; }
if [ -z "$work" ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-bench-tokenizer.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"

# The documents: the same generator for every size, so a smaller one is a prefix of a larger.
python3 - "$work" "$mibs" <<'PY'
import sys
work, mibs = sys.argv[1], [int(m) for m in sys.argv[2].split(",")]
words = ["lockstep", "bitwise", "audit", "Replay", "CHAIN", "hash", "über", "naïve", "日本語の文",
         "Ελληνικά", "русский", "emoji🙂🎉", "x=42;", "(a+b)*c", "don't", "I'll", "3.14159",
         "1234567", "e\u0301", "\u00a0nbsp", "wide\u3000space", "tab\there", "--", "...",
         "the", "of", "and", "tokenizer", "deterministic", "replay", "checkpoint", "gradient"]
state, parts, size, total = 5, [], 0, max(mibs) << 20
def nxt(n):
    global state
    state = (state * 1664525 + 1013904223) & 0xFFFFFFFF
    return (state >> 8) % n
while size < total + 64:
    k = nxt(100)
    p = (words[nxt(len(words))] * (1 + nxt(8)) if k == 0 else " " * (2 + nxt(30)) if k == 1 else
         words[nxt(len(words))] + ("\n" if k < 12 else "\t" if k < 14 else " "))
    parts.append(p)
    size += len(p.encode())
text = "".join(parts).encode()
for m in mibs:
    t = text[: m << 20]
    while True:
        try:
            t.decode()
            break
        except UnicodeDecodeError:
            t = t[:-1]
    open(f"{work}/doc-{m}mib.txt", "wb").write(t)
open(f"{work}/train.txt", "wb").write(text[: 256 << 10].decode(errors="ignore").encode())
PY
python3 "$here/tests/data/make_bpe_tokenizer.py" "$style" 2000 "$work/tokenizer.json" "$work/train.txt"

module="${LOCKSTEP_TOKENIZERS_JS:-${TMPDIR:-/tmp}/lockstep-npm-0.2.0/node_modules/@huggingface/tokenizers}"
hf_missing=""
if ! command -v node > /dev/null; then
  hf_missing="node is not installed"
elif [ ! -f "$module/dist/tokenizers.mjs" ]; then
  prefix=$(dirname "$(dirname "$(dirname "$module")")")
  timeout 180 npm install --silent --no-audit --no-fund --prefix "$prefix" @huggingface/tokenizers@0.2.0 > /dev/null 2>&1 || true
  [ -f "$module/dist/tokenizers.mjs" ] || hf_missing="@huggingface/tokenizers 0.2.0 is not installed in $module (npm unreachable?)"
fi

results="[]"
IFS=, read -ra sizes <<< "$mibs"
for m in "${sizes[@]}"; do
  doc="$work/doc-${m}mib.txt"
  best=""
  for ((r = 0; r < reps; ++r)); do
    rm -rf "$work/out"
    start=$(date +%s.%N)
    "$lockstep" data tokenize --tokenizer "$work/tokenizer.json" --input "$doc" --out "$work/out" > /dev/null
    end=$(date +%s.%N)
    best=$(python3 -c "import sys; t = $end - $start; print(t if '$best' == '' else min(t, $best))")
    echo "bench-tokenizer: lockstep ${m} MiB: ${best} s (best so far)" >&2
  done
  tokens=$(python3 -c "import json; print(json.load(open('$work/out/manifest.json'))['total_tokens'])")
  sha=$(cat "$work"/out/shard_*.bin | sha256sum | cut -d' ' -f1)
  hf="null"
  if [ -z "$hf_missing" ] && ((m <= hf_max)); then
    echo "bench-tokenizer: @huggingface/tokenizers ${m} MiB" >&2
    hf=$(node "$here/tests/clients/tokenizers/bench.mjs" "$module" "$work/tokenizer.json" "$reps" "$doc")
  fi
  results=$(python3 - "$results" "$m" "$(stat -c %s "$doc")" "$best" "$tokens" "$sha" "$hf" <<'PY'
import json, sys
results, m, size, seconds, tokens, sha, hf = sys.argv[1:]
entry = {"mib": int(m), "bytes": int(size),
         "lockstep": {"seconds": round(float(seconds), 4),
                      "mib_per_s": round(int(size) / 2**20 / float(seconds), 2),
                      "ids": int(tokens)}}
hf = json.loads(hf)
if hf:
    entry["huggingface_tokenizers_js"] = {"seconds": round(hf[0]["seconds"], 4),
                                          "mib_per_s": round(hf[0]["bytes"] / 2**20 / hf[0]["seconds"], 2),
                                          "ids": hf[0]["ids"]}
    entry["same_ids"] = hf[0]["sha256"] == sha
print(json.dumps(json.loads(results) + [entry]))
PY
)
done
python3 - "$results" "$style" "$work/tokenizer.json" "$hf_missing" "$lockstep" <<'PY'
import hashlib, json, os, platform, sys
results, style, tokenizer, hf_missing, lockstep = sys.argv[1:]
t = json.load(open(tokenizer))
out = {"benchmark": "tokenizer",
       "tokenizer": {"style": style, "learned_by": "tests/data/make_bpe_tokenizer.py",
                     "merges": len(t["model"]["merges"]), "vocab": len(t["model"]["vocab"]),
                     "blake2b": hashlib.blake2b(open(tokenizer, "rb").read(), digest_size=32).hexdigest()},
       "lockstep": {"command": "lockstep data tokenize --tokenizer tokenizer.json", "binary": lockstep},
       "huggingface_tokenizers_js": {"version": "0.2.0", "measures": "Tokenizer.encode only"}
       if not hf_missing else {"missing": hf_missing},
       "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
       "results": json.loads(results)}
print(json.dumps(out, indent=1))
PY
