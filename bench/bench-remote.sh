#!/usr/bin/env bash
# bench-remote.sh BUILD_DIR: what `make bench-remote` runs.
#
# Serves the ~1M-row benchmark table, split into 8 ZSTD shards with row
# groups of 32768 rows (bench/gen-shards.mjs), from nginx on loopback behind
# tests/remote/faultproxy.mjs capping the total bandwidth at BENCH_RATE bytes/s
# (default 100 MB/s).  In the same run it measures:
#   - plain curl downloading every shard through the same proxy: the
#     network's rate, the peer for the ratios below;
#   - a simulated trainer (bench/serve-client, sleeping BENCH_COMPUTE_US per
#     batch of 1024 rows, as a GPU step leaves the CPU free) on a cold larderd
#     with its default settings and a cache that holds the dataset, for 3
#     epochs, reading the same rows written in no order (gen-shards.mjs
#     `shuffled`, as a job preparing a training set writes them): the epoch-1 remote
#     throughput against curl's, the time to the first batch, the epoch-1
#     stall fraction beside the bound the network sets (and that bound with the
#     step the trainer measured, which overshoots its nominal one), and the stall and
#     remote bytes of epochs 2 and 3;
#   - the same trainer for 6 epochs on a cold larderd whose cache holds half
#     of the dataset, four times: row groups kept together in the shuffle
#     (memory_limit 128M), then units mixed singly with
#     memory_limit 128M and 32M, and 128M with the staging area off: the
#     remote bytes of epochs 2-6 against the dataset's size, and what the
#     staging area (stage_capacity) holds.
# Remote bytes are counted by the proxy (every body byte it sent), and each
# request is attributed to the epoch in which it completed.
#
#   - the first epoch again behind a second proxy that adds BENCH_LATENCY_MS
#     (default 40) to every request, as an object store in another zone:
#     curl's rate through it, the stall beside the bound, and the time to the
#     first batch beside its floor (the footers' fetch, then the first
#     unit's row group's), for both proxies.
# The first-epoch runs use the default, shuffle_row_groups = auto, which
# keeps a row group's units in one window for rows in no order (a cold epoch
# then consumes row groups in the order they arrive); a last cold epoch with
# the default on the shards in id order, where auto mixes units singly,
# shows what that costs.  Each prints what auto chose (the stream's note).
#
# Environment: BENCH_RATE (100000000), BENCH_LATENCY_MS (40), BENCH_COMPUTE_US (2500), BENCH_WINDOW
# (shuffle_window_bytes, 32M: an eighth of the dataset, as a window is a
# small part of a real one), BENCH_DAEMON_FLAGS (more larderd flags for every
# run, such as --fetch_inflight_per_host=4), BENCH_CLIENT_WINDOW (the batches
# the trainer may hold; default 32, liblarder's).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
client=$build/bin/serve-client
rate=${BENCH_RATE:-100000000}
compute_us=${BENCH_COMPUTE_US:-2500}
latency_ms=${BENCH_LATENCY_MS:-40}
window=${BENCH_WINDOW:-32M}
win=()
if [ -n "${BENCH_CLIENT_WINDOW:-}" ]; then win=(--window "$BENCH_CLIENT_WINDOW"); fi
work=bench/work
shards=$work/shards

if [ ! -f "$work/zstd-v1.parquet" ]; then
  echo "bench-remote: generating the dataset (bench/gen-dataset.mjs)"
  if [ ! -d bench/node_modules/@duckdb ]; then (cd bench && npm ci --no-audit --no-fund --loglevel=error); fi
  node bench/gen-dataset.mjs "$work" >/dev/null
fi
node bench/gen-shards.mjs "$work/zstd-v1.parquet" "$shards" >/dev/null
node bench/gen-shards.mjs "$work/zstd-v1.parquet" "$shards/shuffled" 8 32768 shuffled >/dev/null
if [ ! -d tests/node_modules/s3rver ]; then (cd tests && npm ci --no-audit --no-fund --loglevel=error); fi

tmp=$(mktemp -d /tmp/larder-bench-remote.XXXXXX)
daemon_pid=
proxy_pid=
lat_pid=
cleanup() {
  if [ -n "$daemon_pid" ]; then kill -TERM "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
  for p in $proxy_pid $lat_pid; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  tests/remote/nginx.sh stop "$tmp/ng" >/dev/null 2>&1 || true
  if [ -z "${BENCH_KEEP:-}" ]; then rm -rf "$tmp"; else echo "bench-remote: kept $tmp"; fi
}
trap cleanup EXIT

json_field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

ng=$(tests/remote/nginx.sh start "$tmp/ng" "$shards" --watch-pid $$)
ng_port=$(json_field "$ng" port)
start_proxy() { # name, faultproxy flags...: prints its port
  local name=$1
  shift
  node tests/remote/faultproxy.mjs --upstream "http://127.0.0.1:$ng_port" --rate "$rate" \
    --log "$tmp/$name.log" --watch-pid $$ "$@" >"$tmp/$name.json" 2>"$tmp/$name.err" &
  echo $! >"$tmp/$name.pid"
  for _ in $(seq 100); do [ -s "$tmp/$name.json" ] && break; sleep 0.05; done
}
start_proxy proxy
proxy_pid=$(cat "$tmp/proxy.pid")
port=$(json_field "$(head -1 "$tmp/proxy.json")" port)
# The same link with latency_ms more per request.
start_proxy proxy-lat --latency-ms "$latency_ms"
lat_pid=$(cat "$tmp/proxy-lat.pid")
lat_port=$(json_field "$(head -1 "$tmp/proxy-lat.json")" port)
urls=()
shuf_urls=()
lat_urls=()
for f in "$shards"/part-*.parquet; do
  urls+=("http://127.0.0.1:$port/$(basename "$f")")
  shuf_urls+=("http://127.0.0.1:$port/shuffled/$(basename "$f")")
  lat_urls+=("http://127.0.0.1:$lat_port/shuffled/$(basename "$f")")
done

# Each phase's requests are the log lines it added (the proxies append).
mark() { stat -c %s "$tmp/${1:-proxy}.log" 2>/dev/null || echo 0; }
cut_log() { tail -c +$(($1 + 1)) "$tmp/${3:-proxy}.log" >"$tmp/$2"; }
# The peer: curl, one connection, every shard in turn, through each proxy.
curl_all() { # name, proxy, urls...
  local name=$1 proxy=$2
  shift 2
  local args=()
  for u in "$@"; do args+=(-o /dev/null "$u"); done
  local m
  m=$(mark "$proxy")
  curl -sf "${args[@]}"
  sleep 0.2
  cut_log "$m" "$name.requests" "$proxy"
}
curl_all curl proxy "${urls[@]}"
curl_all curl-lat proxy-lat "${lat_urls[@]}"

start_daemon() { # name, flags...
  local name=$1
  shift
  "$build/bin/larderd" --socket="$tmp/$name.sock" --cache_dir="$tmp/$name-cache" \
    --shuffle_window_bytes="$window" --log_level=notice "$@" ${BENCH_DAEMON_FLAGS:-} \
    2>"$tmp/$name.log" &
  daemon_pid=$!
  for _ in $(seq 200); do [ -S "$tmp/$name.sock" ] && break; sleep 0.05; done
}
stop_daemon() {
  kill -TERM "$daemon_pid"
  wait "$daemon_pid" || true
  daemon_pid=
}

# Cache holding the dataset.
start_daemon full --cache_capacity=16G --memory_limit=1G
m=$(mark)
"$client" run "$tmp/full.sock" "${shuf_urls[@]}" --epochs 3 --batch-size 1024 "${win[@]}" --seed 7 \
  --compute-us "$compute_us" >"$tmp/full.jsonl" 2>"$tmp/full.note"
sleep 0.2
cut_log "$m" full.requests
stop_daemon

# Cache holding half of it (half of the decoded bytes one epoch serves).
epoch_bytes=$(head -1 "$tmp/full.jsonl" | python3 -c "import json,sys; print(json.load(sys.stdin)['bytes'])")
half=$((epoch_bytes / 2))
# Four settings, on the shards in id order: row groups kept together in the
# shuffle, then units mixed singly (what auto chooses for them), with
# memory_limit 128M and 32M, and 128M without the staging area
# (stage_capacity=0), as the peer of the second.
half_runs=("half-rg:--memory_limit=128M --shuffle_row_groups=true"
  "half-unit:--memory_limit=128M --shuffle_row_groups=false"
  "half-unit-32m:--memory_limit=32M --shuffle_row_groups=false"
  "half-unit-nostage:--memory_limit=128M --stage_capacity=0 --shuffle_row_groups=false")
for run in "${half_runs[@]}"; do
  name=${run%%:*}
  # shellcheck disable=SC2086 # the flags are words
  start_daemon "$name" --cache_capacity="$half" ${run#*:}
  m=$(mark)
  "$client" run "$tmp/$name.sock" "${urls[@]}" --epochs 6 --batch-size 1024 "${win[@]}" --seed 7 \
    --compute-us "$compute_us" >"$tmp/$name.jsonl"
  "$build/bin/larderctl" --socket "$tmp/$name.sock" --json stats >"$tmp/$name.stats"
  sleep 0.2
  cut_log "$m" "$name.requests"
  stop_daemon
done

# The first epoch behind the latency, cold, as the first run above.
start_daemon lat --cache_capacity=16G --memory_limit=1G
m=$(mark proxy-lat)
"$client" run "$tmp/lat.sock" "${lat_urls[@]}" --epochs 1 --batch-size 1024 "${win[@]}" --seed 7 \
  --compute-us "$compute_us" >"$tmp/lat.jsonl" 2>"$tmp/lat.note"
sleep 0.2
cut_log "$m" lat.requests proxy-lat
stop_daemon

# The default on the shards in id order (auto mixes units singly), cold,
# one epoch.
start_daemon unit --cache_capacity=16G --memory_limit=1G
m=$(mark)
"$client" run "$tmp/unit.sock" "${urls[@]}" --epochs 1 --batch-size 1024 "${win[@]}" --seed 7 \
  --compute-us "$compute_us" >"$tmp/unit.jsonl" 2>"$tmp/unit.note"
sleep 0.2
cut_log "$m" unit.requests
stop_daemon

python3 - "$tmp" "$shards" "$rate" "$compute_us" "$window" "$half" "$latency_ms" <<'PY'
import datetime, json, os, sys
tmp, shards, rate, compute_us, window, half, latency_ms = sys.argv[1:]
rate, compute_us, half = float(rate), float(compute_us), int(half)
dataset = sum(os.path.getsize(os.path.join(shards, f)) for f in os.listdir(shards) if f.endswith('.parquet'))

def requests(path):
    out = []
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            print("bad log line:", repr(line[:300]), file=sys.stderr)
            continue
        if 'ms' not in r or 'bytes' not in r:
            continue
        end = datetime.datetime.fromisoformat(r['t'].replace('Z', '+00:00')).timestamp()
        out.append((end - r['ms'] / 1000, end, r['bytes'], r.get('range') or ''))
    return out

def floor_s(reqs):
    """The first batch's floor from a cold run's requests: from the first
    request's start until every footer (suffix ranges) has arrived, then
    the first column-data request's own time."""
    t0 = min(r[0] for r in reqs)
    footers = [r for r in reqs if r[3].startswith('bytes=-')]
    data = [r for r in reqs if r[3] and not r[3].startswith('bytes=-')]
    f_end = max(r[1] for r in footers) if footers else t0
    first = min(data, key=lambda r: r[0]) if data else None
    return f_end - t0, (first[1] - first[0]) if first else 0.0

def span_rate(reqs):
    start = min(r[0] for r in reqs)
    end = max(r[1] for r in reqs)
    return sum(r[2] for r in reqs) / (end - start), end - start

def epochs(path):
    return [json.loads(l) for l in open(path) if l.startswith('{')]

def per_epoch_bytes(reqs, eps):
    out = [0] * len(eps)
    for _, end, n, _ in reqs:
        k = next((i for i, e in enumerate(eps) if end <= e['end_unix']), len(eps) - 1)
        out[k] += n
    return out

curl_rate, curl_secs = span_rate(requests(f'{tmp}/curl.requests'))
full = epochs(f'{tmp}/full.jsonl')
full_reqs = requests(f'{tmp}/full.requests')
full_bytes = per_epoch_bytes(full_reqs, full)
e1_reqs = [r for r in full_reqs if r[1] <= full[0]['end_unix']]
e1_rate, e1_secs = span_rate(e1_reqs)
net_secs = full_bytes[0] / curl_rate
compute_secs = full[0]['batches'] * compute_us / 1e6
bound = max(0.0, net_secs - compute_secs) / max(net_secs, compute_secs)

mb = lambda n: n / 1e6
print(f"bench-remote: {mb(dataset):.0f} MB in 8 shards ({full[0]['rows']} rows), nginx behind a "
      f"{mb(rate):.0f} MB/s cap; trainer computes {compute_us / 1000:.1f} ms per batch of 1024 rows; "
      f"shuffle window {window}")
print(f"  curl, every shard in turn         {mb(curl_rate):7.1f} MB/s  ({curl_secs:.2f} s)")
def note(name):
    for line in open(f'{tmp}/{name}.note'):
        if line.startswith('serve-client: note: '):
            return line[len('serve-client: note: '):].strip()
    return '(none)'
print(f"  rows in no order, default settings; auto chose: {note('full')}")
print(f"  larder epoch 1, remote throughput {mb(e1_rate):7.1f} MB/s  {e1_rate / curl_rate:5.2f} x curl  (goal >= 0.90)")
fl_f, fl_u = floor_s(e1_reqs)
print(f"  time to first batch               {full[0]['first_batch_s']:7.2f} s  (floor {fl_f + fl_u:.2f} s: "
      f"every footer after {fl_f:.2f} s, then the first unit's row group in {fl_u:.2f} s)")
# The bound again with the step the trainer measured (its sleep overshoots
# the nominal step a little): what a perfect prefetcher would leave.
step_secs = full[0]['batches'] * full[0]['compute_us'] / 1e6
bound_step = max(0.0, net_secs - step_secs) / max(net_secs, step_secs)
print(f"  epoch 1: {full[0]['seconds']:.2f} s, stall {100 * full[0]['stall']:5.1f}%; the network's bound "
      f"{100 * bound:5.1f}% ({mb(full_bytes[0]):.0f} MB at curl's rate = {net_secs:.2f} s against "
      f"{compute_secs:.2f} s of compute)  (goal: within 5 points); with the step measured "
      f"({full[0]['compute_us']:.0f} us) the bound is {100 * bound_step:.1f}%")
for k in (1, 2):
    print(f"  epoch {k + 1}: {full[k]['seconds']:.2f} s, stall {100 * full[k]['stall']:5.2f}% (goal < 1%), "
          f"remote bytes {full_bytes[k]} (goal 0)")
print(f"  cache of half the dataset ({mb(half):.0f} MB): remote MB per epoch, and epochs 2-6 "
      f"against the dataset (goal <= 0.55)")
print(f"  (shards in id order)")
for name, what in (('half-rg', 'shuffle_row_groups=true, memory_limit 128M'),
                   ('half-unit', 'units singly, memory_limit 128M'),
                   ('half-unit-32m', 'units singly, memory_limit 32M'),
                   ('half-unit-nostage', 'units singly, 128M, stage_capacity=0')):
    half_eps = epochs(f'{tmp}/{name}.jsonl')
    half_bytes = per_epoch_bytes(requests(f'{tmp}/{name}.requests'), half_eps)
    steady = half_bytes[1:]
    ratio = sum(steady) / len(steady) / dataset
    st = json.load(open(f'{tmp}/{name}.stats'))
    print(f"    {what:44s} " + " ".join(f"{mb(b):.0f}" for b in half_bytes)
          + f"  -> {ratio:.2f}; stall per epoch " + " ".join(f"{100 * e['stall']:.1f}%" for e in half_eps)
          + f"; staged {mb(st.get('stage_bytes', 0)):.0f} MB, {st.get('stage_reads', 0)} row groups read from it")
# Behind the latency: the same measures against curl through that proxy.
lcurl_rate, lcurl_secs = span_rate(requests(f'{tmp}/curl-lat.requests'))
lat = epochs(f'{tmp}/lat.jsonl')
lat_reqs = requests(f'{tmp}/lat.requests')
l_rate, _ = span_rate(lat_reqs)
l_bytes = sum(r[2] for r in lat_reqs)
l_net = l_bytes / lcurl_rate
l_compute = lat[0]['batches'] * compute_us / 1e6
l_bound = max(0.0, l_net - l_compute) / max(l_net, l_compute)
l_step = lat[0]['batches'] * lat[0]['compute_us'] / 1e6
l_bound_step = max(0.0, l_net - l_step) / max(l_net, l_step)
lf_f, lf_u = floor_s(lat_reqs)
print(f"  {latency_ms} ms more per request: curl {mb(lcurl_rate):.1f} MB/s; larder epoch 1 {mb(l_rate):.1f} MB/s "
      f"({l_rate / lcurl_rate:.2f} x curl), {lat[0]['seconds']:.2f} s, stall {100 * lat[0]['stall']:.1f}%; "
      f"the network's bound {100 * l_bound:.1f}% (goal: within 5 points; {100 * l_bound_step:.1f}% with the "
      f"step measured); first batch after "
      f"{lat[0]['first_batch_s']:.2f} s (floor {lf_f + lf_u:.2f} s: footers {lf_f:.2f} s, first unit {lf_u:.2f} s)")
unit = epochs(f'{tmp}/unit.jsonl')
u_rate, _ = span_rate(requests(f'{tmp}/unit.requests'))
print(f"  shards in id order, default settings; auto chose: {note('unit')}")
print(f"  shards in id order, default settings, cold epoch 1: first batch after "
      f"{unit[0]['first_batch_s']:.2f} s, {unit[0]['seconds']:.2f} s, stall {100 * unit[0]['stall']:.1f}%, "
      f"remote {mb(u_rate):.1f} MB/s ({u_rate / curl_rate:.2f} x curl)")
PY
