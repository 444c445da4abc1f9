#!/usr/bin/env bash
# Each layer's private headers (src/<layer>/*.h) stay inside it: a file under src/<layer>/
# includes another layer's code only through its public header, include/lockstep/*.h. Run by
# ctest (layering_private_headers); prints every offending include and exits 1, or says so.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
for dir in src/*/; do
  layer=$(basename "$dir")
  # '#include "X/...' where X is another directory under src/.
  while IFS= read -r hit; do
    included=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"${hit#*:*:}")
    if [[ $included != "$layer" && -d src/$included ]]; then
      echo "$hit: src/$layer includes a private header of src/$included" >&2
      status=1
    fi
  done < <(grep -rnE '^#include "[a-z_]+/' "$dir" || true)
done
((status == 0)) && echo "layering: no layer includes another's private headers"
exit $status
