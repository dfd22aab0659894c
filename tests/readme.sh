#!/usr/bin/env bash
# readme.sh: the README's two commands, as written, from a clean clone.
#
# The README must open with a code block holding exactly `make demo` and
# `make test`.  This script clones the repository's HEAD into a temporary
# directory and runs the first command there as written; the run must end
# with `larderctl stats` showing a warm cache.  The second command is the
# one CI runs on a clean clone (.ci/run), and running it from inside itself
# would recurse, so here it is checked with `make -n`: it must install the
# dependencies first, then run the suite in all three flavours and the fuzzer.
#
# Usage: tests/readme.sh [WORK_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-tests/work/readme}
fail() { echo "readme.sh: $*" >&2; exit 1; }

# 1. The README opens with the two commands (the first code block).
block=$(awk '/^```/{n++; next} n==1' README.md | sed 's/[[:space:]]*#.*$//; /^[[:space:]]*$/d')
want=$'make demo\nmake test'
[ "$block" = "$want" ] || fail "the README's first code block is not the two commands:
$block"
grep -qx 'make test' .ci/run || fail ".ci/run does not run 'make test'"

# 2. A clean clone of HEAD (uncommitted changes are not part of it).
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
git clone -q --no-hardlinks "$(pwd)" "$work/clone"
# The npm test tools are installed per checkout; share ours rather than
# downloading them again (deps.sh would otherwise install them).
for d in tests/node_modules bench/node_modules; do
  [ -e "$d" ] && ln -s "$(pwd)/$d" "$work/clone/$d"
done

# 3. make demo, as written.
echo "== make demo (clean clone in $work/clone)"
(cd "$work/clone" && LARDER_DEMO_DIR="$work/demo" make demo) >"$work/demo.log" 2>&1 \
  || { tail -40 "$work/demo.log" >&2; fail "make demo failed (log: $work/demo.log)"; }
grep -q '^== larderctl stats' "$work/demo.log" || fail "make demo did not print larderctl stats"
# Three epochs, each reported with its stall fraction.
epochs=$(grep -ciE '^epoch [0-9]+.*stall' "$work/demo.log" || true)
[ "$epochs" -ge 3 ] || { cat "$work/demo.log" >&2; fail "make demo showed $epochs epochs, not 3"; }
# The cache holds the dataset, and the warm epochs were served from it.
grep -qE '^ +used +[1-9][0-9.]* [KMGT]iB of' "$work/demo.log" \
  || { tail -30 "$work/demo.log" >&2; fail "larderctl stats shows an empty cache"; }
grep -qE '^ +hit ratio +[1-9][0-9.]*%' "$work/demo.log" \
  || { tail -30 "$work/demo.log" >&2; fail "larderctl stats shows no cache hits"; }
sed -n '/^== example trainer/,$p' "$work/demo.log"

# 4. make test, as written: its plan (a dry run).
plan=$(cd "$work/clone" && make -n test 2>&1)
for step in 'scripts/deps.sh' 'V=release check' 'V=asan check' 'V=ubsan check' 'fuzz FUZZ_SECONDS=120'; do
  grep -qF -- "$step" <<<"$plan" || fail "make test does not run '$step':
$plan"
done
rm -rf "$work"
echo "readme.sh: the README's commands work from a clean clone"
