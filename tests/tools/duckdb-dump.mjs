#!/usr/bin/env node
// duckdb-dump.mjs: writes DuckDB's JSON rendering of a Parquet file, one JSON
// object per row in file order: the rendering of the conformance files'
// .duckdb.jsonl.
//
// Usage: node tests/tools/duckdb-dump.mjs FILE.parquet OUT.jsonl [--offset N] [--limit N]
//
// One thread and DuckDB's default preserve_insertion_order keep rows in file
// order; TimeZone is pinned to UTC so TIMESTAMP WITH TIME ZONE shows "+00"
// whatever the machine's zone.

import { DuckDBInstance } from '@duckdb/node-api';

export function sqlString(s) {
  return `'${String(s).replace(/'/g, "''")}'`;
}

export async function openDuckDB() {
  const db = await DuckDBInstance.create(':memory:', { threads: '1' });
  const conn = await db.connect();
  await conn.run(`SET TimeZone = 'UTC'`);
  await conn.run(`SET preserve_insertion_order = true`);
  return { db, conn };
}

// Writes rows [offset, offset+limit) of file (all when limit is undefined) to out.
export async function dumpParquet(conn, file, out, { offset, limit } = {}) {
  let q = `SELECT * FROM read_parquet(${sqlString(file)})`;
  if (limit !== undefined) q += ` LIMIT ${Number(limit)}`;
  if (offset !== undefined) q += ` OFFSET ${Number(offset)}`;
  await conn.run(`COPY (${q}) TO ${sqlString(out)} (FORMAT json)`);
}

async function main() {
  const argv = process.argv.slice(2);
  const pos = [];
  const opt = {};
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--offset' || argv[i] === '--limit') {
      const n = argv[i + 1];
      if (!/^\d+$/.test(n ?? '')) {
        process.stderr.write(`duckdb-dump: ${argv[i]} needs a count\n`);
        process.exit(2);
      }
      opt[argv[i].slice(2)] = Number(n);
      i++;
    } else pos.push(argv[i]);
  }
  if (pos.length !== 2) {
    process.stderr.write('usage: duckdb-dump.mjs FILE.parquet OUT.jsonl [--offset N] [--limit N]\n');
    process.exit(2);
  }
  if (opt.offset !== undefined && opt.limit === undefined) opt.limit = 2 ** 62;
  const { conn } = await openDuckDB();
  await dumpParquet(conn, pos[0], pos[1], opt);
}

if (process.argv[1] && process.argv[1].endsWith('duckdb-dump.mjs')) {
  main().catch((e) => {
    process.stderr.write(`duckdb-dump: ${e.message || e}\n`);
    process.exit(1);
  });
}
