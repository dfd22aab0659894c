#!/usr/bin/env node
// Writes the files that test shuffle_row_groups = auto (daemon/plan/clustered.h):
// the same 20,480 rows in different orders, in 10 row groups of 2,048, by DuckDB and
// by arrow-rs (parquet-wasm), each with the writer's own column statistics.
// Usage: node tests/gen/order-data.mjs OUTDIR
//
// Columns: id BIGINT (0..20479), label INTEGER (hash % 10), cls VARCHAR
// ('class-' || label), flag BOOLEAN (label is odd), x DOUBLE (uniform in
// [0, 1)), dec DECIMAL(20,2) (signed, stored as a 16-byte
// FIXED_LEN_BYTE_ARRAY), name VARCHAR (a hash).
//   random.parquet        rows in the order of a hash: no column is sorted
//   by-label.parquet      ORDER BY label
//   by-id.parquet         ORDER BY id
//   by-cls.parquet        ORDER BY cls (a string label), then the hash
//   by-flag.parquet       ORDER BY flag (a binary label), then the hash
//   by-dec.parquet        ORDER BY dec, negative and positive values
//   arrow-random.parquet  (id, label, x) in the hash order, written by arrow-rs
//   arrow-by-label.parquet  the same ORDER BY label, by arrow-rs
//   split-random/, split-by-label/  the rows of random.parquet and of
//                         by-label.parquet, 10,240 in part-0.parquet, then 10,240 in part-1
import { DuckDBInstance } from '@duckdb/node-api';
import * as A from 'apache-arrow';
import * as PW from 'parquet-wasm';
import fs from 'node:fs';
import path from 'node:path';

const out = process.argv[2];
if (!out) {
  process.stderr.write('usage: order-data.mjs OUTDIR\n');
  process.exit(2);
}
fs.mkdirSync(out, { recursive: true });
const db = await DuckDBInstance.create(':memory:');
const c = await db.connect();
await c.run('SET threads=1');
await c.run('SET preserve_insertion_order = true');
await c.run(`CREATE TABLE t AS
  SELECT i::BIGINT AS id, (hash(i, 1) % 10)::INTEGER AS label,
         'class-' || (hash(i, 1) % 10)::VARCHAR AS cls, hash(i, 1) % 2 = 1 AS flag,
         (hash(i, 2) % 1000000)::DOUBLE / 1000000 AS x,
         (((hash(i, 3) % 2000000)::BIGINT - 1000000) / 100)::DECIMAL(20,2) AS dec,
         md5(i::VARCHAR) AS name, hash(i, 9) AS h
  FROM range(20480) r(i)`);
const orders = {
  'random.parquet': 'h',
  'by-label.parquet': 'label, h',
  'by-id.parquet': 'id',
  'by-cls.parquet': 'cls, h',
  'by-flag.parquet': 'flag, h',
  'by-dec.parquet': 'dec, h',
};
for (const [file, order] of Object.entries(orders)) {
  await c.run(`COPY (SELECT id, label, cls, flag, x, dec, name FROM t ORDER BY ${order})
    TO '${path.join(out, file)}' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 2048)`);
}
for (const [dir, order] of [['split-random', 'h'], ['split-by-label', 'label, h']]) {
  fs.mkdirSync(path.join(out, dir), { recursive: true });
  for (let k = 0; k < 2; k++) {
    await c.run(`COPY (SELECT id, label, cls, flag, x, dec, name FROM t ORDER BY ${order}
                       LIMIT 10240 OFFSET ${k * 10240})
      TO '${path.join(out, dir, `part-${k}.parquet`)}' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 2048)`);
  }
}
for (const [file, order] of [['arrow-random.parquet', 'h'], ['arrow-by-label.parquet', 'label, h']]) {
  const rows = (await c.runAndReadAll(`SELECT id, label, x FROM t ORDER BY ${order}`)).getRowObjectsJS();
  const table = A.tableFromArrays({
    id: BigInt64Array.from(rows, (r) => BigInt(r.id)),
    label: Int32Array.from(rows, (r) => r.label),
    x: Float64Array.from(rows, (r) => r.x),
  });
  const props = new PW.WriterPropertiesBuilder().setMaxRowGroupSize(2048)
    .setCreatedBy('parquet-wasm (arrow-rs) via larder order-data').build();
  fs.writeFileSync(path.join(out, file), PW.writeParquet(PW.Table.fromIPCStream(A.tableToIPC(table, 'stream')), props));
}
