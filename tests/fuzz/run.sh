#!/usr/bin/env bash
# run.sh: runs libFuzzer targets for a fixed total time and reports findings.
#
# Usage: tests/fuzz/run.sh BUILD_DIR SECONDS TARGET...
#
# SECONDS is split evenly between the targets, which run one after the other.
# Each target TARGET keeps its corpus in BUILD_DIR/corpus-TARGET (grown by
# every run) and reads seeds from BUILD_DIR/seeds-TARGET, made afresh here:
#   fuzz-footer  the conformance files (tests/data/parquet-testing/data and
#                bad_data), as whole files
#   fuzz-pages   column chunks made by the target itself: well-formed chunks
#                of each of its variants, and the chunks of the conformance
#                files that match a variant (LLVMFuzzerInitialize, see
#                fuzz-pages.c)
#   fuzz-ring    well-formed streams of several schemas, and a ring the
#                daemon side reads (LLVMFuzzerInitialize, see fuzz-ring.c)
# and, for every target, the inputs in tests/fuzz/regress/TARGET/ that once
# found a bug there.
# Findings (crash-*, leak-*, timeout-*, oom-*) are kept in
# BUILD_DIR/artifacts-TARGET/ and the log in BUILD_DIR/TARGET.log.  Prints a
# summary per target; exits 1 when any target found something.
set -uo pipefail

if [ $# -lt 3 ]; then
  echo "usage: $0 BUILD_DIR SECONDS TARGET..." >&2
  exit 2
fi
B=$1
SECONDS_TOTAL=$2
shift 2
TARGETS=("$@")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DATA=$HERE/../data/parquet-testing

per=$((SECONDS_TOTAL / ${#TARGETS[@]}))
[ "$per" -lt 1 ] && per=1
status=0
summary=()

for t in "${TARGETS[@]}"; do
  bin=$B/$t
  if [ ! -x "$bin" ]; then
    echo "run.sh: $bin is not built" >&2
    exit 2
  fi
  corpus=$B/corpus-$t
  seeds=$B/seeds-$t
  art=$B/artifacts-$t
  log=$B/$t.log
  rm -rf "$seeds"
  mkdir -p "$corpus" "$seeds" "$art"
  case $t in
    fuzz-footer)
      max_len=4194304
      for f in "$DATA"/data/*.parquet "$DATA"/bad_data/*.parquet; do
        [ -f "$f" ] || continue
        [ "$(stat -c %s "$f")" -le "$max_len" ] && cp "$f" "$seeds/"
      done
      ;;
    fuzz-pages)
      max_len=1048576
      files=$(ls "$DATA"/data/*.parquet 2>/dev/null | tr '\n' ':')
      LARDER_FUZZ_SEED_DIR=$seeds LARDER_FUZZ_SEED_FILES=$files "$bin" >"$log.seeds" 2>&1 ||
        echo "run.sh: $t: making seeds failed (see $log.seeds)" >&2
      ;;
    fuzz-ring)
      max_len=16384
      LARDER_FUZZ_SEED_DIR=$seeds "$bin" >"$log.seeds" 2>&1 ||
        echo "run.sh: $t: making seeds failed (see $log.seeds)" >&2
      ;;
    *)
      max_len=1048576
      ;;
  esac
  # Inputs that once found a bug, kept with the sources.
  if [ -d "$HERE/regress/$t" ]; then cp "$HERE/regress/$t"/* "$seeds/"; fi
  before=$(ls "$art")
  echo "== $t: ${per}s, $(ls "$seeds" | wc -l) seeds, $(ls "$corpus" | wc -l) corpus units"
  "$bin" -max_total_time="$per" -rss_limit_mb=2048 -timeout=10 -max_len="$max_len" \
    -artifact_prefix="$art/" -print_final_stats=1 "$corpus" "$seeds" >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1)
  # Reproducers this run added.
  found=$(comm -13 <(printf '%s\n' "$before" | sort) <(ls "$art" | sort) |
          grep -E '^(crash|leak|timeout|oom)-')
  line="$t: exit $rc, ${execs:-?} runs, ${cov:-no coverage line}, corpus $(ls "$corpus" | wc -l)"
  if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
    status=1
    line="$line: FOUND"
    echo "-- $t found a problem (exit $rc); log: $log"
    grep -E 'ERROR: |SUMMARY: |runtime error|broken promise|Test unit written' "$log" | head -20
    # The stack of the first report.
    awk '/^==[0-9]+==ERROR|runtime error|broken promise/{p=1} p&&/^    #[0-9]+ /{print; n++} n>=25{exit}' "$log"
    for a in $found; do echo "   reproducer: $art/$a"; done
  fi
  summary+=("$line")
done

echo "== fuzzing summary"
for s in "${summary[@]}"; do echo "  $s"; done
exit $status
