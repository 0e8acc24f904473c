// Reservations from Node: reserve a maximum, settle the real cost once, on the embedded
// store and across two limiters sharing a redis-server of the test's own.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { Limiter, Policy, Reservation } = require('sluice');
const { startRedis, freshIdentity } = require('../test-support/support');

let redis;
before(async () => {
  redis = await startRedis();
});
after(async () => {
  await redis?.stop();
});

const budget = () => Policy.fixedWindow('llm-tokens', { limit: 1000, window: '1d' });

test('reserve, then settle the real cost once (memory)', async () => {
  const limiter = await Limiter.connect('memory');
  const tokens = budget();
  const id = freshIdentity();
  const r = await limiter.reserve(tokens, id, 600);
  assert.ok(r instanceof Reservation);
  assert.equal(r.allowed, true);
  assert.equal(r.id.length, 32);
  assert.equal(r.maxCost, 600);
  assert.equal(r.checked.remaining, 400);
  const denied = await limiter.reserve(tokens, id, 500);
  assert.equal(denied.allowed, false);
  assert.equal(denied.id, null);
  assert.ok('Retry-After' in denied.checked.headers);
  const s = await r.settle(150);
  assert.deepEqual(
    [s.maxCost, s.cost, s.refunded, s.debt],
    [600, 150, 450, 0],
  );
  assert.throws(() => r.settle(0), /settled already/);
  await assert.rejects(limiter.settle(r.id, 0), /settled already/);
  const left = await limiter.check(tokens, id, { cost: 0 });
  assert.equal(left.remaining, 850);
});

test('a reservation made by one limiter is settled by another (redis)', async () => {
  const a = await Limiter.connect(redis.url, { timeoutMs: 2000 });
  const b = await Limiter.connect(redis.url, { timeoutMs: 2000 });
  const tokens = budget();
  const id = freshIdentity();
  const r = await a.reserve(tokens, id, 100, { ttlMs: 30000 });
  const s = await b.settle(r.id, 250);
  assert.deepEqual([s.refunded, s.debt], [0, 150]);
  await assert.rejects(a.settle(r.id, 0), /settled already/);
  const short = await b.reserve(tokens, id, 300, { ttlMs: 100 });
  await new Promise((done) => setTimeout(done, 300));
  await assert.rejects(short.settle(0), /no such reservation/);
  const left = await a.check(tokens, id, { cost: 0 });
  assert.equal(left.remaining, 1000 - 250 - 300);
});
