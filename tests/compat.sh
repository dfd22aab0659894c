#!/usr/bin/env bash
# compat.sh: checks larder's Parquet reader (through larderctl) against
# independent readers and writers.
#
# Usage: tests/compat.sh LARDERCTL WORKDIR
#
#   conformance/NAME  each tests/data/parquet-testing/data file DuckDB reads:
#                     `larderctl inspect --json` gives the fields, `larderctl
#                     cat` the rows, compared with NAME.duckdb.jsonl by
#                     tests/tools/compare.mjs
#   expected/NAME     files DuckDB cannot read (legacy LZ4, map_no_value),
#                     against the hand-written tests/data/expected/NAME.jsonl
#   crc/NAME          files with corrupt page CRCs: `cat` must fail naming the
#                     checksum, and `cat --no-verify-crc` must give the values
#   bad/NAME          tests/data/parquet-testing/bad_data: `cat` must exit 1
#                     or 2 with a message naming the file
#   corrupt/NAME      truncated, bit-flipped and overwritten copies of good
#                     files (made in WORKDIR, fixed seeds): `cat` must exit
#                     0, 1 or 2 within LARDER_COMPAT_TIMEOUT seconds, never
#                     crash, hang or trip a sanitizer, and name the file when
#                     it fails
#   gen/NAME          files written by DuckDB and arrow-rs (tests/gen/
#                     gen-files.mjs, into WORKDIR/gen, kept while the
#                     generator is unchanged), compared whole or by windows
#                     (`cat --offset N --limit N`)
#
# Prints one "ok"/"FAIL" line per check, then "N passed, N failed"; exits 1
# on any failure.  Values compare.mjs cannot compare faithfully are listed
# under their check as "skip:" lines (and coarser comparisons as "note:").
#
# Environment:
#   LARDER_COMPAT_FILTER   run only the checks whose KIND/NAME contains it
#   LARDER_COMPAT_JOBS     checks run in parallel (default 2)
#   LARDER_COMPAT_TIMEOUT  seconds per larderctl run on a corrupted file (20)
#   LARDER_COMPAT_CAT_TIMEOUT  seconds per other larderctl run (600)
#   LARDER_COMPAT_FLIPS    single-bit flips per corrupted file (200)
# Needs node and tests/node_modules (scripts/deps.sh installs them).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DATA=$HERE/data/parquet-testing
EXPECTED=$HERE/data/expected
TOOLS=$HERE/tools
SAN_RE='ERROR: (Address|Leak|Memory|Thread|UndefinedBehavior)Sanitizer|runtime error:|SUMMARY: (Address|Undefined)'

# Good files whose corrupted copies are tried.
CORRUPT_SOURCES=(
  alltypes_plain.parquet alltypes_dictionary.parquet nested_maps.snappy.parquet
  datapage_v2.snappy.parquet delta_binary_packed.parquet delta_length_byte_array.parquet
  byte_stream_split.zstd.parquet list_columns.parquet nonnullable.impala.parquet
  rle_boolean_encoding.parquet fixed_length_decimal.parquet concatenated_gzip_members.parquet
  lz4_raw_compressed.parquet int96_from_spark.parquet repeated_no_annotation.parquet
)
# DuckDB cannot read these; tests/data/expected holds their values.
EXPECTED_FILES=(hadoop_lz4_compressed.parquet non_hadoop_lz4_compressed.parquet map_no_value.parquet)
# DuckDB does not check CRCs; these must fail in larder unless told not to check.
CRC_FILES=(datapage_v1-corrupt-checksum.parquet rle-dict-uncompressed-corrupt-checksum.parquet)

# ---------------------------------------------------------------------------
# One check (run through xargs: compat.sh __task KIND NAME)

# run_ctl OUT ERR TIMEOUT ARGS...: runs larderctl, sets rc.
run_ctl() {
  local out=$1 err=$2 t=$3
  shift 3
  # (in a subshell whose own stderr is dropped, so that bash's "Segmentation
  # fault" notices do not clutter the output: the exit status tells)
  (timeout -k 5 "$t" "$LARDERCTL" "$@" >"$out" 2>"$err") 2>/dev/null
  rc=$?
}

sanitizer_hit() { grep -Eq "$SAN_RE" "$1"; }

# compare_run LABEL FILE EXPECTED [cat options...]: inspect + cat + compare.
# Appends to $log; returns 0 when equal; sets $why otherwise.
compare_run() {
  local label=$1 file=$2 expect=$3
  shift 3
  local d=$TASKDIR
  if [ ! -f "$d/inspect.json" ]; then
    run_ctl "$d/inspect.json" "$d/inspect.err" "$CAT_TIMEOUT" inspect --json "$file"
    if [ $rc -ne 0 ] || sanitizer_hit "$d/inspect.err"; then
      why="inspect --json exited $rc: $(head -c 300 "$d/inspect.err")"
      return 1
    fi
  fi
  run_ctl "$d/ours.jsonl" "$d/cat.err" "$CAT_TIMEOUT" cat "$file" "$@"
  if [ $rc -ne 0 ] || sanitizer_hit "$d/cat.err"; then
    why="cat${*:+ $*} exited $rc: $(head -c 300 "$d/cat.err")"
    return 1
  fi
  node "$TOOLS/compare.mjs" --fields "$d/inspect.json" --ours "$d/ours.jsonl" --duckdb "$expect" --label "$label" >"$d/compare.out" 2>&1
  local crc=$?
  cat "$d/compare.out" >>"$log"
  grep -E '^(skip|note):' "$d/compare.out" >>"$d/remarks"
  if [ $crc -ne 0 ]; then
    why="values differ from $(basename "$expect")"
    return 1
  fi
  rm -f "$d/ours.jsonl"
  return 0
}

# mutate SRC OUTDIR: writes the corrupted copies of SRC (deterministic).
mutate() {
  node --input-type=module - "$1" "$2" "$FLIPS" <<'EOF'
import fs from 'node:fs';
import path from 'node:path';
const [src, dir, flipsArg] = process.argv.slice(2);
const buf = fs.readFileSync(src);
const size = buf.length;
const base = path.basename(src, '.parquet');
let seed = 0x9e3779b9;
for (const c of base) seed = (Math.imul(seed ^ c.charCodeAt(0), 0x01000193) >>> 0);
const rnd = () => {
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const ri = (n) => Math.floor(rnd() * n);
fs.mkdirSync(dir, { recursive: true });
const footerLen = size >= 8 ? buf.readUInt32LE(size - 8) : 0;
const footerStart = Math.max(4, size - 8 - Math.min(footerLen, size - 12));
const cuts = new Set([0, 1, 4, 7, 8, 12, size - 1, size - 4, size - 5, size - 8, size - 9, size - 12]);
for (let k = 1; k < 16; k++) cuts.add(4 + Math.floor(((footerStart - 4) * k) / 16));
for (let k = 0; k < 10; k++) cuts.add(footerStart + Math.floor(((size - 8 - footerStart) * k) / 10));
for (const c of [...cuts].filter((c) => c >= 0 && c < size).sort((a, b) => a - b))
  fs.writeFileSync(path.join(dir, `trunc-${String(c).padStart(8, '0')}.parquet`), buf.subarray(0, c));
const flips = Number(flipsArg);
for (let k = 0; k < flips; k++) {
  // half anywhere, half in the footer (metadata, its length and the magic)
  const pos = k % 2 ? ri(size) : footerStart + ri(size - footerStart);
  const bit = ri(8);
  const b = Buffer.from(buf);
  b[pos] ^= 1 << bit;
  fs.writeFileSync(path.join(dir, `flip-${String(k).padStart(3, '0')}-at-${pos}-bit-${bit}.parquet`), b);
}
for (let k = 0; k < 40; k++) {
  const pos = k % 2 ? ri(size) : footerStart + ri(size - footerStart);
  const len = 1 + ri(k % 4 === 0 ? 256 : 16);
  const fill = k % 3; // 0 random, 1 0xff, 2 zeros
  const b = Buffer.from(buf);
  for (let i = pos; i < Math.min(size, pos + len); i++) b[i] = fill === 0 ? ri(256) : fill === 1 ? 0xff : 0;
  fs.writeFileSync(path.join(dir, `ow-${String(k).padStart(3, '0')}-at-${pos}-len-${len}.parquet`), b);
}
EOF
}

# gen_windows NAME: prints "full" or the windows "OFFSET LIMIT", one a line.
gen_windows() {
  node -e '
    const m = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const f = m.files.find((x) => x.file === process.argv[2]);
    if (!f) process.exit(1);
    if (f.compare === "windows") for (const [o, l] of f.windows) console.log(o + " " + l);
    else console.log("full");
  ' "$GEN/manifest.json" "$1"
}

task() {
  local kind=$1 name=$2
  TASKDIR=$WORKDIR/tasks/$kind/$name
  rm -rf "$TASKDIR"
  mkdir -p "$TASKDIR"
  log=$TASKDIR/log
  : >"$log"
  : >"$TASKDIR/remarks"
  why=''
  local ok=1 extra=''
  case $kind in
  conformance)
    compare_run "$kind/$name" "$DATA/data/$name" "$DATA/data/$name.duckdb.jsonl" || ok=0
    ;;
  expected)
    compare_run "$kind/$name" "$DATA/data/$name" "$EXPECTED/$name.jsonl" || ok=0
    ;;
  crc)
    local f=$DATA/data/$name
    run_ctl /dev/null "$TASKDIR/crc.err" "$CAT_TIMEOUT" cat "$f"
    cat "$TASKDIR/crc.err" >>"$log"
    if [ $rc -ne 1 ]; then
      ok=0 why="cat exited $rc on a file with a corrupt page CRC (want 1)"
    elif ! grep -Eqi 'checksum|crc' "$TASKDIR/crc.err"; then
      ok=0 why="cat's error does not mention the checksum/CRC: $(head -c 200 "$TASKDIR/crc.err")"
    elif ! grep -qF "$name" "$TASKDIR/crc.err"; then
      ok=0 why="cat's error does not name the file: $(head -c 200 "$TASKDIR/crc.err")"
    elif sanitizer_hit "$TASKDIR/crc.err"; then
      ok=0 why='sanitizer report'
    else
      compare_run "$kind/$name" "$f" "$f.duckdb.jsonl" --no-verify-crc || { ok=0; why="with --no-verify-crc: $why"; }
    fi
    ;;
  bad)
    run_ctl /dev/null "$TASKDIR/err" "$CORRUPT_TIMEOUT" cat "$DATA/bad_data/$name"
    cat "$TASKDIR/err" >>"$log"
    if [ $rc -ne 1 ] && [ $rc -ne 2 ]; then
      ok=0 why="cat exited $rc (want 1 or 2)"
    elif ! grep -qF "$name" "$TASKDIR/err"; then
      ok=0 why="error does not name the file: $(head -c 200 "$TASKDIR/err")"
    elif sanitizer_hit "$TASKDIR/err"; then
      ok=0 why="sanitizer report: $(grep -Em1 "$SAN_RE" "$TASKDIR/err")"
    fi
    ;;
  corrupt)
    local vdir=$WORKDIR/corrupt/$name
    rm -rf "$vdir"
    if ! mutate "$DATA/data/$name" "$vdir" 2>>"$log"; then
      ok=0 why='could not make the corrupted copies'
    else
      local n=0 n0=0 n1=0 n2=0 bad=0 v b
      for v in "$vdir"/*.parquet; do
        b=${v##*/}
        n=$((n + 1))
        local runs=(cat)
        case $b in trunc-*) runs=(cat inspect) ;; esac
        local r
        for r in "${runs[@]}"; do
          if [ "$r" = inspect ]; then
            run_ctl /dev/null "$TASKDIR/err" "$CORRUPT_TIMEOUT" inspect --json "$v"
          else
            run_ctl /dev/null "$TASKDIR/err" "$CORRUPT_TIMEOUT" cat "$v"
          fi
          local msg=''
          case $rc in
          0) [ "$r" = cat ] && n0=$((n0 + 1)) ;;
          1 | 2)
            [ "$r" = cat ] && { [ $rc -eq 1 ] && n1=$((n1 + 1)) || n2=$((n2 + 1)); }
            grep -qF "$b" "$TASKDIR/err" || msg="exit $rc without naming the file: $(head -c 160 "$TASKDIR/err" | tr '\n' ' ')"
            ;;
          124 | 137) msg="hung (killed after ${CORRUPT_TIMEOUT}s)" ;;
          *)
            if [ $rc -ge 128 ]; then msg="killed by signal $((rc - 128))"; else msg="exit $rc (want 0, 1 or 2)"; fi
            ;;
          esac
          if [ -z "$msg" ] && [ -s "$TASKDIR/err" ] && sanitizer_hit "$TASKDIR/err"; then
            msg="sanitizer report: $(grep -Em1 "$SAN_RE" "$TASKDIR/err")"
          fi
          if [ -n "$msg" ]; then
            bad=$((bad + 1))
            echo "$r $v: $msg" >>"$log"
            mkdir -p "$TASKDIR/failing"
            cp "$v" "$TASKDIR/failing/" 2>/dev/null
            cp "$TASKDIR/err" "$TASKDIR/failing/$b.$r.stderr" 2>/dev/null
          fi
        done
      done
      extra=" ($n copies: cat exit 0 on $n0, 1 on $n1, 2 on $n2)"
      if [ $bad -ne 0 ]; then
        ok=0 why="$bad runs misbehaved, e.g. $(grep -m1 ': ' "$log" | head -c 300); failing copies kept in $TASKDIR/failing"
      fi
      rm -rf "$vdir"
    fi
    ;;
  gen)
    local f=$GEN/$name w
    w=$(gen_windows "$name") || { ok=0 why="not in $GEN/manifest.json"; }
    if [ $ok -eq 1 ] && [ "$w" = full ]; then
      compare_run "$kind/$name" "$f" "$f.duckdb.jsonl" || ok=0
    elif [ $ok -eq 1 ]; then
      local off lim nw=0
      while read -r off lim; do
        nw=$((nw + 1))
        if ! compare_run "$kind/$name [$off+$lim]" "$f" "$f.w$off-$lim.duckdb.jsonl" --offset "$off" --limit "$lim"; then
          ok=0 why="window offset $off limit $lim: $why"
          break
        fi
      done <<<"$w"
      extra=" ($nw windows)"
    fi
    ;;
  *)
    ok=0 why="unknown check kind $kind"
    ;;
  esac
  if [ $ok -eq 1 ]; then
    echo ok >"$TASKDIR/result"
    local line="ok   $kind/$name$extra"
    if [ -s "$TASKDIR/remarks" ]; then line+=$'\n'$(sed 's/^/       /' "$TASKDIR/remarks"); fi
    printf '%s\n' "$line"
  else
    echo FAIL >"$TASKDIR/result"
    printf 'FAIL %s/%s: %s\n' "$kind" "$name" "$why" >"$TASKDIR/summary"
    {
      printf 'FAIL %s/%s%s: %s\n' "$kind" "$name" "$extra" "$why"
      if [ -f "$TASKDIR/compare.out" ]; then sed -n '1,14p' "$TASKDIR/compare.out" | grep -v '^compare ' | sed 's/^/     /'; fi
    }
  fi
}

if [ "${1:-}" = __task ]; then
  shift
  task "$@"
  exit 0
fi

# ---------------------------------------------------------------------------
# Driver

if [ $# -ne 2 ]; then
  echo "usage: $0 LARDERCTL WORKDIR" >&2
  exit 2
fi
case $1 in
*/*) LARDERCTL=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") ;;
*) LARDERCTL=$(command -v "$1") ;;
esac
if [ ! -x "$LARDERCTL" ]; then
  echo "compat: $1 is not an executable" >&2
  exit 2
fi
mkdir -p "$2" || exit 2
WORKDIR=$(cd "$2" && pwd)
GEN=$WORKDIR/gen
FILTER=${LARDER_COMPAT_FILTER:-}
JOBS=${LARDER_COMPAT_JOBS:-2}
CORRUPT_TIMEOUT=${LARDER_COMPAT_TIMEOUT:-20}
CAT_TIMEOUT=${LARDER_COMPAT_CAT_TIMEOUT:-600}
FLIPS=${LARDER_COMPAT_FLIPS:-200}
# A sanitizer's own exit status must not pass for a clean decode error.
export ASAN_OPTIONS="exitcode=86:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:${UBSAN_OPTIONS:-}"
export LARDERCTL WORKDIR GEN DATA EXPECTED TOOLS CORRUPT_TIMEOUT CAT_TIMEOUT FLIPS

if ! command -v node >/dev/null 2>&1 || [ ! -d "$HERE/node_modules/@duckdb/node-api" ]; then
  echo "compat: needs node and tests/node_modules (run scripts/deps.sh)" >&2
  exit 2
fi

start=$(date +%s)
rm -rf "$WORKDIR/tasks"
mkdir -p "$WORKDIR/tasks"
tasks=$WORKDIR/tasks.txt
: >"$tasks"
add() { case "$1/$2" in *"$FILTER"*) printf '%s %s\n' "$1" "$2" >>"$tasks" ;; esac; }

for f in "$DATA"/data/*.parquet; do
  b=$(basename "$f")
  case " ${CRC_FILES[*]} " in *" $b "*) continue ;; esac
  [ -f "$f.duckdb.jsonl" ] && add conformance "$b"
done
for b in "${EXPECTED_FILES[@]}"; do add expected "$b"; done
for f in "$DATA"/data/*.parquet.duckdb.error; do
  b=$(basename "$f" .duckdb.error)
  case " ${EXPECTED_FILES[*]} " in *" $b "*) ;; *) echo "compat: no expected values for data/$b (DuckDB: $(head -c 120 "$f")): not checked" ;; esac
done
for b in "${CRC_FILES[@]}"; do add crc "$b"; done
for f in "$DATA"/bad_data/*.parquet; do add bad "$(basename "$f")"; done
for b in "${CORRUPT_SOURCES[@]}"; do add corrupt "$b"; done

# Generated files: made once per generator version.
gen_failed=0
stamp=$(cat "$HERE/gen/gen-files.mjs" "$TOOLS/duckdb-dump.mjs" "$HERE/package-lock.json" | sha256sum | cut -d' ' -f1)
if [ -f "$GEN/manifest.json" ] && [ "$(cat "$GEN/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "compat: reusing the generated files in $GEN"
else
  echo "compat: generating files into $GEN"
  rm -rf "$GEN"
  if node "$HERE/gen/gen-files.mjs" "$GEN" >"$WORKDIR/gen.log" 2>&1; then
    echo "$stamp" >"$GEN/.stamp"
    tail -n 1 "$WORKDIR/gen.log"
  else
    gen_failed=1
  fi
fi
if [ $gen_failed -eq 0 ]; then
  while read -r b; do add gen "$b"; done < <(node -e '
    const m = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    for (const f of m.files) console.log(f.file);' "$GEN/manifest.json")
fi

echo "compat: $(wc -l <"$tasks") checks, $JOBS at a time, larderctl $LARDERCTL"
xargs -P "$JOBS" -L 1 "$HERE/compat.sh" __task <"$tasks"

passed=0
failed=0
while read -r kind name; do
  r=$(cat "$WORKDIR/tasks/$kind/$name/result" 2>/dev/null)
  if [ "$r" = ok ]; then passed=$((passed + 1)); else
    failed=$((failed + 1))
    [ -n "$r" ] || echo "FAIL $kind/$name: the check did not finish"
  fi
done <"$tasks"
if [ $gen_failed -ne 0 ]; then
  failed=$((failed + 1))
  echo "FAIL gen: gen-files.mjs failed:"
  tail -n 20 "$WORKDIR/gen.log" | sed 's/^/     /'
fi
if [ $failed -ne 0 ]; then
  echo "compat: failures (logs under $WORKDIR/tasks/KIND/NAME/):"
  cat "$WORKDIR"/tasks/*/*/summary 2>/dev/null | sed 's/^/  /'
fi
echo "compat: $(($(date +%s) - start))s"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
