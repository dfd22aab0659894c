#!/usr/bin/env bash
# bundle.sh BUILD_DIR OUT_DIR: packs larderd, larderctl, serve-client and
# liblarder.so with every shared library they load, the C library and its
# loader included, into OUT_DIR, so that `make bench-serve`'s script runs on
# a host that has none of Debian's packages: a GPU node's own image, say.
#
#   bench/bundle.sh build/release /tmp/larder-bundle
#   LARDER_BUNDLE_LIB=... bash bench/bench-serve.sh /tmp/larder-bundle
#
# OUT_DIR/bin holds one small wrapper per program, which runs the real one
# (OUT_DIR/real) through the carried loader with OUT_DIR/lib as its only
# library path.  The programs then use exactly the libraries they were built
# and tested with, whatever the host's glibc is, and exec keeps the process
# id, so bench-serve's RSS readings of the daemon stay right.  liblarder.so
# goes to OUT_DIR/lib (with the Python package's extension, OUT_DIR/lib/larder,
# where built), for a Python trainer that loads it with ctypes (it
# needs the host's own loader, so OUT_DIR/lib's libprotobuf-c.so.1 must be
# loaded first: see bench/torch-trainer.py).
#
# When built, run-tests and bench-cuda come too, with what the CUDA check
# of a GPU host needs (tests/cuda-real.sh, tests/data, bench/bench-cuda.sh
# and bench/work/zstd-v1.parquet if generated), laid out as in the source
# tree: on the GPU host, `bash OUT_DIR/tests/cuda-real.sh OUT_DIR`.
set -euo pipefail
build=${1:?usage: bundle.sh BUILD_DIR OUT_DIR}
out=${2:?usage: bundle.sh BUILD_DIR OUT_DIR}
progs=(larderd larderctl serve-client)
# Optional: the CUDA check's programs (tests/cuda-real.sh), when built.
for p in run-tests bench-cuda; do
  if [ -x "$build/bin/$p" ]; then progs+=("$p"); fi
done

rm -rf "$out"
mkdir -p "$out/bin" "$out/real" "$out/lib"
for p in "${progs[@]}"; do
  [ -x "$build/bin/$p" ] || { echo "bundle: $build/bin/$p is missing (make V=release $build/bin/$p)" >&2; exit 1; }
  cp "$build/bin/$p" "$out/real/$p"
  # The debugging sections are most of a release binary's size, and a
  # bundle is carried to a host for measurement, not debugging.
  if command -v strip >/dev/null; then strip --strip-debug "$out/real/$p"; fi
done
cp "$build/lib/liblarder.so" "$out/lib/"
# The Python package's extension, where built (it finds it beside liblarder).
if [ -d "$build/lib/larder" ]; then cp -r "$build/lib/larder" "$out/lib/"; fi

# Every library the programs load, as ldd resolves them here, the loader
# (the line without "=>") included.
libs=$(for p in "${progs[@]}" ; do ldd "$build/bin/$p"; done; ldd "$build/lib/liblarder.so")
loader=
while read -r name arrow path _; do
  if [ "$arrow" = "=>" ] && [ -f "$path" ]; then
    cp -L "$path" "$out/lib/$name"
  elif [ -f "$name" ]; then
    loader=$(basename "$name")
    cp -L "$name" "$out/lib/$loader"
  fi
done <<<"$libs"
[ -n "$loader" ] || { echo "bundle: ldd named no loader" >&2; exit 1; }

for p in "${progs[@]}"; do
  cat >"$out/bin/$p" <<EOF
#!/bin/sh
d=\$(cd "\$(dirname "\$0")/.." && pwd)
exec "\$d/lib/$loader" --library-path "\$d/lib" "\$d/real/$p" "\$@"
EOF
  chmod +x "$out/bin/$p"
done
# The CUDA check's scripts and data, where its scripts look for them.
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out/tests" "$out/bench"
cp "$src/tests/cuda-real.sh" "$out/tests/"
cp "$src/bench/bench-cuda.sh" "$out/bench/"
cp -r "$src/tests/data" "$out/tests/"
if [ -f "$src/bench/work/zstd-v1.parquet" ]; then
  mkdir -p "$out/bench/work" && cp "$src/bench/work/zstd-v1.parquet" "$out/bench/work/"
fi
echo "bundle: $out ($(du -sh "$out" | cut -f1), $(find "$out/lib" -type f | wc -l) libraries)"
