#!/usr/bin/env bash
# bench-serve.sh BUILD_DIR: what `make bench-serve` runs.
#
# Serves the ~1M-row training dataset of bench-decode (bench/work, generated
# by bench/gen-dataset.mjs) through a real larderd and prints, from one run:
#   - the cold (decode-bound) delivery rate, cache empty;
#   - the warm delivery rate to one client and to two clients at once, in GB/s
#     of batch bytes and rows/s, beside this machine's single-core memcpy
#     bandwidth measured just before and after each of those runs;
#   - the stall fraction of a simulated trainer whose compute per batch
#     exceeds the daemon's cost to produce one;
#   - the same trainer (at twice the cost) and the warm rate beside a
#     CPU-bound neighbour, a process spinning on one core;
#   - the daemon's RSS after each of 10 epochs.
# Batch bytes reach the client through the shared-memory arena: the client
# reads them in place (zero copies), and with --touch reads each cache line.
#
# Environment: BENCH_FILE (default zstd-v1.parquet), BENCH_BATCH (1024), and
# BENCH_SOURCE, a path or glob as the daemon reads sources (another dataset,
# say shards copied to a GPU host), which replaces bench/work/$BENCH_FILE and
# skips generating it; BENCH_CLIENT_WINDOW, the batches each client may hold
# (default 32, liblarder's).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
client=$build/bin/serve-client
work=bench/work
file=$work/${BENCH_FILE:-zstd-v1.parquet}
batch=${BENCH_BATCH:-1024}
win=()
if [ -n "${BENCH_CLIENT_WINDOW:-}" ]; then win=(--window "$BENCH_CLIENT_WINDOW"); fi

if [ -n "${BENCH_SOURCE:-}" ]; then
  file=$BENCH_SOURCE
elif [ ! -f "$file" ]; then
  echo "bench-serve: generating the dataset (bench/gen-dataset.mjs)"
  if [ ! -d bench/node_modules/@duckdb ]; then (cd bench && npm ci --no-audit --no-fund --loglevel=error); fi
  node bench/gen-dataset.mjs "$work" >/dev/null
fi

tmp=$(mktemp -d /tmp/larder-bench-serve.XXXXXX)
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ]; then kill -TERM "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
"$build/bin/larderd" --socket="$tmp/sock" --cache_dir="$tmp/cache" --cache_capacity=16G \
  --memory_limit=4G --log_level=warning 2>"$tmp/daemon.log" &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$tmp/sock" ] && break; sleep 0.05; done

field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
mean_of() { # JSON lines on stdin, key: mean over epochs >= $2
  python3 -c "
import json,sys
rows=[json.loads(l) for l in sys.stdin if l.startswith('{')]
sel=[r for r in rows if r['epoch']>=int(sys.argv[2])]
print(sum(r[sys.argv[1]] for r in sel)/len(sel))" "$1" "$2"
}

# The memcpy bandwidth is measured before the cold run and again after
# each warm run, and each ratio divides by the two copies around its own
# run: a shared VM's memory bandwidth moves by 20-30% from one second to
# the next, and a peer measured a minute earlier is a different machine.
memcpy_now() { field "$("$client" memcpy)" memcpy_gbps; }
memcpy=$(memcpy_now)
echo "bench-serve: $(basename "$file"), batches of $batch rows, window ${BENCH_CLIENT_WINDOW:-32}, $(nproc) cores"

cold=$("$client" run "$tmp/sock" "$file" --epochs 1 --batch-size "$batch" "${win[@]}")
cold_gbps=$(echo "$cold" | mean_of gbps 0)
cold_rows=$(echo "$cold" | mean_of rows_per_s 0)

stats() { "$build/bin/larderctl" --socket "$tmp/sock" --json stats; }
workers=$("$build/bin/larderctl" --socket "$tmp/sock" --json status | python3 -c "import json,sys; print(json.load(sys.stdin)['workers'])")
# The workers' assembly time per batch between two stats snapshots: it
# rises when the machine slows down (a shared VM's memory bandwidth moves
# between runs), which shows whether a stall run below had the speed the
# warm run measured.
assemble_us() {
  python3 -c "
import json,sys
a,b=(json.loads(x) for x in sys.argv[1:])
n=lambda s,k: s.get(k, s.get('global',{}).get(k,0))
print((n(b,'assemble_ns')-n(a,'assemble_ns'))/1e3/max(1,n(b,'batches')-n(a,'batches')))" "$1" "$2"
}
# Seven epochs, the first not counted (it opens the stream and follows a
# memcpy that evicted the caches): six epochs of 80-100 ms each, so that
# one of the VM's pauses (2-20 ms, twice a second) moves the mean less.
# The daemon's CPU time, all its threads together, in nanoseconds: user
# and system time from /proc, which counts in clock ticks.
daemon_cpu_ns() {
  python3 -c "
import os,sys
f=open('/proc/%s/stat' % sys.argv[1]).read().rsplit(')',1)[1].split()
print((int(f[11])+int(f[12]))*10**9//os.sysconf('SC_CLK_TCK'))" "$daemon_pid"
}
memcpy0=$(memcpy_now)
s_w0=$(stats)
cpu_w0=$(daemon_cpu_ns)
warm1=$("$client" run "$tmp/sock" "$file" --epochs 7 --batch-size "$batch" "${win[@]}" --seed 1)
cpu_w1=$(daemon_cpu_ns)
s_w1=$(stats)
memcpy1=$(memcpy_now)
assemble_warm=$(assemble_us "$s_w0" "$s_w1")
warm1_gbps=$(echo "$warm1" | mean_of gbps 1)
warm1_rows=$(echo "$warm1" | mean_of rows_per_s 1)
warm1_sec=$(echo "$warm1" | mean_of seconds 1)
warm1_med=$(echo "$warm1" | python3 -c "
import json,sys,statistics
print(statistics.median(json.loads(l)['gbps'] for l in sys.stdin if l.startswith('{') and json.loads(l)['epoch'] >= 1))")
batches=$(echo "$warm1" | mean_of batches 1)
# The ideal shuffled gather on one core: rows of the dataset's mean size,
# each contiguous, copied in random order out of a shuffle window's worth of
# memory (512 MiB, the default shuffle_window_bytes).
row_bytes=$(echo "$warm1" | python3 -c "
import json,sys
r=[json.loads(l) for l in sys.stdin if l.startswith('{')][-1]
print(max(1, round(r['bytes']/r['rows'])))")
gather=$(field "$("$client" gather "$row_bytes" $((512 << 20)) "$batch")" gather_gbps)
touch1=$("$client" run "$tmp/sock" "$file" --epochs 3 --batch-size "$batch" "${win[@]}" --seed 1 --touch)
touch1_gbps=$(echo "$touch1" | mean_of gbps 1)
memcpy2=$(memcpy_now)

"$client" run "$tmp/sock" "$file" --epochs 3 --batch-size "$batch" "${win[@]}" --seed 2 >"$tmp/c1" &
p1=$!
"$client" run "$tmp/sock" "$file" --epochs 3 --batch-size "$batch" "${win[@]}" --seed 3 >"$tmp/c2" &
p2=$!
wait $p1 $p2
warm2_gbps=$(python3 -c "
import json
a=[json.loads(l) for l in open('$tmp/c1') if l.startswith('{')][1:]
b=[json.loads(l) for l in open('$tmp/c2') if l.startswith('{')][1:]
print(sum(x['bytes'] for x in a+b)/max(sum(x['seconds'] for x in a),sum(x['seconds'] for x in b))/1e9)")
memcpy3=$(memcpy_now)

# A trainer that computes twice as long per batch as the daemon needs to
# make one, alone on the daemon: its stall fraction should be near zero.
# It sleeps for its compute, and a sleep ends late by the time the
# scheduler takes to wake it (tens of microseconds on a small VM with the
# daemon's threads on the cores), so its time between calls, measured by
# liblarder and printed, is longer than the sleep.
cost_us=$(python3 -c "print($warm1_sec/$batches*1e6)")
# The daemon's cost to produce a batch, in CPU time: everything its
# threads ran during the warm run (7 epochs) over the batches it made.
# With several workers a batch comes out more often than that (cost_us
# above, the interval between batches), so a step can be shorter than the
# cost and still be fed.
all_batches=$(echo "$warm1" | python3 -c "
import json,sys
print(sum(json.loads(l)['batches'] for l in sys.stdin if l.startswith('{')))")
cpu_cost_us=$(python3 -c "print(($cpu_w1-$cpu_w0)/1e3/$all_batches)")
# Each simulated trainer runs 7 epochs: the first opens the stream (its
# first batch waits for the footers and the first plan), the other 6 are
# the warm epochs measured.  On a shared VM one epoch in several has a
# stall of a few milliseconds that the machine causes (a vCPU descheduled
# for 2-20 ms: an idle thread that sleeps 100 us at a time sees such gaps
# twice a second), so fewer epochs measure the machine more than the
# daemon; the worst epoch is printed beside the mean.
stall_epochs=7
compute_us=$(python3 -c "print(round(2*$cost_us))")
# The daemon's stats around it: the Wake frames per batch are the socket
# messages left once batches and releases go through the descriptor ring.
wakes() {
  python3 -c "
import json,sys
a,b=(json.loads(x) for x in sys.argv[1:])
n=lambda s,k: s.get(k, s.get('global',{}).get(k,0))
print((n(b,'ring_wakes_sent')+n(b,'ring_wakes_received')-n(a,'ring_wakes_sent')-n(a,'ring_wakes_received'))/max(1,n(b,'batches')-n(a,'batches')))" "$1" "$2"
}
# A trainer twice as slow as the interval between batches.
s0=$(stats)
sim=$("$client" run "$tmp/sock" "$file" --epochs "$stall_epochs" --batch-size "$batch" "${win[@]}" --seed 4 --compute-us "$compute_us")
s1=$(stats)
wakes_per_batch=$(wakes "$s0" "$s1")
assemble_sim=$(assemble_us "$s0" "$s1")
# A trainer barely slower than the interval (it sleeps 1.25 times it, and
# its step comes out longer, as above): the workers keep up with no slack
# to spare.
compute2_us=$(python3 -c "print(round(1.25*$cost_us))")
s2=$(stats)
sim2=$("$client" run "$tmp/sock" "$file" --epochs "$stall_epochs" --batch-size "$batch" "${win[@]}" --seed 6 --compute-us "$compute2_us")
s3=$(stats)
assemble_sim2=$(assemble_us "$s2" "$s3")

# A trainer whose step just exceeds the daemon's cost to produce a batch
# (it sleeps that CPU time, and its step comes out longer, as above): the
# case the goal names.  On a host with a few workers this step is about
# twice the interval between batches; on one with many, ten times.
compute3_us=$(python3 -c "print(round($cpu_cost_us))")
s4=$(stats)
sim3=$("$client" run "$tmp/sock" "$file" --epochs "$stall_epochs" --batch-size "$batch" "${win[@]}" --seed 8 --compute-us "$compute3_us")
s5=$(stats)
assemble_sim3=$(assemble_us "$s4" "$s5")
# One epoch of a VM's hiccup moves a trainer's mean, and the median shows
# whether the others held.
# Per simulated trainer (run output, sleep, assembly triples): its mean
# over the warm epochs, with the median epoch and the worst beside it.
trainer_stats() {
  python3 -c "
import json,statistics,sys
out=[]
for run,sleep,asm in zip(sys.argv[1::3],sys.argv[2::3],sys.argv[3::3]):
    rows=[json.loads(l) for l in run.splitlines() if l.startswith('{')]
    w=[r for r in rows if r['epoch']>=1]
    mean=lambda k: sum(r[k] for r in w)/len(w)
    out.append(dict(step=mean('compute_us'), sleep=float(sleep), stall=mean('stall'),
                    median=statistics.median(r['stall'] for r in w), worst=max(r['stall'] for r in w),
                    long=mean('stall_long'), call_ns=mean('call_ns_p50'), assemble=float(asm)))
print(json.dumps(out))" "$@"
}
trainers=$(trainer_stats "$sim3" "$compute3_us" "$assemble_sim3" "$sim" "$compute_us" "$assemble_sim" \
  "$sim2" "$compute2_us" "$assemble_sim2")

# Beside a busy neighbour: trainers share their host with Python,
# augmentation and NCCL threads, so one process keeps a core busy (a spin
# loop at the default niceness) while a trainer stepping twice the daemon's
# cost reads, then while one client reads as fast as it can.  The same
# trainer alone first, for the comparison in the same run.
compute4_us=$(python3 -c "print(round(2*$cpu_cost_us))")
s6=$(stats)
sim4=$("$client" run "$tmp/sock" "$file" --epochs "$stall_epochs" --batch-size "$batch" "${win[@]}" --seed 10 --compute-us "$compute4_us")
s7=$(stats)
assemble_sim4=$(assemble_us "$s6" "$s7")
python3 -c 'while True: pass' &
neighbour_pid=$!
trap 'kill "$neighbour_pid" 2>/dev/null || true; cleanup' EXIT
s8=$(stats)
simn=$("$client" run "$tmp/sock" "$file" --epochs "$stall_epochs" --batch-size "$batch" "${win[@]}" --seed 12 --compute-us "$compute4_us")
s9=$(stats)
assemble_simn=$(assemble_us "$s8" "$s9")
memcpy4=$(memcpy_now)
warmn=$("$client" run "$tmp/sock" "$file" --epochs 4 --batch-size "$batch" "${win[@]}" --seed 11)
memcpy5=$(memcpy_now)
kill "$neighbour_pid" 2>/dev/null || true
wait "$neighbour_pid" 2>/dev/null || true
trap cleanup EXIT
warmn_gbps=$(echo "$warmn" | mean_of gbps 1)
neighbour=$(trainer_stats "$sim4" "$compute4_us" "$assemble_sim4" "$simn" "$compute4_us" "$assemble_simn")

rss=$("$client" run "$tmp/sock" "$file" --epochs 10 --batch-size "$batch" "${win[@]}" --seed 5 --daemon-pid "$daemon_pid")

python3 - "$memcpy" "$cold_gbps" "$cold_rows" "$warm1_gbps" "$warm1_rows" "$touch1_gbps" \
  "$warm2_gbps" "$cost_us" "$gather" "$row_bytes" "$wakes_per_batch" "$assemble_warm" "$workers" \
  "$memcpy0" "$memcpy1" "$memcpy2" "$memcpy3" "$warm1_med" "$cpu_cost_us" "$warmn_gbps" \
  "$memcpy4" "$memcpy5" <<PY
import json, sys
(memcpy, cold, cold_rows, w1, w1_rows, t1, w2, cost, gather, row_bytes, wakes, asm_warm,
 workers, m0, m1, m2, m3, w1_med, cpu_cost, wn, m4, m5) = map(float, sys.argv[1:])
ms = [memcpy, m0, m1, m2, m3]
# Each run's peer: the mean of the copies measured just before and after it.
m_cold, m_w1, m_t1, m_w2 = (memcpy + m0) / 2, (m0 + m1) / 2, (m1 + m2) / 2, (m2 + m3) / 2
print(f"  single-core memcpy          {m_w1:8.2f} GB/s  (around the warm run; {min(ms):.2f}-{max(ms):.2f} over five "
      f"measures, each ratio below against those around its own run)")
print(f"  single-core ideal gather    {gather:8.2f} GB/s  (rows of {row_bytes:.0f} B, each contiguous, in random order from 512 MiB)")
print(f"  cold (decode-bound)         {cold:8.2f} GB/s  {cold_rows/1e6:6.2f} M rows/s  {cold/m_cold:5.2f} x memcpy")
print(f"  warm, 1 client              {w1:8.2f} GB/s  {w1_rows/1e6:6.2f} M rows/s  {w1/m_w1:5.2f} x memcpy  (goal >= 0.50; "
      f"median epoch {w1_med/m_w1:.2f} x), {w1/gather:.2f} x ideal gather")
print(f"  warm, 1 client reading all  {t1:8.2f} GB/s                    {t1/m_t1:5.2f} x memcpy")
print(f"  warm, 2 clients (total)     {w2:8.2f} GB/s                    {w2/m_w2:5.2f} x memcpy")
print(f"  copies of batch bytes between daemon and client: 0 (shared-memory arena, read in place)")
print(f"  the daemon's cost to produce a batch: {cpu_cost:.0f} us of CPU time (its threads during the warm run, "
      f"over its batches); with {workers:.0f} workers one came every {cost:.0f} us; "
      f"{wakes:.3f} socket messages per batch")
# Each simulated trainer: its step, and its stall over the warm epochs.
# The goal is for a step longer than the daemon's cost; a shorter one is
# fed only because the workers make batches in parallel, and its stall is
# printed as well, with the part of it spent in the ready calls.
for t in json.loads("""$trainers"""):
    goal = "goal < 1%" if t["step"] > cpu_cost else "shorter than the cost: no goal"
    print(f"  simulated trainer computing {t['step']:.0f} us/batch ({t['step']/cpu_cost:.2f} x the cost, "
          f"{t['step']/cost:.1f} x the interval; it sleeps {t['sleep']:.0f} us of it): stall "
          f"{100*t['stall']:.2f}% over $((stall_epochs - 1)) warm epochs ({goal}; median epoch "
          f"{100*t['median']:.2f}%, worst {100*t['worst']:.2f}%; in waits of 20 us or more "
          f"{100*t['long']:.2f}%, the rest in shorter calls; a ready call took {t['call_ns']/1e3:.2f} us, median); "
          f"a worker's assembly {t['assemble']:.0f} us per batch ({asm_warm:.0f} us in the warm run)")
# Beside the neighbour: the same trainer (twice the cost) alone and then
# with a core kept busy, and the warm rate with it.
alone, busy = json.loads("""$neighbour""")
print(f"  beside a CPU-bound neighbour (one process spinning on a core): warm, 1 client {wn:.2f} GB/s "
      f"({wn/((m4+m5)/2):.2f} x memcpy measured beside it, {wn/w1:.2f} x the warm run alone)")
for name, t in (("alone", alone), ("beside it", busy)):
    print(f"  simulated trainer computing {t['step']:.0f} us/batch ({t['step']/cpu_cost:.2f} x the cost), "
          f"{name}: stall {100*t['stall']:.2f}% over $((stall_epochs - 1)) warm epochs (goal < 1%; median epoch "
          f"{100*t['median']:.2f}%, worst {100*t['worst']:.2f}%; in waits of 20 us or more "
          f"{100*t['long']:.2f}%); a worker's assembly {t['assemble']:.0f} us per batch")
rss = [json.loads(l)["daemon_rss_kb"] for l in """$rss""".splitlines() if l.startswith("{")]
print("  daemon RSS after each of 10 epochs (MiB): " + " ".join(f"{r/1024:.0f}" for r in rss))
if rss:
    print(f"  RSS spread over epochs 2-10: {(max(rss[1:])-min(rss[1:]))/1024:.0f} MiB of {max(rss)/1024:.0f} MiB")
PY
