#!/usr/bin/env bash
# scripts/lib/work-dir.sh: a script's work directory is claimed, never taken from someone else.
# Each case asserts what is left on disk, and the refusals their exit status and message; then
# one script that uses it (scripts/gpu-bundle.sh) refuses a directory it did not make.
# usage: work_dir_test.sh LOCKSTEP_BINARY
set -euo pipefail
cd "$(dirname "$0")/../.."
binary=$(realpath -e -- "$1")
source scripts/lib/work-dir.sh
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# claim DIR OWNER EXPECTED_STATUS [MESSAGE_PATTERN]: claim_work_dir in a subshell (it exits on a
# refusal), its status and stderr checked.
claim() {
  local status=0
  (claim_work_dir "$1" "$2") 2>"$t/err" || status=$?
  [[ $status == "$3" ]] || fail "claim_work_dir $1 $2: status $status, expected $3 ($(<"$t/err"))"
  if [[ -n ${4:-} ]]; then grep -q -- "$4" "$t/err" || fail "claim_work_dir $1: message $(<"$t/err")"; fi
}

echo "outside" >"$t/outside.txt"

# Absent: created, the marker naming its owner.
claim "$t/new/work" me 0
[[ -d $t/new/work && $(<"$t/new/work/.lockstep-work") == me ]] || fail "absent directory not made"

# Its own from an earlier run: emptied (a link inside removed, its target kept), marker kept.
mkdir "$t/new/work/sub" && echo x >"$t/new/work/sub/f" && echo y >"$t/new/work/.hidden"
ln -s "$t/outside.txt" "$t/new/work/link"
claim "$t/new/work" me 0
[[ $(ls -A "$t/new/work") == .lockstep-work ]] || fail "own directory not emptied: $(ls -A "$t/new/work")"
[[ $(<"$t/outside.txt") == outside ]] || fail "a link's target was touched"

# Empty: claimed.
mkdir "$t/empty"
claim "$t/empty" me 0
[[ $(<"$t/empty/.lockstep-work") == me ]] || fail "empty directory not claimed"

# Someone's files: refused, untouched.
mkdir "$t/theirs" && echo mine >"$t/theirs/thesis.tex"
claim "$t/theirs" me 2 "is not empty and was not made by me"
[[ $(<"$t/theirs/thesis.tex") == mine && ! -e $t/theirs/.lockstep-work ]] || fail "theirs touched"

# Another script's: refused, untouched.
claim "$t/other" other-script 0 && echo keep >"$t/other/result.json"
claim "$t/other" me 2 "was not made by me"
[[ $(<"$t/other/result.json") == keep && $(<"$t/other/.lockstep-work") == other-script ]] ||
  fail "another script's directory touched"

# A marker that is a link to a file naming the owner: refused.
mkdir "$t/linked-marker" && echo me >"$t/marker-target" && echo keep >"$t/linked-marker/f"
ln -s "$t/marker-target" "$t/linked-marker/.lockstep-work"
claim "$t/linked-marker" me 2 "was not made by me"
[[ $(<"$t/linked-marker/f") == keep ]] || fail "a directory with a linked marker was emptied"

# A symbolic link, even to this owner's own directory, and a dangling one: refused.
ln -s "$t/new/work" "$t/link-to-own"
echo keep >"$t/new/work/result.json"
claim "$t/link-to-own" me 2 "is a symbolic link"
[[ $(<"$t/new/work/result.json") == keep ]] || fail "a linked directory was emptied"
ln -s "$t/nowhere" "$t/dangling"
claim "$t/dangling" me 2 "is a symbolic link"
[[ ! -e $t/nowhere ]] || fail "a dangling link's target was made"

# A file, and a device: refused, untouched.
echo keep >"$t/file"
claim "$t/file" me 2 "is not a directory"
[[ $(<"$t/file") == keep ]] || fail "a file was touched"
claim /dev/null me 2 "is not a directory"

# A script that writes into the directory it is given refuses one it did not make.
mkdir "$t/bundle" && echo mine >"$t/bundle/notes.txt"
status=0
LOCKSTEP_BUNDLE="$t/bundle" LOCKSTEP_BINARY="$binary" scripts/gpu-bundle.sh 2>"$t/err" || status=$?
[[ $status == 2 ]] || fail "gpu-bundle.sh into someone's directory: status $status ($(<"$t/err"))"
grep -q "was not made by scripts/gpu-bundle.sh" "$t/err" || fail "gpu-bundle.sh message: $(<"$t/err")"
[[ $(ls -A "$t/bundle") == notes.txt && $(<"$t/bundle/notes.txt") == mine ]] ||
  fail "gpu-bundle.sh touched someone's directory"
echo "work directories: every case as expected"
