#!/usr/bin/env bash
# Lists the functions and classes of the C++ sources given (default: src and include) with their
# length in lines, longest first, from universal-ctags' start and end lines. With --max N it lists
# only the functions (not classes) longer than N lines and exits 1 when there is one, 77 when
# universal-ctags is missing (ctest reports that as skipped).
# Usage: scripts/function-lengths.sh [--max N] [PATH...]
set -euo pipefail
cd "$(dirname "$0")/.."
max=""
if [[ ${1:-} == --max ]]; then
  max=$2
  shift 2
fi
(($#)) || set -- src include
if ! ctags --version 2>/dev/null | grep -q "Universal Ctags"; then
  echo "function-lengths.sh: universal-ctags is not installed (apt-get install universal-ctags)" >&2
  exit 77
fi
ctags --output-format=json --fields=+ne --c++-kinds=fc --languages=C++ --sort=no -R -o - "$@" |
  python3 -c '
import json, re, sys
limit = int(sys.argv[1]) if sys.argv[1] else None
rows = []
for line in sys.stdin:
    tag = json.loads(line)
    if tag.get("_type") != "tag" or "end" not in tag:
        continue
    kind = tag["kind"]
    if limit is not None and kind != "function":
        continue
    n = tag["end"] - tag["line"] + 1
    # An unnamed namespace or lambda shows as "{anonymous}".
    name = re.sub(r"^lockstep::", "", tag.get("scope", "") + "::" + tag["name"]).lstrip(":")
    name = re.sub(r"__anon[0-9a-f]+", "{anonymous}", name)
    if limit is None or n > limit:
        rows.append((n, kind, "%s:%d" % (tag["path"], tag["line"]), name))
rows.sort(key=lambda r: (-r[0], r[2]))
for n, kind, where, name in rows:
    print(f"{n:5d}  {kind:8s}  {where:40s}  {name}")
if limit is not None and rows:
    print(f"{len(rows)} function(s) over {limit} lines", file=sys.stderr)
    sys.exit(1)
' "$max"
