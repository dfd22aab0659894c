// json-lossless.mjs: a small JSON parser that keeps number literals as their
// raw text, so that 64-bit integers and decimals compare exactly.
//
// parse(text) returns:
//   null, true, false      as themselves
//   a string               as a JS string
//   a number               as a JsonNumber {raw: '-12.340'}; raw is the literal
//                          text, or 'NaN' / 'Infinity' / '-Infinity'
//   an array               as a JS array
//   an object              as a JsonObject {entries: [[key, value], ...]}, in
//                          text order, duplicate keys kept
//
// Besides strict JSON it accepts the bare tokens NaN, Infinity and -Infinity,
// which DuckDB's JSON writer emits for non-finite floats.

export class JsonNumber {
  constructor(raw) {
    this.raw = raw;
  }
  toString() {
    return this.raw;
  }
}

export class JsonObject {
  constructor(entries) {
    this.entries = entries;
  }
  // First value under key, or undefined.
  get(key) {
    for (const e of this.entries) if (e[0] === key) return e[1];
    return undefined;
  }
  has(key) {
    for (const e of this.entries) if (e[0] === key) return true;
    return false;
  }
  keys() {
    return this.entries.map((e) => e[0]);
  }
}

export class JsonSyntaxError extends Error {}

const NUM_RE = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;

class Parser {
  constructor(text) {
    this.s = text;
    this.i = 0;
  }
  fail(what) {
    const near = this.s.slice(Math.max(0, this.i - 20), this.i + 20);
    throw new JsonSyntaxError(`JSON: ${what} at offset ${this.i} near ${JSON.stringify(near)}`);
  }
  ws() {
    const s = this.s;
    let i = this.i;
    for (;;) {
      const c = s.charCodeAt(i);
      if (c === 32 || c === 10 || c === 13 || c === 9) i++;
      else break;
    }
    this.i = i;
  }
  value() {
    this.ws();
    const s = this.s;
    const c = s[this.i];
    switch (c) {
      case '{':
        return this.object();
      case '[':
        return this.array();
      case '"':
        return this.string();
      case 't':
        return this.word('true', true);
      case 'f':
        return this.word('false', false);
      case 'n':
        return this.word('null', null);
      case 'N':
        return this.word('NaN', new JsonNumber('NaN'));
      case 'I':
        return this.word('Infinity', new JsonNumber('Infinity'));
      default:
        if (c === '-' && s.startsWith('-Infinity', this.i)) return this.word('-Infinity', new JsonNumber('-Infinity'));
        return this.number();
    }
  }
  word(w, v) {
    if (!this.s.startsWith(w, this.i)) this.fail('unexpected token');
    this.i += w.length;
    return v;
  }
  number() {
    NUM_RE.lastIndex = this.i;
    const m = NUM_RE.exec(this.s);
    if (!m) this.fail('unexpected character');
    this.i += m[0].length;
    return new JsonNumber(m[0]);
  }
  string() {
    const s = this.s;
    let i = this.i + 1;
    let start = i;
    let out = '';
    for (;;) {
      const q = s.indexOf('"', i);
      const b = s.indexOf('\\', i);
      if (q < 0) this.fail('unterminated string');
      if (b < 0 || q < b) {
        out += s.slice(start, q);
        this.i = q + 1;
        return out;
      }
      out += s.slice(start, b);
      const e = s[b + 1];
      let next = b + 2;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          const hex = s.slice(b + 2, b + 6);
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) {
            this.i = b;
            this.fail('bad \\u escape');
          }
          out += String.fromCharCode(parseInt(hex, 16));
          next = b + 6;
          break;
        }
        default:
          this.i = b;
          this.fail('bad escape');
      }
      i = start = next;
    }
  }
  array() {
    this.i++;
    const out = [];
    this.ws();
    if (this.s[this.i] === ']') {
      this.i++;
      return out;
    }
    for (;;) {
      out.push(this.value());
      this.ws();
      const c = this.s[this.i++];
      if (c === ']') return out;
      if (c !== ',') {
        this.i--;
        this.fail("expected ',' or ']'");
      }
    }
  }
  object() {
    this.i++;
    const entries = [];
    this.ws();
    if (this.s[this.i] === '}') {
      this.i++;
      return new JsonObject(entries);
    }
    for (;;) {
      this.ws();
      if (this.s[this.i] !== '"') this.fail('expected a key');
      const k = this.string();
      this.ws();
      if (this.s[this.i++] !== ':') {
        this.i--;
        this.fail("expected ':'");
      }
      entries.push([k, this.value()]);
      this.ws();
      const c = this.s[this.i++];
      if (c === '}') return new JsonObject(entries);
      if (c !== ',') {
        this.i--;
        this.fail("expected ',' or '}'");
      }
    }
  }
}

export function parse(text) {
  const p = new Parser(text);
  const v = p.value();
  p.ws();
  if (p.i !== text.length) p.fail('trailing characters');
  return v;
}

// Renders a parsed value back as JSON text (numbers as their raw text), for
// messages.
export function stringify(v) {
  if (v === null || v === undefined) return 'null';
  if (v === true) return 'true';
  if (v === false) return 'false';
  if (v instanceof JsonNumber) return v.raw;
  if (typeof v === 'string') return JSON.stringify(v);
  if (Array.isArray(v)) return '[' + v.map(stringify).join(',') + ']';
  if (v instanceof JsonObject)
    return '{' + v.entries.map(([k, x]) => JSON.stringify(k) + ':' + stringify(x)).join(',') + '}';
  return String(v);
}
