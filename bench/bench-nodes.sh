#!/usr/bin/env bash
# bench-nodes.sh BUILD_DIR: what `make bench-nodes` runs.
#
# A many-node job simulated on one machine: for N = 1, 2 and 4 nodes, N
# larderd (each its own socket and cache, standing for a node) and N nginx
# on loopback serving the same benchmark shards (bench/gen-shards.mjs: ~1M
# rows, 8 ZSTD shards, row groups of 32768 rows), so that each node's
# object-store egress is counted by its own access log.  Each node runs
# BENCH_LOCAL ranks (example-trainer, 2 by default) of one job with
# BENCH_PARTITIONS node partitions (4): first a cold epoch, then two more
# epochs from a second run.  It prints, against the dataset's size:
#   - the job's total egress in the cold epoch (all nodes; 1.0 = the
#     dataset fetched once by the whole job, N = fetched once per node);
#   - the largest node's egress against its share (1/N of the dataset);
#   - the egress of the warm epochs (0 when each node's cache holds its
#     share);
#   - the largest node's cache against one node's cache of the whole dataset.
# Environment: BENCH_PARTITIONS (4), BENCH_LOCAL (2), BENCH_BATCH (global
# batch, 1024).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
parts=${BENCH_PARTITIONS:-4}
local_ranks=${BENCH_LOCAL:-2}
global=${BENCH_BATCH:-1024}
work=bench/work
shards=$work/shards

if [ ! -f "$work/zstd-v1.parquet" ]; then
  echo "bench-nodes: generating the dataset (bench/gen-dataset.mjs)"
  if [ ! -d bench/node_modules/@duckdb ]; then (cd bench && npm ci --no-audit --no-fund --loglevel=error); fi
  node bench/gen-dataset.mjs "$work" >/dev/null
fi
node bench/gen-shards.mjs "$work/zstd-v1.parquet" "$shards" >/dev/null

tmp=$(mktemp -d /tmp/larder-bench-nodes.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  for d in "$tmp"/ng-*; do [ -d "$d" ] && tests/remote/nginx.sh stop "$d" >/dev/null 2>&1; done
  if [ -z "${BENCH_KEEP:-}" ]; then rm -rf "$tmp"; else echo "bench-nodes: kept $tmp"; fi
}
trap cleanup EXIT
json_field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

dataset=0
for f in "$shards"/part-*.parquet; do dataset=$((dataset + $(stat -c %s "$f"))); done
echo "bench-nodes: $(ls "$shards"/part-*.parquet | wc -l) shards, $dataset bytes; partitions $parts," \
  "$local_ranks ranks a node, global batch $global"
printf '%6s %12s %14s %12s %14s\n' nodes "cold egress" "node vs share" "warm egress" "node cache"

run_job() { # nodes epochs out-suffix
  local nodes=$1 epochs=$2 tag=$3 ws=$(($1 * local_ranks)) bs=$((global / ($1 * local_ranks)))
  local jobs=()
  for n in $(seq 0 $((nodes - 1))); do
    local urls=()
    for f in "$shards"/part-*.parquet; do urls+=("http://127.0.0.1:${ports[$n]}/$(basename "$f")"); done
    for l in $(seq 0 $((local_ranks - 1))); do
      "$build/bin/example-trainer" --socket "$tmp/n$nodes-$n.sock" --batch-size "$bs" \
        --epochs "$epochs" --seed 7 --rank $((n * local_ranks + l)) --world-size "$ws" \
        --local-world-size "$local_ranks" --partitions "$parts" "${urls[@]}" \
        >"$tmp/n$nodes-$n-$l-$tag.out" 2>&1 &
      jobs+=($!)
    done
  done
  for j in "${jobs[@]}"; do wait "$j"; done
}

egress() { # access log: body bytes sent
  python3 -c '
import json, sys
t = 0
for line in open(sys.argv[1]):
    try: t += int(json.loads(line).get("body_bytes_sent", 0))
    except Exception: pass
print(t)' "$1"
}

one_cache=0
for nodes in 1 2 4; do
  ports=()
  for n in $(seq 0 $((nodes - 1))); do
    ng=$(tests/remote/nginx.sh start "$tmp/ng-$nodes-$n" "$shards" --watch-pid $$)
    ports+=("$(json_field "$ng" port)")
    "$build/bin/larderd" --socket="$tmp/n$nodes-$n.sock" --cache_dir="$tmp/n$nodes-$n-cache" \
      --cache_capacity=16G --memory_limit=1G --log_level=warning 2>"$tmp/n$nodes-$n.log" &
    pids+=($!)
  done
  for n in $(seq 0 $((nodes - 1))); do
    for _ in $(seq 200); do [ -S "$tmp/n$nodes-$n.sock" ] && break; sleep 0.05; done
  done
  run_job "$nodes" 1 cold
  sleep 0.3
  cold=0 node_max=0
  declare -A after_cold
  for n in $(seq 0 $((nodes - 1))); do
    e=$(egress "$tmp/ng-$nodes-$n/access.log")
    after_cold[$n]=$e
    cold=$((cold + e))
    [ "$e" -gt "$node_max" ] && node_max=$e
  done
  run_job "$nodes" 3 warm
  sleep 0.3
  warm=0 cache_max=0
  for n in $(seq 0 $((nodes - 1))); do
    e=$(egress "$tmp/ng-$nodes-$n/access.log")
    warm=$((warm + e - after_cold[$n]))
    used=$("$build/bin/larderctl" --socket "$tmp/n$nodes-$n.sock" stats --json |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["cache"]["used_bytes"])')
    [ "$used" -gt "$cache_max" ] && cache_max=$used
  done
  [ "$nodes" = 1 ] && one_cache=$cache_max
  python3 -c '
import sys
nodes, cold, node_max, warm, cache_max, one_cache, dataset = map(int, sys.argv[1:])
share = dataset / nodes
print("%6d %11.3fx %13.3fx %11.3fx %13.3fx" % (nodes, cold / dataset, node_max / share,
      warm / dataset, cache_max / one_cache))' "$nodes" "$cold" "$node_max" "$warm" "$cache_max" \
    "$one_cache" "$dataset"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  pids=()
  for n in $(seq 0 $((nodes - 1))); do tests/remote/nginx.sh stop "$tmp/ng-$nodes-$n" >/dev/null 2>&1; done
  unset after_cold
done
echo "cold egress: the job's bytes from the object store in the first epoch, against the dataset"
echo "(1.0: fetched once by the whole job); node vs share: the busiest node's against 1/N of the"
echo "dataset; warm egress: epochs 2-3; node cache: the fullest node's cache against one node's"
echo "cache of the whole dataset (1/N is the goal)."
