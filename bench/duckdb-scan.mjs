#!/usr/bin/env node
// duckdb-scan.mjs [--runs N] [--method M] FILE...: the DuckDB side of
// `make bench-decode`.  For each Parquet file, times DuckDB decoding every
// column on one thread (SET threads=1) and prints one JSON object per line:
//
//   {"engine":"duckdb","file":...,"rows":...,"decoded_bytes":...,
//    "median_s":...,"mb_per_s":...,"rows_per_s":...,...}
//
// MB/s is decoded_bytes / 1e6 / median_s, where decoded_bytes is the sum of
// total_uncompressed_size over every column chunk of the file (from
// parquet_metadata(), read once outside the timed runs): exactly the
// numerator bench-decode.c takes from pq_file_meta, so the two sides' MB/s
// differ only by their times.  rows/s is the file's row count / median_s.
// Each file gets one untimed warm-up run (page cache warm, code paths hot),
// then N timed runs (default 11, or $BENCH_RUNS); the median is reported.
// A fresh query each run: DuckDB re-reads the footer and every page, as
// bench-decode.c re-opens the file each run.
//
// Which query (--method, default "scan")
// -------------------------------------
// The query must make DuckDB decode every value of every column, including
// the blob and the list's elements, and do little else.  DuckDB skips work
// in ways that rule out the obvious candidates (measured on the
// uncompressed V1 file, where a real scan takes ~120-150 ms):
//   - projection pushdown: SELECT count(*) FROM (SELECT * ...) reads no
//     column, and count(*) comes from the footer's row count (1 ms);
//   - statistics: max(id), min(f0) are answered from the column chunks'
//     min/max statistics (0.6 ms), and count(id), count(image) from their
//     null counts (1 ms), without reading a page; so min/max/count
//     aggregates silently drop the columns they name;
//   - filter pushdown / late materialization: a WHERE clause is evaluated in
//     the scan on the filter columns first, and the other columns are only
//     decoded for rows that pass;
// and the ones that do make DuckDB decode everything add work beside it
// (medians of 15 interleaved runs in one process per file, all six files):
//   - "stream": SELECT * streamed to the client, fetchChunk() and drop (no
//     conversion to JS values).  Every chunk goes through the streaming
//     result buffer and crosses the libuv thread pool (~420 round trips):
//     1.9-3.2x the scan's time;
//   - "materialize": SELECT * into a materialized result: a copy of the
//     whole file's decoded data (~460 MB of RSS) into a ColumnDataCollection,
//     1.5-2.4x the scan's time and bimodal from page-faulting that memory;
//   - "sum": one sum() per column (sum(strlen(path)),
//     sum(octet_length(image)), sum(len(embedding)) for the variable-width
//     ones): statistics cannot answer it and it touches every fixed-width
//     value, but it adds HUGEINT/DOUBLE accumulation and reaches no blob byte
//     or list element the scan does not already decode: 1.02-1.3x the scan.
// "scan", the choice: EXPLAIN ANALYZE SELECT * FROM read_parquet(f).  It
// executes the real plan: a TABLE_SCAN whose projection lists all 15
// columns, producing every row into DuckDB vectors (profile: "860,160
// rows"), into the EXPLAIN_ANALYZE sink, which drops each chunk.  So
// DuckDB does exactly its decode work (pages read, decompressed, decoded into
// vectors, list offsets and child vectors built, strings validated) and
// nothing else; the only addition is the profiler's per-operator timer,
// which is per chunk and negligible.  This is DuckDB's own materialization:
// a VARCHAR/BLOB value is a string_t that may point into the decompressed
// page buffer rather than a copy, and a dictionary-encoded column may come
// out as a dictionary vector; that is how DuckDB decodes, and is what larder
// is compared against.
//
// Settings: threads=1; enable_external_file_cache=false and
// parquet_metadata_cache=false so that, like bench-decode.c, every run reads
// the footer and the pages from the file (page cache) again rather than from
// DuckDB's own caches.
//
// Memory: peak_rss_delta_bytes is the process's peak RSS during the warm-up
// run (VmHWM, reset through /proc/self/clear_refs) less its RSS before it;
// null where /proc does not allow it.
import { readFileSync, statSync, writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { DuckDBInstance } from '@duckdb/node-api';

const METHODS = {
  scan: (f) => `EXPLAIN ANALYZE SELECT * FROM read_parquet(${f})`,
  stream: (f) => `SELECT * FROM read_parquet(${f})`,
  materialize: (f) => `SELECT * FROM read_parquet(${f})`,
  sum: null, // built from the file's columns, below
};

function usage(msg) {
  if (msg) console.error(`duckdb-scan: ${msg}`);
  console.error(`usage: duckdb-scan.mjs [--runs N] [--method ${Object.keys(METHODS).join('|')}] FILE...`);
  process.exit(2);
}

let runs = Number(process.env.BENCH_RUNS ?? 11);
let method = 'scan';
const files = [];
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  if (a === '--runs') runs = Number(argv[++i]);
  else if (a === '--method') method = argv[++i];
  else if (a.startsWith('--')) usage(`unknown option ${a}`);
  else files.push(a);
}
if (!files.length) usage();
if (!Number.isInteger(runs) || runs < 1) usage('--runs must be a positive integer');
if (!(method in METHODS)) usage(`unknown method ${method}`);

const sqlString = (s) => `'${s.replaceAll("'", "''")}'`;
const quoteIdent = (s) => `"${s.replaceAll('"', '""')}"`;

function procStatusBytes(field) {
  try {
    const m = readFileSync('/proc/self/status', 'utf8').match(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm'));
    return m ? Number(m[1]) * 1024 : null;
  } catch {
    return null;
  }
}
function resetPeakRss() {
  try {
    writeFileSync('/proc/self/clear_refs', '5');
    return true;
  } catch {
    return false;
  }
}

const instance = await DuckDBInstance.create(':memory:', { threads: '1' });
const con = await instance.connect();
await con.run('SET threads = 1');
await con.run('SET enable_external_file_cache = false');
await con.run('SET parquet_metadata_cache = false');
const rowsOf = async (sql) => (await con.runAndReadAll(sql)).getRowObjectsJson();
const duckdbVersion = (await rowsOf('SELECT version() AS v'))[0].v;

// One execution of the query; returns the row count it saw where it can.
async function runOnce(sql) {
  if (method === 'stream') {
    const result = await con.stream(sql);
    let n = 0;
    for (;;) {
      const chunk = await result.fetchChunk();
      if (!chunk || chunk.rowCount === 0) break;
      n += chunk.rowCount; // the values are never read or converted
    }
    return n;
  }
  const result = await con.run(sql);
  return method === 'materialize' ? result.rowCount : null;
}

for (const file of files) {
  const path = resolve(file);
  const f = sqlString(path);
  const [meta] = await rowsOf(
    `SELECT sum(total_uncompressed_size)::BIGINT AS decoded_bytes,
            count(DISTINCT row_group_id)::BIGINT AS row_groups
     FROM parquet_metadata(${f})`,
  );
  const [fm] = await rowsOf(`SELECT num_rows::BIGINT AS num_rows FROM parquet_file_metadata(${f})`);
  const rows = Number(fm.num_rows);
  const decodedBytes = Number(meta.decoded_bytes);

  let sql;
  if (method === 'sum') {
    const cols = await rowsOf(`DESCRIBE SELECT * FROM read_parquet(${f})`);
    const exprs = cols.map(({ column_name: name, column_type: type }) => {
      const c = quoteIdent(name);
      if (type === 'VARCHAR') return `sum(strlen(${c}))`;
      if (type === 'BLOB') return `sum(octet_length(${c}))`;
      if (type.endsWith('[]')) return `sum(len(${c}))`;
      return `sum(${c})`;
    });
    sql = `SELECT ${exprs.join(', ')} FROM read_parquet(${f})`;
  } else {
    sql = METHODS[method](f);
  }

  // Warm-up, also the memory measurement.
  const canReset = resetPeakRss();
  const rssBefore = procStatusBytes('VmRSS');
  const seen = await runOnce(sql);
  const hwm = procStatusBytes('VmHWM');
  if (seen !== null && seen !== rows) throw new Error(`${file}: query returned ${seen} rows, metadata says ${rows}`);

  const times = [];
  for (let i = 0; i < runs; i++) {
    const t0 = process.hrtime.bigint();
    await runOnce(sql);
    times.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  const sorted = [...times].sort((a, b) => a - b);
  const median =
    sorted.length % 2 ? sorted[sorted.length >> 1] : (sorted[sorted.length / 2 - 1] + sorted[sorted.length / 2]) / 2;
  console.log(
    JSON.stringify({
      engine: 'duckdb',
      duckdb_version: duckdbVersion,
      method,
      query: sql,
      threads: 1,
      file,
      file_bytes: statSync(path).size,
      rows,
      row_groups: Number(meta.row_groups),
      decoded_bytes: decodedBytes,
      runs,
      times_s: times.map((t) => Number(t.toFixed(6))),
      median_s: Number(median.toFixed(6)),
      min_s: Number(sorted[0].toFixed(6)),
      mb_per_s: Number((decodedBytes / 1e6 / median).toFixed(1)),
      rows_per_s: Math.round(rows / median),
      peak_rss_delta_bytes: canReset && rssBefore !== null && hwm !== null ? hwm - rssBefore : null,
    }),
  );
}
