#!/usr/bin/env bash
# bench-decode.sh BENCH_DECODE_BINARY: what `make bench-decode` runs.
#
# 1. Installs the DuckDB npm package pinned by bench/package-lock.json (once;
#    a stamp records the lock file's hash).
# 2. Generates the dataset into bench/work/ (gen-dataset.mjs; skipped when
#    its stamp matches): ~860K rows, uncompressed/snappy/zstd x pages v1/v2.
# 3. For each file, runs larder's decoder (the bench-decode binary) and then
#    DuckDB (duckdb-scan.mjs), both on one thread and pinned to the same CPU,
#    one process per file and side, so that neither side's retained heap
#    hides the next file's memory peak.  Interleaving the two sides file by
#    file keeps a drift in the machine's speed from favouring either.
# 4. Prints a table: file, size, larder MB/s and rows/s, DuckDB MB/s and
#    rows/s, the ratio larder/DuckDB (DuckDB median time / larder median time,
#    i.e. larder throughput / DuckDB throughput), and memory; then a
#    summary line.  The raw JSON lines are kept in bench/work/*.jsonl.
#
# MB/s = (sum of the file's column chunks' total_uncompressed_size) / 1e6 /
# median seconds, the same numerator on both sides.
#
# Environment:
#   BENCH_RUNS=N     timed runs per file and side (default 11; plus a warm-up)
#   BENCH_CPU=N      the CPU both sides are pinned to (default: the last CPU
#                    this script may use; "none" to not pin)
#   BENCH_FILES=...  space-separated subset of the file names to run
#   BENCH_STRICT=1   exit 1 when a ratio is below 1.0 (the issue's goal)
#   LARDER_BENCH_ROWS=N  rows in the generated dataset (see gen-dataset.mjs)
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 PATH/TO/bench-decode" >&2
  exit 2
fi
bin=$(realpath "$1")
if [ ! -x "$bin" ]; then
  echo "bench-decode: $1 is not an executable" >&2
  exit 2
fi
cd "$(dirname "$0")"
bench_dir=$(pwd)
work="$bench_dir/work"
mkdir -p "$work"

# 1. npm dependencies.
stamp=node_modules/.larder-lock-hash
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bench-decode: installing DuckDB for node (npm ci)"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" >"$stamp"
fi

# 2. Dataset.
node gen-dataset.mjs "$work"

names=(uncompressed-v1 snappy-v1 zstd-v1 uncompressed-v2 snappy-v2 zstd-v2)
if [ -n "${BENCH_FILES:-}" ]; then
  read -r -a names <<<"${BENCH_FILES//.parquet/}"
fi

# 3. Pinning.  One CPU for both sides; taskset pins every thread of the
# process (DuckDB with threads=1 executes on one libuv worker while node's
# main thread waits on it).
pin=()
cpu=${BENCH_CPU:-}
if [ "$cpu" != none ] && command -v taskset >/dev/null 2>&1; then
  if [ -z "$cpu" ]; then
    # The last CPU in our affinity list, away from CPU 0's interrupts.
    cpu=$(taskset -pc $$ | sed 's/.*: //' | tr ',' '\n' | tail -n1 | sed 's/.*-//')
  fi
  pin=(taskset -c "$cpu")
  echo "bench-decode: both sides pinned to CPU $cpu, $(nproc) CPUs available"
else
  echo "bench-decode: not pinned"
fi

# Other processes on the machine make both sides slower and noisier; say so.
load_warning() {
  local load
  load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
  if awk -v l="$load" 'BEGIN { exit !(l >= 0.5) }'; then
    echo "bench-decode: warning: load average $load $1 on $(nproc) CPUs: other processes compete with the benchmark, figures may be noisy" >&2
  fi
}
load_warning "before the runs"

larder_out="$work/larder.jsonl"
duckdb_out="$work/duckdb.jsonl"
: >"$larder_out"
: >"$duckdb_out"
status=0
for name in "${names[@]}"; do
  f="$work/$name.parquet"
  if [ ! -f "$f" ]; then
    echo "bench-decode: no $f" >&2
    exit 1
  fi
  echo "bench-decode: $name.parquet: larder ..." >&2
  if ! "${pin[@]}" "$bin" "$f" >>"$larder_out"; then
    echo "bench-decode: larder failed on $f" >&2
    status=1
  fi
  echo "bench-decode: $name.parquet: duckdb ..." >&2
  if ! "${pin[@]}" node duckdb-scan.mjs "$f" >>"$duckdb_out"; then
    echo "bench-decode: duckdb failed on $f" >&2
    status=1
  fi
done

load_warning "after the runs"

# 4. Table and summary.
BENCH_STRICT=${BENCH_STRICT:-0} node --input-type=module - "$larder_out" "$duckdb_out" <<'EOF' || status=$?
import { readFileSync } from 'node:fs';
import { basename } from 'node:path';
const [larderPath, duckdbPath] = process.argv.slice(-2);
const load = (p) => {
  const m = new Map();
  for (const line of readFileSync(p, 'utf8').split('\n')) {
    if (!line.trim()) continue;
    const o = JSON.parse(line);
    m.set(basename(o.file), o);
  }
  return m;
};
const larder = load(larderPath), duckdb = load(duckdbPath);
const names = [...new Set([...larder.keys(), ...duckdb.keys()])];
const MB = (b) => (b == null ? '-' : (b / 1e6).toFixed(1));
const rate = (o, k) => (o ? (k === 'rows_per_s' ? (o[k] / 1e6).toFixed(2) + 'M' : o[k].toFixed(0)) : '-');
const head = ['file', 'size MB', 'decoded MB', 'larder MB/s', 'rows/s', 'duckdb MB/s', 'rows/s', 'ratio',
  'peak RSS', 'heap', 'batch', 'RG', 'heap/RG', 'RSS/RG', 'duckdb RSS'];
const rows = [];
const ratios = [];
let worst = null;
let heapWorst = null;
let rssWorst = null;
const times = (x, base) => (x == null || !base ? null : x / base);
const fmtX = (x) => (x == null ? '-' : x.toFixed(2) + 'x');
for (const n of names) {
  const l = larder.get(n), d = duckdb.get(n);
  if (l && d && (l.decoded_bytes !== d.decoded_bytes || l.rows !== d.rows)) {
    console.error(`bench-decode: ${n}: the two sides disagree: larder ${l.rows} rows, ${l.decoded_bytes} bytes; ` +
      `DuckDB ${d.rows} rows, ${d.decoded_bytes} bytes`);
  }
  const ratio = l && d ? d.median_s / l.median_s : null;
  if (ratio != null) {
    ratios.push(ratio);
    if (!worst || ratio < worst.ratio) worst = { n, ratio };
  }
  const heapRg = times(l?.peak_anon_delta_bytes, l?.max_rg_decoded_bytes);
  const rssRg = times(l?.peak_rss_delta_bytes, l?.max_rg_decoded_bytes);
  if (heapRg != null && (!heapWorst || heapRg > heapWorst.x)) heapWorst = { n, x: heapRg };
  if (rssRg != null && (!rssWorst || rssRg > rssWorst.x)) rssWorst = { n, x: rssRg };
  const o = l ?? d;
  rows.push([n, MB(o.file_bytes), MB(o.decoded_bytes), rate(l, 'mb_per_s'), rate(l, 'rows_per_s'),
    rate(d, 'mb_per_s'), rate(d, 'rows_per_s'), ratio == null ? '-' : ratio.toFixed(2),
    MB(l?.peak_rss_delta_bytes), MB(l?.peak_anon_delta_bytes), MB(l?.max_batch_bytes), MB(l?.max_rg_decoded_bytes),
    fmtX(heapRg), fmtX(rssRg), MB(d?.peak_rss_delta_bytes)]);
}
const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
const fmt = (r) => r.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ');
console.log('');
console.log(fmt(head));
console.log(widths.map((w) => '-'.repeat(w)).join('  '));
for (const r of rows) console.log(fmt(r));
console.log('');
console.log('MB = 1e6 bytes.  MB/s: the sum of the column chunks\' total_uncompressed_size / the median of ' +
  `${(larder.values().next().value ?? duckdb.values().next().value)?.runs ?? '?'} runs.  ratio: DuckDB time / larder time.`);
console.log('Memory (MB), larder: peak RSS = peak resident memory over the RSS before decoding, mapped file pages ' +
  'included; heap = the same for anonymous memory only (sampled); batch = the largest pq_batch_bytes; RG = the ' +
  'largest row group\'s decoded bytes.  duckdb RSS = DuckDB\'s peak RSS over its RSS before the query.');
const expected = names.length;
const met = ratios.filter((r) => r >= 1.0).length;
const geo = ratios.length ? Math.exp(ratios.reduce((a, r) => a + Math.log(r), 0) / ratios.length) : null;
let summary = `bench-decode: larder/DuckDB ratio ` +
  (ratios.length
    ? `min ${worst.ratio.toFixed(2)} (${worst.n}), geomean ${geo.toFixed(2)}; ratio >= 1.0 on ${met}/${expected} files`
    : `unavailable (no file measured on both sides)`);
if (heapWorst) {
  summary += `; larder memory at most ${heapWorst.x.toFixed(2)}x one row group's decoded size (heap, ${heapWorst.n})`;
  if (rssWorst) summary += `, ${rssWorst.x.toFixed(2)}x with mapped file pages (RSS, ${rssWorst.n})`;
}
console.log(summary);
if (process.env.BENCH_STRICT === '1' && (ratios.length !== expected || met !== expected)) process.exit(1);
EOF
exit $status
