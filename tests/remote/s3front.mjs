#!/usr/bin/env node
// s3front.mjs: an S3 endpoint on 127.0.0.1 for tests.  s3rver (a child
// process on an internal loopback port) stores the objects; this front
// verifies every request's SigV4 signature, fixes s3rver's Range handling,
// maps virtual-hosted requests to path-style, and injects faults on demand.
// Prints one JSON line when ready; runs until SIGTERM.  See README.md.
import http from 'node:http';
import net from 'node:net';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import {
  LOOPBACK, Logger, TokenBucket, onShutdown, parseArgs, parseRange, printReady, readBody,
  resolveRange, sleep,
} from './lib/common.mjs';
import {
  Faults, Stats, handleControl, parseFaultArg, s3ErrorXml, sendResponse, statusFaultResponse,
  stripHopByHop,
} from './lib/faults.mjs';
import { parseQuery, rawHeaderMap, uriEncode, verifyRequest } from './lib/sigv4.mjs';

const SELF = fileURLToPath(import.meta.url);

// ---------------------------------------------------------------------------
// The s3rver child (run as: s3front.mjs --s3rver-child CONFIG_JSON).  It
// needs NODE_OPTIONS=--openssl-legacy-provider: ListObjectsV2 continuation
// tokens are DES-encrypted, and OpenSSL 3 keeps DES in its legacy provider.
if (process.argv[2] === '--s3rver-child') {
  const cfg = JSON.parse(process.argv[3]);
  const require = createRequire(import.meta.url);
  const S3rver = require('s3rver');
  const server = new S3rver({
    address: LOOPBACK,
    port: 0,
    directory: cfg.dir,
    silent: true,
    vhostBuckets: false,
    allowMismatchedSignatures: true,
    configureBuckets: cfg.buckets.map((name) => ({ name })),
  });
  const addr = await server.run();
  process.send({ port: addr.port });
  // The front holds the IPC channel: when it goes (even by SIGKILL), so do we.
  process.on('disconnect', () => process.exit(0));
  process.on('SIGTERM', () => process.exit(0));
} else {
  await main();
}

function usage() {
  return `usage: s3front.mjs [--port N] [--bucket NAME]... [--access-key K] [--secret-key S]
                  [--session-token T] [--region R] [--data DIR] [--log FILE]
                  [--fault SPEC]... [--latency-ms L] [--rate BYTES_PER_S] [--conn-rate BYTES_PER_S]
                  [--host NAME]... [--max-skew-s N] [--no-require-content-sha256]
                  [--allow-anonymous] [--watch-pid PID] [--credentials-file FILE]
--credentials-file: JSON lines {access_key, secret_key, session_token,
expiration} (credfake.mjs writes them), read again for every request whose
key is not --access-key: such a request is verified with that line's
secret and token, and refused with ExpiredToken past its expiration.
Prints {"port":N,"pid":N,"endpoint":...} on stdout when ready; SIGTERM stops it.`;
}

async function main() {
  const { flags } = parseArgs(process.argv.slice(2), {
    port: 'int',
    bucket: 'list',
    'access-key': 'string',
    'secret-key': 'string',
    'session-token': 'string',
    region: 'string',
    data: 'string',
    log: 'string',
    fault: 'list',
    'latency-ms': 'number',
    rate: 'int',
    'conn-rate': 'int',
    host: 'list',
    'max-skew-s': 'number',
    'no-require-content-sha256': 'bool',
    'allow-anonymous': 'bool',
    'watch-pid': 'int',
    'credentials-file': 'string',
  }, usage());

  const cfg = {
    accessKey: flags['access-key'] ?? 'larder-test-key',
    secretKey: flags['secret-key'] ?? 'larder-test-secret',
    sessionToken: flags['session-token'] || null,
    region: flags.region ?? 'us-east-1',
    maxSkewS: flags['max-skew-s'] ?? 900,
    requireContentSha256: !flags['no-require-content-sha256'],
  };
  const extraHosts = new Set(flags.host.map((h) => h.toLowerCase()));
  const log = new Logger(flags.log);
  const faults = new Faults();
  const stats = new Stats();
  faults.latencyMs = flags['latency-ms'] ?? 0;
  try {
    for (const f of flags.fault) faults.add(parseFaultArg(f));
  } catch (e) {
    process.stderr.write(`s3front: --fault: ${e.message}\n`);
    process.exit(2);
  }
  const globalRate = new TokenBucket(flags.rate ?? 0);
  let connRate = flags['conn-rate'] ?? 0;

  // The data directory: given (kept), or a temporary one (removed at exit).
  let dataDir = flags.data;
  let tempData = false;
  if (!dataDir) {
    dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 's3front-'));
    tempData = true;
  }
  fs.mkdirSync(dataDir, { recursive: true });

  // Start s3rver.
  const nodeOptions = `${process.env.NODE_OPTIONS || ''} --openssl-legacy-provider`.trim();
  const child = spawn(process.execPath, [SELF, '--s3rver-child', JSON.stringify({ dir: dataDir, buckets: flags.bucket })], {
    env: { ...process.env, NODE_OPTIONS: nodeOptions },
    stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
  });
  const childOut = (d) => log.write({ event: 's3rver-output', text: d.toString() });
  child.stdout.on('data', childOut);
  child.stderr.on('data', (d) => {
    childOut(d);
    if (!flags.log) process.stderr.write(d);
  });
  let stopping = false;
  const s3port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('s3rver did not start within 30 s')), 30000);
    child.once('message', (m) => {
      clearTimeout(t);
      resolve(m.port);
    });
    child.once('exit', (code, sig) => {
      clearTimeout(t);
      reject(new Error(`s3rver exited (${code ?? sig}) before it was ready`));
    });
  }).catch((e) => {
    process.stderr.write(`s3front: ${e.message}\n`);
    process.exit(1);
  });
  child.on('exit', (code, sig) => {
    if (stopping) return;
    log.write({ event: 's3rver-exit', code, signal: sig });
    process.stderr.write(`s3front: s3rver exited (${code ?? sig}); stopping\n`);
    process.exit(1);
  });

  const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });

  function upstream(method, upath, headers, body) {
    return new Promise((resolve, reject) => {
      const r = http.request({ host: LOOPBACK, port: s3port, method, path: upath, headers, agent }, resolve);
      r.on('error', reject);
      r.end(body && body.length ? body : undefined);
    });
  }

  async function headObject(upath, headers) {
    const h = { ...headers };
    for (const k of ['range', 'if-match', 'if-none-match', 'if-modified-since', 'if-unmodified-since', 'content-length']) delete h[k];
    const r = await upstream('HEAD', upath, h, null);
    r.resume();
    await new Promise((resolve) => r.on('end', resolve).on('close', resolve));
    return r;
  }

  const isEndpointHost = (h) =>
    net.isIP(h) !== 0 || h === 'localhost' || h.startsWith('s3.') || /^s3-[^.]+\.amazonaws\.com$/.test(h) || extraHosts.has(h);

  // The bucket named by a virtual-hosted Host, or null for path-style.
  function bucketFromHost(hostHeader) {
    let h = (hostHeader || '').toLowerCase();
    if (h.startsWith('[')) return null; // an IPv6 literal
    h = h.replace(/:\d+$/, '').replace(/\.$/, '');
    if (!h || isEndpointHost(h) || !h.includes('.')) return null;
    for (let i = h.indexOf('.'); i > 0; i = h.indexOf('.', i + 1)) {
      if (isEndpointHost(h.slice(i + 1))) return h.slice(0, i);
    }
    return h.slice(0, h.indexOf('.'));
  }

  function sendError(res, rec, status, code, message, extra = {}, headers = {}) {
    const body = Buffer.from(s3ErrorXml(code, message, extra));
    if (rec) stats.status(rec, status);
    if (res.headersSent) return res.destroy();
    res.writeHead(status, { 'content-type': 'application/xml', 'content-length': body.length, ...headers });
    res.end(body);
  }

  let connSeq = 0;
  const server = http.createServer({ requestTimeout: 0 });
  server.keepAliveTimeout = 30000;
  server.on('connection', (s) => {
    s.larderId = ++connSeq;
    stats.connections++;
  });
  server.on('request', async (req, res) => {
    const t0 = performance.now();
    let rec = null;
    let outcome = 'ok';
    try {
      if (await handleControl(req, res, {
        faults,
        stats,
        log,
        extra: {
          apply(body) {
            if (body.rate !== undefined) globalRate.setRate(body.rate);
            if (body.conn_rate !== undefined) connRate = Number(body.conn_rate) || 0;
          },
          state: () => ({ rate: globalRate.rate, conn_rate: connRate }),
        },
      })) return;

      const q = req.url.indexOf('?');
      const rawPath = q < 0 ? req.url : req.url.slice(0, q);
      const rawQuery = q < 0 ? '' : req.url.slice(q + 1);
      if (!rawPath.startsWith('/')) {
        return sendError(res, null, 400, 'InvalidURI', "Couldn't parse the specified URI.");
      }
      const vbucket = bucketFromHost(req.headers.host);
      const s3Path = vbucket ? `/${vbucket}${rawPath === '/' ? '' : rawPath}` : rawPath;
      let bucket;
      let key;
      let decodedPath;
      try {
        const slash = s3Path.indexOf('/', 1);
        bucket = decodeURIComponent(slash < 0 ? s3Path.slice(1) : s3Path.slice(1, slash));
        key = slash < 0 ? '' : decodeURIComponent(s3Path.slice(slash + 1));
        decodedPath = `/${bucket}${slash < 0 ? '' : '/' + key}`;
      } catch {
        return sendError(res, null, 400, 'InvalidURI', "Couldn't parse the specified URI.");
      }
      const method = req.method;
      const rangeHeader = req.headers.range;
      const info = {
        method,
        path: decodedPath,
        url: decodedPath + (rawQuery ? `?${rawQuery}` : ''),
        ranged: rangeHeader !== undefined,
        range: rangeHeader,
        conn: req.socket.larderId,
      };
      rec = stats.begin(info);

      const hasBody = Number(req.headers['content-length'] || 0) > 0 || req.headers['transfer-encoding'] !== undefined;
      const body = hasBody ? await readBody(req) : null;

      if (!(flags['allow-anonymous'] && !req.headers.authorization)) {
        // A key handed out by credfake.mjs: its own secret and token.
        let reqCfg = cfg;
        const akid = /Credential=([^/,\s]+)\//.exec(req.headers.authorization || '')?.[1];
        if (akid && rec) rec.akid = akid;
        if (flags['credentials-file'] && akid && akid !== cfg.accessKey) {
          let entry = null;
          try {
            for (const line of fs.readFileSync(flags['credentials-file'], 'utf8').split('\n')) {
              if (!line.trim()) continue;
              const e = JSON.parse(line);
              if (e.access_key === akid) entry = e;
            }
          } catch { /* no file yet: no such key */ }
          if (entry) {
            if (entry.expiration && Date.parse(entry.expiration) <= Date.now()) {
              outcome = 'auth: ExpiredToken';
              return sendError(res, rec, 400, 'ExpiredToken', 'The provided token has expired.');
            }
            reqCfg = { ...cfg, accessKey: entry.access_key, secretKey: entry.secret_key, sessionToken: entry.session_token || null };
          }
        }
        const v = await verifyRequest(
          { method, rawPath, rawQuery, headers: rawHeaderMap(req.rawHeaders) },
          body,
          reqCfg,
        );
        if (!v.ok) {
          outcome = `auth: ${v.code}`;
          return sendError(res, rec, v.status, v.code, v.message, v.extra);
        }
      }

      const { latencyMs, fault } = faults.pick(info);
      if (latencyMs > 0) {
        stats.fault(rec, 'latency');
        await sleep(latencyMs);
      }
      if (fault) stats.fault(rec, fault.type);
      if (fault?.type === 'status') {
        const r = statusFaultResponse(fault, 's3');
        stats.status(rec, r.status);
        outcome = `status ${r.status}`;
        return await sendResponse(req, res, r, null, { onBytes: (n) => stats.bytes(rec, n) });
      }
      if (fault?.type === 'drop') {
        outcome = 'drop';
        const s = req.socket;
        if (fault.mode === 'rst') s.resetAndDestroy();
        else s.end();
        return;
      }

      // The request for s3rver: path-style, unsigned (s3rver lets anonymous
      // requests in), Range made explicit below.
      // The query goes on re-encoded the way it was verified (a "+" is a
      // plus here, where s3rver's parser would read a space).
      let upQuery;
      try {
        upQuery = parseQuery(rawQuery)
          .map(([k, v]) => (v === null ? uriEncode(k) : `${uriEncode(k)}=${uriEncode(v)}`))
          .join('&');
      } catch {
        outcome = 'bad-query';
        return sendError(res, rec, 400, 'InvalidArgument', 'Malformed percent-encoding in the query string.');
      }
      const upath = s3Path + (upQuery ? `?${upQuery}` : '');
      const uh = stripHopByHop(req.headers);
      for (const k of ['authorization', 'x-amz-security-token', 'range', 'expect', 'if-match', 'if-unmodified-since']) delete uh[k];
      uh.host = `${LOOPBACK}:${s3port}`;
      if (body) {
        uh['content-length'] = String(body.length);
        delete uh['transfer-encoding'];
      }

      const isObjectRead = (method === 'GET' || method === 'HEAD') && key !== '' && !rawQuery.split('&').some((p) => /^(uploadId|partNumber|acl|tagging)(=|$)/.test(p));
      let head = null;
      if (isObjectRead && (rangeHeader !== undefined || req.headers['if-match'] || req.headers['if-unmodified-since'])) {
        head = await headObject(upath, uh);
      }

      // Preconditions s3rver does not implement.
      if (head && head.statusCode === 200) {
        const etag = head.headers.etag;
        const im = req.headers['if-match'];
        if (im !== undefined) {
          const tags = im.split(',').map((s) => s.trim().replace(/^W\//, ''));
          if (!tags.includes('*') && !tags.includes(etag)) {
            outcome = 'precondition';
            return sendError(res, rec, 412, 'PreconditionFailed', 'At least one of the pre-conditions you specified did not hold', { Condition: 'If-Match' });
          }
        } else if (req.headers['if-unmodified-since']) {
          const since = Date.parse(req.headers['if-unmodified-since']);
          const lm = Date.parse(head.headers['last-modified']);
          if (Number.isFinite(since) && Number.isFinite(lm) && lm > since) {
            outcome = 'precondition';
            return sendError(res, rec, 412, 'PreconditionFailed', 'At least one of the pre-conditions you specified did not hold', { Condition: 'If-Unmodified-Since' });
          }
        }
      }

      // Range: parse and resolve here; s3rver gets an explicit "bytes=A-B"
      // and its answer is cut to the right length (it answers "bytes=-N"
      // with the first N+1 bytes, and "bytes=0-0" with the whole object).
      let range = null; // { start, end, size } of what the client asked
      let sendRange = null; // what s3rver is asked
      let overrideCR = null;
      let limit = null;
      let corruptFallback = false;
      if (isObjectRead && rangeHeader !== undefined && head && head.statusCode === 200) {
        const pr = parseRange(rangeHeader);
        const size = Number(head.headers['content-length']);
        if (pr) {
          const rr = resolveRange(pr, size);
          if (rr.unsatisfiable) {
            outcome = 'range-unsatisfiable';
            return sendError(res, rec, 416, 'InvalidRange', 'The requested range is not satisfiable',
              { RangeRequested: rangeHeader, ActualObjectSize: size }, { 'content-range': `bytes */${size}` });
          }
          range = { ...rr, size };
        }
      }
      if (range && fault?.type === 'ignore_range') {
        range = null;
      } else if (range) {
        const len = range.end - range.start + 1;
        sendRange = [range.start, range.end];
        overrideCR = `bytes ${range.start}-${range.end}/${range.size}`;
        limit = len;
        if (fault?.type === 'wrong_bytes') {
          const shift = Math.abs(Number(fault.shift ?? len)) || len;
          if (range.end + shift <= range.size - 1) sendRange = [range.start + shift, range.end + shift];
          else if (range.start - shift >= 0) sendRange = [range.start - shift, range.end - shift];
          else corruptFallback = true; // the range covers (nearly) everything: flip bytes instead
        } else if (fault?.type === 'wrong_content_range') {
          const shift = Number(fault.shift ?? 1);
          overrideCR = fault.value ?? `bytes ${range.start + shift}-${range.end + shift}/${range.size}`;
        }
      }
      if (sendRange) uh.range = `bytes=${sendRange[0]}-${sendRange[1]}`;

      const up = await upstream(method, upath, uh, body);
      const headers = { ...up.headers };
      let status = up.statusCode;
      if (range && status === 206) {
        headers['content-range'] = overrideCR;
        headers['content-length'] = String(limit);
      } else {
        limit = null;
      }
      stats.status(rec, status);
      const bodyFault = fault && ['cut', 'short', 'stall', 'corrupt'].includes(fault.type)
        ? fault
        : corruptFallback ? { type: 'corrupt', at: 0 } : null;
      const throttles = [globalRate];
      if (connRate > 0) {
        const sock = req.socket;
        if (!sock.larderBucket) sock.larderBucket = new TokenBucket(connRate);
        else if (sock.larderBucket.rate !== connRate) sock.larderBucket.setRate(connRate);
        throttles.push(sock.larderBucket);
      }
      outcome = await sendResponse(req, res, { status, headers, body: method === 'HEAD' ? null : up }, bodyFault, {
        limit,
        throttles,
        onBytes: (n) => stats.bytes(rec, n),
      });
      if (method === 'HEAD') up.resume();
    } catch (e) {
      outcome = `error: ${e.message}`;
      if (!res.headersSent) sendError(res, rec, 500, 'InternalError', `s3front: ${e.message}`);
      else res.destroy();
    } finally {
      if (rec) {
        log.write({
          event: 'request',
          seq: rec.seq,
          conn: rec.conn,
          method: rec.method,
          url: rec.url,
          host: req.headers.host,
          range: rec.range,
          status: rec.status,
          bytes: rec.bytes,
          fault: rec.fault,
          akid: rec.akid,
          outcome,
          ms: Math.round(performance.now() - t0),
        });
      }
    }
  });

  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(flags.port ?? 0, LOOPBACK, resolve);
  }).catch((e) => {
    process.stderr.write(`s3front: listen: ${e.message}\n`);
    child.kill('SIGTERM');
    process.exit(1);
  });
  const port = server.address().port;

  onShutdown(async (why) => {
    stopping = true;
    log.write({ event: 'stop', why });
    server.close();
    server.closeAllConnections();
    child.kill('SIGTERM');
    await new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)));
    if (tempData) fs.rmSync(dataDir, { recursive: true, force: true });
    log.close();
  }, flags['watch-pid']);

  const ready = {
    port,
    pid: process.pid,
    endpoint: `http://${LOOPBACK}:${port}`,
    region: cfg.region,
    access_key: cfg.accessKey,
    secret_key: cfg.secretKey,
    session_token: cfg.sessionToken,
    buckets: flags.bucket,
    data_dir: dataDir,
    s3rver_port: s3port,
    s3rver_pid: child.pid,
    log: flags.log ?? null,
  };
  log.write({ event: 'ready', ...ready });
  printReady(ready);
}
