// Writes the demo's training dataset with DuckDB: N rows of a typical
// training schema (id, label, features, a path, a 256-byte blob, a nullable
// column and a 16-float embedding), split over several Parquet shards.
// Usage: node tests/gen/demo-data.mjs OUTDIR [ROWS] [SHARDS]
import { DuckDBInstance } from '@duckdb/node-api';
import fs from 'node:fs';
import path from 'node:path';

const out = process.argv[2];
const rows = Number(process.argv[3] ?? 200000);
const shards = Number(process.argv[4] ?? 4);
fs.mkdirSync(out, { recursive: true });
const db = await DuckDBInstance.create(':memory:');
const c = await db.connect();
await c.run('SET threads=2');
const per = Math.ceil(rows / shards);
for (let s = 0; s < shards; s++) {
  const lo = s * per, hi = Math.min(rows, lo + per);
  const file = path.join(out, `shard-${String(s).padStart(5, '0')}.parquet`);
  await c.run(`COPY (
    SELECT i::BIGINT AS id,
           (hash(i, 1) % 10)::INTEGER AS label,
           ((hash(i, 2) % 2000000) / 1000000.0 - 1.0)::FLOAT AS f0,
           ((hash(i, 3) % 2000000) / 1000000.0 - 1.0)::FLOAT AS f1,
           ((hash(i, 4) % 2000000) / 1000000.0 - 1.0)::FLOAT AS f2,
           ((hash(i, 5) % 2000000) / 1000000.0 - 1.0)::FLOAT AS f3,
           'images/' || lpad((i // 1000)::VARCHAR, 5, '0') || '/' || md5(i::VARCHAR) || '.jpg' AS path,
           from_hex(repeat(md5((i * 7)::VARCHAR), 8)) AS image,
           CASE WHEN hash(i, 6) % 10 = 0 THEN NULL ELSE (hash(i, 7) % 1000000)::BIGINT END AS weight_ppm,
           [((hash(i, 10 + k) % 2000) / 1000.0 - 1.0)::FLOAT FOR k IN range(16)] AS embedding
    FROM range(${lo}, ${hi}) t(i)
  ) TO '${file}' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 65536)`);
  console.log(file);
}
