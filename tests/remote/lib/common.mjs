// common.mjs: what the loopback test servers (s3front.mjs, faultproxy.mjs)
// share: flag parsing, the ready line, the log file, shutdown on SIGTERM,
// and the token buckets behind the bandwidth caps.
import fs from 'node:fs';

export const LOOPBACK = '127.0.0.1';

// Parses argv into { flags, positional }.  spec maps a flag name to its kind:
// 'string', 'int', 'number', 'bool' or 'list' (repeatable string).  Both
// "--name value" and "--name=value" are accepted; unknown flags are errors.
export function parseArgs(argv, spec, usage) {
  const flags = {};
  const positional = [];
  for (const [name, kind] of Object.entries(spec)) {
    if (kind === 'list') flags[name] = [];
    else if (kind === 'bool') flags[name] = false;
  }
  const fail = (msg) => {
    process.stderr.write(`${msg}\n${usage}\n`);
    process.exit(2);
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '-h' || a === '--help') {
      process.stdout.write(`${usage}\n`);
      process.exit(0);
    }
    if (!a.startsWith('--')) {
      positional.push(a);
      continue;
    }
    let name = a.slice(2);
    let value;
    const eq = name.indexOf('=');
    if (eq >= 0) {
      value = name.slice(eq + 1);
      name = name.slice(0, eq);
    }
    const kind = spec[name];
    if (!kind) fail(`unknown flag --${name}`);
    if (kind === 'bool') {
      flags[name] = value === undefined ? true : !/^(0|false|no)$/i.test(value);
      continue;
    }
    if (value === undefined) {
      if (i + 1 >= argv.length) fail(`--${name} needs a value`);
      value = argv[++i];
    }
    if (kind === 'int' || kind === 'number') {
      const n = kind === 'int' ? parseSize(value) : Number(value);
      if (!Number.isFinite(n)) fail(`--${name}: not a number: ${value}`);
      flags[name] = n;
    } else if (kind === 'list') {
      flags[name].push(value);
    } else {
      flags[name] = value;
    }
  }
  return { flags, positional };
}

// "100", "64k", "1.5m", "2g" (powers of 1024; a trailing "b" or "/s" is
// ignored).  Returns NaN when it is not such a size.
export function parseSize(v) {
  if (typeof v === 'number') return v;
  const m = /^\s*(-?[0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?(\/s)?\s*$/i.exec(String(v));
  if (!m) return NaN;
  const mult = { '': 1, k: 1024, m: 1024 ** 2, g: 1024 ** 3, t: 1024 ** 4 }[m[2].toLowerCase()];
  return Math.round(Number(m[1]) * mult);
}

// One JSON line per event into the log file (append), or nowhere.
export class Logger {
  constructor(file) {
    this.fd = file ? fs.openSync(file, 'a') : null;
  }
  write(obj) {
    if (this.fd === null) return;
    const line = JSON.stringify({ t: new Date().toISOString(), ...obj }) + '\n';
    try {
      fs.writeSync(this.fd, line);
    } catch {
      /* a full disk must not take the server down */
    }
  }
  close() {
    if (this.fd !== null) fs.closeSync(this.fd);
    this.fd = null;
  }
}

// Prints the ready line: exactly one JSON object on one line on stdout.
export function printReady(obj) {
  process.stdout.write(JSON.stringify({ port: obj.port, pid: process.pid, ...obj }) + '\n');
}

// Runs cleanup once on SIGTERM/SIGINT/SIGHUP (or when --watch-pid's process
// is gone), then exits with status 0.
export function onShutdown(cleanup, watchPid) {
  let done = false;
  const stop = async (why) => {
    if (done) return;
    done = true;
    try {
      await Promise.race([cleanup(why), new Promise((r) => setTimeout(r, 5000))]);
    } finally {
      process.exit(0);
    }
  };
  for (const sig of ['SIGTERM', 'SIGINT', 'SIGHUP']) process.on(sig, () => stop(sig));
  if (watchPid) {
    const t = setInterval(() => {
      try {
        process.kill(watchPid, 0);
      } catch (e) {
        if (e.code === 'ESRCH') stop('watch-pid');
      }
    }, 500);
    t.unref();
  }
  return stop;
}

// A token bucket: take(n) resolves once n bytes may be sent.  Waiters are
// served in order, so connections sharing one bucket share its rate fairly
// (callers take at most `piece` bytes at a time).  rate 0 means unlimited.
export class TokenBucket {
  constructor(rate) {
    this.queue = [];
    this.timer = null;
    this.setRate(rate);
  }
  setRate(rate) {
    this.rate = Math.max(0, Number(rate) || 0);
    // A burst of 1/50 s of traffic (at least 16 KiB): smooth at every rate.
    this.burst = Math.max(16384, Math.floor(this.rate / 50));
    this.piece = Math.min(this.burst, 1 << 20);
    this.tokens = Math.min(this.tokens ?? this.burst, this.burst);
    this.last = performance.now();
    if (this.rate === 0) {
      for (const w of this.queue.splice(0)) w.resolve();
    }
    this.pump();
  }
  refill() {
    const now = performance.now();
    this.tokens = Math.min(this.burst, this.tokens + ((now - this.last) / 1000) * this.rate);
    this.last = now;
  }
  take(n) {
    if (this.rate === 0) return Promise.resolve();
    return new Promise((resolve) => {
      this.queue.push({ n: Math.min(n, this.burst), resolve });
      this.pump();
    });
  }
  pump() {
    if (this.timer || this.rate === 0) return;
    this.refill();
    while (this.queue.length && this.tokens >= this.queue[0].n) {
      const w = this.queue.shift();
      this.tokens -= w.n;
      w.resolve();
    }
    if (this.queue.length) {
      const need = this.queue[0].n - this.tokens;
      const ms = Math.max(1, Math.ceil((need / this.rate) * 1000));
      this.timer = setTimeout(() => {
        this.timer = null;
        this.pump();
      }, ms);
    }
  }
}

// Reads a whole request body (up to limit bytes) into a Buffer.
export function readBody(req, limit = 2 ** 31 - 1) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let n = 0;
    req.on('data', (c) => {
      n += c.length;
      if (n > limit) {
        reject(Object.assign(new Error('request body too large'), { code: 'E2BIG' }));
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

export function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (!ms || ms <= 0) return resolve();
    const t = setTimeout(resolve, ms);
    if (signal) signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
  });
}

// Parses a single "bytes=A-B" / "bytes=A-" / "bytes=-N" Range header value.
// Returns null for anything else (absent, other units, several ranges,
// malformed, or A > B), which a server may treat as "no Range".
export function parseRange(value) {
  if (typeof value !== 'string') return null;
  const m = /^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$/i.exec(value);
  if (!m || (m[1] === '' && m[2] === '')) return null;
  if (m[1] === '') return { suffix: Number(m[2]) };
  const first = Number(m[1]);
  const last = m[2] === '' ? null : Number(m[2]);
  if (last !== null && last < first) return null;
  return { first, last };
}

// Resolves a parsed range against an object size: { start, end } (inclusive)
// or { unsatisfiable: true }.
export function resolveRange(r, size) {
  if (r.suffix !== undefined) {
    if (r.suffix === 0 || size === 0) return { unsatisfiable: true };
    return { start: Math.max(0, size - r.suffix), end: size - 1 };
  }
  if (r.first >= size) return { unsatisfiable: true };
  return { start: r.first, end: r.last === null ? size - 1 : Math.min(r.last, size - 1) };
}
