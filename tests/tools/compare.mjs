#!/usr/bin/env node
// compare.mjs: compares larderctl's `cat` output with DuckDB's JSON rendering
// of the same Parquet file, row by row and field by field.
//
// Usage:
//   node tests/tools/compare.mjs --fields FIELDS.json --ours OURS.jsonl \
//        --duckdb DUCK.jsonl [--label NAME] [--max-diffs N]
//
// FIELDS.json is the "fields" array of `larderctl inspect --json` (the whole
// inspect object is accepted too).  The comparison is driven by our field
// types: DuckDB's rendering is normalized towards ours type by type, through
// lists, structs and maps.  Both files are streamed line by line.
//
// Exit status: 0 when every row and field agrees, 1 on any difference (the
// first few are printed with row number, field path and both values), 2 on a
// usage or I/O error.  Values that cannot be compared faithfully are never
// passed silently: they are counted and printed as "skip:" lines, and
// comparisons made at a coarser precision than ours are printed as "note:".

import fs from 'node:fs';
import readline from 'node:readline';
import { parse, stringify, JsonNumber, JsonObject } from './json-lossless.mjs';

// ---------------------------------------------------------------------------
// Numbers

// Parses a decimal literal (optionally with an exponent) into {m, e} with
// value m * 10^e, m a BigInt; null when it is not one.
const DEC_RE = /^([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$/;
export function parseDecimal(text) {
  const m = DEC_RE.exec(text);
  if (!m || (m[2] === '' && (m[3] === undefined || m[3] === ''))) return null;
  const frac = m[3] ?? '';
  let mant = BigInt((m[2] || '0') + frac);
  if (m[1] === '-') mant = -mant;
  const e = (m[4] ? parseInt(m[4], 10) : 0) - frac.length;
  return { m: mant, e };
}

export function decimalEqual(a, b) {
  const x = parseDecimal(a);
  const y = parseDecimal(b);
  if (!x || !y) return false;
  if (x.e === y.e) return x.m === y.m;
  if (x.e > y.e) return x.m * 10n ** BigInt(x.e - y.e) === y.m;
  return y.m * 10n ** BigInt(y.e - x.e) === x.m;
}

function numText(v) {
  if (v instanceof JsonNumber) return v.raw;
  return null;
}

// Our float rendering: a JSON number, or the strings NaN / Infinity / -Infinity.
function oursFloat(v) {
  if (v instanceof JsonNumber) return Number(v.raw);
  if (v === 'NaN') return NaN;
  if (v === 'Infinity') return Infinity;
  if (v === '-Infinity') return -Infinity;
  return undefined;
}

// DuckDB's float rendering: a JSON number or the bare tokens NaN / Infinity.
function duckFloat(v) {
  if (v instanceof JsonNumber) return Number(v.raw);
  if (v === 'NaN' || v === 'nan') return NaN;
  if (v === 'Infinity' || v === 'inf') return Infinity;
  if (v === '-Infinity' || v === '-inf') return -Infinity;
  return undefined;
}

function sameFloat(a, b) {
  if (Number.isNaN(a) && Number.isNaN(b)) return true;
  return Object.is(a, b);
}

// Rounds a double to the nearest IEEE half-precision value (ties to even).
export function f16round(x) {
  if (!Number.isFinite(x) || x === 0) return x;
  const s = x < 0 ? -1 : 1;
  const a = Math.abs(x);
  if (a >= 65520) return s * Infinity;
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e--;
  if (2 ** (e + 1) <= a) e++;
  if (e < -14) e = -14;
  const q = 2 ** (e - 10);
  const r = a / q;
  let fl = Math.floor(r);
  const diff = r - fl;
  if (diff > 0.5 || (diff === 0.5 && fl % 2 === 1)) fl++;
  return s * fl * q;
}

// ---------------------------------------------------------------------------
// Dates and times (proleptic Gregorian, astronomical years)

function daysFromCivil(y, m, d) {
  y -= m <= 2 ? 1 : 0;
  const era = Math.floor(y / 400);
  const yoe = y - era * 400;
  const doy = Math.floor((153 * (m + (m > 2 ? -3 : 9)) + 2) / 5) + d - 1;
  const doe = yoe * 365 + Math.floor(yoe / 4) - Math.floor(yoe / 100) + doy;
  return era * 146097 + doe - 719468;
}

const NS_PER_SEC = 1000000000n;
const NS_PER_DAY = 86400n * NS_PER_SEC;

function fracNs(frac) {
  if (!frac) return 0n;
  return BigInt((frac + '000000000').slice(0, 9));
}

// Our DATE: YYYY-MM-DD (an extended year may carry a sign).
const OURS_DATE = /^([+-]?\d{4,})-(\d{2})-(\d{2})$/;
// DuckDB's DATE: YYYY-MM-DD, with " (BC)" for years before 1.
const DUCK_DATE = /^(\d{4,})-(\d{2})-(\d{2})( \(BC\))?$/;

function oursDateDays(s) {
  const m = typeof s === 'string' && OURS_DATE.exec(s);
  if (!m) return null;
  return daysFromCivil(parseInt(m[1], 10), +m[2], +m[3]);
}

function duckDateDays(s) {
  const m = typeof s === 'string' && DUCK_DATE.exec(s);
  if (!m) return null;
  let y = parseInt(m[1], 10);
  if (m[4]) y = 1 - y;
  return daysFromCivil(y, +m[2], +m[3]);
}

const OURS_TS = /^([+-]?\d{4,})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(Z?)$/;
const DUCK_TS =
  /^(\d{4,})-(\d{2})-(\d{2})( \(BC\))? (\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?( \(BC\))?(?:([+-])(\d{2})(?::?(\d{2}))?(?::?(\d{2}))?)?$/;

function oursTimestamp(s) {
  const m = typeof s === 'string' && OURS_TS.exec(s);
  if (!m) return null;
  const days = daysFromCivil(parseInt(m[1], 10), +m[2], +m[3]);
  const secs = BigInt(+m[4] * 3600 + +m[5] * 60 + +m[6]);
  return { ns: BigInt(days) * NS_PER_DAY + secs * NS_PER_SEC + fracNs(m[7]), digits: (m[7] || '').length, z: m[8] === 'Z' };
}

function duckTimestamp(s) {
  const m = typeof s === 'string' && DUCK_TS.exec(s);
  if (!m) return null;
  let y = parseInt(m[1], 10);
  if (m[4] || m[9]) y = 1 - y;
  const days = daysFromCivil(y, +m[2], +m[3]);
  const secs = BigInt(+m[5] * 3600 + +m[6] * 60 + +m[7]);
  let ns = BigInt(days) * NS_PER_DAY + secs * NS_PER_SEC + fracNs(m[8]);
  let tz = false;
  if (m[10]) {
    tz = true;
    const off = BigInt(+m[11] * 3600 + +(m[12] || 0) * 60 + +(m[13] || 0)) * NS_PER_SEC;
    ns -= m[10] === '-' ? -off : off;
  }
  return { ns, digits: (m[8] || '').replace(/0+$/, '').length, tz };
}

const OURS_TIME = /^(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?$/;
const DUCK_TIME = /^(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([+-])(\d{2})(?::?(\d{2}))?(?::?(\d{2}))?)?$/;

function oursTime(s) {
  const m = typeof s === 'string' && OURS_TIME.exec(s);
  if (!m) return null;
  return { ns: BigInt(+m[1] * 3600 + +m[2] * 60 + +m[3]) * NS_PER_SEC + fracNs(m[4]), digits: (m[4] || '').length };
}

function duckTime(s) {
  const m = typeof s === 'string' && DUCK_TIME.exec(s);
  if (!m) return null;
  let ns = BigInt(+m[1] * 3600 + +m[2] * 60 + +m[3]) * NS_PER_SEC + fracNs(m[4]);
  if (m[5]) {
    const off = BigInt(+m[6] * 3600 + +(m[7] || 0) * 60 + +(m[8] || 0)) * NS_PER_SEC;
    ns -= m[5] === '-' ? -off : off;
    ns = ((ns % NS_PER_DAY) + NS_PER_DAY) % NS_PER_DAY;
  }
  return { ns, digits: (m[4] || '').replace(/0+$/, '').length };
}

const UNIT_DIGITS = { s: 0, ms: 3, us: 6, ns: 9 };
// int64 nanoseconds cover 1677-09-21T00:12:43.145224192 .. 2262-04-11T23:47:16.854775807
const NS_MIN = -(2n ** 63n);
const NS_MAX = 2n ** 63n - 1n;
const YEAR1_NS = BigInt(daysFromCivil(1, 1, 1)) * NS_PER_DAY;

// ---------------------------------------------------------------------------
// Bytes

function oursBytes(v) {
  if (typeof v !== 'string' || !/^[A-Za-z0-9+/]*={0,2}$/.test(v) || v.length % 4 !== 0) return null;
  return Buffer.from(v, 'base64');
}

// DuckDB renders a BLOB as text: printable ASCII as itself, every other byte
// (and backslash and quotes) as \xHH.  A VARCHAR read of the same bytes shows
// non-ASCII characters as themselves; they are taken back as UTF-8.
function duckBytes(s) {
  if (typeof s !== 'string') return null;
  const out = [];
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 92 && s[i + 1] === 'x' && /^[0-9A-Fa-f]{2}$/.test(s.slice(i + 2, i + 4))) {
      out.push(parseInt(s.slice(i + 2, i + 4), 16));
      i += 3;
    } else if (c < 128) {
      out.push(c);
    } else {
      const cp = s.codePointAt(i);
      if (cp > 0xffff) i++;
      for (const b of Buffer.from(String.fromCodePoint(cp), 'utf8')) out.push(b);
    }
  }
  return Buffer.from(out);
}

function uuidText(buf) {
  const h = buf.toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}
const UUID_RE = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;

// DuckDB's INTERVAL text (IntervalToStringCast) for a Parquet INTERVAL: three
// little-endian uint32 (months, days, milliseconds), read as int32 and micros.
export function duckIntervalText(buf) {
  let months = buf.readInt32LE(0);
  const days = buf.readInt32LE(4);
  let micros = BigInt(buf.readInt32LE(8)) * 1000n;
  const parts = [];
  const unit = (n, name) => `${n} ${name}${n === 1 || n === -1 ? '' : 's'}`;
  if (months !== 0) {
    const years = Math.trunc(months / 12);
    months -= years * 12;
    if (years) parts.push(unit(years, 'year'));
    if (months) parts.push(unit(months, 'month'));
  }
  if (days) parts.push(unit(days, 'day'));
  if (micros !== 0n) {
    let sign = '';
    if (micros < 0n) {
      sign = '-';
      micros = -micros;
    }
    const h = micros / 3600000000n;
    micros -= h * 3600000000n;
    const mi = micros / 60000000n;
    micros -= mi * 60000000n;
    const se = micros / 1000000n;
    micros -= se * 1000000n;
    const two = (x) => String(x).padStart(2, '0');
    let t = `${sign}${two(h)}:${two(mi)}:${two(se)}`;
    if (micros) t += '.' + String(micros).padStart(6, '0').replace(/0+$/, '');
    parts.push(t);
  }
  return parts.length ? parts.join(' ') : '00:00:00';
}

// ---------------------------------------------------------------------------
// JSON values (JSON logical type): structural equality

function jsonEqual(a, b) {
  if (a instanceof JsonNumber || b instanceof JsonNumber) {
    if (!(a instanceof JsonNumber && b instanceof JsonNumber)) return false;
    if (a.raw === b.raw || decimalEqual(a.raw, b.raw)) return true;
    // DuckDB's JSON (yyjson) keeps numbers past 64 bits as doubles
    return sameFloat(Number(a.raw), Number(b.raw));
  }
  if (Array.isArray(a) || Array.isArray(b)) {
    if (!Array.isArray(a) || !Array.isArray(b) || a.length !== b.length) return false;
    return a.every((x, i) => jsonEqual(x, b[i]));
  }
  if (a instanceof JsonObject || b instanceof JsonObject) {
    if (!(a instanceof JsonObject && b instanceof JsonObject) || a.entries.length !== b.entries.length) return false;
    return a.entries.every(([k, v], i) => k === b.entries[i][0] && jsonEqual(v, b.entries[i][1]));
  }
  return a === b;
}

// ---------------------------------------------------------------------------
// The comparison

const INT_TYPES = new Set(['int8', 'int16', 'int32', 'int64', 'uint8', 'uint16', 'uint32', 'uint64']);
const NUMERIC_KEY_TYPES = new Set([...INT_TYPES, 'float16', 'float32', 'float64', 'decimal128', 'decimal256']);

function show(v) {
  if (v === undefined) return '(missing)';
  const s = stringify(v);
  return s.length > 160 ? s.slice(0, 157) + '...' : s;
}

class Comparer {
  constructor(label, maxDiffs) {
    this.label = label;
    this.maxDiffs = maxDiffs;
    this.diffs = [];
    this.ndiffs = 0;
    this.skips = new Map(); // path -> {count, reason, example}
    this.notes = new Map(); // path -> {count, text}
    // Columns where DuckDB shows whole microseconds for what we show in
    // nanoseconds.  Accepted only if DuckDB never shows sub-microsecond digits
    // in that column; decided at the end.
    this.coarse = new Map(); // path -> {count, pending: [diff...]}
    this.fine = new Set(); // paths where DuckDB showed > 6 fractional digits
    this.row = 0;
  }

  diff(path, ours, duck, why) {
    this.diffText(`row ${this.row}, field ${path || '(row)'}: ours ${show(ours)}, DuckDB ${show(duck)}${why ? ` (${why})` : ''}`);
  }

  diffText(text) {
    this.ndiffs++;
    if (this.diffs.length < this.maxDiffs) this.diffs.push(text);
  }

  skip(spath, reason, path, ours, duck) {
    let s = this.skips.get(spath);
    if (!s) {
      s = { count: 0, reason, example: `row ${this.row}, ${path}: ours ${show(ours)}, DuckDB ${show(duck)}` };
      this.skips.set(spath, s);
    }
    s.count++;
  }

  note(spath, text, count = 1) {
    const key = `${spath}\0${text}`;
    let n = this.notes.get(key);
    if (!n) this.notes.set(key, (n = { spath, count: 0, text }));
    n.count += count;
  }

  coarseMatch(spath, path, ours, duck) {
    let c = this.coarse.get(spath);
    if (!c) this.coarse.set(spath, (c = { count: 0, pending: [] }));
    c.count++;
    if (c.pending.length < this.maxDiffs)
      c.pending.push(`row ${this.row}, field ${path}: ours ${show(ours)}, DuckDB ${show(duck)} (differ below a microsecond, and DuckDB shows nanoseconds in this column)`);
  }

  // Compares one value; path names the value (with list indexes), spath the
  // column (list indexes as []), for the per-column skip and note counts.
  value(f, o, d, path, spath) {
    if (o === undefined) return this.diff(path, o, d, 'missing in ours');
    if (d === undefined) return this.diff(path, o, d, 'missing in DuckDB');
    if (o === null || d === null) {
      if (o !== d) this.diff(path, o, d, 'null on one side');
      return;
    }
    const t = f.type;
    if (INT_TYPES.has(t)) return this.integer(f, o, d, path);
    switch (t) {
      case 'null':
        return this.diff(path, o, d, 'null type with a value');
      case 'bool':
        if (typeof o !== 'boolean') return this.diff(path, o, d, 'ours is not a boolean');
        if (o !== d) this.diff(path, o, d);
        return;
      case 'float16':
      case 'float32':
      case 'float64':
        return this.float(f, o, d, path);
      case 'decimal128':
      case 'decimal256':
        return this.decimal(f, o, d, path, spath);
      case 'date32':
      case 'date64':
        return this.date(f, o, d, path);
      case 'time32':
      case 'time64':
        return this.time(f, o, d, path, spath);
      case 'timestamp':
        return this.timestamp(f, o, d, path, spath);
      case 'string':
      case 'large_string':
        return this.string(f, o, d, path, spath);
      case 'binary':
      case 'large_binary':
      case 'fixed_binary':
        return this.binary(f, o, d, path, spath);
      case 'list':
      case 'large_list':
        return this.list(f, o, d, path, spath);
      case 'struct':
        return this.struct(f.children || [], o, d, path, spath);
      case 'map':
        return this.map(f, o, d, path, spath);
      default:
        return this.skip(spath, `type ${t} is not compared`, path, o, d);
    }
  }

  integer(f, o, d, path) {
    const a = numText(o);
    if (a === null || !/^-?\d+$/.test(a)) return this.diff(path, o, d, `ours is not an integer`);
    const b = numText(d);
    if (b === null) return this.diff(path, o, d, 'DuckDB has no number here');
    if (!decimalEqual(a, b)) this.diff(path, o, d);
  }

  float(f, o, d, path) {
    const a = oursFloat(o);
    if (a === undefined) return this.diff(path, o, d, 'ours is not a float');
    const b = duckFloat(d);
    if (b === undefined) return this.diff(path, o, d, 'DuckDB has no number here');
    let mine = a;
    if (f.type === 'float32') mine = Math.fround(a);
    else if (f.type === 'float16') mine = f16round(a);
    if (!sameFloat(mine, b)) this.diff(path, o, d, f.type === 'float64' ? '' : `ours as ${f.type} is ${Object.is(mine, -0) ? '-0' : mine}`);
  }

  decimal(f, o, d, path, spath) {
    if (typeof o !== 'string' || !/^-?\d+(\.\d+)?$/.test(o)) return this.diff(path, o, d, 'ours is not a decimal string');
    const scale = f.scale ?? 0;
    const fracLen = o.includes('.') ? o.length - o.indexOf('.') - 1 : 0;
    if (fracLen !== scale) return this.diff(path, o, d, `ours shows ${fracLen} fractional digits for scale ${scale}`);
    const b = numText(d);
    if (b === null || b === 'NaN' || /Infinity/.test(b)) return this.diff(path, o, d, 'DuckDB has no number here');
    if (decimalEqual(o, b)) return;
    if ((f.precision ?? 0) > 38) {
      // DuckDB reads DECIMAL wider than 38 digits as DOUBLE
      const x = Number(o);
      const y = Number(b);
      if (Math.abs(x - y) <= Math.abs(x) * 1e-15) {
        this.note(spath, 'compared approximately: DuckDB reads DECIMAL with precision > 38 as DOUBLE');
        return;
      }
    }
    this.diff(path, o, d);
  }

  date(f, o, d, path) {
    const a = oursDateDays(o);
    if (a === null) return this.diff(path, o, d, 'ours is not a YYYY-MM-DD date');
    const b = duckDateDays(d);
    if (b === null) return this.diff(path, o, d, 'DuckDB has no date here');
    if (a !== b) this.diff(path, o, d);
  }

  time(f, o, d, path, spath) {
    const a = oursTime(o);
    if (a === null) return this.diff(path, o, d, 'ours is not an HH:MM:SS time');
    const want = UNIT_DIGITS[f.unit];
    if (want !== undefined && a.digits !== want) return this.diff(path, o, d, `ours shows ${a.digits} fractional digits for unit ${f.unit}`);
    const b = duckTime(d);
    if (b === null) return this.diff(path, o, d, 'DuckDB has no time here');
    this.instant(a.ns, b.ns, b.digits, f.unit === 'ns', path, spath, o, d);
  }

  timestamp(f, o, d, path, spath) {
    const a = oursTimestamp(o);
    if (a === null) return this.diff(path, o, d, 'ours is not a YYYY-MM-DDTHH:MM:SS timestamp');
    const unit = f.int96 ? 'ns' : f.unit;
    const want = UNIT_DIGITS[unit];
    if (want !== undefined && a.digits !== want) return this.diff(path, o, d, `ours shows ${a.digits} fractional digits for unit ${unit}`);
    if (a.z !== !!f.utc) return this.diff(path, o, d, f.utc ? "ours lacks the 'Z' of a UTC timestamp" : "ours has a 'Z' on a timestamp not adjusted to UTC");
    const b = duckTimestamp(d);
    if (b === null) return this.diff(path, o, d, 'DuckDB has no timestamp here');
    if (unit === 'ns' && a.ns !== b.ns && (b.ns < NS_MIN || b.ns > NS_MAX) && (a.ns >= NS_MIN && a.ns <= NS_MAX || b.ns < YEAR1_NS)) {
      // An instant int64 nanoseconds cannot hold (INT96 from Spark): ours
      // wrapped into the int64 range, or DuckDB's own arithmetic overflowed
      // (it shows a year BC).  Either way there is no faithful comparison;
      // an ours outside the range must match DuckDB's sane value.
      return this.skip(spath, 'an instant outside the int64-nanosecond range (ours wrapped, or DuckDB overflowed)', path, o, d);
    }
    this.instant(a.ns, b.ns, b.digits, unit === 'ns', path, spath, o, d);
  }

  instant(a, b, duckDigits, oursNs, path, spath, o, d) {
    if (duckDigits > 6) this.fine.add(spath);
    if (a === b) return;
    if (oursNs && duckDigits <= 6) {
      // DuckDB reads some nanosecond columns with microsecond precision
      // (TIMESTAMP(NANOS, UTC), INT96): compare truncated to microseconds.
      const t = (a / 1000n) * 1000n; // toward zero, as DuckDB does
      const fl = a >= 0n || a % 1000n === 0n ? t : t - 1000n; // toward minus infinity
      if (b === t || b === fl) return this.coarseMatch(spath, path, o, d);
    }
    this.diff(path, o, d);
  }

  string(f, o, d, path, spath) {
    if (typeof o !== 'string') return this.diff(path, o, d, 'ours is not a string');
    if (o === d) return;
    if (typeof d !== 'string') {
      // DuckDB inlines JSON-typed values as JSON
      let parsed;
      try {
        parsed = parse(o);
      } catch {
        return this.diff(path, o, d, 'DuckDB shows JSON, ours is not valid JSON');
      }
      if (jsonEqual(parsed, d)) {
        if (f.logical !== 'JSON') this.note(spath, 'DuckDB reads this string column as JSON; compared structurally');
        return;
      }
      return this.diff(path, o, d, 'JSON values differ');
    }
    if (f.logical === 'JSON') {
      // a JSON string value, inlined by DuckDB as a JSON string
      try {
        if (jsonEqual(parse(o), d)) return;
      } catch {
        // not JSON: compared as text below
      }
    }
    // DuckDB may read an unannotated column as BLOB where we read a string
    const bytes = duckBytes(d);
    if (d.includes('\\x') && bytes && bytes.equals(Buffer.from(o, 'utf8'))) {
      this.note(spath, 'DuckDB reads this string column as BLOB; compared as bytes');
      return;
    }
    this.diff(path, o, d);
  }

  binary(f, o, d, path, spath) {
    const a = oursBytes(o);
    if (a === null) return this.diff(path, o, d, 'ours is not base64');
    if (f.type === 'fixed_binary' && f.byte_width !== undefined && a.length !== f.byte_width)
      return this.diff(path, o, d, `ours has ${a.length} bytes for byte_width ${f.byte_width}`);
    if (typeof d !== 'string') return this.diff(path, o, d, 'DuckDB has no string here');
    if (f.logical === 'UUID' || (a.length === 16 && UUID_RE.test(d))) {
      if (UUID_RE.test(d)) {
        if (uuidText(a) !== d.toLowerCase()) this.diff(path, o, d, `ours as UUID is ${uuidText(a)}`);
        return;
      }
    }
    if (f.logical === 'INTERVAL' && a.length === 12) {
      const text = duckIntervalText(a);
      if (text !== d) {
        const b = duckBytes(d);
        if (b && b.equals(a)) return; // DuckDB read it as plain bytes
        this.diff(path, o, d, `ours as INTERVAL is ${JSON.stringify(text)}`);
      }
      return;
    }
    const b = duckBytes(d);
    if (b.equals(a)) return;
    if (a.length === 12 && f.logical === undefined && duckIntervalText(a) === d) {
      this.note(spath, 'DuckDB reads this column as INTERVAL; compared as INTERVAL text');
      return;
    }
    this.diff(path, o, d, `bytes differ: ours ${a.toString('hex').slice(0, 64)}, DuckDB ${b.toString('hex').slice(0, 64)}`);
  }

  list(f, o, d, path, spath) {
    if (!Array.isArray(o)) return this.diff(path, o, d, 'ours is not an array');
    if (!Array.isArray(d)) return this.diff(path, o, d, 'DuckDB has no array here');
    if (o.length !== d.length) return this.diff(path, o, d, `list lengths differ: ours ${o.length}, DuckDB ${d.length}`);
    const el = (f.children || [])[0];
    if (!el) return this.skip(spath, 'list field without an element child', path, o, d);
    for (let i = 0; i < o.length; i++) this.value(el, o[i], d[i], `${path}[${i}]`, `${spath}[]`);
  }

  struct(children, o, d, path, spath) {
    if (!(o instanceof JsonObject)) return this.diff(path, o, d, 'ours is not an object');
    if (!(d instanceof JsonObject)) return this.diff(path, o, d, 'DuckDB has no object here');
    const names = children.map((c) => c.name);
    const ok = o.keys();
    if (ok.length !== names.length || ok.some((k, i) => k !== names[i]))
      return this.diffText(`row ${this.row}, field ${path || '(row)'}: ours has keys ${JSON.stringify(ok)}, the schema's fields are ${JSON.stringify(names)}`);
    const extra = d.keys().filter((k) => !names.includes(k));
    if (extra.length) this.diff(path, ok, d.keys(), `DuckDB has fields ours lacks: ${extra.join(', ')}`);
    const pre = path ? path + '.' : '';
    const spre = spath ? spath + '.' : '';
    for (const c of children) this.value(c, o.get(c.name), d.get(c.name), pre + c.name, spre + c.name);
  }

  map(f, o, d, path, spath) {
    if (!Array.isArray(o)) return this.diff(path, o, d, 'ours is not an array of entries');
    const entries = (f.children || [])[0];
    const kids = (entries && entries.children) || [];
    const kf = kids.find((c) => c.name === 'key') || kids[0];
    const vf = kids.find((c) => c.name === 'value') || (kids.length > 1 ? kids[1] : undefined);
    if (!kf) return this.skip(spath, 'map field without a key child', path, o, d);
    let pairs; // [[keyNode, valueNode]]
    if (d instanceof JsonObject) {
      pairs = d.entries.map(([k, v]) => [this.keyNode(kf, k), v]);
    } else if (Array.isArray(d)) {
      // a map read as a list of {key, value} structs, or (a map without
      // values, like map_no_value's) as a list of keys
      pairs = d.map((e) => (e instanceof JsonObject ? [e.get('key'), vf ? e.get('value') : undefined] : [e, undefined]));
    } else {
      return this.diff(path, o, d, 'DuckDB has no map here');
    }
    if (o.length !== pairs.length) return this.diff(path, o, d, `map sizes differ: ours ${o.length}, DuckDB ${pairs.length}`);
    for (let i = 0; i < o.length; i++) {
      const e = o[i];
      if (!(e instanceof JsonObject)) return this.diff(`${path}[${i}]`, e, d, 'ours entry is not an object');
      this.value(kf, e.get('key'), pairs[i][0], `${path}[${i}].key`, `${spath}[].key`);
      if (vf) {
        const dv = pairs[i][1];
        this.value(vf, e.get('value'), dv === undefined ? null : dv, `${path}[${i}].value`, `${spath}[].value`);
      }
    }
  }

  // DuckDB renders a map as an object keyed by the key's text: turn the text
  // back into what DuckDB would show for a value of the key's type.
  keyNode(kf, text) {
    if (NUMERIC_KEY_TYPES.has(kf.type)) return new JsonNumber(text);
    if (kf.type === 'bool') return text === 'true' ? true : text === 'false' ? false : text;
    return text;
  }

  row_(fields, o, d) {
    this.struct(fields, o, d, '', '');
  }

  finish() {
    for (const [spath, c] of this.coarse) {
      if (this.fine.has(spath)) {
        this.ndiffs += c.count;
        for (const p of c.pending) if (this.diffs.length < this.maxDiffs) this.diffs.push(p);
      } else {
        this.note(spath, 'compared at microsecond precision: DuckDB reads this nanosecond column as microseconds', c.count);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// CLI

function usage(msg) {
  if (msg) process.stderr.write(`compare: ${msg}\n`);
  process.stderr.write('usage: compare.mjs --fields FIELDS.json --ours OURS.jsonl --duckdb DUCK.jsonl [--label NAME] [--max-diffs N]\n');
  process.exit(2);
}

function parseArgs(argv) {
  const a = { maxDiffs: 10 };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    const v = argv[i + 1];
    if (k === '--fields') a.fields = v;
    else if (k === '--ours') a.ours = v;
    else if (k === '--duckdb') a.duckdb = v;
    else if (k === '--label') a.label = v;
    else if (k === '--max-diffs') a.maxDiffs = parseInt(v, 10);
    else if (k === '-h' || k === '--help') usage();
    else usage(`unknown argument ${k}`);
    i++;
  }
  if (!a.fields || !a.ours || !a.duckdb) usage('--fields, --ours and --duckdb are required');
  a.label ??= a.ours;
  return a;
}

function lines(path) {
  const rl = readline.createInterface({ input: fs.createReadStream(path), crlfDelay: Infinity });
  return rl[Symbol.asyncIterator]();
}

async function nextLine(it) {
  for (;;) {
    const r = await it.next();
    if (r.done) return null;
    if (r.value.trim() !== '') return r.value;
  }
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  let fields;
  try {
    fields = JSON.parse(fs.readFileSync(args.fields, 'utf8'));
  } catch (e) {
    usage(`cannot read ${args.fields}: ${e.message}`);
  }
  if (fields && !Array.isArray(fields) && Array.isArray(fields.fields)) fields = fields.fields;
  if (!Array.isArray(fields)) usage(`${args.fields} holds no fields array`);
  for (const p of [args.ours, args.duckdb]) if (!fs.existsSync(p)) usage(`no such file: ${p}`);

  const cmp = new Comparer(args.label, args.maxDiffs);
  const io = lines(args.ours);
  const id = lines(args.duckdb);
  let rowsOurs = 0;
  let rowsDuck = 0;
  let bad = null;
  for (;;) {
    const [lo, ld] = await Promise.all([nextLine(io), nextLine(id)]);
    if (lo !== null) rowsOurs++;
    if (ld !== null) rowsDuck++;
    if (lo === null || ld === null) {
      // count what is left of the longer one
      if (lo !== null) while ((await nextLine(io)) !== null) rowsOurs++;
      if (ld !== null) while ((await nextLine(id)) !== null) rowsDuck++;
      break;
    }
    cmp.row = rowsOurs - 1;
    let o;
    let d;
    try {
      o = parse(lo);
    } catch (e) {
      bad = `row ${cmp.row}: ours is not valid JSON: ${e.message}`;
      break;
    }
    try {
      d = parse(ld);
    } catch (e) {
      bad = `row ${cmp.row}: DuckDB's line is not valid JSON: ${e.message}`;
      break;
    }
    cmp.row_(fields, o, d);
  }
  cmp.finish();

  const out = [];
  let failed = cmp.ndiffs > 0 || bad !== null;
  if (bad) out.push(`  ${bad}`);
  if (!bad && rowsOurs !== rowsDuck) {
    failed = true;
    out.push(`  row count differs: ours ${rowsOurs}, DuckDB ${rowsDuck}`);
  }
  for (const d of cmp.diffs) out.push(`  ${d}`);
  if (cmp.ndiffs > cmp.diffs.length) out.push(`  ... ${cmp.ndiffs - cmp.diffs.length} more differences`);
  const head = failed
    ? `compare ${args.label}: FAIL: ${rowsOurs} rows ours, ${rowsDuck} rows DuckDB, ${cmp.ndiffs} differing values`
    : `compare ${args.label}: ok: ${rowsOurs} rows`;
  process.stdout.write(head + '\n' + out.map((l) => l + '\n').join(''));
  for (const [p, s] of cmp.skips) process.stdout.write(`skip: ${args.label}: field ${p}: ${s.count} values not compared: ${s.reason} (first: ${s.example})\n`);
  for (const n of cmp.notes.values()) process.stdout.write(`note: ${args.label}: field ${n.spath}: ${n.count} values ${n.text}\n`);
  process.exit(failed ? 1 : 0);
}

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith('compare.mjs')) {
  main().catch((e) => {
    process.stderr.write(`compare: ${e.stack || e}\n`);
    process.exit(2);
  });
}
