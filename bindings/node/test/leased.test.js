// Leased mode from the Policy constructors (`mode: 'leased'`, `leaseTtl`), the decision mode
// `mode = "leased"` / `lease_ttl` give a sluice.toml policy. Two limiters on one real
// redis-server are two instances taking slices of one key's quota: together they never admit
// more than the limit. Bad modes are refused with the reason.
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

// Quotas of 20 that refill far too slowly to matter within a test.
const LEASED = {
  tokenBucket: () => Policy.tokenBucket('ltb', { capacity: 20, rate: '1/h', mode: 'leased', leaseTtl: '1s' }),
  gcra: () => Policy.gcra('lgcra', { rate: '1/h', burst: 19, mode: 'leased' }),
  fixedWindow: () => Policy.fixedWindow('lfw', { limit: 20, window: '1d', mode: 'leased', leaseTtl: 2 }),
};

describe('leased policies on two limiters sharing one Redis', () => {
  for (const [algorithm, make] of Object.entries(LEASED)) {
    test(`${algorithm}: never admits more than the limit`, async () => {
      const policy = make();
      assert.equal(policy.decisionMode, 'leased');
      const a = await Limiter.connect(redis.url, { timeoutMs: 2000 });
      const b = await Limiter.connect(redis.url, { timeoutMs: 2000 });
      const id = freshIdentity('leased');
      // 3 rounds of 20 checks at once on each limiter, interleaved: 120 asks of a limit of 20.
      let admitted = 0;
      for (let round = 0; round < 3; round++) {
        const checks = [];
        for (let i = 0; i < 20; i++) checks.push(a.check(policy, id), b.check(policy, id));
        const results = await Promise.all(checks);
        for (const r of results) {
          assert.equal(r.verdict, 'decided');
          if (r.allowed) admitted++;
        }
      }
      assert.ok(admitted <= 20, `two leased limiters admitted ${admitted} of a limit of 20`);
      assert.ok(admitted > 0, 'leased mode admitted nothing');
    });
  }
});

test('a leased policy reports its mode and slice lifetime; exact is the default', () => {
  const leased = Policy.tokenBucket('l', { capacity: 5, rate: '1/s', mode: 'leased', leaseTtl: '250ms' });
  assert.equal(leased.decisionMode, 'leased');
  assert.equal(leased.leaseTtlMs, 250);
  assert.equal(Policy.gcra('g', { rate: '1/s', mode: 'leased' }).leaseTtlMs, 1000);
  const exact = Policy.tokenBucket('e', { capacity: 5, rate: '1/s' });
  assert.equal(exact.decisionMode, 'exact');
  assert.equal(exact.leaseTtlMs, null);
  assert.equal(Policy.tokenBucket('e2', { capacity: 5, rate: '1/s', mode: 'exact' }).decisionMode, 'exact');
  // A leaky bucket's own modes still work beside the decision mode.
  assert.equal(Policy.leakyBucket('lb', { capacity: 5, rate: '1/s', mode: 'shaping' }).decisionMode, 'exact');
});

test('bad decision modes are refused with the reason', () => {
  const refused = (make, pattern) =>
    assert.throws(make, (e) => {
      assert.equal(e.code, 'InvalidArg');
      assert.match(e.message, pattern);
      return true;
    });
  refused(() => Policy.tokenBucket('x', { capacity: 5, rate: '1/s', mode: 'fast' }), /mode must be "exact" or "leased", not "fast"/);
  refused(() => Policy.tokenBucket('x', { capacity: 5, rate: '1/s', leaseTtl: '1s' }), /only a policy with mode: "leased" takes leaseTtl/);
  refused(() => Policy.tokenBucket('x', { capacity: 5, rate: '1/s', mode: 'leased', leaseTtl: '2m' }), /lease_ttl must be between 1ms and/);
  refused(() => Policy.slidingLog('x', { limit: 5, window: '1m', mode: 'leased' }), /mode = "leased" supports token-bucket, gcra and fixed-window, not sliding-log/);
  refused(() => Policy.concurrency('x', { limit: 5, mode: 'leased' }), /not concurrency/);
  refused(() => Policy.leakyBucket('x', { capacity: 5, rate: '1/s', mode: 'fast' }), /unknown leaky-bucket mode "fast"/);
  refused(() => Policy.tokenBucket('x', { capacity: 5, rate: '1/s', mode: 'leased', leaseTtl: 'soon' }), /leaseTtl/);
});
