#!/usr/bin/env bash
# Checks that the C++ lines changed since BASE follow .clang-format, with Debian's
# clang-format-diff; prints the reformatting it would make and exits 1 when any changed line
# differs. BASE defaults to the commit that added .clang-format: every line changed since is
# checked, and lines nobody touched stay as they are (the tree is formatted as it is changed,
# never in one sweeping commit that would bury its history). Needs the history (not a shallow
# clone). scripts/test.sh, and so CI, runs it.
#   usage: scripts/format-check.sh [BASE]    (a commit; e.g. origin/main, HEAD~5)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format-diff >/dev/null ||
  { echo "needs clang-format-diff (Debian: clang-format; scripts/install-deps.sh)" >&2; exit 2; }
base=${1:-$(git log --format=%H --diff-filter=A -1 -- .clang-format)}
if [[ -z $base ]] || ! git rev-parse --verify --quiet "$base^{commit}" >/dev/null; then
  echo "format-check: no commit $base to compare with (a shallow clone?): give BASE" >&2
  exit 2
fi
changes=$(git diff -U0 --no-color "$base" -- '*.cc' '*.h' | clang-format-diff -p1 || true)
if [[ -n $changes ]]; then
  echo "$changes"
  echo "format-check: the lines above, changed since $base, do not follow .clang-format" \
    "(clang-format-diff -p1 -i applies it)" >&2
  exit 1
fi
echo "format-check: the C++ lines changed since $base follow .clang-format"
