#!/usr/bin/env node
// credfake.mjs: the AWS credential endpoints on 127.0.0.1 for tests: STS
// AssumeRoleWithWebIdentity and AssumeRole (POST /; AssumeRole's SigV4
// signature is verified with AWS's signer against the keys of --issued,
// session token included), the container endpoint (GET
// /container...), and IMDSv2 (PUT /latest/api/token, GET
// /latest/meta-data/iam/security-credentials/[ROLE]).  Every answer with
// credentials hands out fresh temporary ones that expire --ttl-s seconds
// later, appended (before the answer goes) as a JSON line to --issued, the
// file s3front.mjs --credentials-file accepts keys from.
// POST /__control {"fail": N, "ttl_s": S} makes the next N credential
// answers fail with a 500 and changes the lifetime; {"imds_token_status":
// N} makes the IMDSv2 token PUT answer N without a token (200: as usual),
// {"imds_v1": true} lets the IMDS GETs through without a token (IMDSv1,
// off by default: 401, as on an instance that requires IMDSv2); GET
// /__stats counts what was asked.  Prints one JSON line when ready; runs until SIGTERM.
import http from 'node:http';
import fs from 'node:fs';
import crypto from 'node:crypto';
import { LOOPBACK, Logger, onShutdown, parseArgs, printReady, readBody } from './lib/common.mjs';
import { rawHeaderMap, verifyRequest } from './lib/sigv4.mjs';

const usage = `usage: credfake.mjs --issued FILE [--port N] [--ttl-s S] [--web-token T]
                    [--role-arn A] [--container-auth T] [--imds-role NAME]
                    [--log FILE] [--watch-pid PID]`;
const { flags } = parseArgs(process.argv.slice(2), {
  port: 'int',
  issued: 'string',
  'ttl-s': 'number',
  'web-token': 'string',
  'role-arn': 'string',
  'container-auth': 'string',
  'imds-role': 'string',
  log: 'string',
  'watch-pid': 'int',
}, usage);
if (!flags.issued) {
  process.stderr.write(`${usage}\n`);
  process.exit(2);
}
const log = new Logger(flags.log);
let ttlS = flags['ttl-s'] ?? 3600;
let failNext = 0;
let imdsTokenStatus = 200;
let imdsV1 = false;
const role = flags['imds-role'] ?? 'larder-node';
const imdsTokens = new Set();
const stats = { requests: 0, issued: { web_identity: 0, container: 0, imds: 0, assume_role: 0 }, failed: 0, denied: 0, imds_v1: 0, by_path: {}, assumed: [] };
let seq = 0;

// Fresh credentials for source, recorded in --issued, or null when a
// failure was asked for.
function issue(source) {
  if (failNext > 0) {
    failNext--;
    stats.failed++;
    return null;
  }
  seq++;
  const tag = { web_identity: 'WEBI', container: 'CONT', imds: 'IMDS', assume_role: 'ROLE' }[source];
  const c = {
    source,
    access_key: `ASIA${tag}${String(seq).padStart(8, '0')}`,
    secret_key: `fakesecret${crypto.randomBytes(15).toString('hex')}`,
    session_token: `FakeSessionToken${crypto.randomBytes(300).toString('base64url')}`,
    expiration: new Date(Date.now() + ttlS * 1000).toISOString().replace(/\.\d{3}Z$/, 'Z'),
  };
  fs.appendFileSync(flags.issued, JSON.stringify(c) + '\n');
  stats.issued[source]++;
  return c;
}

function send(res, status, type, body) {
  res.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

const xmlEsc = (s) => String(s).replace(/[<>&]/g, (c) => ({ '<': '&lt;', '>': '&gt;', '&': '&amp;' })[c]);

function stsError(res, status, code, message) {
  send(res, status, 'text/xml', `<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <Error><Type>Sender</Type><Code>${code}</Code><Message>${xmlEsc(message)}</Message></Error>
  <RequestId>${crypto.randomUUID()}</RequestId>
</ErrorResponse>`);
}

// The key of --issued (the last line naming it) with this access key id.
function issuedKey(akid) {
  let found = null;
  for (const line of fs.readFileSync(flags.issued, 'utf8').split('\n')) {
    if (!line) continue;
    const k = JSON.parse(line);
    if (k.access_key === akid) found = k;
  }
  return found;
}

// AssumeRole: signed (SigV4, service sts) by a key of --issued, which
// may itself be temporary (then with its session token).
async function assumeRole(req, res, raw, q) {
  const headers = rawHeaderMap(req.rawHeaders);
  const m = /Credential=([^/,\s]+)\//.exec(headers.authorization || '');
  const key = m ? issuedKey(m[1]) : null;
  if (!key) {
    stats.denied++;
    return stsError(res, 403, 'InvalidClientTokenId', 'The security token included in the request is invalid.');
  }
  const qi = req.url.indexOf('?');
  const v = await verifyRequest({
    method: req.method,
    rawPath: qi < 0 ? req.url : req.url.slice(0, qi),
    rawQuery: qi < 0 ? '' : req.url.slice(qi + 1),
    headers,
  }, raw, {
    accessKey: key.access_key, secretKey: key.secret_key,
    sessionToken: key.session_token || undefined, region: 'us-east-1', maxSkewS: 900,
    requireContentSha256: false, service: 'sts',
  });
  if (!v.ok) {
    stats.denied++;
    log.write({ event: 'assume_role_denied', code: v.code, message: v.message });
    return stsError(res, 403, v.code === 'SignatureDoesNotMatch' ? 'SignatureDoesNotMatch' : 'AccessDenied', v.message);
  }
  const c = issue('assume_role');
  if (!c) return stsError(res, 500, 'ServiceUnavailable', 'injected failure');
  stats.assumed.push({
    role: q.get('RoleArn'), session: q.get('RoleSessionName'), external_id: q.get('ExternalId'),
    duration_s: q.get('DurationSeconds'), by: key.access_key, issued: c.access_key,
  });
  send(res, 200, 'text/xml', `<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleResult>
    <AssumedRoleUser>
      <Arn>arn:aws:sts::123456789012:assumed-role/larder/${xmlEsc(q.get('RoleSessionName') || '')}</Arn>
      <AssumedRoleId>AROATEST:${xmlEsc(q.get('RoleSessionName') || '')}</AssumedRoleId>
    </AssumedRoleUser>
    <Credentials>
      <AccessKeyId>${c.access_key}</AccessKeyId>
      <SecretAccessKey>${c.secret_key}</SecretAccessKey>
      <SessionToken>${c.session_token}</SessionToken>
      <Expiration>${c.expiration}</Expiration>
    </Credentials>
  </AssumeRoleResult>
  <ResponseMetadata><RequestId>${crypto.randomUUID()}</RequestId></ResponseMetadata>
</AssumeRoleResponse>`);
}

async function sts(req, res) {
  const raw = await readBody(req, 1 << 20);
  const body = raw.toString();
  const q = new URLSearchParams(req.method === 'POST' ? body : req.url.slice(req.url.indexOf('?') + 1));
  if (q.get('Action') === 'AssumeRole') return await assumeRole(req, res, raw, q);
  if (q.get('Action') !== 'AssumeRoleWithWebIdentity') return stsError(res, 400, 'InvalidAction', 'unsupported action');
  if (flags['role-arn'] && q.get('RoleArn') !== flags['role-arn']) {
    stats.denied++;
    return stsError(res, 403, 'AccessDenied', 'wrong role');
  }
  if (flags['web-token'] && q.get('WebIdentityToken') !== flags['web-token']) {
    stats.denied++;
    return stsError(res, 400, 'InvalidIdentityToken', 'the web identity token is not valid');
  }
  const c = issue('web_identity');
  if (!c) return stsError(res, 500, 'ServiceUnavailable', 'injected failure');
  send(res, 200, 'text/xml', `<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>system:serviceaccount:ns:larder</SubjectFromWebIdentityToken>
    <AssumedRoleUser>
      <Arn>arn:aws:sts::123456789012:assumed-role/larder/${xmlEsc(q.get('RoleSessionName') || '')}</Arn>
      <AssumedRoleId>AROATEST:${xmlEsc(q.get('RoleSessionName') || '')}</AssumedRoleId>
    </AssumedRoleUser>
    <Credentials>
      <SessionToken>${c.session_token}</SessionToken>
      <SecretAccessKey>${c.secret_key}</SecretAccessKey>
      <Expiration>${c.expiration}</Expiration>
      <AccessKeyId>${c.access_key}</AccessKeyId>
    </Credentials>
    <Audience>sts.amazonaws.com</Audience>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>${crypto.randomUUID()}</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>`);
}

function jsonCreds(res, source, extra) {
  const c = issue(source);
  if (!c) return send(res, 500, 'application/json', '{"message":"injected failure"}');
  send(res, 200, 'application/json', JSON.stringify({
    ...extra,
    AccessKeyId: c.access_key,
    SecretAccessKey: c.secret_key,
    Token: c.session_token,
    Expiration: c.expiration,
  }));
}

const server = http.createServer(async (req, res) => {
  const path = req.url.split('?')[0];
  try {
    if (path === '/__control') {
      const b = JSON.parse((await readBody(req)).toString() || '{}');
      if (b.fail !== undefined) failNext = Number(b.fail);
      if (b.ttl_s !== undefined) ttlS = Number(b.ttl_s);
      if (b.imds_token_status !== undefined) imdsTokenStatus = Number(b.imds_token_status);
      if (b.imds_v1 !== undefined) imdsV1 = Boolean(b.imds_v1);
      return send(res, 200, 'application/json', JSON.stringify({
        fail: failNext, ttl_s: ttlS, imds_token_status: imdsTokenStatus, imds_v1: imdsV1,
      }));
    }
    if (path === '/__stats') return send(res, 200, 'application/json', JSON.stringify(stats));
    stats.requests++;
    stats.by_path[path] = (stats.by_path[path] || 0) + 1;
    log.write({ event: 'request', method: req.method, path });
    if (path === '/' || path === '/sts') return await sts(req, res);
    if (path.startsWith('/container')) {
      if (flags['container-auth'] && req.headers.authorization !== flags['container-auth']) {
        stats.denied++;
        return send(res, 401, 'application/json', '{"message":"unauthorized"}');
      }
      return jsonCreds(res, 'container', { RoleArn: 'arn:aws:iam::123456789012:role/larder' });
    }
    if (path === '/latest/api/token') {
      if (req.method !== 'PUT' || !req.headers['x-aws-ec2-metadata-token-ttl-seconds']) return send(res, 400, 'text/plain', 'bad token request');
      if (imdsTokenStatus !== 200) return send(res, imdsTokenStatus, 'text/plain', 'no token here');
      const t = crypto.randomBytes(24).toString('base64url');
      imdsTokens.add(t);
      return send(res, 200, 'text/plain', t);
    }
    if (path.startsWith('/latest/meta-data/iam/security-credentials/')) {
      const token = req.headers['x-aws-ec2-metadata-token'];
      if (token === undefined && imdsV1) {
        stats.imds_v1++;
      } else if (!imdsTokens.has(token)) {
        stats.denied++;
        return send(res, 401, 'text/plain', 'no IMDSv2 token');
      }
      const rest = path.slice('/latest/meta-data/iam/security-credentials/'.length);
      if (rest === '') return send(res, 200, 'text/plain', role);
      if (rest !== role) return send(res, 404, 'text/plain', 'no such role');
      return jsonCreds(res, 'imds', { Code: 'Success', LastUpdated: new Date().toISOString(), Type: 'AWS-HMAC' });
    }
    send(res, 404, 'text/plain', 'not found');
  } catch (e) {
    send(res, 500, 'text/plain', String(e.message));
  }
});

server.listen(flags.port ?? 0, LOOPBACK, () => {
  const port = server.address().port;
  onShutdown(async () => {
    server.close();
    server.closeAllConnections();
    log.close?.();
  }, flags['watch-pid']);
  printReady({ port, endpoint: `http://${LOOPBACK}:${port}` });
});
