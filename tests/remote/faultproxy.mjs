#!/usr/bin/env node
// faultproxy.mjs: an HTTP reverse proxy on 127.0.0.1 in front of an upstream
// (nginx.sh, s3front.mjs, ...) that injects faults on demand and caps the
// bandwidth of all its connections together (--rate, a token bucket) or of
// each connection (--conn-rate).  Prints one JSON line when ready; runs until
// SIGTERM.  See README.md.
import http from 'node:http';
import https from 'node:https';
import {
  LOOPBACK, Logger, TokenBucket, onShutdown, parseArgs, parseRange, printReady, resolveRange, sleep,
} from './lib/common.mjs';
import {
  Faults, Stats, clientGone, handleControl, parseFaultArg, sendResponse, statusFaultResponse, stripHopByHop,
} from './lib/faults.mjs';

const USAGE = `usage: faultproxy.mjs --upstream http://127.0.0.1:PORT[/base] [--port N] [--log FILE]
                     [--fault SPEC]... [--latency-ms L] [--rate BYTES_PER_S] [--conn-rate BYTES_PER_S]
                     [--s3-errors] [--rewrite-host] [--watch-pid PID]
Prints {"port":N,"pid":N,"upstream":...} on stdout when ready; SIGTERM stops it.`;

const { flags } = parseArgs(process.argv.slice(2), {
  upstream: 'string',
  port: 'int',
  log: 'string',
  fault: 'list',
  'latency-ms': 'number',
  rate: 'int',
  'conn-rate': 'int',
  's3-errors': 'bool',
  'rewrite-host': 'bool',
  'watch-pid': 'int',
}, USAGE);

if (!flags.upstream) {
  process.stderr.write(`faultproxy: --upstream is required\n${USAGE}\n`);
  process.exit(2);
}
const up = new URL(flags.upstream);
if (up.protocol !== 'http:' && up.protocol !== 'https:') {
  process.stderr.write('faultproxy: --upstream must be http:// or https://\n');
  process.exit(2);
}
const upMod = up.protocol === 'https:' ? https : http;
const upPort = Number(up.port || (up.protocol === 'https:' ? 443 : 80));
const upBase = up.pathname.replace(/\/$/, '');
const agent = new upMod.Agent({ keepAlive: true, maxSockets: 512, rejectUnauthorized: false });

const log = new Logger(flags.log);
const faults = new Faults();
const stats = new Stats();
faults.latencyMs = flags['latency-ms'] ?? 0;
try {
  for (const f of flags.fault) faults.add(parseFaultArg(f));
} catch (e) {
  process.stderr.write(`faultproxy: --fault: ${e.message}\n`);
  process.exit(2);
}
const globalRate = new TokenBucket(flags.rate ?? 0);
let connRate = flags['conn-rate'] ?? 0;
const errorStyle = flags['s3-errors'] ? 's3' : 'text';

function upstreamRequest(method, path, headers, bodyStream) {
  return new Promise((resolve, reject) => {
    const r = upMod.request({ host: up.hostname, port: upPort, method, path: upBase + path, headers, agent }, resolve);
    r.on('error', reject);
    if (bodyStream) bodyStream.pipe(r);
    else r.end();
  });
}

async function upstreamSize(path, headers) {
  const h = { ...headers };
  for (const k of ['range', 'if-range', 'if-match', 'if-none-match', 'if-modified-since', 'if-unmodified-since', 'content-length']) delete h[k];
  const r = await upstreamRequest('HEAD', path, h, null);
  r.resume();
  if (r.statusCode !== 200 || r.headers['content-length'] === undefined) return null;
  return Number(r.headers['content-length']);
}

function connBucket(socket) {
  if (connRate <= 0) return null;
  if (!socket.larderBucket) socket.larderBucket = new TokenBucket(connRate);
  else if (socket.larderBucket.rate !== connRate) socket.larderBucket.setRate(connRate);
  return socket.larderBucket;
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
        state: () => ({ rate: globalRate.rate, conn_rate: connRate, upstream: flags.upstream }),
      },
    })) return;

    const q = req.url.indexOf('?');
    const path = q < 0 ? req.url : req.url.slice(0, q);
    const rangeHeader = req.headers.range;
    const info = {
      method: req.method,
      path,
      url: req.url,
      ranged: rangeHeader !== undefined,
      range: rangeHeader,
      conn: req.socket.larderId,
    };
    rec = stats.begin(info);
    stats.start(rec);
    const { latencyMs, fault } = faults.pick(info);
    if (latencyMs > 0) {
      stats.fault(rec, 'latency');
      await sleep(latencyMs);
    }
    if (fault) stats.fault(rec, fault.type);
    if (fault?.type === 'status') {
      req.resume();
      const r = statusFaultResponse(fault, errorStyle);
      stats.status(rec, r.status);
      outcome = `status ${r.status}`;
      await sendResponse(req, res, r, null, { onBytes: (n) => stats.bytes(rec, n) });
      return;
    }
    if (fault?.type === 'drop') {
      outcome = 'drop';
      if (fault.mode === 'rst') req.socket.resetAndDestroy();
      else req.socket.end();
      return;
    }

    if (fault?.type === 'endless') {
      req.resume();
      const h = { 'content-type': 'application/octet-stream', etag: '"endless"' };
      if (fault.content_range) h['content-range'] = String(fault.content_range);
      stats.status(rec, Number(fault.status));
      res.writeHead(Number(fault.status), h);
      const chunk = Buffer.alloc(65536, 0x41);
      const gone = clientGone(res);
      outcome = 'endless';
      while (!gone.aborted && !res.destroyed) {
        if (!res.write(chunk)) {
          await new Promise((resolve) => {
            res.once('drain', resolve);
            res.once('close', resolve);
          });
        }
        stats.bytes(rec, chunk.length);
      }
      outcome = 'endless-client-gone';
      return;
    }

    const headers = stripHopByHop(req.headers);
    delete headers.expect;
    if (flags['rewrite-host']) headers.host = up.host;

    // Range faults.
    let asked = null; // { start, end, size }
    let overrideCR = null;
    let corruptFallback = false;
    if (fault?.type === 'ignore_range') {
      delete headers.range;
      delete headers['if-range'];
    } else if (fault?.type === 'wrong_bytes') {
      const pr = parseRange(rangeHeader);
      const size = pr ? await upstreamSize(path + (q < 0 ? '' : req.url.slice(q)), headers) : null;
      const rr = size !== null ? resolveRange(pr, size) : null;
      if (rr && !rr.unsatisfiable) {
        asked = { ...rr, size };
        const len = rr.end - rr.start + 1;
        const shift = Math.abs(Number(fault.shift ?? len)) || len;
        let s = null;
        if (rr.end + shift <= size - 1) s = rr.start + shift;
        else if (rr.start - shift >= 0) s = rr.start - shift;
        if (s === null) {
          corruptFallback = true;
          headers.range = `bytes=${rr.start}-${rr.end}`;
        } else {
          headers.range = `bytes=${s}-${s + len - 1}`;
        }
        overrideCR = `bytes ${rr.start}-${rr.end}/${size}`;
        delete headers['if-range'];
      } else {
        outcome = 'wrong_bytes-not-applicable';
      }
    }

    const body = req.method === 'GET' || req.method === 'HEAD' ? null : req;
    if (!body) req.resume();
    let upRes;
    try {
      upRes = await upstreamRequest(req.method, req.url, headers, body);
    } catch (e) {
      outcome = `upstream: ${e.message}`;
      const text = `faultproxy: upstream ${flags.upstream}: ${e.message}\n`;
      stats.status(rec, 502);
      res.writeHead(502, { 'content-type': 'text/plain', 'content-length': Buffer.byteLength(text) });
      res.end(text);
      return;
    }
    res.on('close', () => upRes.destroy());
    const outHeaders = { ...upRes.headers };
    if (upRes.statusCode === 206) {
      if (asked) {
        outHeaders['content-range'] = overrideCR;
        outHeaders['content-length'] = String(asked.end - asked.start + 1);
      } else if (fault?.type === 'wrong_content_range') {
        const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(upRes.headers['content-range'] || '');
        const shift = Number(fault.shift ?? 1);
        if (fault.value) outHeaders['content-range'] = fault.value;
        else if (m) outHeaders['content-range'] = `bytes ${Number(m[1]) + shift}-${Number(m[2]) + shift}/${m[3]}`;
      }
    }
    if (fault?.type === 'strip_headers') {
      for (const k of String(fault.drop || '').split(',')) if (k.trim()) delete outHeaders[k.trim().toLowerCase()];
      if (fault.weak_etag && outHeaders.etag && !String(outHeaders.etag).startsWith('W/')) {
        outHeaders.etag = `W/${outHeaders.etag}`;
      }
    }
    stats.status(rec, upRes.statusCode);
    const bodyFault = fault && ['cut', 'short', 'stall', 'corrupt'].includes(fault.type)
      ? fault
      : corruptFallback ? { type: 'corrupt', at: 0 } : null;
    outcome = await sendResponse(req, res, {
      status: upRes.statusCode,
      headers: outHeaders,
      body: req.method === 'HEAD' ? null : upRes,
    }, bodyFault, {
      throttles: [globalRate, connBucket(req.socket)],
      onBytes: (n) => stats.bytes(rec, n),
    });
    if (req.method === 'HEAD') upRes.resume();
  } catch (e) {
    outcome = `error: ${e.message}`;
    if (!res.headersSent) {
      const text = `faultproxy: ${e.message}\n`;
      if (rec) stats.status(rec, 500);
      res.writeHead(500, { 'content-type': 'text/plain', 'content-length': Buffer.byteLength(text) });
      res.end(text);
    } else {
      res.destroy();
    }
  } finally {
    if (rec) {
      stats.end(rec);
      log.write({
        event: 'request',
        seq: rec.seq,
        conn: rec.conn,
        method: rec.method,
        url: rec.url,
        range: rec.range,
        status: rec.status,
        bytes: rec.bytes,
        fault: rec.fault,
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
  process.stderr.write(`faultproxy: listen: ${e.message}\n`);
  process.exit(1);
});
const port = server.address().port;

onShutdown(async (why) => {
  log.write({ event: 'stop', why });
  server.close();
  server.closeAllConnections();
  agent.destroy();
  log.close();
}, flags['watch-pid']);

const ready = {
  port,
  pid: process.pid,
  url: `http://${LOOPBACK}:${port}`,
  upstream: flags.upstream,
  rate: globalRate.rate,
  conn_rate: connRate,
  log: flags.log ?? null,
};
log.write({ event: 'ready', ...ready });
printReady(ready);
