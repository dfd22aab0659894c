#!/usr/bin/env bash
# make demo: generates a small training dataset and shows larder reading it.
# Usage: scripts/demo.sh BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
ctl=$build/bin/larderctl
work=${LARDER_DEMO_DIR:-/tmp/larder-demo}
mkdir -p "$work/data"
if [ ! -f "$work/data/.done" ]; then
  echo "== generating a 200,000-row training dataset (4 zstd Parquet shards) with DuckDB"
  node tests/gen/demo-data.mjs "$work/data" 200000 4
  touch "$work/data/.done"
fi
first=$(ls "$work"/data/*.parquet | head -1)
echo
echo "== larderctl inspect $first"
"$ctl" inspect "$first"
echo
echo "== larderctl cat $first --columns id,label,path,weight_ppm,embedding --limit 3"
"$ctl" cat "$first" --columns id,label,path,weight_ppm,embedding --limit 3
