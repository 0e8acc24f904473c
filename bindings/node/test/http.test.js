// The middleware over real HTTP: an Express app and a Fastify app on free loopback ports,
// driven with fetch. The guide's 12-request sequence with exact headers, identities, rules,
// concurrency leases and both failure modes with Redis stopped.
'use strict';

const { test, before, after, describe } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const express = require('express');
const Fastify = require('fastify');
const { Limiter, Policy } = require('sluice');
const { rateLimit } = require('sluice/express');
const sluiceFastify = require('sluice/fastify');
const { startRedis, freshIdentity, listen, get } = require('../test-support/support');

let redis;
before(async () => {
  redis = await startRedis();
});
after(async () => {
  await redis?.stop();
});

/** An Express app with the middleware; resolves to { base, close }. */
async function expressApp(options) {
  const app = express();
  app.use(rateLimit(options));
  app.get('/hello', (req, res) => res.json({ ok: true }));
  app.get('/health', (req, res) => res.json({ ok: true }));
  app.get('/whoami', (req, res) => res.json({ identity: req.sluiceIdentity }));
  app.get('/slow', (req, res) => setTimeout(() => res.json({ ok: true }), Number(req.query.ms || 200)));
  return listen(http.createServer(app));
}

/** A Fastify app with the plugin; resolves to { base, close }. */
async function fastifyApp(options) {
  const app = Fastify();
  await app.register(sluiceFastify, options);
  app.get('/hello', async () => ({ ok: true }));
  app.get('/health', async () => ({ ok: true }));
  app.get('/whoami', async (req) => ({ identity: req.sluiceIdentity }));
  app.get('/slow', (req, reply) => {
    setTimeout(() => reply.send({ ok: true }), Number(req.query.ms || 200));
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  const { port } = app.server.address();
  return { base: `http://127.0.0.1:${port}`, close: () => app.close() };
}

const FRAMEWORKS = { express: expressApp, fastify: fastifyApp };

for (const [framework, serve] of Object.entries(FRAMEWORKS)) {
  describe(framework, () => {
    for (const store of ['memory', 'redis']) {
      test(`the guide's 12 requests on ${store}: ten 200, then 429 with the guide's headers`, async () => {
        const limiter = await Limiter.connect(store === 'memory' ? 'memory' : redis.url, { timeoutMs: 2000 });
        const burst = Policy.tokenBucket('burst', { capacity: 10, rate: '5/s' });
        const app = await serve({
          limiter,
          rules: [{ prefix: '/', policies: [burst] }, { prefix: '/health' }],
          apiKeyHeader: 'x-api-key',
        });
        try {
          // The bucket refills one token per 200 ms, so the sequence is exact only when the
          // first 11 requests take less than that (the guide says as much). Warm the app up,
          // then try a fresh key up to three times until a run is fast enough.
          await get(app.base, '/hello', { 'x-api-key': 'warm-up' });
          let key;
          let responses;
          let elapsed = Infinity;
          for (let attempt = 0; attempt < 3 && elapsed >= 180; attempt++) {
            key = `demo-${freshIdentity('k')}`; // a fresh bucket on the shared Redis
            responses = [];
            const started = performance.now();
            for (let i = 0; i < 12; i++) {
              responses.push(await get(app.base, '/hello', { 'x-api-key': key }));
              if (i === 10) elapsed = performance.now() - started;
            }
          }
          assert.ok(elapsed < 180, `11 requests took ${elapsed.toFixed(0)} ms three times: too slow for the sequence`);
          assert.deepEqual(
            responses.slice(0, 11).map((r) => r.status),
            [...Array(10).fill(200), 429],
          );
          responses.forEach((r, i) => {
            if (r.status !== 200 || i >= 10) return;
            assert.deepEqual(JSON.parse(r.body), { ok: true });
            assert.equal(r.headers.get('ratelimit-policy'), '"burst";q=10;w=2');
            assert.equal(r.headers.get('ratelimit'), `"burst";r=${9 - i};t=${i < 5 ? 1 : 2}`);
            assert.equal(r.headers.get('retry-after'), null);
          });
          const denied = responses[10];
          assert.equal(denied.headers.get('ratelimit-policy'), '"burst";q=10;w=2');
          assert.equal(denied.headers.get('ratelimit'), '"burst";r=0;t=2');
          assert.equal(denied.headers.get('retry-after'), '1');
          assert.equal(denied.headers.get('cache-control'), 'no-store');
          assert.equal(denied.headers.get('content-type'), 'application/problem+json');
          const body = JSON.parse(denied.body);
          assert.deepEqual([body.status, body.policy, body.title, body.type], [429, 'burst', 'Too Many Requests', 'about:blank']);
          assert.equal(body.detail, 'rate limit "burst" exceeded (10 per 2 s); retry after 1 s');
          assert.ok(body.retry_after_ms >= 1 && body.retry_after_ms <= 200, body.retry_after_ms);
          // Another key, and an anonymous client (limited by IP), have buckets of their own.
          assert.equal((await get(app.base, '/hello', { 'x-api-key': `${key}-other` })).status, 200);
          if (store === 'memory') assert.equal((await get(app.base, '/hello')).status, 200);
          // Exempt paths are never limited and carry no headers.
          const health = await get(app.base, '/health', { 'x-api-key': key });
          assert.equal(health.status, 200);
          assert.equal(health.headers.get('ratelimit'), null);
          // 5 tokens a second: 250 ms later one more request passes.
          await new Promise((r) => setTimeout(r, 250));
          assert.equal((await get(app.base, '/hello', { 'x-api-key': key })).status, 200);
        } finally {
          await app.close();
        }
      });
    }

    test('identities are the Rust layer\'s: hashed keys, client IP through trusted proxies only', async () => {
      const limiter = await Limiter.connect('memory');
      const policy = Policy.fixedWindow('p', { limit: 100, window: '1m' });
      const trusted = await serve({ limiter, policies: [policy], apiKeyHeader: 'x-api-key', trustedProxies: ['127.0.0.1/32'] });
      const untrusted = await serve({ limiter, policies: [policy] });
      try {
        const who = async (base, headers = {}) => JSON.parse((await get(base, '/whoami', headers)).body).identity;
        const hashed = await who(trusted.base, { 'x-api-key': 'sk_live_1' });
        assert.equal(hashed, limiter.credentialIdentity('sk_live_1'));
        assert.ok(!hashed.includes('sk_live'));
        assert.equal(await who(trusted.base), 'ip:127.0.0.1');
        // The peer is a trusted proxy: the right-most untrusted forwarded address is the client.
        assert.equal(await who(trusted.base, { 'x-forwarded-for': '6.6.6.6, 203.0.113.7' }), 'ip:203.0.113.7');
        assert.equal(await who(trusted.base, { 'x-forwarded-for': '2001:db8:1:2::9' }), 'ip6:2001:db8:1:2::/64');
        // Nobody is trusted: forwarding headers are the client's own words and are ignored.
        assert.equal(await who(untrusted.base, { 'x-forwarded-for': '203.0.113.7' }), 'ip:127.0.0.1');
      } finally {
        await trusted.close();
        await untrusted.close();
      }
    });

    test('rules pick policies by the longest prefix, then by method', async () => {
      const limiter = await Limiter.connect('memory');
      const one = Policy.fixedWindow('one', { limit: 1, window: '1m' });
      const many = Policy.fixedWindow('many', { limit: 100, window: '1m' });
      const app = await serve({
        limiter,
        rules: [
          { prefix: '/', policies: [many] },
          { prefix: '/hello', methods: ['GET'], policies: [one] },
        ],
      });
      try {
        assert.equal((await get(app.base, '/hello')).headers.get('ratelimit-policy'), '"one";q=1;w=60');
        assert.equal((await get(app.base, '/hello?x=1')).status, 429);
        assert.equal((await get(app.base, '/whoami')).headers.get('ratelimit-policy'), '"many";q=100;w=60');
      } finally {
        await app.close();
      }
    });

    test('a concurrency lease is held while the response runs and released when it ends', async () => {
      const limiter = await Limiter.connect(redis.url, { timeoutMs: 2000 });
      const inflight = Policy.concurrency('inflight', { limit: 2, lease: '1m' });
      const app = await serve({ limiter, policies: [inflight], apiKeyHeader: 'x-api-key' });
      try {
        const key = freshIdentity('k');
        const slow = [get(app.base, '/slow?ms=400', { 'x-api-key': key }), get(app.base, '/slow?ms=400', { 'x-api-key': key })];
        await new Promise((r) => setTimeout(r, 150));
        const third = await get(app.base, '/hello', { 'x-api-key': key });
        assert.equal(third.status, 429, 'two requests in flight hold both leases');
        assert.deepEqual((await Promise.all(slow)).map((r) => r.status), [200, 200]);
        // Released on 'close' of each response: give the release a moment to reach Redis.
        let after;
        for (let i = 0; i < 20; i++) {
          after = await get(app.base, '/hello', { 'x-api-key': key });
          if (after.status === 200) break;
          await new Promise((r) => setTimeout(r, 25));
        }
        assert.equal(after.status, 200, 'the leases came back when the responses ended');
      } finally {
        await app.close();
      }
    });

    test('Redis stopped, failing open: requests pass quickly and carry no RateLimit headers', async () => {
      const down = await startRedis();
      const limiter = await Limiter.connect(down.url, { timeoutMs: 50 });
      await down.stop();
      const policy = Policy.fixedWindow('p', { limit: 1, window: '1m' });
      const app = await serve({ limiter, policies: [policy] });
      try {
        for (let i = 0; i < 3; i++) {
          const started = Date.now();
          const r = await get(app.base, '/hello');
          assert.ok(Date.now() - started < 1000);
          assert.equal(r.status, 200);
          assert.deepEqual(JSON.parse(r.body), { ok: true });
          for (const h of ['ratelimit', 'ratelimit-policy', 'x-ratelimit-limit', 'retry-after']) {
            assert.equal(r.headers.get(h), null, h);
          }
        }
      } finally {
        await app.close();
      }
    });

    for (const [configured, expected] of [[undefined, 503], [429, 429]]) {
      test(`Redis stopped, failing closed: ${expected} with Retry-After: 1`, async () => {
        const down = await startRedis();
        const limiter = await Limiter.connect(down.url, { timeoutMs: 50 });
        await down.stop();
        const strict = Policy.fixedWindow('strict', { limit: 100, window: '1m', failureMode: 'closed' });
        const options = { limiter, policies: [strict] };
        if (configured) options.failClosedStatus = configured;
        const app = await serve(options);
        try {
          const started = Date.now();
          const r = await get(app.base, '/hello');
          assert.ok(Date.now() - started < 1000);
          assert.equal(r.status, expected);
          assert.equal(r.headers.get('retry-after'), '1');
          assert.equal(r.headers.get('cache-control'), 'no-store');
          assert.equal(r.headers.get('content-type'), 'application/problem+json');
          assert.equal(r.headers.get('ratelimit'), null);
          const body = JSON.parse(r.body);
          assert.deepEqual([body.policy, body.status, body.retry_after_ms], ['strict', expected, 1000]);
        } finally {
          await app.close();
        }
      });
    }
  });
}

test('middleware options are checked when the app is built', () => {
  assert.throws(() => rateLimit({ policies: [] }), /`limiter` is required/);
  assert.throws(() => rateLimit({ limiter: {}, polices: [] }), /unknown option "polices"/);
  assert.throws(() => rateLimit({ limiter: {} }), /give `policies` or `rules`/);
  assert.throws(() => rateLimit({ limiter: {}, rules: [{ policies: [] }] }), /needs a `prefix`/);
});

test('the middleware also takes a Promise of a limiter', async () => {
  const policy = Policy.fixedWindow('p', { limit: 1, window: '1m' });
  const app = await expressApp({ limiter: Limiter.connect('memory'), policies: [policy] });
  try {
    assert.equal((await get(app.base, '/hello')).status, 200);
    assert.equal((await get(app.base, '/hello')).status, 429);
  } finally {
    await app.close();
  }
});

// A sluice.toml's routes, as `sluice serve` limits them: the deny list answers 403, a route
// counting only 401s gives right passwords back (Fastify settles in onSend, Express before
// the head is written), and the fields describe the state after the refund.
for (const [framework, serve] of Object.entries(FRAMEWORKS)) {
  test(`${framework} with { config }: 403 for the deny list, refunds by outcome`, async () => {
    const fs = require('node:fs');
    const os = require('node:os');
    const path = require('node:path');
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-config-mw-'));
    const config = path.join(dir, 'sluice.toml');
    fs.writeFileSync(config, `
[store]
url = "${redis.url}"
timeout = "2s"

[lists]
deny = ["hdr:blocked"]

[policies.logins]
algorithm = "token-bucket"
capacity = 2
rate = "2/h"
identity = "header:x-user"

[[routes]]
prefix = "/hello"
policies = ["logins"]
count = [401]
upstream = "http://127.0.0.1:9"
`);
    const app = await serve({ config });
    try {
      const denied = await get(app.base, '/hello', { 'x-user': 'blocked' });
      assert.equal(denied.status, 403);
      assert.equal(denied.headers.get('content-type'), 'application/problem+json');
      // /hello answers 200: never counted, so the bucket stays full.
      const user = freshIdentity('u');
      for (let i = 0; i < 4; i++) {
        const r = await get(app.base, '/hello', { 'x-user': user });
        assert.equal(r.status, 200);
        assert.match(r.headers.get('ratelimit'), /^"logins";r=2;/);
      }
      // Unrouted paths pass unlimited.
      const free = await get(app.base, '/health', { 'x-user': user });
      assert.equal(free.status, 200);
      assert.equal(free.headers.get('ratelimit'), null);
    } finally {
      await app.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
}
