#!/usr/bin/env node
// gen-shards.mjs SRC OUTDIR [SHARDS] [ROW_GROUP_SIZE] [ORDER]: splits one Parquet file
// into the sharded layout a training dataset has on remote storage, with
// DuckDB.
//
// bench-remote serves the decode benchmark's table (bench/work/zstd-v1.parquet,
// written by gen-dataset.mjs) the way trainers find data on S3 or behind HTTP:
// SHARDS files (default 8) of consecutive ids, ZSTD, with row groups of
// ROW_GROUP_SIZE rows (default 32768, ~12 MB compressed).  Smaller row groups
// than the decode benchmark's 122880 matter here: a row group is the unit the
// fetcher reads and the cache ranks, so it sets both the time to the first
// batch and how finely a cache smaller than the dataset can be used.
//
// ORDER: `id` (the default), shard k holding the k-th run of consecutive ids
// in id order; or `shuffled`, the rows dealt to the shards by a hash of the
// id and written in the order of another hash, as a job that prepares a
// training set writes it (no column is then sorted across row groups, and
// shuffle_row_groups = auto keeps row groups together).  The hashes are MD5
// of strings: an order by DuckDB's hash(id, n) follows the hash(id) that the
// dataset's float columns come from, and leaves them grouped.
//
// Output: OUTDIR/part-00000.parquet ... and OUTDIR/manifest.json (file sizes,
// rows, row groups).  Regenerated only when the stamp does not match.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { DuckDBInstance } from '@duckdb/node-api';

const [srcArg, outArg, shardsArg, rgArg, orderArg] = process.argv.slice(2);
const ORDER = orderArg ?? 'id';
if (!srcArg || !outArg || !['id', 'shuffled'].includes(ORDER)) {
  console.error('usage: gen-shards.mjs SRC OUTDIR [SHARDS] [ROW_GROUP_SIZE] [id|shuffled]');
  process.exit(2);
}
const SHARDS = Number(shardsArg ?? 8);
const ROW_GROUP_SIZE = Number(rgArg ?? 32768);
const src = resolve(srcArg);
const outDir = resolve(outArg);
mkdirSync(outDir, { recursive: true });

const want = {
  script_sha256: createHash('sha256').update(readFileSync(fileURLToPath(import.meta.url))).digest('hex'),
  src_bytes: statSync(src).size,
  shards: SHARDS,
  row_group_size: ROW_GROUP_SIZE,
  order: ORDER,
};
const stampPath = join(outDir, 'stamp.json');
const manifestPath = join(outDir, 'manifest.json');
const name = (k) => `part-${String(k).padStart(5, '0')}.parquet`;

try {
  const stamp = JSON.parse(readFileSync(stampPath, 'utf8'));
  const ok = Object.keys(want).every((k) => stamp[k] === want[k]) &&
    Array.from({ length: SHARDS }, (_, k) => name(k)).every((n) => statSync(join(outDir, n)).size === stamp.sizes[n]);
  if (ok && existsSync(manifestPath)) {
    console.log(`gen-shards: ${outDir} is up to date`);
    process.exit(0);
  }
} catch {
  // No stamp or a stale one: regenerate.
}

rmSync(stampPath, { force: true });
const instance = await DuckDBInstance.create(':memory:');
const con = await instance.connect();
const q = async (sql) => (await con.runAndReadAll(sql)).getRowObjectsJson();
await con.run('SET preserve_insertion_order = true');
const [{ n }] = await q(`SELECT count(*)::BIGINT AS n FROM read_parquet('${src}')`);
const rows = Number(n);
const manifest = { source: src, rows, shards: SHARDS, row_group_size: ROW_GROUP_SIZE, files: [] };
const sizes = {};
for (let k = 0; k < SHARDS; k++) {
  const lo = Math.floor((rows * k) / SHARDS);
  const hi = Math.floor((rows * (k + 1)) / SHARDS);
  const path = join(outDir, name(k));
  rmSync(`${path}.tmp`, { force: true });
  const select = ORDER === 'id'
    ? `SELECT * FROM read_parquet('${src}') WHERE id >= ${lo} AND id < ${hi} ORDER BY id`
    : `SELECT * FROM read_parquet('${src}') WHERE hash(md5('shard-' || id)) % ${SHARDS} = ${k} ` +
      `ORDER BY md5('order-' || id)`;
  await con.run(
    `COPY (${select}) TO '${path}.tmp' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE ${ROW_GROUP_SIZE})`,
  );
  renameSync(`${path}.tmp`, path);
  const [m] = await q(
    `SELECT count(DISTINCT row_group_id)::BIGINT AS rg, sum(total_uncompressed_size)::BIGINT AS decoded,
            (SELECT count(*) FROM read_parquet('${path}'))::BIGINT AS n
     FROM parquet_metadata('${path}')`,
  );
  sizes[name(k)] = statSync(path).size;
  manifest.files.push({
    name: name(k), rows: Number(m.n), file_bytes: sizes[name(k)], row_groups: Number(m.rg), decoded_bytes: Number(m.decoded),
  });
}
writeFileSync(manifestPath, JSON.stringify(manifest, null, 2) + '\n');
writeFileSync(stampPath, JSON.stringify({ ...want, sizes }, null, 2) + '\n');
const total = manifest.files.reduce((a, f) => a + f.file_bytes, 0);
console.log(`gen-shards: ${SHARDS} shards, ${rows} rows, ${(total / 1e6).toFixed(1)} MB in ${outDir}`);
