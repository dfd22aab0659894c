#!/usr/bin/env bash
# cuda-real.sh [BUILD_OR_BUNDLE_DIR]: the CUDA tests (test-cuda.c) against
# the real driver on a GPU host, then optionally the CUDA benchmark.  Not
# part of `make test` (no GPU there).  Runs from a build tree or from a
# bundle made by bench/bundle.sh (which carries run-tests, the test data
# and this script):
#
#   # on the build machine
#   make -j2 && make build/release/bin/bench-cuda
#   bench/bundle.sh build/release /tmp/larder-bundle
#   tar -C /tmp -czf larder-bundle.tgz larder-bundle
#   # on the GPU host
#   tar -xzf larder-bundle.tgz && cd larder-bundle
#   bash tests/cuda-real.sh .            # the tests
#   BENCH=1 bash tests/cuda-real.sh .    # the tests, then bench-cuda
#                                         # (BENCH_SOURCE: its dataset)
#
# The driver is the host's libcuda.so.1; the tests read device memory back with cuMemcpyDtoH only.  Tests that need
# two GPUs skip on one; those that need the test double's knobs (its
# memory limit, refused pinning) skip that part.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
dir=$(cd "${1:-$root/build/release}" && pwd)
# The host's driver, found as libcuda.so.1 (or LARDER_LIBCUDA set to its
# path, e.g. /usr/lib/x86_64-linux-gnu/libcuda.so.1, should the bundle's
# loader not find it), never the test double.
case ${LARDER_LIBCUDA:-} in *fake-cuda*) unset LARDER_LIBCUDA ;; esac
export LARDER_TEST_CUDA_REAL=1
export LARDERD_BIN=$dir/bin/larderd LARDERCTL_BIN=$dir/bin/larderctl
export LARDER_TEST_DATA=${LARDER_TEST_DATA:-$root/tests/data}
export LARDER_TEST_WORK=${LARDER_TEST_WORK:-$(mktemp -d /tmp/larder-cuda-real.XXXXXX)}
# cuda_other_user's trainer runs as nobody, under this directory.
chmod 0755 "$LARDER_TEST_WORK"
for b in run-tests larderd larderctl; do
  [ -x "$dir/bin/$b" ] || { echo "cuda-real: $dir/bin/$b is missing" >&2; exit 1; }
done
echo "cuda-real: $(uname -n), driver: $(cat /proc/driver/nvidia/version 2>/dev/null | head -1 || echo 'no /proc/driver/nvidia/version')"
command -v nvidia-smi >/dev/null && nvidia-smi -L
echo "cuda-real: ulimit -l $(ulimit -l) (pinned arenas need it high; larderd falls back to pageable copies)"
rc=0
"$dir/bin/run-tests" cuda_values_match cuda_small_arena cuda_exports cuda_close_holding cuda_trainer_killed \
  cuda_fd_handles cuda_two_devices cuda_other_user cuda_pid_namespace cuda_errors || rc=$?
if [ $rc -ne 0 ]; then
  echo "cuda-real: tests FAILED (rc $rc): the failing assertion, with the driver's error string, is above" >&2
fi
if [ "${BENCH:-0}" != 0 ]; then
  # Without BENCH_SOURCE or the bench's dataset, the tests' dataset (the
  # 4 files of test-cuda.c's streams) copied 40 times, as distinct files,
  # in batches of 16384 rows (about 1 MB).
  if [ -z "${BENCH_SOURCE:-}" ] && [ ! -f "$root/bench/work/zstd-v1.parquet" ] &&
     ls "$LARDER_TEST_WORK"/daemon/std/*.parquet >/dev/null 2>&1; then
    export BENCH_SOURCE=$LARDER_TEST_WORK/bench-copies BENCH_BATCH=${BENCH_BATCH:-16384}
    mkdir -p "$BENCH_SOURCE"
    for i in $(seq 40); do
      for f in "$LARDER_TEST_WORK"/daemon/std/*.parquet; do cp "$f" "$BENCH_SOURCE/$i-$(basename "$f")"; done
    done
  fi
  bash "$root/bench/bench-cuda.sh" "$dir" || rc=$?
fi
exit $rc
