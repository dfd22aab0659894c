#!/usr/bin/env bash
# gpu-check.sh BUNDLE [TORCH_DATA.parquet]: what a GPU host checks, from a
# bundle made by bench/bundle.sh on the build machine (the GPU host needs
# none of Debian's packages), in one run:
#   0. the Python package's extension, built for the host's python3 and
#      numpy where it has a compiler and Python's headers;
#   1. the CUDA tests against the real driver, then bench-cuda
#      (tests/cuda-real.sh with BENCH=1); 1b. bench-cuda again, shorter, with
#      the regions exported as VMM descriptors (BENCH_CUDA_FD=1);
#   2. the Python package's tests with the host's python3, where PyTorch,
#      pyarrow and a GPU are (the tests that skip without them run here);
#   2b. the Python package's cost per batch (bench/py-overhead.py), host batches and
#      a CUDA stream's through torch();
#   3. the PyTorch loop fed by larder against the same loop fed from host
#      memory (bench/torch-trainer.py), at 500 and 200 us steps, when a
#      dataset of bench/gen-dataset.mjs's schema is given.
# Each part has a time limit of its own; the logs go to $OUT (or /tmp) as
# gpu-cuda.log, gpu-python.log and gpu-torch.log, and their tails to stdout.
set -uo pipefail
b=$(cd "${1:?usage: gpu-check.sh BUNDLE [TORCH_DATA.parquet]}" && pwd)
data=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp}
ulimit -l unlimited 2>/dev/null || true
nvidia-smi -L 2>/dev/null || echo "gpu-check: no nvidia-smi"
# liblarder.so, loaded into the host's python3 with the host's loader,
# needs the bundle's libprotobuf-c.
export LD_PRELOAD=$b/lib/libprotobuf-c.so.1
rc=0

echo "== 0. The Python package's extension, for this host's python3"
# As pip would build it for a trainer's interpreter: the bundle's copy is
# for the build machine's python3 and numpy.
if ! python3 "$root/bench/build-views.py" "$b/lib/larder" 2>&1; then
  echo "gpu-check: no extension for this python3; the package runs without it"
fi

echo "== 1. CUDA tests and bench-cuda"
LD_PRELOAD= timeout "${CUDA_LIMIT:-200}" env BENCH=1 bash "$b/tests/cuda-real.sh" "$b" \
  >"$out/gpu-cuda.log" 2>&1 || rc=1
tail -45 "$out/gpu-cuda.log"

echo "== 1b. bench-cuda with regions exported as descriptors (cuda_fd_handles)"
# The same device memory, mapped another way: the open's cost and the
# bandwidth beside legacy IPC's (part 1), on a shorter run.
LD_PRELOAD= timeout "${FD_LIMIT:-90}" env BENCH_CUDA_FD=1 BENCH_COPIES="${FD_COPIES:-16}" \
  BENCH_EPOCHS=2 bash "$b/bench/bench-cuda.sh" "$b" >"$out/gpu-cuda-fd.log" 2>&1 || rc=1
tail -12 "$out/gpu-cuda-fd.log"

echo "== 2. Python package tests"
# On a GPU, tests/python/test_cuda.py uses the real driver (not the double).
if nvidia-smi -L >/dev/null 2>&1; then export LARDER_TEST_CUDA_REAL=1; fi
# Not those that build or install from the source tree (make, gcc).
LARDER_BUILD_DIR=$b timeout "${PY_LIMIT:-150}" python3 -m pytest -q -p no:cacheprovider -rs \
  -k "not make_install and not pip_install and not ctypes_suite and not describe_abi" \
  "$root/tests/python" >"$out/gpu-python.log" 2>&1 || rc=1
tail -15 "$out/gpu-python.log"

echo "== 2b. The Python package's cost per batch"
timeout "${OVH_LIMIT:-60}" python3 "$root/bench/py-overhead.py" "$b" --batches 20000 --rounds 3 \
  >"$out/gpu-overhead.log" 2>&1 || rc=1
tail -4 "$out/gpu-overhead.log"
timeout "${OVH_LIMIT:-60}" python3 "$root/bench/py-overhead.py" "$b" --batches 10000 --rounds 3 \
  --cuda >"$out/gpu-overhead-cuda.log" 2>&1 || rc=1
tail -2 "$out/gpu-overhead-cuda.log"

if [ -n "$data" ]; then
  echo "== 3. PyTorch loop against its host-memory peer"
  timeout "${TORCH_LIMIT:-120}" python3 "$root/bench/torch-trainer.py" "$b" "$data" \
    --step-us 500 200 --epochs 8 --batch-size 256 >"$out/gpu-torch.log" 2>&1 || rc=1
  tail -40 "$out/gpu-torch.log"
fi
exit $rc
