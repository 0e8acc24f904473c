// The core API against real stores: the embedded one and a redis-server of the test's own.
// Admitted counts are checked against arithmetic; numbers and header values against the
// guide's worked example.
'use strict';

const { test, before, after, describe } = require('node:test');
const assert = require('node:assert/strict');
const { Limiter, Policy } = require('sluice');
const { startRedis, freshIdentity } = require('../test-support/support');

let redis;
before(async () => {
  redis = await startRedis();
});
after(async () => {
  await redis?.stop();
});

const stores = () => [
  ['memory', 'memory'],
  ['redis', redis.url],
];

// Quotas of 5 that refill or slide far too slowly to matter within a test: 8 quick checks
// admit exactly 5.
const FIVE = {
  tokenBucket: () => Policy.tokenBucket('tb', { capacity: 5, rate: '1/h' }),
  gcra: () => Policy.gcra('gcra', { rate: '1/h', burst: 4 }),
  leakyBucket: () => Policy.leakyBucket('lb', { capacity: 5, rate: '1/h' }),
  fixedWindow: () => Policy.fixedWindow('fw', { limit: 5, window: '1d' }),
  slidingCounter: () => Policy.slidingCounter('sc', { limit: 5, window: '1h' }),
  slidingLog: () => Policy.slidingLog('sl', { limit: 5, window: 3600 }),
  concurrency: () => Policy.concurrency('cc', { limit: 5, lease: '1m' }),
};

describe('every algorithm admits its quota exactly', () => {
  for (const [algorithm, make] of Object.entries(FIVE)) {
    test(`${algorithm} on memory and on Redis`, async () => {
      for (const [store, url] of stores()) {
        const limiter = await Limiter.connect(url, { timeoutMs: 2000 });
        const policy = make();
        const id = freshIdentity();
        const results = [];
        for (let i = 0; i < 8; i++) results.push(await limiter.check(policy, id));
        const admitted = results.filter((r) => r.allowed).length;
        assert.equal(admitted, 5, `${algorithm} on ${store}`);
        assert.deepEqual(
          results.map((r) => r.allowed),
          [true, true, true, true, true, false, false, false],
          `${algorithm} on ${store}: the first five pass`,
        );
        assert.deepEqual(results.slice(0, 5).map((r) => r.remaining), [4, 3, 2, 1, 0], `${algorithm} on ${store}`);
        for (const r of results) assert.equal(r.limit, 5);
        const denied = results[5];
        assert.equal(denied.verdict, 'decided');
        assert.equal(denied.reason, 'limited');
        assert.ok(denied.retryAfterMs > 0, `${algorithm} on ${store}: a denial says when to retry`);
        assert.equal(denied.headers['Retry-After'], String(Math.max(1, Math.ceil(denied.retryAfterMs / 1000))));
      }
    });
  }

  test('concurrent checks on Redis admit exactly the quota', async () => {
    const limiter = await Limiter.connect(redis.url, { timeoutMs: 2000 });
    for (const [algorithm, make] of Object.entries(FIVE)) {
      const policy = make();
      const id = freshIdentity();
      const results = await Promise.all(Array.from({ length: 40 }, () => limiter.check(policy, id)));
      assert.equal(results.filter((r) => r.allowed).length, 5, algorithm);
    }
  });
});

test('costs are taken from the quota', async () => {
  for (const [store, url] of stores()) {
    const limiter = await Limiter.connect(url, { timeoutMs: 2000 });
    const policy = Policy.tokenBucket('costly', { capacity: 10, rate: '1/h' });
    const id = freshIdentity();
    const admitted = [];
    for (let i = 0; i < 5; i++) admitted.push((await limiter.check(policy, id, { cost: 3 })).allowed);
    // 10 tokens, 3 a check: three checks (9), then 1 token left, too few for a fourth.
    assert.deepEqual(admitted, [true, true, true, false, false], store);
    const one = await limiter.check(policy, id, { cost: 1 });
    assert.equal(one.allowed, true, store);
    assert.equal(one.remaining, 0, store);
    const never = await limiter.check(policy, freshIdentity(), { cost: 11 });
    assert.equal(never.allowed, false);
    assert.equal(never.reason, 'cost_exceeds_limit');
  }
});

test("the guide's bucket: numbers and headers of 12 quick checks", async () => {
  for (const [store, url] of stores()) {
    const limiter = await Limiter.connect(url, { timeoutMs: 2000 });
    const burst = Policy.tokenBucket('burst', { capacity: 10, rate: '5/s' });
    const id = freshIdentity();
    const results = [];
    for (let i = 0; i < 12; i++) results.push(await limiter.check(policy(burst), id));
    assert.deepEqual(results.slice(0, 11).map((r) => r.allowed), [...Array(10).fill(true), false], store);
    const first = results[0];
    assert.equal(first.limit, 10);
    assert.equal(first.remaining, 9);
    assert.equal(first.headers['RateLimit-Policy'], '"burst";q=10;w=2');
    assert.equal(first.headers.RateLimit, '"burst";r=9;t=1');
    assert.equal(first.headers['Retry-After'], undefined);
    const denied = results[10];
    assert.equal(denied.headers['RateLimit-Policy'], '"burst";q=10;w=2');
    assert.equal(denied.headers.RateLimit, '"burst";r=0;t=2');
    assert.equal(denied.headers['Retry-After'], '1');
    assert.ok(denied.retryAfterMs >= 1 && denied.retryAfterMs <= 200, `${store}: ${denied.retryAfterMs}`);
    assert.ok(denied.resetAfterMs > 1800 && denied.resetAfterMs <= 2000, `${store}: ${denied.resetAfterMs}`);
    // 5 tokens a second: 250 ms later one more check passes.
    await new Promise((r) => setTimeout(r, 250));
    assert.equal((await limiter.check(burst, id)).allowed, true, store);
  }
  function policy(p) {
    return p;
  }
});

test('credentials are hashed into the identity the Rust layer uses', async () => {
  const limiter = await Limiter.connect('memory');
  const id = limiter.credentialIdentity('sk_live_1');
  assert.match(id, /^key:h[0-9a-f]{32}$/);
  assert.equal(limiter.credentialIdentity(Buffer.from('sk_live_1')), id);
  assert.notEqual(limiter.credentialIdentity('sk_live_2'), id);
  const policy = Policy.fixedWindow('api', { limit: 2, window: '1m' });
  assert.equal(limiter.key(policy, id), `rl:{${id}}:api`);
  // A credential check and an identity check of its hash share one bucket.
  assert.equal((await limiter.check(policy, { credential: 'sk_live_1' })).allowed, true);
  assert.equal((await limiter.check(policy, id)).allowed, true);
  assert.equal((await limiter.check(policy, null, { credential: 'sk_live_1' })).allowed, false);
  // Another hash key, another identity.
  const other = await Limiter.connect('memory', { hashKey: 'ab'.repeat(32) });
  assert.notEqual(other.credentialIdentity('sk_live_1'), id);
});

test('concurrency leases are released through the result', async () => {
  for (const [store, url] of stores()) {
    const limiter = await Limiter.connect(url, { timeoutMs: 2000 });
    const policy = Policy.concurrency('inflight', { limit: 2 });
    const id = freshIdentity();
    const a = await limiter.check(policy, id);
    const b = await limiter.check(policy, id);
    assert.equal((await limiter.check(policy, id)).allowed, false, store);
    assert.equal(typeof a.leaseToken, 'string');
    assert.equal(await a.release(), 1, store);
    assert.equal(await a.release(), 0, 'a second release gives nothing back');
    const c = await limiter.check(policy, id);
    assert.equal(c.allowed, true, `${store}: the released slot is free again`);
    assert.equal(await limiter.release(policy, b.leaseToken), 1, `${store}: by token`);
    await c.release();
  }
});

test('bad input is refused with clear errors', async () => {
  const limiter = await Limiter.connect('memory');
  const refused = (fn, pattern) => assert.throws(fn, (e) => e.code === 'InvalidArg' && pattern.test(e.message));
  refused(() => Policy.gcra('g', { rate: '5/s', capacity: 3 }), /gcra takes no capacity/);
  refused(() => Policy.tokenBucket('t', { capacity: 10 }), /rate/);
  refused(() => Policy.tokenBucket('t', { capcity: 10, rate: '5/s' }), /unknown option "capcity"/);
  refused(() => Policy.fixedWindow('f', { limit: -1, window: '1s' }), /limit must be a whole number/);
  refused(() => Policy.fixedWindow('f', { limit: 1.5, window: '1s' }), /limit must be a whole number/);
  refused(() => Policy.tokenBucket('t', { capacity: 10, rate: 'fast' }), /invalid rate "fast"/);
  refused(() => Policy.fixedWindow('bad name!', { limit: 1, window: '1s' }), /policy "bad name!"/);
  refused(() => Policy.fixedWindow('f', { limit: 1, window: '1s', failureMode: 'maybe' }), /failureMode/);
  const p = Policy.fixedWindow('f', { limit: 1, window: '1s' });
  await assert.rejects(limiter.check(p), /missing identity/);
  await assert.rejects(limiter.check(p, 'user:1', { credential: 'k' }), /either an identity or \{ credential \}/);
  await assert.rejects(limiter.check(p, 'user:1', { cost: -2 }), /cost must be a whole number/);
  await assert.rejects(limiter.check({}, 'user:1'), /must be a Policy/);
  await assert.rejects(Limiter.connect('postgres://x'), (e) => /postgres/.test(e.message));
  await assert.rejects(Limiter.connect('memory', { hashKey: 'short' }), /hashKey must be 64 hex digits/);
});

test('policies describe themselves', () => {
  const p = Policy.slidingLog('search', { limit: 30, window: '1m', failureMode: 'closed', shards: 2 });
  assert.equal(p.name, 'search');
  assert.equal(p.algorithm, 'sliding-log');
  assert.equal(p.quota, 30);
  assert.equal(p.windowMs, 60_000);
  assert.equal(p.failureMode, 'closed');
  assert.equal(p.shards, 2);
  assert.equal(p.shadow, false);
});

test('a shadow policy counts but never denies', async () => {
  const limiter = await Limiter.connect('memory');
  const p = Policy.fixedWindow('trial', { limit: 1, window: '1m', shadow: true });
  const id = freshIdentity();
  assert.equal((await limiter.check(p, id)).allowed, true);
  const second = await limiter.check(p, id);
  assert.equal(second.allowed, true);
  assert.deepEqual(second.headers, {}, 'shadow policies are not shown to clients');
});

test('the event loop keeps running while Redis is slow to answer', async () => {
  const limiter = await Limiter.connect(redis.url, { timeoutMs: 2000 });
  const p = Policy.fixedWindow('slow', { limit: 100, window: '1m' });
  const id = freshIdentity();
  await limiter.check(p, id); // connected and scripts loaded
  // The server is frozen for 400 ms; the check waits that long on the tokio runtime.
  redis.pause();
  const resumed = new Promise((r) =>
    setTimeout(() => {
      redis.resume();
      r();
    }, 400),
  );
  const started = Date.now();
  let ticks = 0;
  const timer = setInterval(() => ticks++, 10);
  const result = await limiter.check(p, id);
  clearInterval(timer);
  await resumed;
  const waited = Date.now() - started;
  assert.equal(result.allowed, true);
  assert.ok(waited >= 250, `the check waited for Redis (${waited} ms)`);
  // A blocked loop would run no timer at all while the check was in flight.
  assert.ok(ticks >= 10, `timers kept firing: ${ticks} ticks in ${waited} ms`);
});

test('with Redis stopped, open policies admit and closed ones deny, quickly', async () => {
  const down = await startRedis();
  const limiter = await Limiter.connect(down.url, { timeoutMs: 50 });
  await down.stop();
  const open = Policy.fixedWindow('open', { limit: 1, window: '1m' });
  const closed = Policy.fixedWindow('closed', { limit: 100, window: '1m', failureMode: 'closed' });
  for (let i = 0; i < 3; i++) {
    const started = Date.now();
    const a = await limiter.check(open, 'user:1');
    const b = await limiter.check(closed, 'user:1');
    assert.ok(Date.now() - started < 1000);
    assert.equal(a.allowed, true);
    assert.equal(a.verdict, 'failed_open');
    assert.deepEqual(a.headers, {}, 'nothing was decided, nothing is described');
    assert.equal(b.allowed, false);
    assert.equal(b.verdict, 'failed_closed');
    assert.equal(b.reason, 'store_unavailable');
    assert.equal(b.retryAfterMs, 1000);
    assert.deepEqual(b.headers, { 'Retry-After': '1' });
  }
});

test('a pending check keeps the process alive, and a finished one lets it exit', () => {
  const { spawnSync } = require('node:child_process');
  const script = `
    const { Limiter, Policy } = require('sluice');
    (async () => {
      const limiter = await Limiter.connect(${JSON.stringify(redis.url)}, { timeoutMs: 2000 });
      const d = await limiter.check(Policy.fixedWindow('alive', { limit: 5, window: '1m' }), 'user:alive');
      console.log(JSON.stringify([d.allowed, d.remaining]));
    })();`;
  const started = Date.now();
  const run = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 20_000, env: process.env });
  assert.equal(run.status, 0, run.stderr);
  assert.equal(run.stdout.trim(), '[true,4]', 'the result arrived before the process ended');
  assert.ok(Date.now() - started < 10_000, 'and the process ended by itself');
});

test('thousands of checks in flight complete in batches, each with its own exact result', async () => {
  for (const [store, url] of stores()) {
    const limiter = await Limiter.connect(url, { timeoutMs: 5000 });
    const policy = Policy.slidingLog('many', { limit: 7, window: '1h' });
    const ids = Array.from({ length: 100 }, () => freshIdentity());
    // 100 identities x 20 checks, all submitted in one turn of the event loop (one batch to
    // the addon), interleaved; a few credential checks ride along on the one-by-one path.
    const pending = [];
    for (let j = 0; j < 2000; j++) pending.push(limiter.check(policy, ids[j % 100]));
    const keyed = Array.from({ length: 5 }, () => limiter.check(policy, { credential: 'sk_many' }));
    const results = await Promise.all(pending);
    for (let i = 0; i < 100; i++) {
      const mine = results.filter((_, j) => j % 100 === i);
      const admitted = mine.filter((r) => r.allowed);
      assert.equal(admitted.length, 7, `${store}: identity ${i}`);
      assert.deepEqual(admitted.map((r) => r.remaining).sort(), [0, 1, 2, 3, 4, 5, 6], store);
      assert.ok(mine.every((r) => r.limit === 7 && r.verdict === 'decided'), store);
      const denied = mine.find((r) => !r.allowed);
      assert.equal(denied.reason, 'limited', store);
      assert.equal(denied.headers['RateLimit-Policy'], '"many";q=7;w=3600', store);
      assert.ok(Number(denied.headers['Retry-After']) > 0, store);
    }
    assert.equal((await Promise.all(keyed)).filter((r) => r.allowed).length, 5, store);
    // A result serialises with its headers, as a plain object would.
    // (Which of an identity's concurrent checks are admitted is up to the batching.)
    const json = JSON.parse(JSON.stringify(results.find((r) => r.allowed)));
    assert.equal(json.allowed, true);
    assert.equal(json.headers['RateLimit-Policy'], '"many";q=7;w=3600');
    assert.equal(json.leaseToken, undefined);
  }
});

test('bad checks in the same turn as good ones fail alone', async () => {
  const limiter = await Limiter.connect('memory');
  const p = Policy.fixedWindow('mixed', { limit: 10, window: '1h' });
  const id = freshIdentity();
  const [a, b, c, d, e] = await Promise.allSettled([
    limiter.check(p, id),
    limiter.check(p, id, { cost: -2 }),
    limiter.check(p, ''),
    limiter.check(p, 'x'.repeat(600)),
    limiter.check(p, id, { cost: 2 }),
  ]);
  assert.equal(a.status, 'fulfilled');
  assert.match(b.reason.message, /cost must be a whole number/);
  assert.match(c.reason.message, /identity must not be empty/);
  assert.match(d.reason.message, /the most is 512/);
  assert.equal(e.status, 'fulfilled');
  assert.equal((await limiter.check(p, id, { cost: 0 })).remaining, 10 - 3);
});

test('identities of any text are cut out of a batch exactly (joined, then split by length)', async () => {
  // One batch carries its identities as one string and their UTF-16 lengths: identities that
  // are prefixes of each other, multi-byte and astral characters (surrogate pairs), the
  // longest batched identity (170 units of 3 UTF-8 bytes each) and a lone surrogate (made
  // U+FFFD, as napi's own conversion makes it). A wrong cut would merge or split counts.
  const tag = freshIdentity();
  const names = [`${tag}`, `${tag}a`, `${tag}aa`, `${tag}ü名`, `${tag}😀x`, `名`.repeat(170), `${tag}\ud800`, `${tag}é`];
  for (const [store, url] of stores()) {
    const limiter = await Limiter.connect(url);
    const policy = Policy.fixedWindow('cut', { limit: 2, window: '1h' });
    const pending = [];
    for (let round = 0; round < 3; round++) for (const n of names) pending.push(limiter.check(policy, n));
    const results = await Promise.all(pending);
    names.forEach((n, i) => {
      const mine = [0, 1, 2].map((round) => results[round * names.length + i]);
      assert.deepEqual(mine.map((r) => r.allowed), [true, true, false], `${store}: ${JSON.stringify(n)}`);
      assert.deepEqual(mine.map((r) => r.remaining), [1, 0, 0], `${store}: ${JSON.stringify(n)}`);
      assert.equal(mine[2].reason, 'limited', store);
      assert.equal(mine[0].reason, undefined, store);
      assert.match(mine[2].headers.RateLimit, /^"cut";r=0;t=\d+$/, store);
      assert.equal(mine[2].headers['RateLimit-Policy'], '"cut";q=2;w=3600', store);
    });
    // The identity the batch limited is the one the one-by-one path limits: a check alone
    // (a credential rides the other path, so this one is alone in its batch) sees the same count.
    for (const n of names) {
      const alone = await limiter.check(policy, n, { cost: 0 });
      assert.equal(alone.remaining, 0, `${store}: ${JSON.stringify(n)} alone`);
    }
    // Leases of a concurrency policy come back with their own results, not a neighbour's.
    const leases = Policy.concurrency('cut-cc', { limit: 1, lease: '1m' });
    const held = await Promise.all(names.map((n) => limiter.check(leases, n)));
    assert.ok(held.every((r) => r.allowed && typeof r.leaseToken === 'string'), store);
    assert.equal(new Set(held.map((r) => r.leaseToken)).size, names.length, store);
    for (const r of held) assert.equal(await r.release(), 1, store);
  }
});

test("the constructors are the core registry's algorithms", () => {
  const names = Object.keys(FIVE).sort();
  const made = Object.keys(Policy).filter((k) => typeof Policy[k] === 'function' && k in FIVE).sort();
  assert.deepEqual(made, names);
  for (const [method, make] of Object.entries(FIVE)) {
    // The registry's stable name, camel-cased, is the constructor's name.
    assert.equal(make().algorithm.replace(/-([a-z])/g, (_, c) => c.toUpperCase()), method);
  }
});

test("a sluice.toml is read by the server's own reader", async () => {
  const path = require('node:path');
  const fs = require('node:fs');
  const os = require('node:os');
  const { Config, ConfigError } = require('sluice');
  const shipped = path.join(__dirname, '..', '..', '..', 'examples', 'sluice.toml');
  // The text alone, and the file with its Envoy files.
  const names = Policy.allFromToml(fs.readFileSync(shipped, 'utf8')).map((p) => p.name);
  assert.deepEqual(names, ['burst', 'daily', 'experimental', 'global-search', 'login', 'per-ip', 'uploads']);
  const config = Config.load(shipped);
  assert.deepEqual(Object.keys(config.policies).sort(), names);
  assert.equal(config.policies.burst.quota, 10);
  assert.equal(config.storeUrl, 'memory');
  const limiter = await Limiter.fromConfig(shipped);
  const results = [];
  for (let i = 0; i < 11; i++) results.push(await limiter.check(config.policies.burst, 'someone'));
  assert.deepEqual(results.map((r) => r.allowed), [...Array(10).fill(true), false]);
  // One name for a check's result in Rust, Python and Node.
  assert.equal(results[0].constructor.name, 'Checked');
  // Errors are the lines `sluice validate` prints: FILE:LINE: field: message.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-config-'));
  const bad = path.join(dir, 'sluice.toml');
  fs.writeFileSync(bad, '[store]\nurl = "memory"\n\n[policies.api]\nalgorithm = "token-bucket"\ncapacity = 10\nrate = "fast"\n');
  assert.throws(() => Config.load(bad), (e) => e instanceof ConfigError && e.code === 'ConfigError' &&
    e.message.startsWith(`${bad}:7: policies.api.rate: `));
  await assert.rejects(Limiter.fromConfig(bad), (e) => e instanceof ConfigError);
  assert.throws(() => Policy.fromToml('[policies.g]\nalgorithm = "gcra"\nrate = "1/s"\ncapacity = 3\n'),
    (e) => e instanceof ConfigError && /^<inline>:4: policies\.g\.capacity: .*gcra takes no capacity/.test(e.message));
  fs.rmSync(dir, { recursive: true });
});
