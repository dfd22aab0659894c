#!/usr/bin/env bash
# make demo: larder end to end on a built-in dataset.
#
#   1. writes a 200,000-row training dataset (4 zstd Parquet shards) with DuckDB;
#   2. serves it with nginx on loopback, as a stand-in for remote storage;
#   3. starts larderd with a default configuration on a private socket and cache;
#   4. runs the example trainer for three epochs over the HTTP URLs: the first epoch
#      is cold (fetched and decoded), the next ones come from memory; then restarts
#      larderd and runs one more epoch, which reads the cache on disk;
#   5. prints `larderctl stats`, then stops everything.
# Usage: scripts/demo.sh BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
work=${LARDER_DEMO_DIR:-/tmp/larder-demo}
mkdir -p "$work/data" "$work/run"
if [ ! -f "$work/data/.done" ]; then
  echo "== writing a 200,000-row training dataset (4 zstd Parquet shards) with DuckDB"
  node tests/gen/demo-data.mjs "$work/data" 200000 4 >/dev/null
  touch "$work/data/.done"
fi

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  [ -f "$work/run/nginx.pid" ] && kill -QUIT "$(cat "$work/run/nginx.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT

# nginx on a free loopback port, serving the shards with Range support.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$work/run/nginx"
cat >"$work/run/nginx.conf" <<NGINX
daemon on;
pid $work/run/nginx.pid;
error_log $work/run/nginx/error.log;
events { worker_connections 256; }
http {
  access_log $work/run/nginx/access.log;
  client_body_temp_path $work/run/nginx/body; proxy_temp_path $work/run/nginx/proxy;
  fastcgi_temp_path $work/run/nginx/fcgi; uwsgi_temp_path $work/run/nginx/uwsgi;
  scgi_temp_path $work/run/nginx/scgi;
  server { listen 127.0.0.1:$port; root $work/data; }
}
NGINX
nginx -p "$work/run/nginx" -c "$work/run/nginx.conf"
echo "== nginx serves the shards on http://127.0.0.1:$port/"

rm -rf "$work/run/cache" "$work/run/sock"
start_larderd() {
  "$build/bin/larderd" --socket="$work/run/sock" --cache_dir="$work/run/cache" \
    --cache_capacity=2G --log_level=notice 2>>"$work/run/larderd.log" &
  pids+=($!)
  for _ in $(seq 100); do [ -S "$work/run/sock" ] && break; sleep 0.05; done
  echo "== larderd is up (socket $work/run/sock, cache $work/run/cache)"
}
start_larderd

urls=()
for f in "$work"/data/*.parquet; do urls+=("http://127.0.0.1:$port/$(basename "$f")"); done
echo
echo "== example trainer: 3 epochs, batches of 256, 1 ms of model work per batch"
"$build/bin/example-trainer" --socket "$work/run/sock" --epochs 3 --batch-size 256 \
  --compute-ms 1 "${urls[@]}"
echo
# A restart empties the daemon's memory; the decoded columns stay in the
# cache on disk, and the next job reads them from there.
echo "== larderd restarted: one more epoch, from the cache"
kill -TERM "${pids[-1]}" && wait "${pids[-1]}" 2>/dev/null || true
unset 'pids[-1]'
start_larderd
"$build/bin/example-trainer" --socket "$work/run/sock" --epochs 1 --batch-size 256 \
  --compute-ms 1 "${urls[@]}"
echo
echo "== larderctl stats"
"$build/bin/larderctl" --socket "$work/run/sock" stats
