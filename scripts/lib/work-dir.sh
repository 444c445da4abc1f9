# Sourced by the scripts that write into a directory they are given (bench/replay_open1b.sh,
# bench/recompute_open1b.sh, scripts/bench-generate.sh --work, scripts/gpu-bundle.sh,
# scripts/gpu-check.sh, scripts/demo.sh), so that none of them deletes what it did not make.
#
# claim_work_dir DIR OWNER: makes DIR this script's own, or refuses (exit 2, naming DIR and why).
#   - DIR absent: created, with a marker file DIR/.lockstep-work holding OWNER;
#   - DIR an empty directory: the marker written into it;
#   - DIR a directory whose marker holds OWNER (this script made it on an earlier run): its
#     contents, the marker aside, removed (links removed, never followed);
#   - anything else — a directory holding files without OWNER's marker (another script's, or
#     someone's own files), a symbolic link (even to a directory), a file, a device — refused, and
#     nothing in it touched.
claim_work_dir() {
  local dir=$1 owner=$2
  local marker="$dir/.lockstep-work"
  if [[ -L $dir ]]; then
    echo "$owner: $dir is a symbolic link; give the directory itself (nothing was changed)" >&2
    exit 2
  fi
  if [[ ! -e $dir ]]; then
    mkdir -p -- "$dir"
  elif [[ ! -d $dir ]]; then
    echo "$owner: $dir exists and is not a directory (nothing was changed)" >&2
    exit 2
  elif [[ -f $marker && ! -L $marker && $(<"$marker") == "$owner" ]]; then
    find "$dir" -mindepth 1 -maxdepth 1 ! -name .lockstep-work -exec rm -rf -- {} +
  elif [[ -n $(find "$dir" -mindepth 1 -maxdepth 1 -print -quit) ]]; then
    echo "$owner: $dir is not empty and was not made by $owner (no $marker naming it); give a" \
      "new or empty directory (nothing was changed)" >&2
    exit 2
  fi
  printf '%s\n' "$owner" >"$marker"
}
