// sigv4.mjs: AWS Signature Version 4 for S3, both ways, on top of
// @smithy/signature-v4 (SignatureV4 with Sha256 from @aws-crypto/sha256-js).
//
// verifyRequest() re-signs an incoming request the way S3 does and compares
// signatures; signRequest() signs an outgoing one (s3put.mjs, s3list.mjs).
//
// S3's canonical request, as implemented here (AWS's "Create a canonical
// request for Signature Version 4" and "Authenticating Requests: Using the
// Authorization Header" for S3):
// - CanonicalURI: the path as received, percent-decoded, then re-encoded
//   once with UriEncode (everything but A-Z a-z 0-9 - . _ ~ and "/" as %XX,
//   uppercase hex).  S3 does not double-encode and does not normalize "."
//   or ".." segments, so the signer runs with uriEscapePath: false.
// - CanonicalQueryString: every parameter decoded, then name and value
//   UriEncode'd (slash too), sorted by name, "name=" for a parameter
//   without a value.  "+" is a literal plus, not a space.
// - CanonicalHeaders: exactly the headers named in SignedHeaders, values
//   trimmed and inner runs of spaces collapsed, repeated headers joined
//   with ",".
// - HashedPayload: the x-amz-content-sha256 header's value, which S3
//   requires on every request signed in the Authorization header.
import crypto from 'node:crypto';
import { SignatureV4, createScope, getCanonicalHeaders, getPayloadHash } from '@smithy/signature-v4';
import { Sha256 } from '@aws-crypto/sha256-js';

export const EMPTY_SHA256 = 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855';

// AWS UriEncode: RFC 3986 unreserved characters stay, the rest is %XX.
export function uriEncode(s, keepSlash = false) {
  const enc = encodeURIComponent(s).replace(/[!'()*]/g, (c) => '%' + c.charCodeAt(0).toString(16).toUpperCase());
  return keepSlash ? enc.replace(/%2F/g, '/') : enc;
}

// Splits a raw query string into [[name, value]] (decoded; null value when
// the parameter had no "=").  Throws on malformed percent-encoding.
export function parseQuery(raw) {
  const out = [];
  if (!raw) return out;
  for (const part of raw.split('&')) {
    if (part === '') continue;
    const eq = part.indexOf('=');
    const name = decodeURIComponent(eq < 0 ? part : part.slice(0, eq));
    const value = eq < 0 ? null : decodeURIComponent(part.slice(eq + 1));
    out.push([name, value]);
  }
  return out;
}

function queryObject(pairs) {
  const q = {};
  for (const [k, v] of pairs) {
    const val = v === null ? '' : v;
    if (q[k] === undefined) q[k] = val;
    else if (Array.isArray(q[k])) q[k].push(val);
    else q[k] = [q[k], val];
  }
  return q;
}

// Header values by lowercase name from rawHeaders, repeated ones joined
// with "," (what AWS's canonicalization asks for).
export function rawHeaderMap(rawHeaders) {
  const h = {};
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    const k = rawHeaders[i].toLowerCase();
    h[k] = h[k] === undefined ? rawHeaders[i + 1] : `${h[k]},${rawHeaders[i + 1]}`;
  }
  return h;
}

function parseAmzDate(s) {
  const m = /^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$/.exec(s || '');
  if (!m) return null;
  const d = new Date(Date.UTC(+m[1], +m[2] - 1, +m[3], +m[4], +m[5], +m[6]));
  return Number.isNaN(d.getTime()) ? null : d;
}

function parseAuthorization(value) {
  const m = /^\s*(\S+)\s+(.*)$/.exec(value || '');
  if (!m) return null;
  const parts = {};
  for (const p of m[2].split(',')) {
    const eq = p.indexOf('=');
    if (eq < 0) continue;
    parts[p.slice(0, eq).trim()] = p.slice(eq + 1).trim();
  }
  return { algorithm: m[1], ...parts };
}

function timingSafeEqualHex(a, b) {
  const ba = Buffer.from(String(a));
  const bb = Buffer.from(String(b));
  return ba.length === bb.length && crypto.timingSafeEqual(ba, bb);
}

const fail = (status, code, message, extra) => ({ ok: false, status, code, message, extra });

/*
 * Verifies an incoming request.
 *   req:     { method, rawPath (as on the wire, no query), rawQuery (no "?"),
 *              headers (lowercase name -> value, see rawHeaderMap) }
 *   body:    the request body (Buffer) or null
 *   cfg:     { accessKey, secretKey, sessionToken, region, maxSkewS,
 *              requireContentSha256, service (default 's3'; another
 *              service's payload hash is that of body) }
 * Returns { ok: true, accessKey } or { ok: false, status, code, message, extra }.
 */
export async function verifyRequest(req, body, cfg) {
  const h = req.headers;
  const query = (() => {
    try {
      return parseQuery(req.rawQuery);
    } catch {
      return null;
    }
  })();
  if (query === null) return fail(400, 'InvalidArgument', 'Malformed percent-encoding in the query string.');
  if (!h.authorization) {
    if (query.some(([k]) => k === 'X-Amz-Algorithm' || k === 'Signature')) {
      return fail(403, 'AccessDenied', 's3front verifies only the Authorization header (no presigned URLs).');
    }
    return fail(403, 'AccessDenied', 'Access Denied (s3front: the request is not signed).');
  }
  const auth = parseAuthorization(h.authorization);
  if (!auth || auth.algorithm !== 'AWS4-HMAC-SHA256') {
    return fail(400, 'InvalidArgument', 'Unsupported Authorization Type (s3front takes AWS4-HMAC-SHA256 only).', {
      ArgumentName: 'Authorization',
      ArgumentValue: h.authorization,
    });
  }
  const cred = (auth.Credential || '').split('/');
  if (cred.length !== 5 || !auth.SignedHeaders || !/^[0-9a-f]{64}$/.test(auth.Signature || '')) {
    return fail(400, 'AuthorizationHeaderMalformed', 'The authorization header is malformed.');
  }
  const [akid, credDate, credRegion, credService, terminator] = cred;
  if (akid !== cfg.accessKey) {
    return fail(403, 'InvalidAccessKeyId', 'The AWS Access Key Id you provided does not exist in our records.', {
      AWSAccessKeyId: akid,
    });
  }
  if (credRegion !== cfg.region) {
    return fail(400, 'AuthorizationHeaderMalformed', `The authorization header is malformed; the region '${credRegion}' is wrong; expecting '${cfg.region}'`, { Region: cfg.region });
  }
  const service = cfg.service || 's3';
  if (credService !== service || terminator !== 'aws4_request') {
    return fail(400, 'AuthorizationHeaderMalformed', `The authorization header is malformed; incorrect service "${credService}" or terminator "${terminator}".`);
  }
  // The request time: x-amz-date, else the Date header (as S3 does).
  let signingDate = parseAmzDate(h['x-amz-date']);
  if (!signingDate && h['x-amz-date'] === undefined && h.date !== undefined) {
    const d = new Date(h.date);
    if (!Number.isNaN(d.getTime())) signingDate = d;
  }
  if (!signingDate) {
    return fail(403, 'AccessDenied', 'AWS authentication requires a valid Date or x-amz-date header');
  }
  const amzDate = signingDate.toISOString().replace(/[-:]|\.\d{3}/g, '');
  if (credDate !== amzDate.slice(0, 8)) {
    return fail(400, 'AuthorizationHeaderMalformed', `The authorization header is malformed; Invalid credential date "${credDate}". Date is not the same as X-Amz-Date: "${amzDate.slice(0, 8)}".`);
  }
  const skew = Math.abs(Date.now() - signingDate.getTime()) / 1000;
  if (cfg.maxSkewS > 0 && skew > cfg.maxSkewS) {
    return fail(403, 'RequestTimeTooSkewed', 'The difference between the request time and the current time is too large.', {
      RequestTime: amzDate,
      ServerTime: new Date().toISOString(),
      MaxAllowedSkewMilliseconds: cfg.maxSkewS * 1000,
    });
  }
  const signed = auth.SignedHeaders.split(';');
  if (!signed.includes('host')) {
    return fail(400, 'AuthorizationHeaderMalformed', 'The authorization header is malformed; SignedHeaders must include host.');
  }
  const unsigned = Object.keys(h).filter((k) => k.startsWith('x-amz-') && !signed.includes(k));
  if (unsigned.length) {
    return fail(403, 'AccessDenied', 'There were headers present in the request which were not signed', {
      HeadersNotSigned: unsigned.join(', '),
    });
  }
  const payloadHash = h['x-amz-content-sha256'];
  if (payloadHash === undefined && cfg.requireContentSha256) {
    return fail(400, 'InvalidRequest', 'Missing required header for this request: x-amz-content-sha256');
  }
  if (payloadHash !== undefined && payloadHash.startsWith('STREAMING-')) {
    return fail(501, 'NotImplemented', `s3front does not implement x-amz-content-sha256: ${payloadHash}`);
  }
  if (payloadHash !== undefined && payloadHash !== 'UNSIGNED-PAYLOAD' && !/^[0-9a-f]{64}$/.test(payloadHash)) {
    return fail(400, 'InvalidArgument', 'x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-..., or a valid sha256 value.', {
      ArgumentName: 'x-amz-content-sha256',
      ArgumentValue: payloadHash,
    });
  }
  if (cfg.sessionToken) {
    if (h['x-amz-security-token'] !== cfg.sessionToken) {
      return fail(403, 'InvalidToken', h['x-amz-security-token'] === undefined
        ? 'The request signed with temporary credentials has no x-amz-security-token header.'
        : 'The provided token is malformed or otherwise invalid.');
    }
  } else if (h['x-amz-security-token'] !== undefined) {
    return fail(403, 'InvalidToken', 'The provided token is malformed or otherwise invalid (s3front has no session token configured).');
  }

  let canonicalPath;
  try {
    canonicalPath = req.rawPath.split('/').map((seg) => uriEncode(decodeURIComponent(seg))).join('/');
  } catch {
    return fail(400, 'InvalidURI', "Couldn't parse the specified URI.");
  }
  const headers = {};
  for (const name of signed) if (h[name] !== undefined) headers[name] = h[name];
  const request = { method: req.method, path: canonicalPath, query: queryObject(query), headers };
  // Services other than S3 sign the body's hash without sending it.
  if (payloadHash === undefined && body) request.body = body;
  // The signer's building blocks, not signer.sign(): sign() drops a Date
  // header from what it signs (it treats Date as its own to generate), and
  // S3 lets clients sign Date.
  const signer = new SignatureV4({
    credentials: {
      accessKeyId: cfg.accessKey,
      secretAccessKey: cfg.secretKey,
      ...(cfg.sessionToken ? { sessionToken: cfg.sessionToken } : {}),
    },
    region: cfg.region,
    service,
    sha256: Sha256,
    uriEscapePath: false,
    applyChecksum: false,
  });
  const canonicalHeaders = getCanonicalHeaders(request, undefined, new Set(signed));
  const headerList = Object.keys(canonicalHeaders).sort().join(';');
  const payload = await getPayloadHash(request, Sha256);
  const canonicalRequest = signer.createCanonicalRequest(request, canonicalHeaders, payload);
  const { longDate, shortDate } = signer.formatDate(signingDate);
  const scope = createScope(shortDate, cfg.region, service);
  const creds = await signer.credentialProvider();
  const signature = await signer.getSignature(longDate, scope, signer.getSigningKey(creds, cfg.region, shortDate, service), canonicalRequest);
  if (headerList === auth.SignedHeaders && timingSafeEqualHex(signature, auth.Signature)) {
    // The payload hash was signed; now check it against the body.
    if (body && payloadHash && /^[0-9a-f]{64}$/.test(payloadHash)) {
      const actual = crypto.createHash('sha256').update(body).digest('hex');
      if (actual !== payloadHash) {
        return fail(400, 'XAmzContentSHA256Mismatch', "The provided 'x-amz-content-sha256' header does not match what was computed.", {
          ClientComputedContentSHA256: payloadHash,
          S3ComputedContentSHA256: actual,
        });
      }
    }
    return { ok: true, accessKey: akid };
  }
  const stringToSign = `AWS4-HMAC-SHA256\n${longDate}\n${scope}\n${crypto.createHash('sha256').update(canonicalRequest).digest('hex')}`;
  return fail(403, 'SignatureDoesNotMatch', 'The request signature we calculated does not match the signature you provided. Check your key and signing method.', {
    AWSAccessKeyId: akid,
    StringToSign: stringToSign,
    SignatureProvided: auth.Signature,
    SignedHeadersProvided: auth.SignedHeaders,
    SignedHeadersFound: headerList,
    CanonicalRequest: canonicalRequest,
  });
}

/*
 * Signs an outgoing S3 request (for the test clients).
 *   { method, host ("127.0.0.1:9000"), path (already encoded), query ([[k,v]]),
 *     headers, body (Buffer|null) } + { accessKey, secretKey, sessionToken, region }
 * Returns the headers to send (host, x-amz-date, x-amz-content-sha256,
 * authorization, and the token if any).
 */
export async function signRequest(r, cfg) {
  const payloadHash = r.body && r.body.length
    ? crypto.createHash('sha256').update(r.body).digest('hex')
    : EMPTY_SHA256;
  const headers = { ...r.headers, host: r.host, 'x-amz-content-sha256': payloadHash };
  const signer = new SignatureV4({
    credentials: {
      accessKeyId: cfg.accessKey,
      secretAccessKey: cfg.secretKey,
      ...(cfg.sessionToken ? { sessionToken: cfg.sessionToken } : {}),
    },
    region: cfg.region,
    service: 's3',
    sha256: Sha256,
    uriEscapePath: false,
    applyChecksum: true,
  });
  const out = await signer.sign({
    method: r.method,
    protocol: 'http:',
    hostname: r.host.replace(/:\d+$/, ''),
    path: r.path,
    query: queryObject(r.query || []),
    headers,
    body: undefined,
  });
  return out.headers;
}

// Encodes a query for the wire the way it is canonicalized (sorted, UriEncode).
export function encodeQuery(pairs) {
  return [...pairs]
    .map(([k, v]) => [uriEncode(k), v === null ? '' : uriEncode(v)])
    .sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0))
    .map(([k, v]) => `${k}=${v}`)
    .join('&');
}
