#!/usr/bin/env bash
# Renders the demo's report page (out/demo/report.html, written by scripts/demo.sh) into
# docs/report.png with headless Chromium, for the README. usage: scripts/report-screenshot.sh
set -euo pipefail
cd "$(dirname "$0")/.."
page=out/demo/report.html
[[ -f $page ]] || { echo "$page: run scripts/demo.sh first" >&2; exit 2; }
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$profile" \
  --window-size=1240,1280 --screenshot="$(pwd)/docs/report.png" "file://$(pwd)/$page" 2>/dev/null
echo "wrote docs/report.png"
