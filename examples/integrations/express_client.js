// An Express app that asks `sluice serve` before each request, over HTTP.
//
// Node.js apps should use the `sluice` package first (bindings/node): the same engine
// in-process, no extra hop. This example is for apps that call one central `sluice serve`.
//
// What keeps it from failing open by accident:
// - one keep-alive `http.Agent` for the whole process, so a burst of requests reuses pooled
//   connections instead of opening one each (and queues on the pool instead of failing);
// - a timeout that holds under load (1.5 s by default, the wait for a pooled socket
//   included), not one tuned for an idle benchmark;
// - when sluice cannot answer (timeout, refused connection, 503 from an overloaded sluice)
//   the request is refused with 503 (fail closed). Failing open is a choice you make
//   explicitly: SLUICE_FAIL_OPEN=1.
//
// Run: SLUICE_URL=http://127.0.0.1:8080 PORT=8000 node express_client.js
// (`npm install express`; Node.js 20+), next to `sluice serve --config examples/api.toml`.
'use strict';

const http = require('node:http');
const express = require('express');

const SLUICE = new URL('/v1/check', process.env.SLUICE_URL || 'http://127.0.0.1:8080');
const POLICY = process.env.SLUICE_POLICY || 'burst';
const TOKEN = process.env.SLUICE_API_TOKEN; // when sluice sets [server] api_token
const FAIL_OPEN = process.env.SLUICE_FAIL_OPEN === '1';
const TIMEOUT_MS = Number(process.env.SLUICE_TIMEOUT_MS || 1500);
const POOL = Number(process.env.SLUICE_POOL || 64);

// One agent per process: at most POOL sockets to sluice, kept alive between requests.
const agent = new http.Agent({ keepAlive: true, maxSockets: POOL, maxFreeSockets: POOL });

/** POSTs `body` to sluice; resolves to { status, json } or rejects within TIMEOUT_MS. */
function askSluice(body) {
  return new Promise((resolve, reject) => {
    const payload = JSON.stringify(body);
    const req = http.request(SLUICE, {
      method: 'POST',
      agent,
      headers: {
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(payload),
        ...(TOKEN ? { authorization: `Bearer ${TOKEN}` } : {}),
      },
    }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c) => { text += c; });
      res.on('end', () => {
        clearTimeout(timer);
        resolve({ status: res.statusCode, text });
      });
      res.on('error', reject);
    });
    // One deadline for the whole call, the wait for a pooled socket included.
    const timer = setTimeout(() => req.destroy(new Error('sluice timed out')), TIMEOUT_MS);
    req.on('error', (e) => { clearTimeout(timer); reject(e); });
    req.end(payload);
  });
}

function unavailable(res, reason) {
  res.set('retry-after', '1');
  return res.status(503).json({ error: 'rate_limiter_unavailable', detail: reason });
}

function rateLimit(req, res, next) {
  const key = req.get('x-api-key');
  // The API key is sent as a credential: sluice hashes it, it never becomes a key name.
  const who = key ? { credential: key } : { identity: `ip:${req.ip}` };
  askSluice({ policy: POLICY, ...who }).then(({ status, text }) => {
    if (status === 503 && FAIL_OPEN) return next(); // overloaded, and failing open was chosen
    if (status !== 200) {
      // A refusal (unknown policy, bad token) is a deployment mistake; a 503 is an
      // overloaded sluice. Either way nothing was decided: refuse rather than admit.
      console.error(`sluice answered ${status}: ${text.slice(0, 200)}`);
      return unavailable(res, `the rate limiter answered ${status}`);
    }
    const d = JSON.parse(text);
    res.set(d.headers);
    if (!d.allowed) return res.status(429).json({ error: 'rate_limited', retry_after_ms: d.retry_after_ms });
    return next();
  }, (e) => {
    console.warn(`sluice did not answer: ${e.message}`);
    if (FAIL_OPEN) return next();
    return unavailable(res, 'the rate limiter did not answer in time');
  });
}

const app = express();
app.use(rateLimit);
app.get('/hello', (req, res) => res.json({ message: 'hello' }));

if (require.main === module) {
  const server = app.listen(Number(process.env.PORT || 8000), '127.0.0.1', () => {
    // The test harness reads the port from this line.
    console.log(`listening on ${server.address().port}`);
  });
}

module.exports = { app, rateLimit };
