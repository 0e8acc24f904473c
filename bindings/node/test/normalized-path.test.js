// The app is called with the path the middleware limited: Express and Fastify apps on free
// loopback ports, sent other spellings of a limited route (repeated slashes, dot segments,
// encoded unreserved characters) with `http.request`, which sends the target as written.
// The route's one request is used by whichever spelling comes first, and the app sees and
// routes the normal form, as behind `sluice serve`'s proxy.
'use strict';

const { test, describe } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const express = require('express');
const Fastify = require('fastify');
const { Limiter, Policy } = require('sluice');
const { rateLimit } = require('sluice/express');
const sluiceFastify = require('sluice/fastify');
const { listen } = require('../test-support/support');

function options(limiter) {
  const one = Policy.fixedWindow('one', { limit: 1, window: '1m' });
  return { limiter, rules: [{ prefix: '/admin', policies: [one] }, { prefix: '/' }] };
}

async function expressApp(limiter) {
  const app = express();
  app.use(rateLimit(options(limiter)));
  app.get('/admin', (req, res) => res.json({ path: req.path, url: req.originalUrl }));
  app.get('/open/*rest', (req, res) => res.json({ path: req.path, url: req.originalUrl }));
  return listen(http.createServer(app));
}

async function fastifyApp(limiter) {
  const app = Fastify();
  await app.register(sluiceFastify, options(limiter));
  app.get('/admin', async (req) => ({ path: req.raw.url.split('?')[0], url: req.url }));
  app.get('/open/*', async (req) => ({ path: req.raw.url.split('?')[0], url: req.url }));
  await app.listen({ port: 0, host: '127.0.0.1' });
  const { port } = app.server.address();
  return { base: `http://127.0.0.1:${port}`, close: () => app.close() };
}

/** GET with the target sent exactly as written (no client-side URL normalization). */
function rawGet(base, target) {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: hostname, port, path: target, method: 'GET', agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

for (const [framework, serve] of Object.entries({ express: expressApp, fastify: fastifyApp })) {
  describe(framework, () => {
    test('the app routes the normalized path that was limited', async () => {
      const app = await serve(await Limiter.connect('memory'));
      try {
        // `//admin` is `/admin` to the limiter: limited, and the app's /admin route serves it.
        const first = await rawGet(app.base, '//admin');
        assert.equal(first.status, 200, first.body);
        assert.equal(first.headers['ratelimit-policy'], '"one";q=1;w=60');
        assert.equal(JSON.parse(first.body).path, '/admin');
        // Other spellings of the same route share its one request: limited, never routed apart.
        for (const target of ['/x/../%61dmin', '/./admin', '/%61dmin?q=1']) {
          const r = await rawGet(app.base, target);
          assert.equal(r.status, 429, `${target}: ${r.body}`);
        }
        // An unlimited route is handed its normal form too, the query kept.
        const open = await rawGet(app.base, '/open//a/./b/../%63?x=1');
        assert.equal(open.status, 200, open.body);
        assert.equal(JSON.parse(open.body).path, '/open/a/c');
        assert.equal(JSON.parse(open.body).url, '/open/a/c?x=1');
      } finally {
        await app.close();
      }
    });
  });
}
