// Compiled (never run) by test/types.test.js: the declarations in index.d.ts, express.d.ts
// and fastify.d.ts accept the documented usage and refuse a wrong option type.
import { Config, Limiter, Policy, Checked } from '../index';
import { rateLimit } from '../express';
import sluice = require('../fastify');

export async function usage(): Promise<number> {
  const limiter = await Limiter.connect('redis://127.0.0.1:6379', { timeoutMs: 50, hashKey: 'ab'.repeat(32) });
  const burst = Policy.tokenBucket('burst', { capacity: 10, rate: '5/s' });
  const window = Policy.slidingLog('search', { limit: 30, window: '1m', failureMode: 'closed' });
  const d: Checked = await limiter.check(burst, 'user:42', { cost: 1 });
  const fromFile = await Limiter.fromConfig(Config.load('sluice.toml'));
  const daily: Policy = Config.load('sluice.toml').policies['daily'];
  void fromFile;
  void daily;
  const byKey = await limiter.check(window, { credential: 'sk_live_1' });
  const inflight = await limiter.check(Policy.concurrency('uploads', { limit: 2 }), 'user:42');
  await inflight.release?.();
  const middleware = rateLimit({ limiter, policies: [burst], apiKeyHeader: 'x-api-key', trustedProxies: 1 });
  void middleware;
  void sluice;
  // @ts-expect-error capacity is a number
  Policy.tokenBucket('x', { capacity: '10', rate: '5/s' });
  const leased = Policy.gcra('leased', { rate: '5/s', mode: 'leased', leaseTtl: '500ms' });
  const mode: 'exact' | 'leased' = leased.decisionMode;
  void mode;
  Policy.leakyBucket('queue', { capacity: 5, rate: '1/s', mode: 'shaping' });
  // @ts-expect-error a decision mode is exact or leased
  Policy.tokenBucket('x', { capacity: 10, rate: '5/s', mode: 'fast' });
  return d.retryAfterMs + byKey.remaining + (d.headers['RateLimit'] ?? '').length;
}
