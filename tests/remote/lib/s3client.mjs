// s3client.mjs: a minimal S3 client over node:http for the test tools,
// signing with lib/sigv4.mjs (so s3front's verification is exercised).
import http from 'node:http';
import { encodeQuery, signRequest, uriEncode } from './sigv4.mjs';

export const CLIENT_FLAGS = {
  endpoint: 'string',
  bucket: 'string',
  'access-key': 'string',
  'secret-key': 'string',
  'session-token': 'string',
  region: 'string',
  'virtual-host': 'bool',
};

export function clientConfig(flags) {
  if (!flags.endpoint) throw new Error('--endpoint http://127.0.0.1:PORT is required');
  const u = new URL(flags.endpoint);
  if (u.protocol !== 'http:') throw new Error('only http:// endpoints');
  return {
    hostname: u.hostname,
    port: Number(u.port || 80),
    accessKey: flags['access-key'] ?? process.env.AWS_ACCESS_KEY_ID ?? 'larder-test-key',
    secretKey: flags['secret-key'] ?? process.env.AWS_SECRET_ACCESS_KEY ?? 'larder-test-secret',
    sessionToken: flags['session-token'] ?? process.env.AWS_SESSION_TOKEN ?? null,
    region: flags.region ?? 'us-east-1',
    virtualHost: flags['virtual-host'],
  };
}

const agent = new http.Agent({ keepAlive: true });

// One signed request.  key: the object key (unencoded) or '' for the bucket.
// query: [[name, value]].  Returns { status, headers, body (Buffer) }.
export async function s3request(cfg, { method, bucket, key = '', query = [], headers = {}, body = null }) {
  const encKey = uriEncode(key, true);
  let host;
  let path;
  if (cfg.virtualHost) {
    // bucket.s3.localhost:PORT, connected to the endpoint's address.
    host = `${bucket}.s3.localhost:${cfg.port}`;
    path = `/${encKey}`;
  } else {
    host = `${cfg.hostname}:${cfg.port}`;
    path = `/${uriEncode(bucket)}${key !== '' ? '/' + encKey : ''}`;
  }
  const qs = encodeQuery(query);
  const signed = await signRequest({ method, host, path, query, headers, body }, cfg);
  if (body && body.length) signed['content-length'] = String(body.length);
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: cfg.hostname, port: cfg.port, method, path: path + (qs ? `?${qs}` : ''), headers: signed, agent },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(body && body.length ? body : undefined);
  });
}

// The text of the first <tag>...</tag> in xml (entities decoded), or null.
export function xmlField(xml, tag) {
  const m = new RegExp(`<${tag}>([\\s\\S]*?)</${tag}>`).exec(xml);
  return m ? unescapeXml(m[1]) : null;
}

export function xmlFields(xml, tag) {
  return [...xml.matchAll(new RegExp(`<${tag}>([\\s\\S]*?)</${tag}>`, 'g'))].map((m) => unescapeXml(m[1]));
}

function unescapeXml(s) {
  return s.replace(/&(lt|gt|amp|apos|quot|#\d+|#x[0-9a-f]+);/gi, (_, e) => {
    const named = { lt: '<', gt: '>', amp: '&', apos: "'", quot: '"' }[e.toLowerCase()];
    if (named) return named;
    return String.fromCodePoint(e[1] === 'x' || e[1] === 'X' ? parseInt(e.slice(2), 16) : parseInt(e.slice(1), 10));
  });
}

export function closeAgent() {
  agent.destroy();
}
