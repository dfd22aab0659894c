#!/usr/bin/env node
// sigv4-vectors.mjs: checks s3front's SigV4 verification (lib/sigv4.mjs)
// against the worked examples in AWS's S3 documentation ("Examples:
// Signature Calculations in AWS Signature Version 4", header-based auth,
// AKIAIOSFODNN7EXAMPLE), plus a few cases derived from them.  Prints
// "N passed, N failed".
import crypto from 'node:crypto';
import { verifyRequest } from './lib/sigv4.mjs';

const cfg = {
  accessKey: 'AKIAIOSFODNN7EXAMPLE',
  secretKey: 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY',
  region: 'us-east-1',
  maxSkewS: 0, // the examples are from 2013
  requireContentSha256: true,
};
const EMPTY = 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855';
const HOST = 'examplebucket.s3.amazonaws.com';
const auth = (signed, sig) =>
  `AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=${signed},Signature=${sig}`;

const GET_OBJECT = {
  method: 'GET',
  rawPath: '/test.txt',
  rawQuery: '',
  headers: {
    host: HOST,
    range: 'bytes=0-9',
    'x-amz-content-sha256': EMPTY,
    'x-amz-date': '20130524T000000Z',
    authorization: auth('host;range;x-amz-content-sha256;x-amz-date', 'f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41'),
  },
};
const LIST = {
  method: 'GET',
  rawPath: '/',
  rawQuery: 'max-keys=2&prefix=J',
  headers: {
    host: HOST,
    'x-amz-content-sha256': EMPTY,
    'x-amz-date': '20130524T000000Z',
    authorization: auth('host;x-amz-content-sha256;x-amz-date', '34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7'),
  },
};
const PUT_BODY = Buffer.from('Welcome to Amazon S3.');
const PUT_OBJECT = {
  method: 'PUT',
  rawPath: '/test%24file.text',
  rawQuery: '',
  headers: {
    host: HOST,
    date: 'Fri, 24 May 2013 00:00:00 GMT',
    'x-amz-date': '20130524T000000Z',
    'x-amz-storage-class': 'REDUCED_REDUNDANCY',
    'x-amz-content-sha256': crypto.createHash('sha256').update(PUT_BODY).digest('hex'),
    authorization: auth('date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class', '98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd'),
  },
};
const GET_LIFECYCLE = {
  method: 'GET',
  rawPath: '/',
  rawQuery: 'lifecycle',
  headers: {
    host: HOST,
    'x-amz-content-sha256': EMPTY,
    'x-amz-date': '20130524T000000Z',
    authorization: auth('host;x-amz-content-sha256;x-amz-date', 'fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543'),
  },
};
const withHeaders = (r, h) => ({ ...r, headers: { ...r.headers, ...h } });

const cases = [
  ['AWS example: GET Object with Range', GET_OBJECT, null, 'ok'],
  ['AWS example: GET Bucket (list objects)', LIST, null, 'ok'],
  ['AWS example: PUT Object (Date signed too)', PUT_OBJECT, PUT_BODY, 'ok'],
  ['AWS example: GET Bucket Lifecycle (a parameter without a value)', GET_LIFECYCLE, null, 'ok'],
  ['the list example with its query sent unsorted', { ...LIST, rawQuery: 'prefix=J&max-keys=2' }, null, 'ok'],
  ['GET Object with a path sent as %74est.txt', { ...GET_OBJECT, rawPath: '/%74est.txt' }, null, 'ok'],
  ['GET Object with another Range than signed', withHeaders(GET_OBJECT, { range: 'bytes=0-10' }), null, 'SignatureDoesNotMatch'],
  ['GET Object signed with another secret', GET_OBJECT, null, 'SignatureDoesNotMatch', { secretKey: 'x' }],
  ['GET Object with an unknown key id', GET_OBJECT, null, 'InvalidAccessKeyId', { accessKey: 'AKIAOTHER' }],
  ['GET Object with an unsigned x-amz-meta header', withHeaders(GET_OBJECT, { 'x-amz-meta-a': '1' }), null, 'AccessDenied'],
  ['PUT Object whose body is not what was signed', PUT_OBJECT, Buffer.from('Welcome to Amazon S4.'), 'XAmzContentSHA256Mismatch'],
  ['GET Object without x-amz-content-sha256', { ...GET_OBJECT, headers: { ...GET_OBJECT.headers, 'x-amz-content-sha256': undefined } }, null, 'InvalidRequest'],
];

let pass = 0;
let fail = 0;
for (const [name, req, body, want, over] of cases) {
  const headers = Object.fromEntries(Object.entries(req.headers).filter(([, v]) => v !== undefined));
  const r = await verifyRequest({ ...req, headers }, body, { ...cfg, ...(over || {}) });
  const got = r.ok ? 'ok' : r.code;
  if (got === want) {
    pass++;
    console.log(`ok   ${name}`);
  } else {
    fail++;
    console.log(`FAIL ${name}: got ${got}, want ${want}`);
    if (r.extra?.CanonicalRequest) console.log(r.extra.CanonicalRequest.replace(/^/gm, '     | '));
  }
}
console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
