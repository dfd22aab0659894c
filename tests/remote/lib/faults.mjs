// faults.mjs: fault injection, counters and the control endpoint shared by
// s3front.mjs and faultproxy.mjs.
//
// A fault is a rule: { type, count, skip, match fields, parameters }.  Each
// request (other than the /__ control paths) takes the first matching rule
// of an action type that still has count left; every matching "latency"
// rule adds its delay on top.  See README.md for the list of types.
import { once } from 'node:events';
import { sleep } from './common.mjs';

export const FAULT_TYPES = {
  status: { status: 503 },
  drop: {},
  cut: { after_bytes: 0, mode: 'rst' },
  short: { missing: null },
  stall: { seconds: 30, after_bytes: null, then: 'close' },
  latency: { ms: 100 },
  wrong_bytes: { shift: null },
  wrong_content_range: { shift: 1, value: null },
  ignore_range: {},
  corrupt: { at: null },
  // faultproxy only: pass the answer through without the headers named in
  // drop ("etag,last-modified"), and/or with its ETag made weak (W/"...").
  strip_headers: { drop: null, weak_etag: false },
  // faultproxy only: answer status (200 or 206, with content_range if
  // given) with no length and a body that never ends, until the client
  // goes away.
  endless: { status: 200, content_range: null },
};
// Types that only make sense for a request with a Range header.
const RANGED_TYPES = new Set(['wrong_bytes', 'wrong_content_range', 'ignore_range']);
const MATCH_KEYS = ['path', 'prefix', 'regex', 'method', 'ranged'];

// Parses a fault given on the command line: JSON ('{"type":"cut",...}') or
// the compact form "type[,key=value...]" (e.g. "status,status=500,count=2").
export function parseFaultArg(text) {
  text = text.trim();
  if (text.startsWith('{') || text.startsWith('[')) return JSON.parse(text);
  const [type, ...kvs] = text.split(',');
  const rule = { type: type.trim() };
  for (const kv of kvs) {
    const eq = kv.indexOf('=');
    if (eq < 0) throw new Error(`fault "${text}": expected key=value, got "${kv}"`);
    const k = kv.slice(0, eq).trim();
    const v = kv.slice(eq + 1).trim();
    rule[k] = /^-?\d+(\.\d+)?$/.test(v) ? Number(v) : v === 'true' ? true : v === 'false' ? false : v;
  }
  return rule;
}

export class Faults {
  constructor() {
    this.rules = [];
    this.nextId = 1;
    this.latencyMs = 0;
  }

  // Validates and adds one rule (or an array of them); returns the ids.
  add(spec) {
    if (Array.isArray(spec)) return spec.flatMap((s) => this.add(s));
    if (!spec || typeof spec !== 'object') throw new Error('a fault must be a JSON object');
    let { type } = spec;
    // Shorthands: {"type":"503"} or {"type":"slowdown"} are status faults.
    if (/^\d{3}$/.test(String(type))) {
      spec = { ...spec, status: Number(type) };
      type = 'status';
    } else if (type === 'slowdown') {
      spec = { status: 503, ...spec };
      type = 'status';
    }
    const defaults = FAULT_TYPES[type];
    if (!defaults) {
      throw new Error(`unknown fault type "${spec.type}" (known: ${Object.keys(FAULT_TYPES).join(', ')})`);
    }
    const rule = { ...defaults, ...spec, type, id: this.nextId++, applied: 0 };
    if (rule.count === undefined || rule.count === null) rule.count = type === 'latency' ? -1 : 1;
    if (rule.count === 'forever' || rule.count === 'all') rule.count = -1;
    rule.count = Number(rule.count);
    rule.skip = Number(rule.skip || 0);
    if (!Number.isInteger(rule.count) || rule.count < -1) throw new Error('count must be an integer >= -1');
    if (RANGED_TYPES.has(type) && rule.ranged === undefined) rule.ranged = true;
    if (rule.regex !== undefined) {
      try {
        rule._re = new RegExp(rule.regex);
      } catch (e) {
        throw new Error(`bad regex: ${e.message}`);
      }
    }
    if (type === 'status') {
      rule.status = Number(rule.status);
      if (!(rule.status >= 100 && rule.status <= 599)) throw new Error('status must be 100..599');
    }
    for (const k of ['after_bytes', 'missing', 'seconds', 'ms', 'shift', 'at']) {
      if (rule[k] !== null && rule[k] !== undefined && !Number.isFinite(Number(rule[k]))) {
        throw new Error(`${k} must be a number`);
      }
    }
    this.rules.push(rule);
    return [rule.id];
  }

  remove(id) {
    const n = this.rules.length;
    this.rules = this.rules.filter((r) => r.id !== Number(id));
    return n !== this.rules.length;
  }

  clear() {
    this.rules = [];
  }

  static matches(rule, info) {
    if (rule.method && String(rule.method).toUpperCase() !== info.method) return false;
    if (rule.path !== undefined && rule.path !== info.path) return false;
    if (rule.prefix !== undefined && !info.path.startsWith(rule.prefix)) return false;
    if (rule._re && !rule._re.test(info.url)) return false;
    if (rule.ranged !== undefined && Boolean(rule.ranged) !== info.ranged) return false;
    return true;
  }

  static consume(rule) {
    if (rule.count === 0) return false;
    if (rule.skip > 0) {
      rule.skip--;
      return false;
    }
    if (rule.count > 0) rule.count--;
    rule.applied++;
    return true;
  }

  // info: { method, path (no query), url (path and query), ranged }.
  // Returns { latencyMs, fault (a rule or null) }; counts are consumed.
  pick(info) {
    let latencyMs = this.latencyMs;
    let fault = null;
    for (const rule of this.rules) {
      if (rule.count === 0 || !Faults.matches(rule, info)) continue;
      if (rule.type === 'latency') {
        if (Faults.consume(rule)) latencyMs += Number(rule.ms);
      } else if (!fault && Faults.consume(rule)) {
        fault = rule;
      }
    }
    return { latencyMs, fault };
  }

  state() {
    return {
      latency_ms: this.latencyMs,
      faults: this.rules.map(({ _re, ...r }) => ({ ...r, remaining: r.count })),
    };
  }
}

export class Stats {
  constructor(keepRecent = 2000) {
    this.keepRecent = keepRecent;
    this.reset();
  }
  reset() {
    this.requests = 0;
    this.bytes_sent = 0;
    this.ranged_requests = 0;
    this.by_status = {};
    this.by_method = {};
    this.by_path = {};
    this.faults = {};
    this.connections = 0;
    // Requests being answered now, and the most at once since the reset
    // (end() is the server's to call; s3front does not).
    this.active = 0;
    this.peak_active = 0;
    this.gen = (this.gen || 0) + 1; // requests begun before a reset end uncounted
    this.recent = [];
    this.seq = 0;
  }
  // Called when a request starts; returns its record (filled in later).
  begin(info) {
    this.requests++;
    if (info.ranged) this.ranged_requests++;
    this.by_method[info.method] = (this.by_method[info.method] || 0) + 1;
    const p = (this.by_path[info.path] ||= { requests: 0, bytes: 0 });
    p.requests++;
    const rec = {
      seq: ++this.seq,
      t: new Date().toISOString(),
      method: info.method,
      path: info.path,
      url: info.url,
      range: info.range || null,
      status: null,
      bytes: 0,
      fault: null,
      conn: info.conn,
    };
    this.recent.push(rec);
    if (this.recent.length > this.keepRecent) this.recent.shift();
    return rec;
  }
  // Counts rec among the requests answered at once, until end(rec).
  start(rec) {
    rec.active = this.gen;
    this.active++;
    if (this.active > this.peak_active) this.peak_active = this.active;
  }
  end(rec) {
    if (rec.active === this.gen) this.active--;
    rec.active = 0;
  }
  status(rec, status) {
    rec.status = status;
    this.by_status[status] = (this.by_status[status] || 0) + 1;
  }
  bytes(rec, n) {
    rec.bytes += n;
    this.bytes_sent += n;
    const p = this.by_path[rec.path];
    if (p) p.bytes += n;
  }
  fault(rec, type) {
    rec.fault = rec.fault ? `${rec.fault}+${type}` : type;
    this.faults[type] = (this.faults[type] || 0) + 1;
  }
  json() {
    return {
      requests: this.requests,
      bytes_sent: this.bytes_sent,
      ranged_requests: this.ranged_requests,
      connections: this.connections,
      active: this.active,
      peak_active: this.peak_active,
      by_status: this.by_status,
      by_method: this.by_method,
      by_path: this.by_path,
      faults: this.faults,
    };
  }
}

function sendJson(res, status, obj) {
  const body = JSON.stringify(obj) + '\n';
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

// Serves the control paths; returns true when req was one of them.
//   GET  /__health            {"ok":true}
//   GET  /__stats             counters (POST /__stats/reset clears them)
//   GET  /__requests          the most recent requests, oldest first
//   GET  /__control           the fault rules and settings
//   POST /__control           {"add": rule|[rules], "remove": id, "clear": true,
//                              "latency_ms": L, "reset_stats": true, ...extra}
// extra: { apply(body) for server-specific settings, state() for them }.
export async function handleControl(req, res, { faults, stats, extra, log }) {
  const url = req.url || '/';
  const path = url.split('?')[0];
  if (!path.startsWith('/__')) return false;
  const known = ['/__health', '/__stats', '/__stats/reset', '/__requests', '/__control'];
  if (!known.includes(path)) return false;
  const state = () => ({ ok: true, ...faults.state(), ...(extra?.state ? extra.state() : {}) });
  try {
    if (path === '/__health') return sendJson(res, 200, { ok: true }), true;
    if (path === '/__stats' && req.method === 'GET') return sendJson(res, 200, stats.json()), true;
    if (path === '/__stats/reset' && req.method === 'POST') {
      stats.reset();
      return sendJson(res, 200, { ok: true }), true;
    }
    if (path === '/__requests' && req.method === 'GET') return sendJson(res, 200, { requests: stats.recent }), true;
    if (path === '/__control' && req.method === 'GET') return sendJson(res, 200, state()), true;
    if (path === '/__control' && req.method === 'POST') {
      const chunks = [];
      for await (const c of req) chunks.push(c);
      const text = Buffer.concat(chunks).toString('utf8').trim();
      const body = text ? JSON.parse(text) : {};
      if (typeof body !== 'object' || body === null || Array.isArray(body)) {
        throw new Error('the control body must be a JSON object');
      }
      let added = [];
      if (body.clear) faults.clear();
      if (body.reset_stats) stats.reset();
      if (body.remove !== undefined) faults.remove(body.remove);
      if (body.latency_ms !== undefined) {
        const l = Number(body.latency_ms);
        if (!Number.isFinite(l) || l < 0) throw new Error('latency_ms must be a number >= 0');
        faults.latencyMs = l;
      }
      if (extra?.apply) extra.apply(body);
      if (body.add !== undefined) added = faults.add(body.add);
      log?.write({ event: 'control', body });
      sendJson(res, 200, { ...state(), added });
      return true;
    }
    sendJson(res, 405, { ok: false, error: `${req.method} not allowed on ${path}` });
  } catch (e) {
    sendJson(res, 400, { ok: false, error: e.message });
  }
  return true;
}

const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'te',
  'trailer',
  'upgrade',
]);

export function stripHopByHop(headers) {
  const out = {};
  for (const [k, v] of Object.entries(headers)) if (!HOP_BY_HOP.has(k.toLowerCase())) out[k] = v;
  return out;
}

// Resolves when res can take more data, or when the client went away.
function writeChunk(res, buf) {
  if (res.destroyed || res.writableEnded) return Promise.resolve(false);
  if (res.write(buf)) return Promise.resolve(true);
  return new Promise((resolve) => {
    const done = (v) => {
      res.off('drain', onDrain);
      res.off('close', onClose);
      resolve(v);
    };
    const onDrain = () => done(true);
    const onClose = () => done(false);
    res.on('drain', onDrain);
    res.on('close', onClose);
  });
}

// Resolves once what was written so far has been handed to the kernel.
function flushed(res) {
  return new Promise((resolve) => {
    if (res.destroyed) return resolve();
    res.write(Buffer.alloc(0), () => resolve());
  });
}

function closeSocket(res, mode) {
  const s = res.socket;
  if (!s || s.destroyed) return;
  if (mode === 'rst' && typeof s.resetAndDestroy === 'function') s.resetAndDestroy();
  else if (mode === 'fin') s.end();
  else s.destroy();
}

// A signal that aborts when the client connection closes.
export function clientGone(res) {
  const ac = new AbortController();
  res.on('close', () => ac.abort());
  return ac.signal;
}

/*
 * Sends a response: status, headers, then the body (a Readable, a Buffer or
 * null), applying the fault (if any) and the bandwidth caps.
 *   opts.limit: send at most this many body bytes, then end normally (the
 *               rest of the body is dropped).
 *   opts.throttles: TokenBuckets every byte must pass.
 *   opts.onBytes(n): called for each piece sent.
 * Returns a string naming how it ended ("ok", "cut", "short", "stall-close",
 * "client-gone").
 */
export async function sendResponse(req, res, { status, headers, body }, fault, opts = {}) {
  const gone = clientGone(res);
  const throttles = (opts.throttles || []).filter((t) => t && t.rate > 0);
  const destroyBody = () => {
    if (body && typeof body.destroy === 'function') body.destroy();
  };
  headers = stripHopByHop(headers);
  let length = headers['content-length'] !== undefined ? Number(headers['content-length']) : null;
  if (opts.limit !== undefined && opts.limit !== null) {
    length = length === null ? opts.limit : Math.min(length, opts.limit);
    headers['content-length'] = String(length);
  }

  // Where in the body something happens: [offset, action].
  let stopAt = null;
  let stopMode = null;
  let stallAt = null;
  let corruptAt = null;
  if (fault) {
    if (fault.type === 'stall') {
      if (fault.after_bytes === null || fault.after_bytes === undefined) {
        await sleep(Number(fault.seconds) * 1000, gone);
        if (gone.aborted) return destroyBody(), 'client-gone';
        if (fault.then !== 'continue') {
          destroyBody();
          closeSocket(res, fault.then === 'rst' ? 'rst' : 'destroy');
          return 'stall-close';
        }
      } else {
        stallAt = Number(fault.after_bytes);
      }
    } else if (fault.type === 'cut') {
      stopAt = Number(fault.after_bytes) || 0;
      stopMode = fault.mode === 'fin' ? 'fin' : 'rst';
    } else if (fault.type === 'short') {
      if (length !== null && length > 0) {
        const missing = fault.missing === null || fault.missing === undefined
          ? Math.max(1, Math.floor(length / 2))
          : Math.min(length, Math.max(1, Number(fault.missing)));
        stopAt = length - missing;
        stopMode = 'fin';
      }
    } else if (fault.type === 'corrupt') {
      if (length !== null && length > 0) {
        corruptAt = fault.at === null || fault.at === undefined ? Math.floor(length / 2) : Number(fault.at);
      }
    }
  }

  res.writeHead(status, headers);
  if (!body || req.method === 'HEAD' || length === 0) {
    if (stopAt !== null) {
      await flushed(res);
      closeSocket(res, stopMode);
      destroyBody();
      return stopMode === 'fin' ? 'short' : 'cut';
    }
    res.end();
    destroyBody();
    return 'ok';
  }

  let sent = 0;
  const limit = length;
  const iter = Buffer.isBuffer(body) ? [body] : body;
  try {
    for await (let chunk of iter) {
      while (chunk.length > 0) {
        if (gone.aborted) return destroyBody(), 'client-gone';
        // The next boundary: a stop, a stall, the limit.
        let room = chunk.length;
        if (limit !== null) room = Math.min(room, limit - sent);
        if (stopAt !== null) room = Math.min(room, stopAt - sent);
        if (stallAt !== null && stallAt >= sent) room = Math.min(room, stallAt - sent);
        if (throttles.length) room = Math.min(room, ...throttles.map((t) => t.piece));
        if (stallAt !== null && sent === stallAt) {
          stallAt = null;
          await flushed(res);
          await sleep(Number(fault.seconds) * 1000, gone);
          if (gone.aborted) return destroyBody(), 'client-gone';
          if (fault.then !== 'continue') {
            destroyBody();
            closeSocket(res, fault.then === 'rst' ? 'rst' : 'destroy');
            return 'stall-close';
          }
          continue;
        }
        if (stopAt !== null && sent === stopAt) {
          await flushed(res);
          // Give the client a moment to read what was sent before a reset.
          if (stopMode === 'rst') await sleep(50);
          closeSocket(res, stopMode);
          destroyBody();
          return stopMode === 'fin' ? 'short' : 'cut';
        }
        if (limit !== null && sent >= limit) break;
        let piece = chunk.subarray(0, room);
        chunk = chunk.subarray(room);
        for (const t of throttles) await t.take(piece.length);
        if (corruptAt !== null && corruptAt >= sent && corruptAt < sent + piece.length) {
          piece = Buffer.from(piece);
          piece[corruptAt - sent] ^= 0xff;
          corruptAt = null;
        }
        sent += piece.length;
        opts.onBytes?.(piece.length);
        if (!(await writeChunk(res, piece))) return destroyBody(), 'client-gone';
      }
      if (limit !== null && sent >= limit) break;
    }
  } catch (e) {
    // The upstream broke mid-body: pass the breakage on.
    closeSocket(res, 'destroy');
    return `upstream-error: ${e.message}`;
  }
  if (stallAt !== null && sent === stallAt) {
    await flushed(res);
    await sleep(Number(fault.seconds) * 1000, gone);
    if (gone.aborted) return destroyBody(), 'client-gone';
    if (fault.then !== 'continue') {
      destroyBody();
      closeSocket(res, fault.then === 'rst' ? 'rst' : 'destroy');
      return 'stall-close';
    }
  }
  if (stopAt !== null && sent === stopAt) {
    await flushed(res);
    if (stopMode === 'rst') await sleep(50);
    closeSocket(res, stopMode);
    destroyBody();
    return stopMode === 'fin' ? 'short' : 'cut';
  }
  destroyBody();
  if (limit !== null && sent < limit) {
    // The upstream sent less than it announced: close, do not pad.
    closeSocket(res, 'fin');
    return 'upstream-short';
  }
  res.end();
  await once(res, 'finish').catch(() => {});
  return 'ok';
}

// The body for an injected status, S3 style or plain text.
export const S3_ERROR_CODES = {
  400: ['BadRequest', 'An error occurred when parsing the HTTP request.'],
  403: ['AccessDenied', 'Access Denied'],
  404: ['NoSuchKey', 'The specified key does not exist.'],
  408: ['RequestTimeout', 'Your socket connection to the server was not read from or written to within the timeout period.'],
  429: ['SlowDown', 'Please reduce your request rate.'],
  500: ['InternalError', 'We encountered an internal error. Please try again.'],
  501: ['NotImplemented', 'A header you provided implies functionality that is not implemented.'],
  502: ['BadGateway', 'Bad gateway.'],
  503: ['SlowDown', 'Please reduce your request rate.'],
  504: ['GatewayTimeout', 'Gateway timeout.'],
};

function xmlEscape(s) {
  return String(s).replace(/[<>&'"]/g, (c) => ({ '<': '&lt;', '>': '&gt;', '&': '&amp;', "'": '&apos;', '"': '&quot;' })[c]);
}

let requestCounter = 0;
export function s3ErrorXml(code, message, extra = {}) {
  const fields = Object.entries(extra)
    .filter(([, v]) => v !== undefined && v !== null)
    .map(([k, v]) => `<${k}>${xmlEscape(v)}</${k}>`)
    .join('');
  const rid = (Date.now().toString(16) + (++requestCounter).toString(16)).toUpperCase().padStart(16, '0');
  return (
    '<?xml version="1.0" encoding="UTF-8"?>\n' +
    `<Error><Code>${xmlEscape(code)}</Code><Message>${xmlEscape(message)}</Message>${fields}` +
    `<RequestId>${rid}</RequestId><HostId>s3front</HostId></Error>`
  );
}

export function statusFaultResponse(rule, style) {
  const headers = {};
  if (rule.retry_after !== undefined) headers['retry-after'] = String(rule.retry_after);
  // Extra headers: {"headers":{"x-big":"..."}}.
  if (rule.headers && typeof rule.headers === 'object') {
    for (const [k, v] of Object.entries(rule.headers)) headers[k.toLowerCase()] = String(v);
  }
  // A redirect: {"type":"status","status":302,"location":"http://..."}.
  if (rule.location !== undefined) headers.location = String(rule.location);
  let body;
  if (rule.body !== undefined) {
    body = String(rule.body);
    headers['content-type'] = 'text/plain';
  } else if (style === 's3') {
    const [code, message] = S3_ERROR_CODES[rule.status] || ['InjectedError', 'Injected error.'];
    body = s3ErrorXml(rule.code || code, rule.message || message);
    headers['content-type'] = 'application/xml';
  } else {
    body = `injected ${rule.status}\n`;
    headers['content-type'] = 'text/plain';
  }
  headers['content-length'] = String(Buffer.byteLength(body));
  return { status: rule.status, headers, body: Buffer.from(body) };
}
