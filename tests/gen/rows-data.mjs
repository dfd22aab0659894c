// Writes, with DuckDB, the files that test the daemon's row blocks
// (daemon/serve/layout.h): every kind of column a row block packs, and the cases
// where it must not inline.
// Usage: node tests/gen/rows-data.mjs OUTDIR
//
// OUTDIR/mixed.parquet, 6000 rows in row groups of 1000:
//   id      BIGINT            the row number
//   flag    BOOLEAN           NULL in every 13th row
//   small   SMALLINT, tiny TINYINT, dec DECIMAL(30,4) (16 bytes), uid UUID
//   name    VARCHAR           0 to 3000 characters: some rows past the
//                             row block's inline limit (1024), some empty,
//                             some NULL, so rows vary in size
//   ints    INTEGER[]         NULL lists, empty lists, and NULL elements
//                             only in rows 2000..2999 (their units cannot
//                             inline the column)
//   vec     DOUBLE[]          4 values, never NULL
//   big     FLOAT[]           600 values in rows 4000..4999 (2400 bytes a
//                             row: long on average, not inlined), 2 elsewhere
//   tags    VARCHAR[]         a list of strings: never packed
//   pt      STRUCT(x INT, y VARCHAR): never packed
// OUTDIR/uniform.parquet, 3000 rows: fixed-size rows (id, a 64-byte blob,
//   an 8-float list), the stride case.
// OUTDIR/wide.parquet, 8192 rows in one row group, and wide-fit.parquet,
//   its first 6400 rows: rows of about 550 bytes (id, a 448-byte blob, a
//   note of 0 to 120 characters, NULL in every 9th row), so that units of
//   a few thousand rows make row blocks past 1 MiB, which get a mapping of
//   their own in huge pages.
// OUTDIR/dict.parquet: see below.
import { DuckDBInstance } from '@duckdb/node-api';
import fs from 'node:fs';
import path from 'node:path';

const out = process.argv[2];
if (!out) {
  process.stderr.write('usage: rows-data.mjs OUTDIR\n');
  process.exit(2);
}
fs.mkdirSync(out, { recursive: true });
const db = await DuckDBInstance.create(':memory:');
const c = await db.connect();
await c.run('SET threads=1');
await c.run(`COPY (
  SELECT i::BIGINT AS id,
         CASE WHEN i % 13 = 0 THEN NULL ELSE hash(i, 1) % 2 = 0 END AS flag,
         ((hash(i, 2) % 60000)::INTEGER - 30000)::SMALLINT AS small,
         ((hash(i, 3) % 250)::INTEGER - 125)::TINYINT AS tiny,
         ((hash(i, 4) % 100000000000)::DECIMAL(30,4) / 7)::DECIMAL(30,4) AS dec,
         md5(i::VARCHAR)::UUID AS uid,
         CASE WHEN i % 17 = 0 THEN NULL
              WHEN i % 19 = 0 THEN ''
              ELSE repeat(chr(97 + (i % 26)::INTEGER), (hash(i, 5) % 3000)::INTEGER) || i::VARCHAR END AS name,
         CASE WHEN i % 11 = 5 THEN NULL
              ELSE [CASE WHEN i BETWEEN 2000 AND 2999 AND (i + k) % 3 = 0 THEN NULL
                         ELSE (i * 10 + k)::INTEGER END FOR k IN range((i % 5)::BIGINT)] END AS ints,
         [(i + k / 4.0)::DOUBLE FOR k IN range(4)] AS vec,
         [(i * 1.5 + k)::FLOAT FOR k IN range(CASE WHEN i BETWEEN 4000 AND 4999 THEN 600 ELSE 2 END)] AS big,
         ['t' || (i % 7)::VARCHAR, 'u' || (i % 3)::VARCHAR] AS tags,
         {'x': (i % 100)::INTEGER, 'y': 'p' || i::VARCHAR} AS pt
  FROM range(6000) t(i)
) TO '${path.join(out, 'mixed.parquet')}' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 1000)`);
await c.run(`COPY (
  SELECT i::BIGINT AS id,
         from_hex(repeat(md5(i::VARCHAR), 4)) AS blob,
         [(i + k)::FLOAT FOR k IN range(8)] AS emb
  FROM range(3000) t(i)
) TO '${path.join(out, 'uniform.parquet')}' (FORMAT parquet, COMPRESSION snappy, ROW_GROUP_SIZE 1000)`);
for (const [name, rows] of [['wide.parquet', 8192], ['wide-fit.parquet', 6400]]) {
  await c.run(`COPY (
    SELECT i::BIGINT AS id,
           from_hex(repeat(md5(i::VARCHAR), 28)) AS blob,
           CASE WHEN i % 9 = 0 THEN NULL
                ELSE repeat(chr(65 + (i % 26)::INTEGER), (hash(i, 6) % 121)::INTEGER) END AS note
    FROM range(${rows}) t(i)
  ) TO '${path.join(out, name)}' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 8192)`);
}
// OUTDIR/dict.parquet, 240 rows in one row group: a string of 1,000,000
// characters, one of three (DuckDB dictionary-encodes them), then the row's
// id: 240 MB decoded from a file of a few KB, so that a unit cut from the
// footer's sizes decodes to far more than they say.
await c.run(`COPY (
  SELECT i::BIGINT AS id,
         repeat(chr(97 + (i % 3)::INTEGER), 1000000) AS big
  FROM range(240) t(i)
) TO '${path.join(out, 'dict.parquet')}' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 240)`);
console.log(out);
