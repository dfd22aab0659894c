#!/usr/bin/env bash
# bench-cuda.sh BUILD_DIR: what `make bench-cuda` runs, and what runs on a
# GPU host from a bundle (bench/bundle.sh BUILD_DIR OUT_DIR carries
# bench-cuda, this script and, when present, bench/work/zstd-v1.parquet):
#
#   bash OUT_DIR/bench/bench-cuda.sh OUT_DIR
#
# Starts a larderd (the real libcuda.so.1, unless LARDER_LIBCUDA says
# otherwise), then bench-cuda prints, from one run: per GPU the
# cuMemcpyHtoD bandwidth from pinned and pageable memory beside the batch
# bytes larder delivers into that GPU (alone, then all GPUs at once) and
# the ideal shuffled gather on the daemon's workers' count of threads, the
# daemon's CPU per batch on the CUDA path beside the host path, and the
# stall of a trainer stepping just over that cost.
#
# Environment: BENCH_SOURCE (a path or glob of Parquet files; default
# bench/work/zstd-v1.parquet beside this script), BENCH_COPIES (when the
# source is one file, the dataset is that many copies of it, as distinct
# files, so that a warm epoch is long enough to time: default 64),
# BENCH_BATCH (8192), BENCH_EPOCHS (4, the first not counted),
# BENCH_ARENA_BYTES (0: the daemon's 256 MiB), BENCH_CUDA_FD (1: the
# daemon exports regions as VMM descriptors, cuda_fd_handles = true).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build/release}" && pwd)
source=${BENCH_SOURCE:-$here/work/zstd-v1.parquet}
if ! ls $source >/dev/null 2>&1; then
  echo "bench-cuda: no dataset at $source: set BENCH_SOURCE (make bench-serve generates bench/work)" >&2
  exit 1
fi
case $source in /*) ;; *) source=$PWD/$source ;; esac
tmp=$(mktemp -d /tmp/larder-bench-cuda.XXXXXX)
copies=${BENCH_COPIES:-64}
if [ -f "$source" ] && [ "$copies" -gt 1 ]; then
  mkdir -p "$tmp/data"
  for i in $(seq "$copies"); do cp "$source" "$tmp/data/$i.parquet"; done
  echo "bench-cuda: the dataset is $copies copies of $source ($(du -sh "$tmp/data" | cut -f1) on disk)"
  source=$tmp/data
fi
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ]; then kill -TERM "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
# Arenas are pinned (cuMemHostRegister): say so when the lock limit is low.
if [ "$(ulimit -l)" != unlimited ]; then
  echo "bench-cuda: ulimit -l is $(ulimit -l) KiB: arenas may not be pinned (copies then go from pageable memory; see the daemon's log)"
fi
"$build/bin/larderd" --socket="$tmp/sock" --cache_dir="$tmp/cache" --cache_capacity=16G \
  --memory_limit=8G --log_level=notice --cuda_fd_handles="$([ "${BENCH_CUDA_FD:-0}" = 1 ] && echo true || echo false)" \
  2>"$tmp/daemon.log" &
daemon_pid=$!
for _ in $(seq 200); do [ -S "$tmp/sock" ] && break; sleep 0.05; done
[ -S "$tmp/sock" ] || { echo "bench-cuda: larderd did not start:" >&2; cat "$tmp/daemon.log" >&2; exit 1; }
# The daemon's pid for its CPU time: the bundle's wrapper execs, keeping it.
# Its workers: the threads of the ideal gather bench-cuda measures.
workers=$("$build/bin/larderctl" --socket="$tmp/sock" --json status 2>/dev/null | tr ',{}' '\n\n\n' |
  awk -F: '/"workers"/ { print $2 + 0; exit }')
rc=0
"$build/bin/bench-cuda" all "$tmp/sock" "$source" "$daemon_pid" --batch-size "${BENCH_BATCH:-8192}" \
  --epochs "${BENCH_EPOCHS:-4}" --arena-bytes "${BENCH_ARENA_BYTES:-0}" \
  ${workers:+--workers "$workers"} || rc=$?
# The daemon's side of the CUDA copies (cuda.h's stats), over every CUDA
# stream above: how long a batch's copy ran, from its start on a worker
# (which goes on to its next task) until the driver reported it done.
"$build/bin/larderctl" --socket="$tmp/sock" stats --json 2>/dev/null | tr ',{}' '\n\n\n' |
  awk -F: '/"cuda_copies"|"cuda_copy_bytes"|"cuda_copy_ns"|"assemble_ns"|"batches_delivered"/ { gsub(/"/, "", $1); v[$1] = $2 }
    END { if (v["cuda_copies"] > 0)
      printf "  the daemon'"'"'s copies: %d, %.2f GB, %.1f us each from start to end (%.2f GB/s a copy)\n",
        v["cuda_copies"], v["cuda_copy_bytes"] / 1e9, v["cuda_copy_ns"] / v["cuda_copies"] / 1e3,
        v["cuda_copy_bytes"] / v["cuda_copy_ns"] }' || true
if [ $rc -ne 0 ] || grep -q "cannot pin\|CUDA" "$tmp/daemon.log"; then
  echo "--- larderd log (CUDA lines) ---"; grep -i "cuda\|error" "$tmp/daemon.log" | tail -20 || true
fi
exit $rc
