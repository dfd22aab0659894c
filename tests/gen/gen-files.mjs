#!/usr/bin/env node
// gen-files.mjs: writes Parquet files with independent writers (DuckDB, and
// arrow-rs through parquet-wasm), each with the values DuckDB reads back, for
// tests/compat.sh to compare larder's reader against.
//
// Usage: node tests/gen/gen-files.mjs OUTDIR
//
// Writes OUTDIR/<file>.parquet, OUTDIR/<file>.parquet.duckdb.jsonl (or, for
// files compared by windows, OUTDIR/<file>.parquet.w<offset>-<limit>.duckdb.jsonl
// per window) and OUTDIR/manifest.json:
//   {"generator": "...", "files": [{file, writer, rows, description,
//     compare: "full"|"windows", windows?: [[offset, limit], ...]}]}
// Every file's encodings, codecs and data page kinds are read back from the
// written file (DuckDB's parquet_metadata() and the page headers) and named
// in its description; a file that lacks what it was written to cover fails
// the generation.  Content is deterministic (fixed seeds, one DuckDB thread).
//
// What the writers can and cannot give (DuckDB 1.5.6, parquet-wasm 0.8.0):
// - DuckDB writes data page v1 headers for PARQUET_VERSION V1 and V2 alike;
//   V2 only switches the value encodings (DELTA_BINARY_PACKED,
//   DELTA_LENGTH_BYTE_ARRAY, BYTE_STREAM_SPLIT), never DELTA_BYTE_ARRAY.
//   Data page v2 and DELTA_BYTE_ARRAY come from the arrow-rs files.
// - DuckDB writes HUGEINT/UHUGEINT as DOUBLE and TIMESTAMP_S as micros, so
//   those add nothing and are left out; TIMETZ becomes TIME(UTC).
// - DuckDB cannot read the legacy LZ4 codec, BYTE_STREAM_SPLIT on anything
//   but FLOAT/DOUBLE, nor decimals wider than 16 bytes: for those files the
//   expected values come from a plainly written twin or from the generator.

import fs from 'node:fs';
import path from 'node:path';
import * as A from 'apache-arrow';
import * as PW from 'parquet-wasm';
import { openDuckDB, dumpParquet, sqlString } from '../tools/duckdb-dump.mjs';

const OUT = process.argv[2];
if (!OUT || process.argv.length !== 3) {
  process.stderr.write('usage: gen-files.mjs OUTDIR\n');
  process.exit(2);
}
fs.mkdirSync(OUT, { recursive: true });

const t0 = Date.now();
const log = (msg) => process.stderr.write(`gen: [${((Date.now() - t0) / 1000).toFixed(1)}s] ${msg}\n`);

const { conn } = await openDuckDB();
const q = async (sql) => (await conn.runAndReadAll(sql)).getRowObjectsJS();
const manifest = [];

// ---------------------------------------------------------------------------
// What a written file holds

// Reads the first page header at each column chunk's data_page_offset (a
// Thrift compact struct whose field 1 is the PageType) to tell v1 data pages
// from v2 ones.
function pageKind(fd, offset) {
  const b = Buffer.alloc(8);
  fs.readSync(fd, b, 0, 8, offset);
  if (b[0] !== 0x15) return 'unknown';
  let v = 0;
  let shift = 0;
  for (let i = 1; i < 6; i++) {
    v |= (b[i] & 0x7f) << shift;
    shift += 7;
    if (!(b[i] & 0x80)) break;
  }
  const t = (v >>> 1) ^ -(v & 1);
  return { 0: 'DATA_PAGE', 2: 'DICTIONARY_PAGE', 3: 'DATA_PAGE_V2' }[t] ?? `page type ${t}`;
}

async function describeFile(file) {
  const rows = await q(
    `SELECT row_group_id, row_group_num_rows, path_in_schema, encodings, compression, data_page_offset FROM parquet_metadata(${sqlString(file)}) ORDER BY row_group_id, column_id`,
  );
  const enc = new Set();
  const codecs = new Set();
  const pages = new Set();
  const rg = new Map();
  const byColumn = new Map();
  const fd = fs.openSync(file, 'r');
  for (const r of rows) {
    const encs = String(r.encodings).split(/,\s*/).filter((e) => e !== '');
    for (const e of encs) enc.add(e);
    codecs.add(r.compression);
    pages.add(pageKind(fd, Number(r.data_page_offset)));
    rg.set(Number(r.row_group_id), Number(r.row_group_num_rows));
    const col = String(r.path_in_schema).split(/,\s*/)[0];
    if (!byColumn.has(col)) byColumn.set(col, new Set());
    for (const e of encs) byColumn.get(col).add(e);
  }
  fs.closeSync(fd);
  const rowGroups = [...rg.entries()].sort((a, b) => a[0] - b[0]).map((e) => e[1]);
  return { enc, codecs, pages, rowGroups, byColumn };
}

function summary(info) {
  const rg = info.rowGroups;
  const rgText = rg.length <= 4 ? rg.join('+') : `${rg.length} (${rg.slice(0, 2).join(', ')}, ..., ${rg[rg.length - 1]})`;
  return `row groups: ${rgText}; codecs: ${[...info.codecs].join(', ')}; encodings: ${[...info.enc].sort().join(', ')}; data pages: ${[...info.pages].sort().join(', ')}`;
}

function require_(info, name, { encodings = [], pages = [], codec, columnEncodings = {} }) {
  const miss = [];
  for (const e of encodings) if (!info.enc.has(e)) miss.push(`encoding ${e}`);
  for (const p of pages) if (!info.pages.has(p)) miss.push(`page kind ${p}`);
  if (codec && !info.codecs.has(codec)) miss.push(`codec ${codec}`);
  for (const [col, e] of Object.entries(columnEncodings))
    if (!(info.byColumn.get(col) || new Set()).has(e)) miss.push(`encoding ${e} in column ${col}`);
  if (miss.length) throw new Error(`${name}: the written file lacks ${miss.join(', ')} (${summary(info)})`);
}

async function expectFull(file) {
  await dumpParquet(conn, path.join(OUT, file), path.join(OUT, `${file}.duckdb.jsonl`));
}

async function expectWindows(file, windows) {
  for (const [off, lim] of windows)
    await dumpParquet(conn, path.join(OUT, file), path.join(OUT, `${file}.w${off}-${lim}.duckdb.jsonl`), { offset: off, limit: lim });
}

// ---------------------------------------------------------------------------
// DuckDB writer

// Every scalar type DuckDB writes to Parquet, nulls in every column, edge
// values in the first rows, and nested lists, structs and maps.
const DUCK_ALLTYPES = `
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy', 'ünïcode');
CREATE TABLE alltypes AS
SELECT
  i::BIGINT AS id,
  CASE WHEN i % 7 = 1 THEN NULL WHEN i = 0 THEN -128 WHEN i = 2 THEN 127 ELSE (i * 37) % 256 - 128 END::TINYINT AS c_tinyint,
  CASE WHEN i % 7 = 2 THEN NULL WHEN i = 0 THEN -32768 WHEN i = 3 THEN 32767 ELSE (i * 7919) % 65536 - 32768 END::SMALLINT AS c_smallint,
  CASE WHEN i % 7 = 3 THEN NULL WHEN i = 0 THEN -2147483648 WHEN i = 4 THEN 2147483647 ELSE (i * 2654435761) % 4294967296 - 2147483648 END::INTEGER AS c_integer,
  CASE WHEN i % 7 = 4 THEN NULL WHEN i = 0 THEN -9223372036854775808 WHEN i = 5 THEN 9223372036854775807
       ELSE (i::HUGEINT * 11400714819323198485 % 18446744073709551616 - 9223372036854775808) END::BIGINT AS c_bigint,
  CASE WHEN i % 7 = 5 THEN NULL WHEN i = 0 THEN 255 ELSE (i * 31) % 256 END::UTINYINT AS c_utinyint,
  CASE WHEN i % 7 = 6 THEN NULL WHEN i = 0 THEN 65535 ELSE (i * 7907) % 65536 END::USMALLINT AS c_usmallint,
  CASE WHEN i % 7 = 0 AND i > 0 THEN NULL WHEN i = 0 THEN 4294967295 ELSE (i * 2246822519) % 4294967296 END::UINTEGER AS c_uinteger,
  CASE WHEN i % 5 = 1 THEN NULL WHEN i = 0 THEN 18446744073709551615 ELSE (i::HUGEINT * 14029467366897019727 % 18446744073709551616) END::UBIGINT AS c_ubigint,
  CASE WHEN i % 9 = 1 THEN NULL WHEN i = 3 THEN 'nan'::FLOAT WHEN i = 4 THEN 'inf'::FLOAT WHEN i = 5 THEN '-inf'::FLOAT
       WHEN i = 6 THEN -0.0::FLOAT WHEN i = 7 THEN 3.4028235e38::FLOAT WHEN i = 8 THEN 1.4e-45::FLOAT
       ELSE ((i * 7919) % 100003) / 7.0 - 7000 END::FLOAT AS c_float,
  CASE WHEN i % 9 = 2 THEN NULL WHEN i = 3 THEN 'nan'::DOUBLE WHEN i = 4 THEN '-inf'::DOUBLE WHEN i = 5 THEN 'inf'::DOUBLE
       WHEN i = 6 THEN -0.0::DOUBLE WHEN i = 7 THEN 1.7976931348623157e308 WHEN i = 8 THEN 5e-324
       ELSE ((i * 104729) % 1000003) / 3.0 - 100000.1 END::DOUBLE AS c_double,
  CASE WHEN i % 6 = 1 THEN NULL ELSE (((i * 37) % 19999 - 9999) / 100)::DECIMAL(4,2) END AS c_dec4_2,
  CASE WHEN i % 6 = 2 THEN NULL WHEN i = 0 THEN '-999999999999.999999'::DECIMAL(18,6)
       ELSE ((CASE WHEN i % 2 = 0 THEN '-' ELSE '' END) || ((i * 2654435761) % 999999999999)::VARCHAR || '.' || lpad(((i * 40503) % 1000000)::VARCHAR, 6, '0'))::DECIMAL(18,6) END AS c_dec18_6,
  CASE WHEN i % 6 = 3 THEN NULL WHEN i = 0 THEN '9999999999999999999999999999.9999999999'::DECIMAL(38,10)
       ELSE ((CASE WHEN i % 2 = 1 THEN '-' ELSE '' END) || ((i::HUGEINT * 12345678901234567890123) % 9999999999999999999999999999)::VARCHAR || '.'
             || lpad(((i * 2654435761) % 10000000000)::VARCHAR, 10, '0'))::DECIMAL(38,10) END AS c_dec38_10,
  CASE WHEN i % 8 = 1 THEN NULL WHEN i = 0 THEN DATE '0001-01-01' WHEN i = 2 THEN DATE '9999-12-31'
       ELSE DATE '1970-01-01' + ((i * 9973) % 200000 - 100000)::INTEGER END AS c_date,
  CASE WHEN i % 8 = 2 THEN NULL WHEN i = 0 THEN TIME '23:59:59.999999' ELSE TIME '00:00:00' + to_microseconds((i * 7777777777) % 86400000000) END AS c_time,
  CASE WHEN i % 8 = 3 THEN NULL ELSE TIMETZ '00:00:00+00' + to_microseconds((i * 7777777) % 86400000000) END AS c_timetz,
  CASE WHEN i % 8 = 4 THEN NULL WHEN i = 0 THEN TIMESTAMP '0001-01-01 00:00:00' WHEN i = 2 THEN TIMESTAMP '9999-12-31 23:59:59.999999'
       ELSE make_timestamp(((i * 2654435761787) % 8000000000000000) - 4000000000000000) END AS c_timestamp,
  CASE WHEN i % 8 = 5 THEN NULL ELSE make_timestamp(((i * 2654435761787) % 8000000000000000) - 4000000000000000)::TIMESTAMP_S END AS c_timestamp_s,
  CASE WHEN i % 8 = 6 THEN NULL ELSE make_timestamp(((i * 2654435761787) % 8000000000000000) - 4000000000000000)::TIMESTAMP_MS END AS c_timestamp_ms,
  CASE WHEN i % 8 = 7 THEN NULL ELSE make_timestamp_ns(((i::HUGEINT * 2654435761787123) % 8000000000000000000 - 4000000000000000000)::BIGINT) END AS c_timestamp_ns,
  CASE WHEN i % 8 = 0 AND i > 0 THEN NULL ELSE make_timestamp(((i * 2654435761787) % 4000000000000000) - 1000000000000000)::TIMESTAMPTZ END AS c_timestamptz,
  CASE WHEN i % 10 = 1 THEN NULL WHEN i % 10 = 2 THEN '' WHEN i = 0 THEN 'quote " backslash \\ slash / tab' || chr(9) || ' nl' || chr(10) || ' ctrl' || chr(1) || ' emoji 🦆 end'
       ELSE 'str-' || i::VARCHAR || '-' || repeat(['a', 'é', '日本', 'Ω'][i % 4 + 1], i % 13) END AS c_varchar,
  CASE WHEN i % 10 = 3 THEN NULL WHEN i % 10 = 4 THEN ''::BLOB WHEN i = 0 THEN '\\x00\\x5C\\x22\\x27\\x7F\\x80\\xFF AZ~'::BLOB
       ELSE unhex(left(md5(i::VARCHAR) || md5((i + 1)::VARCHAR), 2 * (i % 29))) END AS c_blob,
  CASE WHEN i % 10 = 5 THEN NULL ELSE md5('uuid' || i::VARCHAR)::UUID END AS c_uuid,
  CASE WHEN i % 10 = 6 THEN NULL ELSE (['sad', 'ok', 'happy', 'ünïcode'][i % 4 + 1])::mood END AS c_enum,
  CASE WHEN i % 10 = 7 THEN NULL WHEN i = 0 THEN '{"big":12345678901234567890,"dec":1.50,"s":"x\\"y","n":null,"l":[true,false,{}]}'::JSON
       ELSE json_object('i', i, 'half', i / 2, 's', 'v' || i::VARCHAR, 'l', [i % 3, i % 5]) END AS c_json,
  CASE WHEN i % 11 = 1 THEN NULL ELSE i % 3 = 0 END AS c_boolean,
  CASE WHEN i % 11 = 2 THEN NULL ELSE to_months(i % 40) + to_days(i % 45) + to_microseconds((i * 12345678) % 90000000000 // 1000 * 1000) END AS c_interval,
  CASE i % 6 WHEN 0 THEN NULL WHEN 1 THEN [] WHEN 2 THEN [NULL] ELSE [i, NULL, i + 1] || range(i % 9)::INTEGER[] END::INTEGER[] AS c_list_int,
  CASE i % 7 WHEN 0 THEN NULL WHEN 1 THEN [] WHEN 2 THEN [[]] WHEN 3 THEN [NULL, ['x']] WHEN 4 THEN [['a', NULL, ''], [], NULL]
       ELSE [['s' || i::VARCHAR], repeat(['y'], i % 4)] END::VARCHAR[][] AS c_list_list,
  CASE WHEN i % 5 = 0 THEN NULL ELSE [{'k': 'k' || i::VARCHAR, 'v': i / 4.0}, NULL, {'k': NULL, 'v': NULL}][1:(i % 4)] END AS c_list_struct,
  CASE WHEN i % 9 = 3 THEN NULL
       ELSE {'a': CASE WHEN i % 4 = 0 THEN NULL ELSE i * 3 END,
             'b': CASE WHEN i % 5 = 0 THEN NULL ELSE {'c': 'c' || i::VARCHAR, 'd': CASE WHEN i % 3 = 0 THEN NULL ELSE [i * 0.25, NULL] END} END,
             'e': [i % 2 = 0]} END AS c_struct,
  CASE i % 6 WHEN 0 THEN NULL WHEN 1 THEN MAP {}::MAP(VARCHAR, INTEGER)
       ELSE MAP {'k' || i::VARCHAR: i, 'nullval': NULL, 'z': -i} END AS c_map,
  CASE WHEN i % 4 = 0 THEN NULL ELSE MAP {i: ['a' || i::VARCHAR, NULL], i + 1: [], i + 2: NULL} END AS c_map_int_list,
  CASE WHEN i % 5 = 2 THEN NULL ELSE MAP {'m' || (i % 3)::VARCHAR: {'x': i, 'y': CASE WHEN i % 2 = 0 THEN NULL ELSE 'y' END}} END AS c_map_struct
FROM range(0, 5000) t(i);
`;

async function genDuckDB() {
  await conn.run(`SET threads = 1`);
  for (const stmt of DUCK_ALLTYPES.split(/;\s*\n/).filter((s) => s.trim())) await conn.run(stmt);
  const codecs = ['uncompressed', 'snappy', 'gzip', 'zstd', 'lz4_raw', 'brotli'];
  for (const version of ['V1', 'V2']) {
    for (const codec of codecs) {
      const file = `duckdb-alltypes-${codec}-${version.toLowerCase()}.parquet`;
      const full = path.join(OUT, file);
      await conn.run(
        `COPY (SELECT * FROM alltypes ORDER BY id) TO ${sqlString(full)} (FORMAT parquet, COMPRESSION ${codec}, ROW_GROUP_SIZE 1000, PARQUET_VERSION ${version})`,
      );
      const info = await describeFile(full);
      // DuckDB writes v1 data page headers for both versions; V2 switches the
      // value encodings (data page v2 headers come from the arrow-rs files).
      const need = { codec: codec.toUpperCase(), pages: ['DATA_PAGE'] };
      if (version === 'V2') need.encodings = ['DELTA_BINARY_PACKED', 'DELTA_LENGTH_BYTE_ARRAY', 'BYTE_STREAM_SPLIT', 'RLE_DICTIONARY'];
      else need.encodings = ['PLAIN', 'RLE_DICTIONARY'];
      require_(info, file, need);
      await expectFull(file);
      manifest.push({
        file,
        writer: 'duckdb',
        rows: 5000,
        description: `DuckDB PARQUET_VERSION ${version}, ${codec}: every scalar type DuckDB writes (int8..int64, uint8..uint64, float, double, decimal(4,2)/(18,6)/(38,10), date, time, timetz (as TIME UTC), timestamp s (stored as us)/ms/us/ns, timestamptz, varchar, blob, uuid, enum, json, boolean, interval) with nulls and edge values, lists (nested, empty, null, null elements), structs (nested, null), maps (null values, list and struct values); ${summary(info)}`,
        compare: 'full',
      });
      log(`${file}`);
    }
  }

  // 64k-row row groups, about 200k rows, compared whole
  {
    const file = 'duckdb-rowgroups-64k.parquet';
    const full = path.join(OUT, file);
    await conn.run(`COPY (
      SELECT i::BIGINT AS id,
        CASE WHEN i % 13 = 0 THEN NULL ELSE (i * 2654435761) % 1000000007 END::INTEGER AS v,
        (i * 0.001 - 7.5)::DOUBLE AS d,
        CASE WHEN i % 17 = 0 THEN NULL ELSE 'row-' || i::VARCHAR END AS s,
        DATE '2000-01-01' + (i % 10000)::INTEGER AS dt,
        make_timestamp(1600000000000000 + i * 1000003) AS ts,
        ((i * 7919) % 100000000 / 1000.0)::DECIMAL(18,6) AS dec,
        CASE WHEN i % 11 = 0 THEN NULL ELSE range(i % 5)::INTEGER[] END AS l,
        {'a': i % 100, 'b': CASE WHEN i % 3 = 0 THEN NULL ELSE 'b' || (i % 1000)::VARCHAR END} AS st
      FROM range(0, 200000) t(i)) TO ${sqlString(full)} (FORMAT parquet, COMPRESSION snappy, ROW_GROUP_SIZE 65536)`);
    const info = await describeFile(full);
    if (info.rowGroups.length < 3) throw new Error(`${file}: expected several row groups (${summary(info)})`);
    await expectFull(file);
    manifest.push({ file, writer: 'duckdb', rows: 200000, description: `DuckDB, ROW_GROUP_SIZE 65536 over 200000 rows; ${summary(info)}`, compare: 'full' });
    log(file);
  }

  // 1M-row row groups, 1.2M rows, compared by windows
  {
    const file = 'duckdb-rowgroups-1m.parquet';
    const full = path.join(OUT, file);
    const rows = 1200000;
    await conn.run(`COPY (
      SELECT i::BIGINT AS id,
        CASE WHEN i % 13 = 0 THEN NULL ELSE (i * 2654435761) % 1000000007 END::INTEGER AS v,
        ((i * 104729) % 1000003 / 7.0)::DOUBLE AS d,
        (md5_number(i::VARCHAR) % 9223372036854775807)::BIGINT AS r,
        CASE WHEN i % 17 = 0 THEN NULL ELSE 's' || (i % 5000)::VARCHAR END AS s,
        CASE WHEN i % 11 = 0 THEN NULL WHEN i % 11 = 1 THEN [] ELSE [i % 7, i % 5] END::INTEGER[] AS l
      FROM range(0, ${rows}) t(i)) TO ${sqlString(full)} (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 1048576, PARQUET_VERSION V2)`);
    const info = await describeFile(full);
    if (info.rowGroups.length < 2 || info.rowGroups[0] < 1000000) throw new Error(`${file}: expected a first row group of about 1M rows (${summary(info)})`);
    const windows = [[0, 1000], [65000, 2000], [131000, 1500], [524000, 600]];
    let b = 0;
    for (const n of info.rowGroups.slice(0, -1)) {
      b += n;
      windows.push([b - 700, 1400]); // across each row group boundary
    }
    windows.push([rows - 500, 1000]); // runs past the end
    await expectWindows(file, windows);
    manifest.push({
      file,
      writer: 'duckdb',
      rows,
      description: `DuckDB V2, ROW_GROUP_SIZE 1048576 over ${rows} rows; windows cross 64k-row boundaries, the row group boundary and the end; ${summary(info)}`,
      compare: 'windows',
      windows,
    });
    log(file);
  }

  // ~256 random bytes per row, like encoded images or tensors
  {
    const file = 'duckdb-blobs-256.parquet';
    const full = path.join(OUT, file);
    const rows = 20000;
    await conn.run(`COPY (
      SELECT i::BIGINT AS id,
        CASE WHEN i % 97 = 5 THEN NULL
             ELSE unhex(left(array_to_string(list_transform(range(17), k -> md5(i::VARCHAR || '/' || k::VARCHAR)), ''), 2 * (240 + i % 33))) END AS payload,
        (i % 10)::INTEGER AS label
      FROM range(0, ${rows}) t(i)) TO ${sqlString(full)} (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 8192)`);
    const info = await describeFile(full);
    await expectFull(file);
    manifest.push({ file, writer: 'duckdb', rows, description: `DuckDB, a BLOB column of 240..272 pseudo-random bytes per row; ${summary(info)}`, compare: 'full' });
    log(file);
  }
}

// ---------------------------------------------------------------------------
// arrow-rs writer (parquet-wasm), tables built with apache-arrow JS

function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function bitmap(valid) {
  const b = new Uint8Array((valid.length + 7) >> 3);
  let nulls = 0;
  for (let i = 0; i < valid.length; i++) {
    if (valid[i]) b[i >> 3] |= 1 << (i & 7);
    else nulls++;
  }
  return { b, nulls };
}

function prim(type, values, valid) {
  const { b, nulls } = bitmap(valid ?? new Array(values.length / (type.stride || 1)).fill(true));
  const length = valid ? valid.length : values.length / (type.stride || 1);
  return A.makeData({ type, length, nullCount: nulls, nullBitmap: nulls ? b : undefined, data: values });
}

const utf8enc = new TextEncoder();
function varbin(type, vals, large) {
  const valid = vals.map((v) => v !== null);
  const bufs = vals.map((v) => (v === null ? new Uint8Array(0) : typeof v === 'string' ? utf8enc.encode(v) : v));
  const off = large ? new BigInt64Array(vals.length + 1) : new Int32Array(vals.length + 1);
  let tot = 0;
  bufs.forEach((x, i) => {
    tot += x.length;
    off[i + 1] = large ? BigInt(tot) : tot;
  });
  const data = new Uint8Array(tot);
  let p = 0;
  for (const x of bufs) {
    data.set(x, p);
    p += x.length;
  }
  const { b, nulls } = bitmap(valid);
  return A.makeData({ type, length: vals.length, nullCount: nulls, nullBitmap: nulls ? b : undefined, valueOffsets: off, data });
}

// lists: an array of (array | null) over a child Data of the concatenated elements
function listData(type, lists, child, large) {
  const off = large ? new BigInt64Array(lists.length + 1) : new Int32Array(lists.length + 1);
  let n = 0;
  lists.forEach((l, i) => {
    n += l ? l.length : 0;
    off[i + 1] = large ? BigInt(n) : n;
  });
  const { b, nulls } = bitmap(lists.map((l) => l !== null));
  return A.makeData({ type, length: lists.length, nullCount: nulls, nullBitmap: nulls ? b : undefined, valueOffsets: off, child });
}

function structData(type, length, children, valid) {
  const { b, nulls } = bitmap(valid ?? new Array(length).fill(true));
  return A.makeData({ type, length, nullCount: nulls, nullBitmap: nulls ? b : undefined, children });
}

const field = (name, type, nullable = true) => new A.Field(name, type, nullable);

// The decimal128 (or 256) words of a BigInt, little-endian two's complement.
function decimalWords(values, words) {
  const out = new Uint32Array(values.length * words);
  values.forEach((v, i) => {
    let x = BigInt.asUintN(32 * words, v ?? 0n);
    for (let w = 0; w < words; w++) {
      out[i * words + w] = Number(x & 0xffffffffn);
      x >>= 32n;
    }
  });
  return out;
}

function buildArrowTable(N, seed) {
  const rnd = mulberry32(seed);
  const ri = (n) => Math.floor(rnd() * n);
  const nul = (p) => rnd() < p;
  const cols = [];
  const add = (name, data, nullable = true) => cols.push([field(name, data.type, nullable), data]);
  const valid = (p) => Array.from({ length: N }, () => !nul(p));

  add('id', prim(new A.Int64(), BigInt64Array.from({ length: N }, (_, i) => BigInt(i))), false);
  add('i8', prim(new A.Int8(), Int8Array.from({ length: N }, (_, i) => (i === 0 ? -128 : i === 1 ? 127 : ri(256) - 128)), valid(0.1)));
  add('i16', prim(new A.Int16(), Int16Array.from({ length: N }, (_, i) => (i === 0 ? -32768 : ri(65536) - 32768)), valid(0.1)));
  add('i32', prim(new A.Int32(), Int32Array.from({ length: N }, (_, i) => (i === 0 ? -2147483648 : i === 1 ? 2147483647 : ri(4294967296) - 2147483648)), valid(0.1)));
  add('i32_sorted', prim(new A.Int32(), Int32Array.from({ length: N }, (_, i) => i * 3 - 5000)), valid(0.05));
  add(
    'i64',
    prim(new A.Int64(), BigInt64Array.from({ length: N }, (_, i) => (i === 0 ? -(2n ** 63n) : i === 1 ? 2n ** 63n - 1n : BigInt(ri(2 ** 31)) * BigInt(ri(2 ** 31)) * (i % 2 ? -1n : 1n))), valid(0.1)),
  );
  add('u8', prim(new A.Uint8(), Uint8Array.from({ length: N }, (_, i) => (i === 0 ? 255 : ri(256))), valid(0.1)));
  add('u16', prim(new A.Uint16(), Uint16Array.from({ length: N }, (_, i) => (i === 0 ? 65535 : ri(65536))), valid(0.1)));
  add('u32', prim(new A.Uint32(), Uint32Array.from({ length: N }, (_, i) => (i === 0 ? 4294967295 : ri(4294967296))), valid(0.1)));
  add('u64', prim(new A.Uint64(), BigUint64Array.from({ length: N }, (_, i) => (i === 0 ? 2n ** 64n - 1n : BigInt(ri(2 ** 32)) * BigInt(ri(2 ** 32)))), valid(0.1)));
  const f16 = Uint16Array.from({ length: N }, (_, i) => [0x7e00, 0x7c00, 0xfc00, 0x8000, 0x0001, 0x7bff][i] ?? ri(0x7c00) | (ri(2) << 15));
  add('f16', prim(new A.Float16(), f16, valid(0.1)));
  const specials = [NaN, Infinity, -Infinity, -0, 0];
  add('f32', prim(new A.Float32(), Float32Array.from({ length: N }, (_, i) => (i < 5 ? specials[i] : (rnd() - 0.5) * 10 ** ri(20))), valid(0.1)));
  add('f64', prim(new A.Float64(), Float64Array.from({ length: N }, (_, i) => (i < 5 ? specials[(i + 1) % 5] : (rnd() - 0.5) * 10 ** (ri(40) - 20))), valid(0.1)));
  const bools = new Uint8Array((N + 7) >> 3);
  for (let i = 0; i < N; i++) if (nul(0.5)) bools[i >> 3] |= 1 << (i & 7);
  add('b', prim(new A.Bool(), bools, valid(0.1)));
  const words = ['alpha', 'beta', 'gamma', 'δέλτα', '日本語', '', 'emoji 🦆', 'quote " and \\ backslash', 'nl\nline'];
  const strs = Array.from({ length: N }, (_, i) => (nul(0.1) ? null : `${words[ri(words.length)]}-${i}-${'x'.repeat(ri(20))}`));
  add('s', varbin(new A.Utf8(), strs));
  add('s_lowcard', varbin(new A.Utf8(), Array.from({ length: N }, () => (nul(0.1) ? null : words[ri(words.length)]))));
  add('s_prefix', varbin(new A.Utf8(), Array.from({ length: N }, (_, i) => (nul(0.05) ? null : `common/prefix/${String(Math.floor(i / 3)).padStart(6, '0')}/${ri(10)}`))));
  add('ls', varbin(new A.LargeUtf8(), strs.map((s) => (s === null ? null : s.toUpperCase())), true));
  const blobs = Array.from({ length: N }, () => (nul(0.1) ? null : Uint8Array.from({ length: ri(48) }, () => ri(256))));
  add('bin', varbin(new A.Binary(), blobs));
  add('lbin', varbin(new A.LargeBinary(), blobs.map((b) => (b === null ? null : b.slice().reverse())), true));
  add('fsb16', prim(new A.FixedSizeBinary(16), Uint8Array.from({ length: 16 * N }, () => ri(256)), valid(0.1)));
  const dec = (digits) => Array.from({ length: N }, () => {
    let s = '';
    for (let k = 0; k < digits; k++) s += ri(10);
    return BigInt(s) * (ri(2) ? -1n : 1n);
  });
  add('dec9_2', prim(new A.Decimal(2, 9, 128), decimalWords(dec(9), 4), valid(0.1)));
  add('dec18_4', prim(new A.Decimal(4, 18, 128), decimalWords(dec(18), 4), valid(0.1)));
  add('dec38_10', prim(new A.Decimal(10, 38, 128), decimalWords(dec(38), 4), valid(0.1)));
  add('date32', prim(new A.DateDay(), Int32Array.from({ length: N }, (_, i) => (i === 0 ? -719162 : i === 1 ? 2932896 : ri(100000) - 50000)), valid(0.1)));
  add('time_ms', prim(new A.TimeMillisecond(), Int32Array.from({ length: N }, () => ri(86400000)), valid(0.1)));
  add('time_us', prim(new A.TimeMicrosecond(), BigInt64Array.from({ length: N }, () => BigInt(ri(86400000)) * 1000n + BigInt(ri(1000))), valid(0.1)));
  add('time_ns', prim(new A.TimeNanosecond(), BigInt64Array.from({ length: N }, () => BigInt(ri(86400000)) * 1000000n + BigInt(ri(1000000))), valid(0.1)));
  const tsBase = () => BigInt(ri(2 ** 31)) - 2n ** 30n; // seconds, 1936..2004
  add('ts_ms', prim(new A.TimestampMillisecond(), BigInt64Array.from({ length: N }, () => tsBase() * 1000n + BigInt(ri(1000))), valid(0.1)));
  add('ts_ms_utc', prim(new A.TimestampMillisecond('UTC'), BigInt64Array.from({ length: N }, () => tsBase() * 1000n + BigInt(ri(1000))), valid(0.1)));
  add('ts_us', prim(new A.TimestampMicrosecond(), BigInt64Array.from({ length: N }, () => tsBase() * 1000000n + BigInt(ri(1000000))), valid(0.1)));
  add('ts_us_utc', prim(new A.TimestampMicrosecond('+01:00'), BigInt64Array.from({ length: N }, () => tsBase() * 1000000n + BigInt(ri(1000000))), valid(0.1)));
  add('ts_ns', prim(new A.TimestampNanosecond(), BigInt64Array.from({ length: N }, () => tsBase() * 1000000000n + BigInt(ri(1000000000))), valid(0.1)));
  add('ts_ns_utc', prim(new A.TimestampNanosecond('UTC'), BigInt64Array.from({ length: N }, () => tsBase() * 1000000000n + BigInt(ri(1000000000))), valid(0.1)));
  {
    const dv = varbin(new A.Utf8(), ['red', 'green', 'blue', 'ünï']);
    const idx = Int32Array.from({ length: N }, () => ri(4));
    const { b, nulls } = bitmap(valid(0.1));
    add('dict', A.makeData({ type: new A.Dictionary(new A.Utf8(), new A.Int32()), length: N, nullCount: nulls, nullBitmap: nulls ? b : undefined, data: idx, dictionary: A.makeVector(dv) }));
  }
  add('iv_ym', prim(new A.IntervalYearMonth(), Int32Array.from({ length: N }, () => ri(500)), valid(0.1)));
  add('iv_dt', prim(new A.IntervalDayTime(), Int32Array.from({ length: 2 * N }, () => ri(100000)), valid(0.1)));

  // list<int32> with null lists, empty lists and null elements
  {
    const lists = Array.from({ length: N }, () => (nul(0.1) ? null : Array.from({ length: ri(6) }, () => (nul(0.15) ? null : ri(2000) - 1000))));
    const flat = lists.flatMap((l) => l ?? []);
    const child = prim(new A.Int32(), Int32Array.from(flat, (v) => v ?? 0), flat.map((v) => v !== null));
    add('list_i32', listData(new A.List(field('element', new A.Int32())), lists, child));
  }
  // large_list<utf8>
  {
    const lists = Array.from({ length: N }, () => (nul(0.1) ? null : Array.from({ length: ri(4) }, () => (nul(0.15) ? null : words[ri(words.length)]))));
    const child = varbin(new A.Utf8(), lists.flatMap((l) => l ?? []));
    add('llist_str', listData(new A.LargeList(field('element', new A.Utf8())), lists, child, true));
  }
  // list<list<int64>>
  {
    const outer = Array.from({ length: N }, () => (nul(0.1) ? null : Array.from({ length: ri(4) }, () => (nul(0.2) ? null : Array.from({ length: ri(4) }, () => (nul(0.1) ? null : BigInt(ri(1e9))))))));
    const inner = outer.flatMap((l) => l ?? []);
    const flat = inner.flatMap((l) => l ?? []);
    const leaf = prim(new A.Int64(), BigInt64Array.from(flat, (v) => v ?? 0n), flat.map((v) => v !== null));
    const innerType = new A.List(field('element', new A.Int64()));
    const innerData = listData(innerType, inner, leaf);
    add('list_list_i64', listData(new A.List(field('element', innerType)), outer, innerData));
  }
  // struct{a: int32, b: utf8, c: struct{d: float64, e: list<int32>}}
  {
    const cType = new A.Struct([field('d', new A.Float64()), field('e', new A.List(field('element', new A.Int32())))]);
    const d = prim(new A.Float64(), Float64Array.from({ length: N }, () => rnd() * 100), valid(0.1));
    const eLists = Array.from({ length: N }, () => (nul(0.2) ? null : Array.from({ length: ri(3) }, () => ri(100))));
    const e = listData(new A.List(field('element', new A.Int32())), eLists, prim(new A.Int32(), Int32Array.from(eLists.flatMap((l) => l ?? []))));
    const c = structData(cType, N, [d, e], valid(0.15));
    const a = prim(new A.Int32(), Int32Array.from({ length: N }, () => ri(1000)), valid(0.1));
    const b = varbin(new A.Utf8(), Array.from({ length: N }, () => (nul(0.1) ? null : words[ri(words.length)])));
    const sType = new A.Struct([field('a', new A.Int32()), field('b', new A.Utf8()), field('c', cType)]);
    add('st', structData(sType, N, [a, b, c], valid(0.1)));
  }
  // map<utf8, int64> with null values, empty and null maps
  {
    const maps = Array.from({ length: N }, () => (nul(0.1) ? null : Array.from({ length: ri(4) }, (_, k) => [`key${k}-${ri(100)}`, nul(0.2) ? null : BigInt(ri(1e6))])));
    const ents = maps.flatMap((m) => m ?? []);
    const keys = varbin(new A.Utf8(), ents.map((e) => e[0]));
    const vals = prim(new A.Int64(), BigInt64Array.from(ents, (e) => e[1] ?? 0n), ents.map((e) => e[1] !== null));
    const eType = new A.Struct([field('key', new A.Utf8(), false), field('value', new A.Int64())]);
    const entries = structData(eType, ents.length, [keys, vals]);
    const off = new Int32Array(N + 1);
    maps.forEach((m, i) => (off[i + 1] = off[i] + (m ? m.length : 0)));
    const { b, nulls } = bitmap(maps.map((m) => m !== null));
    add('map_str_i64', A.makeData({ type: new A.Map_(field('entries', eType, false)), length: N, nullCount: nulls, nullBitmap: nulls ? b : undefined, valueOffsets: off, child: entries }));
  }
  // list<struct{k: utf8, v: float32}>
  {
    const lists = Array.from({ length: N }, () => (nul(0.1) ? null : Array.from({ length: ri(3) }, () => (nul(0.1) ? null : [words[ri(words.length)], Math.fround(rnd() * 10)]))));
    const items = lists.flatMap((l) => l ?? []);
    const k = varbin(new A.Utf8(), items.map((it) => (it ? it[0] : null)));
    const v = prim(new A.Float32(), Float32Array.from(items, (it) => (it ? it[1] : 0)), items.map((it) => it !== null));
    const sType = new A.Struct([field('k', new A.Utf8()), field('v', new A.Float32())]);
    const child = structData(sType, items.length, [k, v], items.map((it) => it !== null));
    add('list_struct', listData(new A.List(field('element', sType)), lists, child));
  }

  const fields = cols.map((c) => c[0]);
  const batch = new A.RecordBatch(new A.Schema(fields), structData(new A.Struct(fields), N, cols.map((c) => c[1])));
  return A.tableToIPC(new A.Table([batch]), 'stream');
}

function writeArrow(file, ipc, configure) {
  const b = configure(new PW.WriterPropertiesBuilder().setCreatedBy('parquet-wasm (arrow-rs) via larder gen-files'));
  const bytes = PW.writeParquet(PW.Table.fromIPCStream(ipc), b.build());
  fs.writeFileSync(path.join(OUT, file), bytes);
}

async function genArrow() {
  const N = 4000;
  const ipc = buildArrowTable(N, 20240611);
  const C = PW.Compression;
  const base = 'an arrow table of every type arrow-rs writes to Parquet (int8..int64, uint8..uint64, float16/32/64, bool, utf8, large_utf8, binary, large_binary, fixed_size_binary(16), decimal(9,2)/(18,4)/(38,10), date32, time ms/us/ns, timestamp ms/us/ns with and without UTC, dictionary<utf8>, intervals, list<int32>, large_list<utf8>, list<list<int64>>, nested struct, map<utf8,int64>, list<struct>) with nulls';
  const variants = [
    ['uncompressed', (b) => b.setCompression(C.UNCOMPRESSED), { codec: 'UNCOMPRESSED' }],
    ['snappy', (b) => b.setCompression(C.SNAPPY), { codec: 'SNAPPY' }],
    ['gzip', (b) => b.setCompression(C.GZIP), { codec: 'GZIP' }],
    ['brotli', (b) => b.setCompression(C.BROTLI), { codec: 'BROTLI' }],
    ['zstd', (b) => b.setCompression(C.ZSTD), { codec: 'ZSTD' }],
    ['lz4_raw', (b) => b.setCompression(C.LZ4_RAW), { codec: 'LZ4_RAW' }],
  ];
  for (const [name, conf, need] of variants) {
    const file = `arrow-alltypes-${name}-v1.parquet`;
    writeArrow(file, ipc, (b) => conf(b).setWriterVersion(PW.WriterVersion.V1).setMaxRowGroupSize(1500));
    const info = await describeFile(path.join(OUT, file));
    require_(info, file, { ...need, pages: ['DATA_PAGE'], encodings: ['PLAIN', 'RLE_DICTIONARY'] });
    await expectFull(file);
    manifest.push({ file, writer: 'arrow-rs (parquet-wasm)', rows: N, description: `arrow-rs, data page v1, dictionary on, ${name}: ${base}; ${summary(info)}`, compare: 'full' });
    log(file);
  }

  // The legacy (Hadoop-framed) LZ4 codec: DuckDB cannot read it, so the
  // expected values are DuckDB's read of the same table written with LZ4_RAW.
  {
    const file = 'arrow-alltypes-lz4hadoop-v1.parquet';
    writeArrow(file, ipc, (b) => b.setCompression(C.LZ4).setWriterVersion(PW.WriterVersion.V1).setMaxRowGroupSize(1500));
    const info = await describeFile(path.join(OUT, file));
    require_(info, file, { codec: 'LZ4' });
    fs.copyFileSync(path.join(OUT, 'arrow-alltypes-lz4_raw-v1.parquet.duckdb.jsonl'), path.join(OUT, `${file}.duckdb.jsonl`));
    manifest.push({
      file,
      writer: 'arrow-rs (parquet-wasm)',
      rows: N,
      description: `arrow-rs, data page v1, legacy LZ4 codec (Hadoop framing); expected values are DuckDB's read of arrow-alltypes-lz4_raw-v1 (same table), since DuckDB does not read LZ4: ${base}; ${summary(info)}`,
      compare: 'full',
    });
    log(file);
  }

  // Data page v2, with and without dictionaries
  for (const [name, conf, dict] of [
    ['v2-dict-snappy', (b) => b.setCompression(C.SNAPPY), true],
    ['v2-nodict-zstd', (b) => b.setCompression(C.ZSTD).setDictionaryEnabled(false), false],
    ['v2-nodict-uncompressed-smallpages', (b) => b.setCompression(C.UNCOMPRESSED).setDictionaryEnabled(false).setDataPageSizeLimit(512).setWriteBatchSize(64).setMaxRowGroupSize(700), false],
  ]) {
    const file = `arrow-alltypes-${name}.parquet`;
    writeArrow(file, ipc, (b) => conf(b).setWriterVersion(PW.WriterVersion.V2).setMaxRowGroupSize(2000));
    const info = await describeFile(path.join(OUT, file));
    require_(info, file, { pages: ['DATA_PAGE_V2'], encodings: dict ? ['RLE_DICTIONARY'] : ['PLAIN'] });
    await expectFull(file);
    manifest.push({ file, writer: 'arrow-rs (parquet-wasm)', rows: N, description: `arrow-rs, data page v2, dictionary ${dict ? 'on' : 'off'}: ${base}; ${summary(info)}`, compare: 'full' });
    log(file);
  }

  // Explicit encodings per column, on v1 and v2 data pages
  const E = PW.Encoding;
  const perColumn = {
    i8: E.DELTA_BINARY_PACKED,
    i16: E.DELTA_BINARY_PACKED,
    i32: E.DELTA_BINARY_PACKED,
    i32_sorted: E.DELTA_BINARY_PACKED,
    i64: E.DELTA_BINARY_PACKED,
    u32: E.DELTA_BINARY_PACKED,
    u64: E.DELTA_BINARY_PACKED,
    date32: E.DELTA_BINARY_PACKED,
    ts_us: E.DELTA_BINARY_PACKED,
    s: E.DELTA_LENGTH_BYTE_ARRAY,
    bin: E.DELTA_LENGTH_BYTE_ARRAY,
    s_prefix: E.DELTA_BYTE_ARRAY,
    ls: E.DELTA_BYTE_ARRAY,
    lbin: E.DELTA_BYTE_ARRAY,
    f32: E.BYTE_STREAM_SPLIT,
    f64: E.BYTE_STREAM_SPLIT,
    f16: E.BYTE_STREAM_SPLIT,
    u16: E.BYTE_STREAM_SPLIT,
    ts_ns: E.BYTE_STREAM_SPLIT,
    dec18_4: E.BYTE_STREAM_SPLIT,
    fsb16: E.BYTE_STREAM_SPLIT,
    b: E.RLE,
  };
  const expectCols = {
    i32: 'DELTA_BINARY_PACKED',
    i64: 'DELTA_BINARY_PACKED',
    s: 'DELTA_LENGTH_BYTE_ARRAY',
    s_prefix: 'DELTA_BYTE_ARRAY',
    f32: 'BYTE_STREAM_SPLIT',
    f64: 'BYTE_STREAM_SPLIT',
    u16: 'BYTE_STREAM_SPLIT',
    fsb16: 'BYTE_STREAM_SPLIT',
    dec18_4: 'BYTE_STREAM_SPLIT',
  };
  for (const [ver, wv, page] of [['v1', PW.WriterVersion.V1, 'DATA_PAGE'], ['v2', PW.WriterVersion.V2, 'DATA_PAGE_V2']]) {
    const file = `arrow-encodings-${ver}.parquet`;
    writeArrow(file, ipc, (b) => {
      b = b.setCompression(C.SNAPPY).setWriterVersion(wv).setMaxRowGroupSize(2500).setDataPageSizeLimit(4096);
      for (const [col, e] of Object.entries(perColumn)) b = b.setColumnDictionaryEnabled(col, false).setColumnEncoding(col, e);
      return b;
    });
    const info = await describeFile(path.join(OUT, file));
    require_(info, file, { pages: [page], columnEncodings: expectCols });
    const perCol = [...info.byColumn.entries()].filter(([c]) => perColumn[c] !== undefined).map(([c, e]) => `${c}=${[...e].join('+')}`).join(' ');
    // DuckDB reads BYTE_STREAM_SPLIT only for FLOAT and DOUBLE: the values it
    // reads from the same table written plainly are the expected ones.
    let from = '';
    try {
      await expectFull(file);
    } catch (e) {
      fs.copyFileSync(path.join(OUT, 'arrow-alltypes-uncompressed-v1.parquet.duckdb.jsonl'), path.join(OUT, `${file}.duckdb.jsonl`));
      from = ` Expected values are DuckDB's read of arrow-alltypes-uncompressed-v1 (same table), since DuckDB fails on this file: ${String(e.message).split('\n')[0]}.`;
    }
    manifest.push({
      file,
      writer: 'arrow-rs (parquet-wasm)',
      rows: N,
      description: `arrow-rs, data page ${ver}, per-column encodings DELTA_BINARY_PACKED / DELTA_LENGTH_BYTE_ARRAY / DELTA_BYTE_ARRAY / BYTE_STREAM_SPLIT (also on integer, FLOAT16, DECIMAL and FIXED_LEN_BYTE_ARRAY columns) / RLE (${perCol}): ${base}; ${summary(info)}.${from}`,
      compare: 'full',
    });
    log(file);
  }

  // decimal256: DuckDB 1.5.6 reads DECIMAL wider than 38 digits as DOUBLE, and
  // misreads FIXED_LEN_BYTE_ARRAY decimals wider than 16 bytes (1.00000000 in
  // a DECIMAL(50,8) comes back as 16777216), so the expected values are the
  // generator's own, written in DuckDB's rendering (a decimal as a JSON number).
  {
    const n = 500;
    const rnd = mulberry32(77);
    const vals = Array.from({ length: n }, (_, i) => {
      let s = '';
      for (let k = 0; k < 50; k++) s += Math.floor(rnd() * 10);
      return i === 0 ? 0n : BigInt(s) * (i % 2 ? -1n : 1n);
    });
    const validity = vals.map((_, i) => i % 10 !== 3);
    const cols = [
      [field('id', new A.Int32(), false), prim(new A.Int32(), Int32Array.from({ length: n }, (_, i) => i))],
      [field('d76', new A.Decimal(8, 50, 256)), prim(new A.Decimal(8, 50, 256), decimalWords(vals, 8), validity)],
    ];
    const fields = cols.map((c) => c[0]);
    const batch = new A.RecordBatch(new A.Schema(fields), structData(new A.Struct(fields), n, cols.map((c) => c[1])));
    const file = 'arrow-decimal256.parquet';
    writeArrow(file, A.tableToIPC(new A.Table([batch]), 'stream'), (b) => b.setCompression(C.SNAPPY));
    const info = await describeFile(path.join(OUT, file));
    const text = (v) => {
      const neg = v < 0n;
      const s = String(neg ? -v : v).padStart(9, '0');
      return `${neg ? '-' : ''}${s.slice(0, -8)}.${s.slice(-8)}`;
    };
    fs.writeFileSync(
      path.join(OUT, `${file}.duckdb.jsonl`),
      vals.map((v, i) => `{"id":${i},"d76":${validity[i] ? text(v) : 'null'}}\n`).join(''),
    );
    manifest.push({
      file,
      writer: 'arrow-rs (parquet-wasm)',
      rows: n,
      description: `arrow-rs, decimal256(50,8) as FIXED_LEN_BYTE_ARRAY(21); expected values are the generator's own (DuckDB 1.5.6 misreads such decimals); ${summary(info)}`,
      compare: 'full',
    });
    log(file);
  }
}

await genDuckDB();
await genArrow();

let total = 0;
for (const f of fs.readdirSync(OUT)) total += fs.statSync(path.join(OUT, f)).size;
fs.writeFileSync(path.join(OUT, 'manifest.json'), JSON.stringify({ generator: 'tests/gen/gen-files.mjs', files: manifest }, null, 1) + '\n');
log(`${manifest.length} files, ${(total / 1048576).toFixed(1)} MiB in ${OUT}`);
