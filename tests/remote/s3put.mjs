#!/usr/bin/env node
// s3put.mjs: uploads local files to a bucket through an S3 endpoint (s3front),
// each PUT signed with SigV4 (x-amz-content-sha256 is the body's hash, so the
// front checks the signature and the payload).
//
//   s3put.mjs --endpoint http://127.0.0.1:PORT --bucket B [--prefix P] [--key K]
//             [--create-bucket] [--access-key K --secret-key S [--session-token T]]
//             [--region R] [--virtual-host] [--content-type T] FILE|DIR...
//
// A directory is uploaded recursively, keys being PREFIX + its relative paths;
// a file's key is PREFIX + its base name (or --key for a single file).
// Prints {"uploaded":[{"key","size","etag"}],"count":N,"bytes":N}; exits 1 on
// the first failure, with the S3 error on stderr.
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from './lib/common.mjs';
import { CLIENT_FLAGS, clientConfig, closeAgent, s3request, xmlField } from './lib/s3client.mjs';

const USAGE = 'usage: s3put.mjs --endpoint URL --bucket B [--prefix P] [--key K] [--create-bucket] ' +
  '[--access-key K] [--secret-key S] [--session-token T] [--region R] [--virtual-host] [--content-type T] FILE|DIR...';
const { flags, positional } = parseArgs(process.argv.slice(2), {
  ...CLIENT_FLAGS, prefix: 'string', key: 'string', 'create-bucket': 'bool', 'content-type': 'string',
}, USAGE);

function die(msg) {
  process.stderr.write(`s3put: ${msg}\n`);
  process.exit(1);
}

let cfg;
try {
  cfg = clientConfig(flags);
} catch (e) {
  die(e.message);
}
if (!flags.bucket) die('--bucket is required');
if (!positional.length) die('no files given');

function walk(p, rel, out) {
  const st = fs.statSync(p);
  if (st.isDirectory()) {
    for (const name of fs.readdirSync(p).sort()) walk(path.join(p, name), rel ? `${rel}/${name}` : name, out);
  } else if (st.isFile()) {
    out.push({ file: p, rel });
  }
}

const files = [];
for (const p of positional) {
  const st = fs.statSync(p);
  if (st.isDirectory()) walk(p, '', files);
  else files.push({ file: p, rel: flags.key ?? path.basename(p) });
}
if (flags.key && files.length !== 1) die('--key needs exactly one file');

const prefix = flags.prefix ?? '';
const uploaded = [];
let bytes = 0;
if (flags['create-bucket']) {
  const r = await s3request(cfg, { method: 'PUT', bucket: flags.bucket });
  if (r.status !== 200 && xmlField(r.body.toString(), 'Code') !== 'BucketAlreadyOwnedByYou') {
    die(`create bucket ${flags.bucket}: HTTP ${r.status} ${r.body.toString()}`);
  }
}
for (const { file, rel } of files) {
  const key = prefix + rel;
  const body = fs.readFileSync(file);
  const headers = { 'content-type': flags['content-type'] ?? 'application/octet-stream' };
  const r = await s3request(cfg, { method: 'PUT', bucket: flags.bucket, key, headers, body });
  if (r.status !== 200) die(`PUT ${flags.bucket}/${key}: HTTP ${r.status} ${r.body.toString()}`);
  uploaded.push({ key, size: body.length, etag: r.headers.etag ?? null });
  bytes += body.length;
}
closeAgent();
process.stdout.write(JSON.stringify({ uploaded, count: uploaded.length, bytes }) + '\n');
